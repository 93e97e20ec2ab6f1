"""The KV cache a generation carries from step to step: its kinds, its length
and how a prefill's keys and values enter it (see ``loop.py``'s docstring
for what each kind costs)."""
from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import numpy as np

from ..errors import BlockcError
from ..frontends.models import DecoderLM
from .decoder import as_decoder


class CacheKind(Enum):
    """How the decode graph holds the past: the CLI's ``--cache`` strings are the values."""

    INPLACE = "inplace"   # buffers of cache_len positions, written in place, kept by the backend
    CONCAT = "concat"     # the past with the step's rows appended: a new, longer cache every step

    @property
    def preallocated(self) -> bool:
        """Whether the decode graph takes buffers of a fixed length (``cache_len``)."""
        return self is CacheKind.INPLACE

    @classmethod
    def of(cls, value: "CacheKind | str") -> "CacheKind":
        """``value`` (a kind or its name) as a kind, else a ``BlockcError`` listing the kinds."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise BlockcError(f"cache must be one of {', '.join(k.value for k in cls)}, got {value!r}") from None


def cache_names(layers: int) -> list[tuple[str, str]]:
    """``(past input, present output)`` of every layer's keys and values, as
    ``DecoderLM.for_cache`` names them: what one step hands the next."""
    return [(f"past.{i}.{kv}", f"present.{i}.{kv}") for i in range(layers) for kv in ("key", "value")]


CACHE_BUCKET = 64   # the smallest default in-place cache, in positions


def bucketed(needed: int, most: int) -> int:
    """The default in-place cache for ``needed`` positions: the next power of
    two from ``CACHE_BUCKET`` on, at most ``most``. Each length is a decode
    graph and so a build: ``--max-new 5`` and ``6`` share one, and a run
    builds at most log2(max_positions) of them."""
    length = CACHE_BUCKET
    while length < needed:
        length *= 2
    return max(needed, min(length, most))


def cache_length(model: DecoderLM, prompts: Sequence[Sequence[int]], max_new: int, cache: CacheKind | str,
                 cache_len: int | None) -> int | None:
    """The positions an in-place cache holds: the longest prompt and every
    new token but the last (which no step reads back), ``bucketed``; ``cache_len``
    if it is given, holds them and fits the model's positions (a longer
    buffer could never be filled), else a ``BlockcError``. None for the
    concat cache, which has no buffer to size."""
    model, cache = as_decoder(model), CacheKind.of(cache)
    if not cache.preallocated:
        if cache_len is not None:
            raise BlockcError(f"cache_len sizes the in-place cache; the {cache.value} cache has no buffer to size")
        return None
    longest = max(len(p) for p in prompts)
    needed = longest + max_new - 1
    if cache_len is None:
        return bucketed(needed, model.cfg.max_positions)
    if isinstance(cache_len, bool) or not isinstance(cache_len, (int, np.integer)) or cache_len < 1:
        raise BlockcError(f"cache_len must be a positive integer, got {cache_len!r}")
    if needed > cache_len:
        raise BlockcError(f"a prompt of {longest} tokens and {max_new} new ones need a cache of {needed} positions, "
                          f"over the preallocated cache_len={cache_len}")
    if cache_len > model.cfg.max_positions:
        raise BlockcError(f"cache_len={cache_len} is over the model's maximum of {model.cfg.max_positions} "
                          f"positions (max_positions): the buffer could never be filled")
    return int(cache_len)


def into_cache(present: np.ndarray, cache_len: int) -> np.ndarray:
    """A prefill's keys or values ``[batch, kv_heads, seq, head_dim]`` at the
    start of a zeroed buffer of ``cache_len`` positions."""
    batch, heads, seq, size = present.shape
    buffer = np.zeros((batch, heads, cache_len, size), present.dtype)
    buffer[:, :, :seq] = present
    return buffer
