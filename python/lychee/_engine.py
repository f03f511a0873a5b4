"""lychee.Engine and the module-level tools (train_heads, read_weights), over lychee._lychee."""
from __future__ import annotations

import numbers
import os
from typing import (Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Union, cast,
                    overload)

from . import _lychee
from . import policy as _policy
from .policy import _int
from .sampling import SamplingParams

#: One prompt: text (tokenized with the model's BOS default) or token ids.
Prompt = Union[str, Sequence[int]]
#: One chat message: {"role": ..., "content": ...} (OpenAI style) or a (role, content) pair.
Message = Union[Mapping[str, str], Sequence[str]]
#: One conversation: a list of messages.
Conversation = Sequence[Message]
#: SamplingParams for every prompt of a batch, or one per prompt.
Sampling = Union[SamplingParams, Sequence[SamplingParams], None]


def _float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def _is_message(m: Any) -> bool:
    if isinstance(m, Mapping):
        return True
    return (isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 2
            and isinstance(m[0], str) and isinstance(m[1], str))


class Engine:
    """A loaded model on a device: generate, stream and chat, one prompt or a batch.

        import lychee
        engine = lychee.Engine()                         # the default model, on the GPU if there is one
        print(engine.generate("The capital of France is", max_tokens=8).text)
        outs = engine.generate(["Once upon a time", "The sea"], lychee.SamplingParams(max_tokens=16))
        for piece in engine.stream("Write a haiku", max_tokens=32):
            print(piece, end="")
        reply = engine.chat([{"role": "user", "content": "Hi!"}], format="openai")   # an OpenAI dict

    model: a Hugging Face model directory, a .gguf file, or a Hub id "org/name[:QUANT]" found in
    the local Hugging Face cache (docs/chat-templates.md) (None = the default model,
    SmolLM2-135M-Instruct, fetched by scripts/fetch_assets.sh); device: "auto" (the GPU when
    this build has CUDA and one is present), "cpu" or "cuda"; kv_memory: the GPU KV-cache pool
    in GiB (None = sized from max_batch and the context; it also bounds a batch's sequences);
    max_context: the longest sequence (None = the model's); threads: CPU compute threads (None =
    the cores this process may use); tensor_parallel: GPUs to split the model over (devices
    0..N-1, N dividing the KV heads; see docs/scaling.md), kv_memory then per GPU;
    weights: how the GPU holds the linear matrices, "bf16" (default) or "fp8" (e4m3 with a scale per
    output channel: half the bytes per step; see policies for what stays bf16);
    cpu_weights: how the CPU holds them, "native" (default: a GGUF file's quantised blocks kept,
    int8 dot products at decode: ~3x faster decode than f32 on quantised files), "f32" (the
    reference), "fp8" or "bf16"
    (f32 holding the values FP8 / bf16 weights stand for, to measure what those formats cost).
    The CLI's --weights and --cpu-weights; ARCHITECTURE.md describes each. policies: the policies
    the engine will run (lychee.policy objects), as the CLI's --policy at load: with them FP8
    weights keep the Q/K/V of the layers whose heads choose tokens for others unrounded (bf16),
    tensor parallelism spreads their dense heads evenly over the GPUs, and device="auto" passes
    over a GPU that cannot run one of them; any policy can still be given per request.
    max_batch: the most sequences a batch (generate or chat with a list) decodes at once.
    kv_cache_dtype: how the KV cache holds K and V (the CLI's --kv-cache-dtype, vLLM's name):
    "bf16" (default; "auto" is the same) or "fp8" ("fp8_e4m3": e4m3 codes with one scale per token
    and KV head, written once; on the GPU half the bytes, so kv_memory holds ~2x the tokens; the
    CPU rounds its f32 cache to the same values, to measure what FP8 costs, and saves no memory).

    One request runs at a time (calls from several threads take turns). While a stream is
    generating, other requests raise EngineBusyError rather than cancel it.
    """

    def __init__(self, model: Union[str, os.PathLike, None] = None, device: str = "auto",
                 kv_memory: Optional[float] = None, max_context: Optional[int] = None,
                 threads: Optional[int] = None, tensor_parallel: int = 1, weights: str = "bf16",
                 cpu_weights: str = "native", policies: Union[_policy.Policy, Sequence[_policy.Policy]] = (),
                 max_batch: int = 8, kv_cache_dtype: str = "bf16"):
        for name, value in (("device", device), ("weights", weights), ("cpu_weights", cpu_weights),
                            ("kv_cache_dtype", kv_cache_dtype)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if isinstance(policies, _policy.Policy):  # one policy
            policies = [policies]
        self._e = _lychee.Engine(
            os.fspath(model) if model is not None else "", device,
            _float("kv_memory", kv_memory) if kv_memory is not None else 0.0,
            _int("max_context", max_context, 1) if max_context is not None else 0,
            _int("threads", threads, 1) if threads is not None else 0,
            _int("tensor_parallel", tensor_parallel, 1), weights, cpu_weights,
            [_policy.resolve(p) for p in policies], _int("max_batch", max_batch, 1), kv_cache_dtype)

    # --- the model ------------------------------------------------------------------------
    @property
    def device(self) -> str:
        """"cpu" or "cuda": where the engine runs."""
        return self._e.device

    @property
    def model_path(self) -> str:
        """The model's file or directory."""
        return self._e.model_path

    @property
    def model_name(self) -> str:
        """The model's name, as the server and the OpenAI form report it (a GGUF file's stem)."""
        return self._e.model_name

    @property
    def max_batch(self) -> int:
        """The most sequences a batch decodes at once."""
        return self._e.max_batch

    @property
    def fp8_kept_layers(self) -> List[int]:
        """FP8 weights: the layers whose Q/K/V stay unrounded (where a policy given at load selects
        tokens for other heads); [] otherwise."""
        return list(self._e.fp8_kept_layers)

    @property
    def weights(self) -> str:
        """The weight format in use: "bf16" or "fp8" on the GPU; "f32", "native", "fp8" or "bf16" on the CPU."""
        return self._e.weights

    @property
    def kv_tokens(self) -> int:
        """The KV budget a batch's sequences share, in tokens: kv_memory over the bytes a token's K and V
        take in the cache's dtype (FP8 on the GPU: ~2x bf16's), else max_batch x the context."""
        return self._e.kv_tokens

    @property
    def kv_cache_dtype(self) -> str:
        """How the KV cache holds K and V: "bf16" or "fp8" (the CPU keeps f32, FP8-rounded with "fp8")."""
        return self._e.kv_cache_dtype

    @property
    def config(self) -> Dict[str, Any]:
        """The model's configuration (name, n_layers, n_heads, n_kv_heads, head_dim, ...)."""
        return self._e.config

    @property
    def context(self) -> int:
        """The longest sequence, prompt plus generated tokens."""
        return self._e.context

    @property
    def stop_ids(self) -> List[int]:
        """The token ids that end a generation (unless ignore_eos)."""
        return self._e.stop_ids

    def __repr__(self) -> str:
        return f"lychee.Engine({self.config['name']!r}, device={self.device!r})"

    # --- tokens ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: Optional[bool] = None, special: bool = True) -> List[int]:
        """Token ids of text; add_bos None = the model's default; special: parse special-token text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._e.tokenize(text, self._e.add_bos if add_bos is None else bool(add_bos), bool(special))

    def detokenize(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of token ids (invalid UTF-8, e.g. half a character, becomes U+FFFD)."""
        return self._e.detokenize([int(i) for i in ids], bool(skip_special))

    def _prompt(self, prompt: Prompt, where: str = "prompt") -> List[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        if isinstance(prompt, (bytes, bytearray)):
            raise TypeError(f"{where} must be a str or a sequence of token ids, got bytes")
        try:
            ids = list(prompt)
        except TypeError:
            raise TypeError(f"{where} must be a str or a sequence of token ids, got {type(prompt).__name__}") from None
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"{where}[{i}] must be a token id (an int), got {type(t).__name__}")
        return [int(t) for t in ids]

    @staticmethod
    def _is_batch(prompt: Any) -> bool:
        """A list of prompts (texts or token-id lists), not one prompt (a text or token ids)."""
        if isinstance(prompt, (str, bytes, bytearray)):
            return False
        if not isinstance(prompt, Sequence):
            raise TypeError(f"prompt must be a str, token ids or a list of prompts, got {type(prompt).__name__}")
        if len(prompt) == 0:
            raise ValueError("prompt is empty: give a str, token ids or a non-empty list of prompts")
        first = prompt[0]
        return not (isinstance(first, numbers.Integral) and not isinstance(first, bool))

    @staticmethod
    def _listed(prompt: Any) -> Any:
        """An iterable that is not a sequence (a generator, a NumPy array) as a list."""
        if not isinstance(prompt, (str, bytes, bytearray, Sequence)) and isinstance(prompt, Iterable):
            return list(prompt)
        return prompt

    def chat_tokens(self, messages: Conversation, add_generation_prompt: bool = True) -> List[int]:
        """The token ids of a conversation in the model's chat template.

        messages: dicts {"role": ..., "content": ...} (OpenAI style) or (role, content) pairs.
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of messages, got {type(messages).__name__}")
        pairs = []
        for i, m in enumerate(messages):
            if isinstance(m, Mapping):
                if "role" not in m or "content" not in m:
                    raise ValueError(f"messages[{i}] needs 'role' and 'content', got keys {sorted(m)}")
                role, content = m["role"], m["content"]
            else:
                try:
                    role, content = m
                except (TypeError, ValueError):
                    raise TypeError(f"messages[{i}] must be a dict with role and content or a (role, content) pair") from None
            if not isinstance(role, str) or not isinstance(content, str):
                raise TypeError(f"messages[{i}]: role and content must be str")
            pairs.append((role, content))
        return self._e.encode_chat(pairs, bool(add_generation_prompt))

    # --- generation -----------------------------------------------------------------------
    @staticmethod
    def _sampling(sampling: Sampling, n: Optional[int], overrides: Dict[str, Any]) -> List[SamplingParams]:
        """The SamplingParams of each of n prompts (n None: one prompt, not a batch), keyword
        arguments (those not None) replacing the object's fields."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        if sampling is None:
            params: List[SamplingParams] = [SamplingParams(**changes)]
        elif isinstance(sampling, SamplingParams):
            params = [sampling.replace(**changes) if changes else sampling]
        elif n is not None and isinstance(sampling, Sequence) and not isinstance(sampling, str):
            if len(sampling) != n:
                raise ValueError(f"sampling: {len(sampling)} SamplingParams for {n} prompts (give one, or one per prompt)")
            params = []
            for i, p in enumerate(sampling):
                if not isinstance(p, SamplingParams):
                    raise TypeError(f"sampling[{i}] must be a lychee.SamplingParams, got {type(p).__name__}")
                params.append(p.replace(**changes) if changes else p)
            return params
        else:
            raise TypeError(
                f"sampling must be a lychee.SamplingParams{' or a list of them' if n is not None else ''}, got "
                f"{type(sampling).__name__} (max_tokens, temperature and the rest are keyword arguments)")
        return params * (n if n is not None else 1)

    @staticmethod
    def _format(results: Any, format: Optional[str]) -> Any:
        if format is None:
            return results
        if format != "openai":
            raise ValueError(f'format must be None or "openai", got {format!r}')
        if isinstance(results, list):
            return [r.to_openai() for r in results]
        return results.to_openai()

    # A str is also a sequence of str, so the one-prompt overloads overlap the list ones; the first
    # that matches wins, which is the runtime's rule too.
    @overload
    def generate(self, prompt: Prompt, sampling: Optional[SamplingParams] = None, *,  # type: ignore[overload-overlap]
                 max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
                 policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
                 logprobs: Optional[int] = None, correct_every: Optional[int] = None,
                 on_text: Optional[Callable[[str], None]] = None, format: None = None) -> _lychee.Completion: ...

    @overload
    def generate(self, prompt: Prompt, sampling: Optional[SamplingParams] = None, *,  # type: ignore[overload-overlap]
                 max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
                 policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
                 logprobs: Optional[int] = None, correct_every: Optional[int] = None,
                 on_text: Optional[Callable[[str], None]] = None, format: Literal["openai"]) -> Dict[str, Any]: ...

    @overload
    def generate(self, prompt: Sequence[Prompt], sampling: Sampling = None, *,
                 max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
                 policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
                 logprobs: Optional[int] = None, correct_every: Optional[int] = None,
                 on_text: None = None, format: None = None) -> List[_lychee.Completion]: ...

    @overload
    def generate(self, prompt: Sequence[Prompt], sampling: Sampling = None, *,
                 max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
                 top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
                 policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
                 logprobs: Optional[int] = None, correct_every: Optional[int] = None,
                 on_text: None = None, format: Literal["openai"]) -> List[Dict[str, Any]]: ...

    def generate(self, prompt, sampling=None, *, max_tokens=None, temperature=None, top_p=None, top_k=None,
                 seed=None, stop=None, policy=None, ignore_eos=None, logprobs=None, correct_every=None,
                 on_text=None, format=None):
        """Completes a prompt, or a list of prompts as one batch.

        prompt: a str (tokenized with the model's BOS default), token ids, or a list of either:
            a list runs as one batch (continuous batching: up to max_batch sequences decode
            together, a finished one's place going to the next prompt) and returns a list of
            Completions in the same order; under greedy sampling (or equal seeds) each is what
            its prompt alone gives.
        sampling: a lychee.SamplingParams (or, for a list, one per prompt); None = the defaults.
        max_tokens, temperature, top_p, top_k, seed, stop, policy, ignore_eos, logprobs,
            correct_every: SamplingParams' fields as keyword arguments; those given replace the
            sampling object's.
        on_text: called with each piece of text as it becomes final (one prompt only).
        format: None returns Completion objects (text, tokens, finish_reason, ttft, tpot,
            kv_bytes_read, ...); "openai" returns the OpenAI text_completion dicts instead.
        Ctrl-C stops the generation after the current token and raises KeyboardInterrupt.
        Raises EngineBusyError while a stream of this engine is still generating.
        """
        overrides = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                         stop=stop, policy=policy, ignore_eos=ignore_eos, logprobs=logprobs,
                         correct_every=correct_every)
        prompt = self._listed(prompt)
        if self._is_batch(prompt):
            if on_text is not None:
                raise TypeError("on_text streams one prompt; a list of prompts returns when the batch is done")
            prompts = [self._prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
            params = self._sampling(sampling, len(prompts), overrides)
            return self._format(self._e.generate_batch([s._request(p) for s, p in zip(params, prompts)]), format)
        request = self._sampling(sampling, None, overrides)[0]._request(self._prompt(prompt))
        return self._format(self._e.generate(request, on_text), format)

    def stream(self, prompt: Prompt, sampling: Optional[SamplingParams] = None, *, max_tokens: Optional[int] = None,
               temperature: Optional[float] = None, top_p: Optional[float] = None, top_k: Optional[int] = None,
               seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
               policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
               logprobs: Optional[int] = None, correct_every: Optional[int] = None) -> _lychee.Stream:
        """As generate for one prompt, yielding pieces of text as they become final; the joined
        pieces equal generate's text. The returned Stream's .completion holds the statistics once
        it has ended; close() (or leaving a with block) cancels the generation.

        While the stream generates, this engine takes no other request: generate, stream, chat
        and evaluate raise EngineBusyError (nothing is cancelled behind your back). Read the
        stream to its end, close() it, or use it in a with block.
        """
        prompt = self._listed(prompt)
        if self._is_batch(prompt):
            raise TypeError("stream() takes one prompt; generate() runs a list of prompts as a batch")
        overrides = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                         stop=stop, policy=policy, ignore_eos=ignore_eos, logprobs=logprobs,
                         correct_every=correct_every)
        request = self._sampling(sampling, None, overrides)[0]._request(self._prompt(prompt))
        return self._e.stream(request)

    @staticmethod
    def _is_conversation_batch(messages: Any) -> bool:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of messages (or of conversations), got {type(messages).__name__}")
        if len(messages) == 0:
            raise ValueError("messages is empty: give a conversation (a list of messages) or a list of conversations")
        return not _is_message(messages[0])

    @overload
    def chat(self, messages: Sequence[Mapping[str, str]], sampling: Optional[SamplingParams] = None, *,
             max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
             logprobs: Optional[int] = None, correct_every: Optional[int] = None, stream: Literal[False] = False, format: None = None) -> _lychee.Completion: ...

    @overload
    def chat(self, messages: Sequence[Mapping[str, str]], sampling: Optional[SamplingParams] = None, *,
             max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
             logprobs: Optional[int] = None, correct_every: Optional[int] = None, stream: Literal[True], format: None = None) -> _lychee.Stream: ...

    @overload
    def chat(self, messages: Sequence[Mapping[str, str]], sampling: Optional[SamplingParams] = None, *,
             max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
             logprobs: Optional[int] = None, correct_every: Optional[int] = None, stream: Literal[False] = False, format: Literal["openai"]) -> Dict[str, Any]: ...

    @overload
    def chat(self, messages: Sequence[Sequence[Mapping[str, str]]], sampling: Sampling = None, *,
             max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
             logprobs: Optional[int] = None, correct_every: Optional[int] = None, stream: Literal[False] = False, format: None = None) -> List[_lychee.Completion]: ...

    @overload
    def chat(self, messages: Sequence[Sequence[Mapping[str, str]]], sampling: Sampling = None, *,
             max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
             logprobs: Optional[int] = None, correct_every: Optional[int] = None, stream: Literal[False] = False, format: Literal["openai"]) -> List[Dict[str, Any]]: ...

    @overload
    def chat(self, messages: Union[Conversation, Sequence[Conversation]], sampling: Sampling = None, *,
             max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
             logprobs: Optional[int] = None, correct_every: Optional[int] = None, stream: bool = False, format: Optional[str] = None) -> Any: ...

    def chat(self, messages: Union[Conversation, Sequence[Conversation]], sampling: Sampling = None, *,
             max_tokens: Optional[int] = None, temperature: Optional[float] = None, top_p: Optional[float] = None,
             top_k: Optional[int] = None, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, ignore_eos: Optional[bool] = None,
             logprobs: Optional[int] = None, correct_every: Optional[int] = None, stream: bool = False,
             format: Optional[str] = None) -> Any:
        """The assistant's reply to a conversation in the model's chat template, or to each of a
        list of conversations as one batch (a list back, in order).

        messages: a conversation, a list of {"role": ..., "content": ...} dicts (OpenAI style) or
            (role, content) pairs; or a list of conversations.
        sampling and the keyword arguments: as for generate.
        stream: True returns a Stream of text pieces (one conversation only).
        format: None returns Completion objects; "openai" the OpenAI chat.completion dicts
            (id, object, created, model, choices[0].message {role, content}, finish_reason, usage);
            Completion.to_openai() gives the same for a result in hand.
        """
        overrides = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                         stop=stop, policy=policy, ignore_eos=ignore_eos, logprobs=logprobs,
                         correct_every=correct_every)
        if self._is_conversation_batch(messages):
            if stream:
                raise TypeError("stream=True takes one conversation; a list of conversations runs as a batch")
            ids = []
            for i, conversation in enumerate(messages):
                if isinstance(conversation, (str, bytes)) or not isinstance(conversation, Sequence):
                    raise TypeError(f"messages[{i}] must be a conversation (a list of messages), "
                                    f"got {type(conversation).__name__}")
                try:
                    ids.append(self.chat_tokens(conversation))
                except (TypeError, ValueError) as e:
                    raise type(e)(f"messages[{i}]: {e}") from None
            params = self._sampling(sampling, len(ids), overrides)
            return self._format(self._e.generate_batch([s._request(p, chat=True) for s, p in zip(params, ids)]),
                                format)
        conversation = cast(Conversation, messages)
        request = self._sampling(sampling, None, overrides)[0]._request(self.chat_tokens(conversation), chat=True)
        if stream:
            if format is not None:
                raise TypeError("format applies to finished replies; with stream=True use the Stream's "
                                ".completion.to_openai() once it has ended")
            return self._e.stream(request)
        return self._format(self._e.generate(request, None), format)

    # --- head roles and evaluation ------------------------------------------------------------
    def default_head_roles(self) -> _lychee.HeadRoles:
        """The TidalDecode-matched stand-in the policies use when given no head-role file."""
        return self._e.default_head_roles()

    def load_head_roles(self, path: Union[str, os.PathLike]) -> _lychee.HeadRoles:
        """A head-role file, validated against this model."""
        return self._e.load_head_roles(os.fspath(path))

    def evaluate(self, tasks: Sequence[str] = ("passkey",), lengths: Sequence[int] = (1024,),
                 depths: Sequence[float] = (0.1, 0.5, 0.9), policies: Sequence[_policy.Policy] = (_policy.Full(),),
                 samples: int = 1, seed: int = 0, haystack: str = "essays", correct_every: int = 0,
                 progress: Optional[Callable[[str], None]] = None) -> List[dict]:
        """Retrieval accuracy of each policy at equal prefill (lychee eval): one record per
        (sample, policy) with task, length, depth, policy_label, score, kv_bytes_read,
        kv_bytes_dense, decode_steps, prompt_tokens and output. progress gets a line per sample."""
        resolved = [_policy.resolve(p) for p in policies]
        return self._e.evaluate([str(t) for t in tasks], [_int("lengths[]", int(n), 1) for n in lengths],
                                [float(d) for d in depths], resolved, _int("samples", samples, 1),
                                _int("seed", seed, 0), haystack, _int("correct_every", correct_every, 0), progress)


def train_heads(model: Union[str, os.PathLike, None] = None, *, device: str = "auto", steps: int = 3000,
                retrieval_heads: int = 0, out: Union[str, os.PathLike, None] = None,
                progress: Optional[Callable[[str], None]] = None, **options) -> dict:
    """Learns LycheeDecode head roles (lychee train-heads; docs/trainer.md) and writes the output
    directory (roles.json, train_log.csv, heatmap.svg, summary.json, checkpoint.json).

    Further options by the CLI's names with underscores: gate, data, haystack, propagate, loss,
    decision, min_len, max_len, passkeys, passkey_words, lr, lambda_lr, lambda_init, keep_ratio,
    seed, resume, log_every, checkpoint_every, tf32, stop_after, prefill, teacher_attention,
    data_parallel, gpus.
    progress gets each progress line.
    Returns a dict with "roles" (HeadRoles), "out_dir", "final_loss", "steps_run", ...
    """
    config = _lychee.TrainHeadsConfig()
    config.model = os.fspath(model) if model is not None else ""
    config.device = device
    config.steps = _int("steps", steps, 1)
    config.retrieval_heads = _int("retrieval_heads", retrieval_heads, 0)
    if out is not None:
        config.out = os.fspath(out)
    for name, value in options.items():
        if name.startswith("_") or not hasattr(config, name) or name in ("model", "device", "steps", "out"):
            raise TypeError(f"train_heads() got an unexpected keyword argument {name!r}")
        setattr(config, name, value)
    return _lychee.train_heads(config, progress)


def read_weights(model: Union[str, os.PathLike, None] = None) -> dict:
    """Every weight of a checkpoint (None = the default model) as float32 NumPy arrays keyed by
    Hugging Face name, dequantised and in HF layout exactly as the engine loads them (needs numpy)."""
    return _lychee.read_weights(os.fspath(model) if model is not None else "")


def select_units_reference(scores: Sequence[float], unit_size: int, n_tokens: int, strategy: str = "topk",
                           budget: int = 4096, value: float = 0.0, sink: int = 0, recent: int = 0,
                           scale: float = 1.0) -> List[int]:
    """The CPU reference selection (src/attention/selection.h) over per-unit scores: ascending
    unit ids. The oracle lychee.ops.select_units is tested against."""
    return _lychee.select_units_reference([float(s) for s in scores], unit_size, n_tokens, strategy, budget,
                                          float(value), sink, recent, float(scale))
