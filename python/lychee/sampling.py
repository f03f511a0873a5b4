"""SamplingParams: how one generation samples, stops and attends, in one object.

    params = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, seed=1, stop=["\\n\\n"])
    engine.generate("Once upon a time", params)
    engine.generate(["Once upon a time", "The sea"], params)        # one batch, a list back
    engine.generate("Once upon a time", params, max_tokens=8)        # keywords override the object
    engine.chat(messages, SamplingParams(policy=lychee.policy.Lychee(budget=256)))

Every Engine method that generates (generate, stream, chat) takes one as its second argument
(or sampling=...) and the same names as keyword arguments.
"""
from __future__ import annotations

import dataclasses
import numbers
import secrets
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

from . import _lychee
from . import policy as _policy


def _check_int(name: str, value: Any, minimum: int, maximum: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"SamplingParams.{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"SamplingParams.{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"SamplingParams.{name} must be <= {maximum}, got {value}")
    return value


def _check_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"SamplingParams.{name} must be a number, got {type(value).__name__}")
    return float(value)


def _check_stops(stop: Any) -> List[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, Sequence):
        raise TypeError(f"SamplingParams.stop must be a str or a list of str, got {type(stop).__name__}")
    stops = list(stop)
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise TypeError(f"SamplingParams.stop[{i}] must be a str, got {type(s).__name__}")
    return stops


@dataclass(frozen=True)
class SamplingParams:
    """How one generation samples, stops and attends (vLLM's SamplingParams, lychee's names).

    max_tokens: the most tokens to generate (0 = none).
    temperature: 0 is greedy (the most likely token each step); higher is more random.
    top_p: nucleus sampling, the smallest set of tokens whose probability reaches top_p (1 = off).
    top_k: sample among the k most likely tokens (0 = off).
    seed: makes sampling repeatable; None draws a random seed per request (Completion.seed says
        which). A batch given one seed seeds every prompt with it, as separate calls would.
    stop: a string or strings that end the text (the stop string is not included).
    policy: the attention policy, a lychee.policy object (None = Full(); its budget and other
        options are the policy object's: policy=Lychee(budget=256, block_size=16)).
    ignore_eos: go on past the model's end-of-sequence tokens (stop strings still stop).
    logprobs: None = off; n >= 0 = each token's log-probability and the n likeliest alternatives
        (Completion.logprobs, and the OpenAI form's logprobs).
    correct_every: cache correction, a dense re-prefill of the last N decoded tokens every N
        tokens (0 = off; docs/policies.md).
    speculate: self-speculative decoding with `policy` as the draft and Full verifying
        (docs/speculative.md): 0 = off, N = drafted tokens per cycle (1..16), "auto" = chosen from
        the acceptance and step times. The tokens are Full's (greedy) or Full's distribution
        (sampling); Completion.drafted / accepted count the drafts. Without logprobs or
        correct_every; a list of prompts speculates as one batch.

    Frozen: replace(**changes) gives a changed copy. Types and ranges are checked here; the engine
    checks temperature and top_p ranges and the policy's options against the model.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop: Union[str, Sequence[str], None] = None
    policy: Optional[_policy.Policy] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    correct_every: int = 0
    speculate: Union[int, str] = 0

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, 0)
        _check_float("temperature", self.temperature)
        _check_float("top_p", self.top_p)
        _check_int("top_k", self.top_k, 0)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**64 - 1)
        _check_stops(self.stop)
        if self.policy is not None and not isinstance(self.policy, _policy.Policy):
            raise TypeError(
                "SamplingParams.policy must be a lychee.policy object (Full(), Lychee(...), Tidal(...), Quest(...), "
                f"Duo(...)), got {type(self.policy).__name__}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"SamplingParams.ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0)
        _check_int("correct_every", self.correct_every, 0)
        if isinstance(self.speculate, str):
            if self.speculate != "auto":
                raise ValueError(f"SamplingParams.speculate must be a count 0..16 or \"auto\", got {self.speculate!r}")
        else:
            _check_int("speculate", self.speculate, 0, 16)

    def replace(self, **changes: Any) -> "SamplingParams":
        """A copy with the given fields changed (checked as the constructor checks them)."""
        return dataclasses.replace(self, **changes)

    def _request(self, prompt: List[int], chat: bool = False) -> _lychee.Request:
        """The engine's request for these parameters and a tokenized prompt."""
        r = _lychee.Request()
        r.prompt = prompt
        r.max_tokens = int(self.max_tokens)
        r.temperature = float(self.temperature)
        r.top_p = float(self.top_p)
        r.top_k = int(self.top_k)
        r.seed = int(self.seed) if self.seed is not None else secrets.randbits(64)
        r.stop = _check_stops(self.stop)
        r.ignore_eos = self.ignore_eos
        r.correct_every = int(self.correct_every)
        r.speculate = self.speculate if isinstance(self.speculate, str) else str(int(self.speculate))
        r.logprobs = int(self.logprobs) if self.logprobs is not None else -1
        r.chat = chat
        r.policy, r.roles = _policy.resolve(self.policy)
        return r


__all__ = ["SamplingParams"]
