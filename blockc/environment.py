"""Settings read from the environment, under one rule.

blockc reads a few variables (``BLOCKC_THREADS``, ``BLOCKC_TP_TIMEOUT``,
``BLOCKC_CACHE_MAX``, torchrun's ``MASTER_PORT``). Each is unset or blank for
its default; any other text is parsed, and text that does not parse, or
parses to a value outside the setting's range, is refused by blockc's own
error naming the variable, its text and what it sets: never a bare
``ValueError`` from ``int()``, never a silent default.
"""
from __future__ import annotations

import os
from typing import Callable, TypeVar

from .errors import BlockcError

T = TypeVar("T")


def env_setting(name: str, parse: Callable[[str], T | None], default: T, meaning: str,
                error: type[BlockcError] = BlockcError) -> T:
    """``$name`` parsed, or ``default`` where it is unset or blank. ``parse``
    returns the value, or None (or raises ``ValueError``) for text outside
    the setting; then ``error("NAME='text' is not " + meaning)``. A
    ``BlockcError`` from ``parse`` (its own message) passes through."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = parse(text)
    except (ValueError, OverflowError):
        value = None
    if value is None:
        raise error(f"{name}={text!r} is not {meaning}")
    return value


def positive_int(text: str) -> int | None:
    """A whole number of 1 or more (``int``'s reading: no fractions, no exponents)."""
    value = int(text)
    return value if value >= 1 else None


def positive_float(text: str) -> float | None:
    """A finite number above 0."""
    value = float(text)
    return value if 0 < value < float("inf") else None
