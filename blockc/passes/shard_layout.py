"""How a value is laid out over the ranks of a tensor-parallel group: the
algebra ``passes/shard.py`` propagates through a graph.

A layout is one of:

* ``()``: replicated, every rank holds the whole value;
* a tuple of ``Split(axis, parts, stride)``: the axis is cut into ``parts``
  equal contiguous blocks and rank ``r`` holds block ``(r // stride) % parts``
  (one ``Split(axis, N, 1)`` is the usual case; grouped-query attention with
  fewer K/V heads than ranks splits the heads axis into a K/V-group axis and a
  query-group axis, two ``Split``s whose strides say which rank holds what);
* ``PARTIAL``: every rank holds a summand of the value (the output of a
  row-split projection), made whole by an ``all_reduce``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import numpy as np

PARTIAL = "partial"


@dataclass(frozen=True)
class Split:
    axis: int
    parts: int
    stride: int = 1
    padded: bool = False   # the axis rounded up to a multiple of parts, the last block ending in zeros

    def block(self, rank: int) -> int:
        return (rank // self.stride) % self.parts

    def size(self, whole: int) -> int:
        """One block's length along an axis of ``whole``."""
        return -(-whole // self.parts) if self.padded else whole // self.parts

    def at(self, axis: int) -> "Split":
        """The same split of another axis (the value moved or was reshaped)."""
        return replace(self, axis=axis)


def split_of(layout, axis: int) -> Split | None:
    if layout == PARTIAL:
        return None
    return next((s for s in layout if s.axis == axis), None)


def local_shape(shape, layout) -> tuple:
    """The shape of one rank's block (symbolic dims are never split)."""
    out = list(shape)
    for s in layout if layout != PARTIAL else ():
        out[s.axis] = s.size(shape[s.axis])
    return tuple(out)


def rank_index(shape, layout, rank: int) -> tuple:
    """The index (a tuple of slices) of rank ``rank``'s block of a value of
    ``shape``: what a rank reads of a weight (``safetensors``' ``get_slice``
    takes it as it is, so a rank never reads the whole tensor)."""
    index = [slice(None)] * len(shape)
    for s in layout:
        size = s.size(shape[s.axis])
        index[s.axis] = slice(min(s.block(rank) * size, shape[s.axis]), min((s.block(rank) + 1) * size,
                                                                           shape[s.axis]))
    return tuple(index)


def padded_block(part: np.ndarray, shape, layout) -> np.ndarray:
    """A block read with ``rank_index``, zero-padded to its full length (the
    last blocks of a padded split hold fewer rows, or none)."""
    want = local_shape(tuple(shape), layout)
    if part.shape == want:
        return part
    return np.pad(part, [(0, w - h) for h, w in zip(part.shape, want)])


def reshape_groups(src: tuple, dst: tuple) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of ``src`` axes with runs of ``dst`` axes of equal product
    (symbolic dims must pair one to one); None where they do not pair so."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        # an axis of one beside a symbolic dim (or past the end) pairs with nothing
        if j < len(dst) and dst[j] == 1 and (i >= len(src) or not isinstance(src[i], int)):
            groups.append(([], [j]))
            j += 1
            continue
        if i < len(src) and src[i] == 1 and (j >= len(dst) or not isinstance(dst[j], int)):
            groups.append(([i], []))
            i += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        if i < len(src) and j < len(dst) and not (isinstance(src[i], int) and isinstance(dst[j], int)):
            if src[i] != dst[j]:
                return None
            groups.append(([i], [j]))
            i, j = i + 1, j + 1
            continue
        a, b = [i], [j]
        pa, pb = src[i], dst[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(src) and isinstance(src[i], int):
                pa *= src[i]
                a.append(i)
                i += 1
            elif pb < pa and j < len(dst) and isinstance(dst[j], int):
                pb *= dst[j]
                b.append(j)
                j += 1
            else:
                return None
        groups.append((a, b))
    return groups


def reshape_layout(src: tuple, dst: tuple, layout) -> tuple | str:
    """The layout of ``reshape(x, dst)`` for ``x`` of shape ``src`` laid out
    so, or the reason none keeps each rank's block a block of the output."""
    if not layout:
        return ()
    if any(s.padded for s in layout):
        return "a padded vocabulary split cannot be reshaped"
    groups = reshape_groups(src, dst)
    if groups is None:
        return f"cannot pair the axes of {list(src)} and {list(dst)}"
    out = []
    for a, b in groups:
        splits = [s for s in layout if s.axis in a]
        if not splits:
            continue
        if len(a) == 1 and len(b) == 1:
            out.append(splits[0].at(b[0]))
        elif len(a) == 1:
            made = _factor(splits[0], [dst[k] for k in b], b, last=len(dst) - 1)
            if isinstance(made, str):
                return made
            out += made
        elif len(b) == 1:
            made = _merge(splits, [src[k] for k in a], a, b[0])
            if isinstance(made, str):
                return made
            out.append(made)
        else:
            return f"a split axis of {list(src)} is regrouped into {list(dst)}"
    return tuple(out)


def _factor(s: Split, sizes: list[int], axes: list[int], last: int) -> list[Split] | str:
    """One split axis cut into factors, outermost first: the outer factors
    absorb the split. It must never reach the output's last axis: cutting an
    axis into (heads, features) puts a head's features last, and splitting
    those would turn attention into partial sums."""
    left, stride, out = s.parts, s.stride, []
    for size, axis in zip(sizes, axes):
        if left == 1:
            break
        if size == 1:
            continue
        if axis == last:
            return "the split would cut each head's features"
        if size % left == 0:
            out.append(Split(axis, left, stride))
            left = 1
        elif left % size == 0:
            out.append(Split(axis, size, stride * (left // size)))
            left //= size
        else:
            return f"{size} heads do not divide among {left} ranks"
    if left != 1:
        return f"{sizes} do not divide among {s.parts} ranks"
    return out


def _merge(splits: list[Split], sizes: list[int], axes: list[int], into: int) -> Split | str:
    """Several axes merged into one: the blocks stay contiguous where every
    axis outside the innermost split one is cut down to single rows, and the
    ranks walk the blocks in order (strides nest)."""
    by_axis = {s.axis: s for s in splits}
    inner = max(by_axis)
    for axis, size in zip(axes, sizes):
        if axis < inner and size // (by_axis[axis].parts if axis in by_axis else 1) != 1:
            return "merging would make a rank's block discontiguous"
    stride = min(s.stride for s in splits)
    for axis in sorted(by_axis, reverse=True):
        if by_axis[axis].stride != stride:
            return "the merged axes' ranks do not nest"
        stride *= by_axis[axis].parts
    parts = prod(s.parts for s in splits)
    return Split(into, parts, min(s.stride for s in splits))
