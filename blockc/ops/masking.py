"""What an attention mask means, said once for every target.

Scores are scaled, then masked: an ``additive`` mask is added, a ``bool``
mask (True where attention is allowed) replaces the scores it forbids by
``fill``, and a causal mask, computed from indices, does the same for the
keys after each query. The causal mask is aligned to the bottom right: query
``i`` of ``rows`` sees key ``j`` of ``cols`` when ``j <= i + (cols - rows)``,
so a block of queries at the end of a KV cache sees the whole past, and a
square mask is the usual lower triangle.

The helpers are written with operators only, so every target calls the same
code on its own values: numpy index grids for the reference, IR dims for the
ONNX and PyTorch graphs (``causal_offset`` of two dims is a dim), and C
expressions for the generated CUDA (``blockc/codegen/cuda/exprs.CExpr``).
"""
from __future__ import annotations

import numpy as np

# Replacing a masked score by float32's lowest value (rather than -inf) keeps a
# fully masked row finite: it averages the values instead of giving NaN.
DEFAULT_FILL = float(np.finfo(np.float32).min)


def causal_offset(rows, cols):
    """``k`` such that query ``i`` sees key ``j`` when ``j <= i + k``: the
    ``diagonal`` of a ``tril`` that draws the causal mask."""
    return cols - rows


def causal_allowed(i, j, rows, cols):
    """Whether query ``i`` (of ``rows``) may attend to key ``j`` (of ``cols``)."""
    return j <= i + causal_offset(rows, cols)


def causal_visible(rows: int, cols: int) -> int:
    """How many of a ``rows x cols`` causal mask's entries are allowed: row
    ``i`` sees ``i + cols - rows + 1`` keys (never more than ``cols``, none
    before the first key), so the count is ``1 + 2 + ... + cols`` less the
    rows cut off above (``cols > rows``: a cache's past) or missing (``rows > cols``)."""
    first = max(1, cols - rows + 1)   # keys the first row that sees any sees
    return cols * (cols + 1) // 2 - (first - 1) * first // 2 if rows > 0 and cols > 0 else 0


def causal_mask_array(rows: int, cols: int) -> np.ndarray:
    """``bool[rows, cols]``: the causal mask as numpy computes it."""
    return causal_allowed(np.arange(rows)[:, None], np.arange(cols)[None, :], rows, cols)


def fill_for(fill: float, lowest: float) -> float:
    """The fill a narrower dtype can hold: float32's lowest in a float16 graph
    would overflow to -inf; the dtype's own lowest masks the same way."""
    return max(fill, lowest)


def apply_masks(s, masks, attrs, *, mul, add, where, fill, causal):
    """Scale and mask the scores ``s`` as ``attrs`` (scale, mask, causal) say,
    with the target's own ``mul(a, b)``, ``add(a, b)``, ``where(c, a, b)``,
    its ``fill`` value and ``causal()``, which makes the causal mask of
    ``s``'s last two dims. ``masks`` holds the one mask input, if any."""
    if attrs["scale"] != 1.0:
        s = mul(s, attrs["scale"])
    if attrs["mask"] == "additive":
        s = add(s, masks[0])
    elif attrs["mask"] == "bool":
        s = where(masks[0], s, fill)
    if attrs["causal"]:
        s = where(causal(), s, fill)
    return s


def guard_rows(out, masks, attrs, *, logical_and, causal, any_key, where, zero):
    """A ``guarded`` attention's output: ``out`` with each query row that has
    no key to attend (its boolean mask all False, or the causal mask leaving
    it none) replaced by ``zero``, as PyTorch's scaled_dot_product_attention
    and ONNX Runtime's attention ops give such a row; unguarded, it is the
    mean of the values (the finite ``fill`` above). ``causal()`` makes the
    causal mask of the scores' last two dims, ``any_key(a)`` reduces a
    boolean ``[..., rows, cols]`` to ``[..., rows, 1]`` with logical or.
    Only boolean masks are guarded: an additive one forbids no key."""
    if not attrs.get("guarded"):
        return out
    allowed = allowed_keys(masks, attrs, logical_and=logical_and, causal=causal)
    return out if allowed is None else where(any_key(allowed), out, zero)


def allowed_keys(masks, attrs, *, logical_and, causal):
    """Which keys each query may attend (the boolean mask and the causal
    mask, with the target's ``logical_and`` and ``causal()``), or None where
    no key is forbidden (an additive mask or none, not causal). The guard
    reads this, never the scores: with a finite fill an allowed key may
    score below the fill, and a row of such keys still has keys."""
    allowed = masks[0] if attrs["mask"] == "bool" else None
    if attrs["causal"]:
        allowed = causal() if allowed is None else logical_and(allowed, causal())
    return allowed
