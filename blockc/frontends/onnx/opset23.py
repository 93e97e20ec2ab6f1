"""Import rules for the fused operators of ai.onnx opset 23: ``Attention``,
``RMSNormalization`` and ``RotaryEmbedding``.

Each is replayed through what the built-in models are traced from
(``layers.grouped_attention``, the ``rmsnorm`` op, ``rotary.Rotary``), so the
imported graph is in the standard form like any traced one, and the fusion
passes make ``attention`` / ``add_rmsnorm`` / ``rotary`` of it again: the
inverse of the ``onnx23`` export encodings (``blockc/ops/fused_onnx.py``,
``blockc/ops/rotary.py``). What this file adds is only where ONNX's meaning
differs from blockc's, said at the place it is bridged:

* Attention's causal mask is aligned at ``past_key``'s length (query ``i``
  sees key ``j <= i + past``); blockc's at the end (``j <= i + cols - rows``,
  ``ops/masking.py``). They agree when the new keys are as many as the
  queries; otherwise the ONNX mask is drawn as an explicit one.
* Attention gives a zero row where a query's every key is masked; blockc's
  attention averages V there (a boolean mask) or gives NaN (an additive
  ``-inf`` one). Where such a row can occur, the output is zeroed by a guard.
* RotaryEmbedding's caches hold one angle per pair ``[positions, rd/2]``;
  blockc's tables hold it for both members (``rotary.pair_table``).

An attribute or input blockc cannot express (``softcap``, the
``qk_matmul_output`` output, a ``softmax_precision`` other than the inputs'
type, opset 24's ``nonpad_kv_seqlen``, opset 25's sliding windows) is
refused by name.
"""
from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ops.masking import causal_allowed, causal_mask_array
from ..layers import grouped_attention, join_heads, split_heads
from ..rotary import Rotary, pair_table, rotary_rows
from ..tensor import apply, causal_mask, concat, where
from .convert import MOVES, Rule, Unsupported, _attr, _known, axis_of, is_tensor, normalize_from, tensor

OPSET = 23


def _static(*dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def _require(node, ins, names: tuple[str, ...]) -> None:
    """Refuse a node whose required inputs are not all given."""
    for i, name in enumerate(names):
        if i >= len(ins) or ins[i] is None:
            raise Unsupported(f"{node.op_type} without its input {name}")


# ---- Attention ---------------------------------------------------------------------
def _refuse_unsupported_attention(node, ins, ctx, dtype: DType) -> None:
    if len(ins) > 6 and ins[6] is not None:
        raise Unsupported("Attention with nonpad_kv_seqlen (opset 24's external KV cache lengths)")
    for side in ("left_window_size", "right_window_size"):
        if _attr(node, side, -1) != -1:
            raise Unsupported(f"Attention with {side}={_attr(node, side)}: blockc's attention has no sliding window")
    softcap = _attr(node, "softcap", 0.0)
    if softcap:
        raise Unsupported(f"Attention with softcap={softcap:g}: blockc's attention has no soft cap")
    if len(node.output) > 3 and node.output[3] and ctx.used(node.output[3]):
        raise Unsupported(f"Attention's qk_matmul_output (qk_matmul_output_mode="
                          f"{_attr(node, 'qk_matmul_output_mode', 0)}): blockc's attention does not expose its scores")
    scale = _attr(node, "scale")
    if scale is not None and scale <= 0:   # ONNX Runtime refuses such a file; q and k are scaled by its root
        raise Unsupported(f"attribute scale {scale:g} is not above 0 (ONNX takes a scale greater than 0)")
    precision = _attr(node, "softmax_precision")
    if precision is not None and precision != dtype.onnx_code:
        raise Unsupported(f"Attention with softmax_precision={precision}: blockc's softmax runs in the "
                          f"inputs' {dtype.name}")
    if (len(ins) > 4 and ins[4] is not None) != (len(ins) > 5 and ins[5] is not None):
        raise Unsupported("Attention with only one of past_key and past_value")


def _heads_of(x, heads, name: str):
    """A 3-D ``[batch, seq, heads*size]`` input as ``[batch, heads, seq, size]``."""
    if not heads:
        raise Unsupported(f"Attention on 3-D inputs without {name}")
    hidden = x.shape[2]
    if not isinstance(hidden, int) or hidden % heads:
        raise Unsupported(f"Attention's {name}={heads} does not divide the hidden size {hidden}")
    return split_heads(x, heads, hidden // heads)


def _padded(mask, total):
    """A mask whose last axis is shorter than the keys, padded as ONNX
    pads it: the keys after it are masked (False, or -inf added)."""
    width = mask.shape[-1]
    if not _static(width, total) or width >= total:
        return mask
    fill = np.array(False) if _is_bool(mask) else np.array(-np.inf, _numpy_dtype(mask))
    shape = list(mask.shape[:-1]) + [total - width]
    if not is_tensor(mask):
        return np.concatenate([mask, np.broadcast_to(fill, shape)], -1)
    return concat([mask, apply("expand", tensor(fill), shape=shape)], -1)


def _numpy_dtype(v):
    return v.dtype.numpy if is_tensor(v) else np.asarray(v).dtype


def _is_bool(v) -> bool:
    return v.dtype == DType.bool if is_tensor(v) else np.asarray(v).dtype == np.bool_


def _with_causal(mask, allowed: np.ndarray):
    """``mask`` (None, boolean or additive) with the keys ``allowed`` (a
    known boolean array) does not hold masked, as ONNX composes them."""
    if mask is None:
        return allowed
    if _is_bool(mask):
        return np.logical_and(mask, allowed) if not is_tensor(mask) else apply("logical_and", mask, tensor(allowed))
    neg = np.array(-np.inf, _numpy_dtype(mask))
    return np.where(allowed, mask, neg) if not is_tensor(mask) else where(tensor(allowed), mask, tensor(neg))


def _finite(value) -> bool:
    """Whether every element of ``value`` is one of some finite constants, moved
    or picked by ``where`` (a bias made from a boolean mask, as blockc's
    exports make it): no key of such an additive mask is masked out entirely."""
    p = value.producer
    if p is not None and p.op == "constant":
        return bool(np.isfinite(p.attrs["value"]).all())
    if p is not None and p.op == "where":
        return all(_finite(x) for x in p.inputs[1:])
    return p is not None and p.op in MOVES and _finite(p.inputs[0])


def _rows_seeing_keys(mask, causal: bool, rows, cols):
    """Which query rows have a key left to attend (``[..., rows, 1]``), where
    a row with none can occur; None where every row has one. The causal mask
    alone always leaves a row its first key, so only a mask input can empty one."""
    if mask is None or (is_tensor(mask) and not _is_bool(mask) and _finite(mask.value)):
        return None
    if not is_tensor(mask):
        allowed = _known(mask) if _is_bool(mask) else ~np.isneginf(_known(mask))
        if causal and not _static(rows, cols):
            mask = tensor(mask)   # a known mask beside symbolic query and key lengths: decided at run time
        else:
            if causal:
                allowed = np.logical_and(allowed, causal_mask_array(rows, cols))
            seen = allowed.any(axis=-1, keepdims=True)
            return None if seen.all() else seen
    allowed = mask if _is_bool(mask) else apply("logical_not", apply("equal", mask, tensor(np.array(-np.inf), mask)))
    if causal:
        allowed = apply("logical_and", allowed, causal_mask(rows, cols))
    return allowed.cast(DType.float32).max(-1).cast(DType.bool)


def _attention(node, ins, ctx):
    _require(node, ins, ("Q", "K", "V"))
    q, k, v = (tensor(t) for t in ins[:3])
    _refuse_unsupported_attention(node, ins, ctx, q.dtype)
    mask, past_key, past_value = (list(ins[3:6]) + [None] * 3)[:3]
    if mask is not None and not _is_bool(mask) and np.dtype(_numpy_dtype(mask)) != np.dtype(q.dtype.numpy):
        raise Unsupported(f"Attention's attn_mask is {np.dtype(_numpy_dtype(mask))}: ONNX takes a bool mask or "
                          f"one of the inputs' {q.dtype.name}")
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise Unsupported(f"Attention on q, k, v of ranks {q.ndim}, {k.ndim}, {v.ndim} (ONNX takes all 3-D or all 4-D)")
    three_d = q.ndim == 3
    if three_d:
        q = _heads_of(q, _attr(node, "q_num_heads"), "q_num_heads")
        k = _heads_of(k, _attr(node, "kv_num_heads"), "kv_num_heads")
        v = _heads_of(v, _attr(node, "kv_num_heads"), "kv_num_heads")
    rows, new_keys = q.shape[2], k.shape[2]
    if past_key is not None:
        k, v = concat([tensor(past_key, k), k], 2), concat([tensor(past_value, v), v], 2)
    cols = k.shape[2]
    causal = bool(_attr(node, "is_causal", 0))
    if mask is not None:
        mask = _padded(mask, cols)
    if causal and rows != new_keys:
        # ONNX's frontier is at past_key's length: blockc's causal_allowed with
        # the query block placed right after the past (cols = rows + past)
        if not _static(rows, cols, new_keys):
            raise Unsupported(f"Attention with is_causal over {rows} queries and {new_keys} new keys: "
                              f"ONNX aligns its causal mask at past_key's length, blockc at the end, and "
                              f"the lengths must be known to draw ONNX's")
        past = cols - new_keys
        allowed = causal_allowed(np.arange(rows)[:, None], np.arange(cols)[None, :], rows, rows + past)
        mask, causal = _with_causal(mask, allowed), False
    seen = _rows_seeing_keys(mask, causal, rows, cols)
    y = grouped_attention(q, k, v, None if mask is None else tensor(mask, q), causal, _attr(node, "scale"))
    if seen is not None:   # ONNX's zero row where every key is masked
        y = where(tensor(seen), y, tensor(np.zeros((), y.dtype.numpy)))
    return [join_heads(y) if three_d else y, k, v]


# ---- RMSNormalization --------------------------------------------------------------
def _rms_normalization(node, ins, ctx):
    _require(node, ins, ("X", "scale"))
    x, scale = tensor(ins[0]), ins[1]
    stash = _attr(node, "stash_type", 1)
    if stash != DType.float32.onnx_code:
        raise Unsupported(f"RMSNormalization with stash_type={stash} (ONNX defines it for float32, 1)")
    return [normalize_from(axis_of(node, x.ndim), "rmsnorm", x, [scale], eps=float(_attr(node, "epsilon", 1e-5)))]


# ---- RotaryEmbedding ---------------------------------------------------------------
def _rotary_embedding(node, ins, ctx):
    _require(node, ins, ("X", "cos_cache", "sin_cache"))
    x = tensor(ins[0])
    cos, sin = ins[1], ins[2]
    positions = ins[3] if len(ins) > 3 else None
    interleaved = bool(_attr(node, "interleaved", 0))
    if x.ndim == 3:
        heads = _attr(node, "num_heads", 0)
        hidden = x.shape[2]
        if not heads or not isinstance(hidden, int) or hidden % heads:
            raise Unsupported(f"RotaryEmbedding of a 3-D input needs num_heads dividing its {hidden} "
                              f"(num_heads={heads})")
        turned = split_heads(x, heads, hidden // heads)
    elif x.ndim == 4:
        turned = x
    else:
        raise Unsupported(f"RotaryEmbedding of a rank-{x.ndim} input (ONNX takes 3-D or 4-D)")
    rd = _attr(node, "rotary_embedding_dim", 0) or turned.shape[3]
    half = cos.shape[-1] if is_tensor(cos) else np.shape(cos)[-1]
    if 2 * half != rd:
        raise Unsupported(f"RotaryEmbedding's caches hold {half} angles per row for rotary_embedding_dim {rd} "
                          f"(ONNX wants rotary_embedding_dim/2)")
    cos, sin = (tensor(pair_table(t, interleaved, concat if is_tensor(t) else np.concatenate), x) for t in (cos, sin))
    if positions is not None:
        rotary = rotary_rows(cos, sin, tensor(positions), interleaved)
    elif cos.ndim == 3:   # no position ids: the caches are this batch's rows, [batch, seq, rd/2]
        rotary = Rotary(*(t.reshape(0, 1, -1, rd) for t in (cos, sin)), rd, interleaved)
    else:
        raise Unsupported(f"RotaryEmbedding without position_ids takes caches [batch, seq, rd/2], got {cos.shape}")
    y = rotary.rotate(turned)
    return [join_heads(y) if x.ndim == 3 else y]


RULES = {
    "Attention": Rule(_attention, since=OPSET),
    "RMSNormalization": Rule(_rms_normalization, since=OPSET),
    "RotaryEmbedding": Rule(_rotary_embedding, since=OPSET),
}
