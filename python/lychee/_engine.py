"""lychee.Engine and the module-level tools (train_heads, read_weights), over lychee._lychee."""
from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import _lychee
from . import policy as _policy
from .policy import _int

Prompt = Union[str, Sequence[int]]
Message = Union[Mapping[str, str], Sequence[str]]


def _float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def _stops(stop) -> List[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    stops = list(stop)
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise TypeError(f"stop[{i}] must be a str, got {type(s).__name__}")
    return stops


class Engine:
    """A loaded model on a device.

    model: a Hugging Face model directory or a .gguf file (None = the default model,
    SmolLM2-135M-Instruct, fetched by scripts/fetch_assets.sh); device: "auto" (the GPU when
    this build has CUDA and one is present), "cpu" or "cuda"; kv_memory: the GPU KV-cache pool
    in GiB (None = sized from the context); max_context: the longest sequence (None = the
    model's); threads: CPU compute threads (None = the cores this process may use);
    tensor_parallel: GPUs to split the model over (devices 0..N-1, N dividing the KV heads; see
    docs/scaling.md), kv_memory then per GPU;
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
    """

    def __init__(self, model: Union[str, os.PathLike, None] = None, device: str = "auto",
                 kv_memory: Optional[float] = None, max_context: Optional[int] = None,
                 threads: Optional[int] = None, tensor_parallel: int = 1, weights: str = "bf16",
                 cpu_weights: str = "native", policies: Sequence[_policy.Policy] = ()):
        for name, value in (("device", device), ("weights", weights), ("cpu_weights", cpu_weights)):
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
            [_policy.resolve(p) for p in policies])

    # --- the model ------------------------------------------------------------------------
    @property
    def device(self) -> str:
        """"cpu" or "cuda": where the engine runs."""
        return self._e.device

    @property
    def model_path(self) -> str:
        return self._e.model_path

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
    def config(self) -> Dict[str, object]:
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

    def _prompt(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        if isinstance(prompt, (bytes, bytearray)):
            raise TypeError("prompt must be a str or a sequence of token ids, got bytes")
        try:
            return [int(i) for i in prompt]
        except TypeError:
            raise TypeError(f"prompt must be a str or a sequence of token ids, got {type(prompt).__name__}") from None

    def chat_tokens(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> List[int]:
        """The token ids of a conversation in the model's chat template.

        messages: dicts {"role": ..., "content": ...} (OpenAI style) or (role, content) pairs.
        """
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
    def _args(self, prompt, max_tokens, temperature, top_p, top_k, seed, stop, policy, ignore_eos, correct_every):
        settings, roles = _policy.resolve(policy)
        return (self._prompt(prompt), _int("max_tokens", max_tokens, 0), _float("temperature", temperature),
                _float("top_p", top_p), _int("top_k", top_k, 0), _int("seed", seed, 0), _stops(stop),
                bool(ignore_eos), _int("correct_every", correct_every, 0), settings, roles)

    def generate(self, prompt: Prompt, max_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, stop: Union[str, Sequence[str], None] = None,
                 policy: Optional[_policy.Policy] = None, *, ignore_eos: bool = False, correct_every: int = 0,
                 on_text: Optional[Callable[[str], None]] = None) -> _lychee.Completion:
        """Completes a prompt (text, tokenized with the model's BOS default, or token ids).

        temperature 0 is greedy; top_k 0 and top_p 1 are off; seed makes sampling repeatable.
        stop: strings that end the text (not included). policy: a lychee.policy object (None =
        Full()). ignore_eos: go on past the model's stop tokens. correct_every: cache correction
        (a dense re-prefill every N decoded tokens). on_text: called with each piece of text.
        Returns a Completion (text, tokens, finish_reason, ttft, tpot, kv_bytes_read, ...).
        Ctrl-C stops the generation after the current token and raises KeyboardInterrupt.
        """
        args = self._args(prompt, max_tokens, temperature, top_p, top_k, seed, stop, policy, ignore_eos,
                          correct_every)
        return self._e.generate(*args, on_text)

    def stream(self, prompt: Prompt, max_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int = 0, stop: Union[str, Sequence[str], None] = None,
               policy: Optional[_policy.Policy] = None, *, ignore_eos: bool = False,
               correct_every: int = 0) -> _lychee.Stream:
        """As generate, yielding pieces of text as they are final; the joined pieces equal
        generate's text. The returned Stream's .completion holds the statistics once exhausted;
        close() (or leaving a with block) cancels the generation."""
        args = self._args(prompt, max_tokens, temperature, top_p, top_k, seed, stop, policy, ignore_eos,
                          correct_every)
        return self._e.stream(*args)

    def chat(self, messages: Sequence[Message], max_tokens: int = 128, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop: Union[str, Sequence[str], None] = None,
             policy: Optional[_policy.Policy] = None, *, stream: bool = False, correct_every: int = 0):
        """The assistant's reply to a conversation in the model's chat template (a Completion, or
        a Stream of text pieces with stream=True). messages as for chat_tokens."""
        ids = self.chat_tokens(messages)
        fn = self.stream if stream else self.generate
        return fn(ids, max_tokens, temperature, top_p, top_k, seed, stop, policy, correct_every=correct_every)

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
    seed, resume, log_every, checkpoint_every, tf32. progress gets each progress line.
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
