"""Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer").

Each pair of query/key dimensions ``(a, b)`` at position ``p`` is turned by
the angle ``p * theta_i``, ``theta_i = base ** (-2i / rotary_dim)``::

    a' = a cos(p theta_i) - b sin(p theta_i)
    b' = b cos(p theta_i) + a sin(p theta_i)

so ``q'·k'`` depends on the positions only through their difference. Two
conventions pair the dimensions differently, and a checkpoint is trained for
one of them:

* ``rotate_half`` (Llama, GPT-NeoX, Qwen, Hugging Face's layout): dimension
  ``i`` pairs with ``i + rotary_dim/2``;
* ``interleaved`` (GPT-J, Meta's original Llama checkpoints): dimension
  ``2i`` pairs with ``2i + 1``.

Hugging Face's Llama converter turns the second into the first by permuting
the rows of ``W_q`` and ``W_k`` within each head, so both describe the same
model. With ``rotary_dim`` below the head size only the first ``rotary_dim``
dimensions turn (GPT-J, GPT-NeoX's ``rotary_pct``); the rest pass through.

Both are written as ``x * cos + rotated(x) * sin`` with ``cos``/``sin``
tables of ``[max_positions, rotary_dim]`` (each angle repeated for the two
members of its pair) and ``rotated`` the pair swap with one sign flipped:
``concat(-x2, x1)`` of the two halves, or the same per adjacent pair. The
tables are fixed parameters (made from their formula, never random, like the
sinusoidal table) gathered by the ``position_ids`` input, so a decode step or
a left-padded row rotates by the positions it is given; a graph input that
indexes a table is range-checked on every backend (``ops/limits.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..errors import ModelError, at_user_line
from ..ir.dims import Dim
from .module import Module, Parameter
from .tensor import Tensor, concat, gather

ROPE_FORMS = ("rotate_half", "interleaved")


def rotary_problem(head_dim: int, rotary_dim: int, base: float, form: str = "rotate_half") -> str | None:
    """Why these RoPE settings cannot work, or None. ``rotary_dim`` 0 means
    the whole head. (The config check and the layer both ask this.)"""
    if form not in ROPE_FORMS:
        return f"rope_form must be one of {', '.join(ROPE_FORMS)}, got {form!r}"
    if not rotary_dim and head_dim % 2:
        return (f"the head size {head_dim} is odd, and RoPE turns pairs of dimensions: "
                f"set rotary_dim to an even number below it")
    if rotary_dim < 0 or rotary_dim % 2:
        return f"rotary_dim={rotary_dim} must be a positive even number: RoPE turns pairs of dimensions"
    rd = rotary_dim or head_dim
    if rd > head_dim:
        return f"rotary_dim={rd} is more than the head size {head_dim}"
    if not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 0:
        return f"rope_theta must be a positive finite number (e.g. 10000), got {base!r}"
    return None


def rope_angles(positions: int, rotary_dim: int, base: float) -> np.ndarray:
    """``[positions, rotary_dim/2]``: the angle ``p * base**(-2i/rotary_dim)``, in float64."""
    inv_freq = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    return np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]


def rope_table(shape: tuple, rng=None, *, fn, base: float, interleaved: bool) -> np.ndarray:
    """The ``cos`` (``fn=np.cos``) or ``sin`` table: each angle for both
    members of its pair (``pair_table``)."""
    positions, rotary_dim = shape
    return pair_table(fn(rope_angles(positions, rotary_dim, base)), interleaved, np.concatenate)


def pair_table(values, interleaved: bool, join):
    """``[..., rotary_dim/2]`` values, one per pair, as ``[..., rotary_dim]``:
    each written for both members of its pair, side by side (interleaved) or
    half apart. ``join`` concatenates a list along an axis: ``np.concatenate``
    for arrays, the DSL's ``concat`` for tensors (an ONNX file's caches)."""
    if not interleaved:
        return join([values, values], -1)
    lead, half = list(values.shape[:-1]), values.shape[-1]
    column = values.reshape(lead + [half, 1])
    return join([column, column], -1).reshape(lead + [2 * half])


@dataclass(frozen=True)
class Rotary:
    """The ``cos``/``sin`` rows of some positions, ready to rotate queries
    and keys ``[..., seq, head_dim]``: made once per model by
    ``RotaryEmbedding.angles`` and shared by every layer."""

    cos: Tensor
    sin: Tensor
    rotary_dim: int
    interleaved: bool

    def rotate(self, x: Tensor) -> Tensor:
        rd, head = self.rotary_dim, x.shape[-1]
        if not isinstance(head, int) or head < rd:
            raise ModelError(at_user_line(f"rotary embedding of {rd} dimensions on heads of size {head}"))
        turned, rest = (x, None) if rd == head else x.split([rd, head - rd], -1)
        if self.interleaved:
            pairs = turned.reshape([0] * (x.ndim - 1) + [rd // 2, 2])
            even, odd = pairs.split([1, 1], -1)
            swapped = concat([-odd, even], -1).reshape([0] * (x.ndim - 1) + [rd])
        else:
            first, second = turned.split([rd // 2, rd // 2], -1)
            swapped = concat([-second, first], -1)
        out = turned * self.cos + swapped * self.sin
        return out if rest is None else concat([out, rest], -1)


class RotaryEmbedding(Module):
    """RoPE for heads of ``head_dim``, positions below ``max_positions``.

    ``angles(position_ids)`` gathers the tables once (``position_ids``:
    int64 ``[batch, seq]`` or ``[seq]``); ``Rotary.rotate`` turns a
    ``[batch, heads, seq, head_dim]`` tensor. ``rope(x, position_ids)`` does
    both. ``rotary_dim`` None or 0 turns the whole head; ``interleaved``
    picks the GPT-J pairing (see the module docstring).
    """

    def __init__(self, head_dim: int, max_positions: int, rotary_dim: int | None = None, base: float = 10000.0,
                 interleaved: bool = False):
        super().__init__()
        problem = rotary_problem(head_dim, rotary_dim or 0, base)
        if problem:
            raise ModelError(at_user_line(problem))
        self.rotary_dim, self.base, self.interleaved = rotary_dim or head_dim, float(base), interleaved
        shape = (max_positions, self.rotary_dim)
        # Fixed: the fused op's runtime encodings read one angle per pair (ops/rotary.py), exact only
        # for tables laid out as rope_table makes them; a weights file cannot substitute others.
        self.cos = Parameter(shape, partial(rope_table, fn=np.cos, base=self.base, interleaved=interleaved),
                             fixed=True)
        self.sin = Parameter(shape, partial(rope_table, fn=np.sin, base=self.base, interleaved=interleaved),
                             fixed=True)

    def angles(self, position_ids: Tensor, rows: Dim | None = None) -> Rotary:
        """``rows``: gather from the tables' first ``rows`` only (a generation
        step's ``past+seq``), which bounds ``rows`` by the tables and the ids
        by ``rows`` (``ops/limits.py``)."""
        if position_ids.ndim not in (1, 2):
            raise ModelError(at_user_line(f"position_ids must be [batch, seq] or [seq], got {position_ids}"))
        cos, sin = self.cos, self.sin
        if rows is not None:
            cos, sin = cos.slice(0, 0, rows), sin.slice(0, 0, rows)
        return rotary_rows(cos, sin, position_ids, self.interleaved)

    def forward(self, x: Tensor, position_ids: Tensor) -> Tensor:
        return self.angles(position_ids).rotate(x)


def rotary_rows(cos: Tensor, sin: Tensor, position_ids: Tensor, interleaved: bool) -> Rotary:
    """The rows of tables ``[positions, rotary_dim]`` at ``position_ids``
    (``[batch, seq]`` or ``[seq]``), ready to rotate."""
    rotary_dim = cos.shape[-1]
    cos, sin = gather(cos, position_ids), gather(sin, position_ids)
    if position_ids.ndim == 2:  # [batch, seq, rd] -> [batch, 1, seq, rd]: the same angles for every head
        cos, sin = (t.reshape(0, 1, -1, rotary_dim) for t in (cos, sin))
    return Rotary(cos, sin, rotary_dim, interleaved)
