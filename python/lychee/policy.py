"""Attention policies for Engine.generate / stream / chat / evaluate.

Each is a small frozen dataclass mapped onto the engine's policy settings (the CLI's --policy,
--budget, ... flags; src/runtime/policy_settings.h); the engine validates the values against the
model and raises lychee.InvalidArgumentError naming the option.

    Full()                                     every head reads every token
    Lychee(budget=256, block_size=16, heads=...)   LycheeDecode (heads: a head-role file or HeadRoles)
    Tidal(budget=256, layers=None)             TidalDecode (selection layers; default 2 and round(13/32 L))
    Quest(budget=256, page=16)                 Quest
    Duo(heads=..., sink=64, recent=256)        DuoAttention
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from . import _lychee

HeadsArg = Union[None, str, "os.PathLike[str]", _lychee.HeadRoles]


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _heads(settings: _lychee.PolicySettings, heads: HeadsArg) -> Optional[_lychee.HeadRoles]:
    if heads is None:
        return None
    if isinstance(heads, _lychee.HeadRoles):
        return heads
    if isinstance(heads, (str, os.PathLike)):
        settings.heads = os.fspath(heads)
        return None
    raise TypeError(f"heads must be a path or a lychee.HeadRoles, got {type(heads).__name__}")


class Policy:
    """Base of the policies: settings(): (PolicySettings, HeadRoles or None) for the engine."""

    def settings(self) -> Tuple[_lychee.PolicySettings, Optional[_lychee.HeadRoles]]:
        """The engine's settings for this policy (the CLI's --policy flags) and its head roles (None:
        the settings' file or the stand-in); the options' types and ranges checked."""
        raise NotImplementedError


@dataclass(frozen=True)
class Full(Policy):
    """Dense attention: every head reads every token."""

    def settings(self):
        s = _lychee.PolicySettings()
        s.policy = "full"
        return s, None


@dataclass(frozen=True)
class Lychee(Policy):
    """LycheeDecode: retrieval heads read everything and select; sparse heads reuse the selection.

    budget: tokens a sparse head reads (top-k); block_size: selection unit (1 = tokens);
    heads: head-role file or HeadRoles (None = the TidalDecode-matched stand-in);
    select: "topk", "topp", "threshold" or "ratio" with select_value; sink/recent: forced tokens.
    """

    budget: int = 4096
    block_size: int = 16
    heads: HeadsArg = None
    select: str = "topk"
    select_value: float = 0.0
    sink: int = 64
    recent: int = 256

    def settings(self):
        s = _lychee.PolicySettings()
        s.policy = "lychee"
        s.budget = _int("Lychee.budget", self.budget, 1)
        s.block_size = _int("Lychee.block_size", self.block_size, 1)
        if self.select not in ("topk", "topp", "threshold", "ratio"):
            raise ValueError(f"Lychee.select must be topk, topp, threshold or ratio, got {self.select!r}")
        s.select = self.select
        s.select_value = float(self.select_value)
        s.sink = _int("Lychee.sink", self.sink, 0)
        s.recent = _int("Lychee.recent", self.recent, 0)
        return s, _heads(s, self.heads)


@dataclass(frozen=True)
class Tidal(Policy):
    """TidalDecode: dense layers, token-selection layers, sparse layers sharing the selection."""

    budget: int = 4096
    layers: Optional[Sequence[int]] = None

    def settings(self):
        s = _lychee.PolicySettings()
        s.policy = "tidal"
        s.budget = _int("Tidal.budget", self.budget, 1)
        if self.layers is not None:
            s.tidal_layers = [_int("Tidal.layers[]", int(x), 0) for x in self.layers]
        return s, None


@dataclass(frozen=True)
class Quest(Policy):
    """Quest: pages ranked by the min/max-key bound per query head."""

    budget: int = 4096
    page: int = 16

    def settings(self):
        s = _lychee.PolicySettings()
        s.policy = "quest"
        s.budget = _int("Quest.budget", self.budget, 1)
        s.quest_page = _int("Quest.page", self.page, 1)
        return s, None


@dataclass(frozen=True)
class Duo(Policy):
    """DuoAttention: retrieval heads dense, streaming heads read sink + recent tokens."""

    heads: HeadsArg = None
    sink: int = 64
    recent: int = 256

    def settings(self):
        s = _lychee.PolicySettings()
        s.policy = "duo"
        s.duo_sink = _int("Duo.sink", self.sink, 0)
        s.duo_recent = _int("Duo.recent", self.recent, 1)
        return s, _heads(s, self.heads)


def resolve(policy) -> Tuple[_lychee.PolicySettings, Optional[_lychee.HeadRoles]]:
    """The engine's settings for a policy object (None = Full)."""
    if policy is None:
        return Full().settings()
    if not isinstance(policy, Policy):
        raise TypeError(
            "policy must be a lychee.policy object (Full(), Lychee(...), Tidal(...), Quest(...), Duo(...)), "
            f"got {type(policy).__name__}")
    return policy.settings()


__all__ = ["Duo", "Full", "Lychee", "Policy", "Quest", "Tidal", "resolve"]
