"""Import rules for ONNX Runtime's ``com.microsoft`` fused operators: the
ones blockc's ``contrib`` encoding writes (``blockc/ops/fused_onnx.py``,
``ops/rotary.py``, ``ops/kv_cache.py``), so that every file blockc writes
imports back.

As ``opset23.py`` does, each op is replayed through what the models are
traced from (``layers.grouped_attention``, ``layernorm``/``rmsnorm``,
``gelu``, ``rotary.Rotary``): the imported graph is in the standard form, and
the fusion passes make the same fused op of it again. What differs from
blockc's meaning is bridged here, where it is met:

* ``scale=0`` on the attention ops means ``1/sqrt(head_size)``;
* ``MultiHeadAttention``'s and ``Attention``'s ``unidirectional`` mask is
  aligned at the top left, blockc's causal mask at the bottom right: the
  same only where there are as many keys as queries (otherwise refused);
* their ``key_padding_mask`` / 2-D ``mask_index`` adds ``mask_filter_value``
  to the masked keys: a boolean mask where that swamps every score
  (``MASK_BIAS`` or below, as blockc writes it), else that additive bias;
* ``GroupQueryAttention`` is causal after its past and reads every row's key
  count off ``seqlens_k``: blockc's attention takes one count for all rows,
  so ``seqlens_k`` must be ``total_sequence_length - 1`` (what blockc
  writes), or ONNX Runtime GenAI's ``ReduceSum(attention_mask) - 1``, read
  as the mask's width less one: a mask of 1s (the input is sampled so, and
  ``generate`` refuses padded prompts to such a file). A past longer than
  ``total - seq`` rows is a cache buffer, which the step writes its rows
  into (``cache_write``); a past of 0 rows is a prefill. Query, key and
  value may come packed in ``query`` (GenAI's), and ``do_rotary`` turns
  queries and keys at positions ``[total - seq, total)`` with the
  ``cos_cache``/``sin_cache`` rows there;
* ``SimplifiedLayerNormalization`` is ONNX Runtime's, registered in the
  ONNX domain (``ONNX_DOMAIN_RULES``).

An attribute or input these do not express (a packed QKV weight of
``Attention`` with a past, explicit ``position_ids`` or a ``head_sink`` of
GroupQueryAttention, local windows, soft caps, a 3-D ``mask_index``, the
training outputs of the skip norms) is refused by name.
"""
from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ops.activations import ACTIVATIONS
from ...ops.fused_onnx import MASK_BIAS
from ...ops.masking import causal_offset
from ..layers import grouped_attention, join_heads, split_heads
from ..rotary import pair_table, rotary_rows
from ..tensor import apply, cache_write, concat, where
from .convert import (MOVES, Rule, Unsupported, _attr, axis_of, dims_of, input_at, is_tensor, normalize_from,
                      tensor)
from .opset23 import _require, _rotary_embedding

DOMAIN = "com.microsoft"
VERSION = 1   # the domain's one opset: a rule is read at it alone


def _refuse_attrs(node, defaults: dict) -> None:
    """Refuse each attribute set to other than its default (one blockc cannot express)."""
    for name, default in defaults.items():
        value = _attr(node, name, default)
        if value != default:
            raise Unsupported(f"{node.op_type} with {name}={value}: blockc's op has no such mode")


def _refuse_inputs(node, ins, names: dict[int, str]) -> None:
    for i, name in names.items():
        if input_at(ins, i) is not None:
            raise Unsupported(f"{node.op_type} with its input {name}")


def _refuse_outputs(node, ctx, names: dict[int, str]) -> None:
    for i, name in names.items():
        if len(node.output) > i and node.output[i] and ctx.used(node.output[i]):
            raise Unsupported(f"{node.op_type}'s output {name} (blockc's op does not compute it)")


# ---- the skip norms and the biased GELUs ------------------------------------------
def _skip_norm(ir_op: str, params: int):
    """SkipLayerNormalization (gamma, beta) / SkipSimplifiedLayerNormalization (gamma):
    ``norm(input + skip + bias)``, and that sum as the fourth output."""
    def run(node, ins, ctx):
        _require(node, ins, ("input", "skip", "gamma"))
        _refuse_outputs(node, ctx, {1: "mean", 2: "inv_std_var"})
        x = tensor(ins[0])
        total = x + tensor(ins[1], x)
        bias = input_at(ins, 1 + params + 1)
        if bias is not None:
            total = total + tensor(bias, x)
        norm_params = [p for p in ins[2:2 + params] if p is not None]
        if len(norm_params) < params:   # no beta: a zero bias of the hidden size
            norm_params.append(np.zeros(x.shape[-1:], x.dtype.numpy))
        y = normalize_from(x.ndim - 1, ir_op, total, norm_params, eps=float(_attr(node, "epsilon", 1e-12)))
        return [y, None, None, total]
    return Rule(run, since=VERSION, until=VERSION)


def _bias_activation(act):
    """``act``'s com.microsoft op (BiasGelu, FastGelu): ``act(x + bias)``, its
    row in ``ops/activations.py`` the one place that names the op."""
    def run(node, ins, ctx):
        x = tensor(ins[0])
        if input_at(ins, 1) is not None:
            x = x + tensor(ins[1], x)
        return [apply(act.op, x, **act.attrs)]
    return Rule(run, since=VERSION, until=VERSION)


# ---- rotary --------------------------------------------------------------------------
def _rotary(node, ins, ctx):
    _require(node, ins, ("input", "position_ids", "cos_cache", "sin_cache"))
    _refuse_attrs(node, {"scale": 1.0, "is_packed_batching": 0})
    positions = ins[1]
    rank = positions.ndim if is_tensor(positions) else np.ndim(positions)
    if rank != 2:
        raise Unsupported(f"RotaryEmbedding with rank-{rank} position_ids (blockc takes them [batch, seq])")
    return _rotary_embedding(node, [ins[0], ins[2], ins[3], positions], ctx)   # ai.onnx's input order


# ---- attention -----------------------------------------------------------------------
def _scale(node):
    """The scores' scale: ``scale``, where 0 (the default) means 1/sqrt(head_size)."""
    return _attr(node, "scale", 0.0) or None


def _heads(x, heads: int, name: str, node):
    """A packed ``[batch, seq, heads*size]`` input as ``[batch, heads, seq, size]``."""
    x = tensor(x)
    if x.ndim == 4:
        return x
    hidden = x.shape[-1]
    if x.ndim != 3 or not heads or not isinstance(hidden, int) or hidden % heads:
        raise Unsupported(f"{node.op_type}'s {name} {list(x.shape)} is not [batch, seq, {heads} heads * size]")
    return split_heads(x, heads, hidden // heads)


def _padding_mask(node, mask, like):
    """A 2-D key padding mask ([batch, keys], nonzero: attend) as a mask over
    the scores: boolean where ``mask_filter_value`` swamps every score, else
    that value added to the masked keys."""
    mask = tensor(mask)
    if mask.ndim != 2:
        raise Unsupported(f"{node.op_type} with a rank-{mask.ndim} mask_index (blockc reads a [batch, keys] one)")
    keep = apply("logical_not", apply("equal", mask, tensor(np.zeros((), mask.dtype.numpy)))).reshape(0, 1, 1, -1)
    fill = float(_attr(node, "mask_filter_value", -10000.0))
    if fill <= MASK_BIAS:
        return keep
    zero, filled = (tensor(np.array(v, like.dtype.numpy)) for v in (0.0, fill))
    return where(keep, zero, filled)


def _causal_top_left(node, q, k) -> bool:
    """``unidirectional``, which blockc's causal flag means only for as many keys as queries."""
    if not _attr(node, "unidirectional", 0):
        return False
    if causal_offset(q.shape[2], k.shape[2]) != 0:   # the two alignments agree only at offset 0
        raise Unsupported(f"{node.op_type} with unidirectional=1 over {q.shape[2]} queries and {k.shape[2]} keys: "
                          f"its causal mask is aligned at the first key, blockc's at the last")
    return True


def _masks(node, ins, padding: int, bias: int, like):
    """The node's key padding mask and its attention_bias, combined as one mask (None: neither)."""
    mask = _padding_mask(node, ins[padding], like) if input_at(ins, padding) is not None else None
    if input_at(ins, bias) is None:
        return mask
    additive = tensor(ins[bias], like)
    if mask is not None and mask.dtype == DType.bool:   # added to the bias as the op adds it
        mask = where(mask, *(tensor(np.array(v, like.dtype.numpy)) for v in (0.0, MASK_BIAS)))
    return additive if mask is None else additive + mask


def _multi_head_attention(node, ins, ctx):
    _require(node, ins, ("query", "key", "value"))
    _refuse_inputs(node, ins, {3: "bias", 6: "past_key", 7: "past_value"})
    _refuse_outputs(node, ctx, {1: "present_key", 2: "present_value"})
    heads = _attr(node, "num_heads", 0)
    q = _heads(ins[0], heads, "query", node)
    k, v = (_heads(x, heads, name, node) for x, name in ((ins[1], "key"), (ins[2], "value")))
    causal = _causal_top_left(node, q, k)
    y = grouped_attention(q, k, v, _masks(node, ins, 4, 5, q), causal, _scale(node))
    return [join_heads(y)]


def _qkv_attention(node, ins, ctx):
    """com.microsoft.Attention: the packed projection, then multi-head attention."""
    _require(node, ins, ("input", "weights"))
    _refuse_inputs(node, ins, {4: "past", 6: "past_sequence_length"})
    _refuse_outputs(node, ctx, {1: "present"})
    _refuse_attrs(node, {"do_rotary": 0, "past_present_share_buffer": 0})
    heads = _attr(node, "num_heads", 0)
    x = tensor(ins[0])
    y = apply("matmul", x, tensor(ins[1], x))
    if input_at(ins, 2) is not None:
        y = y + tensor(ins[2], x)
    width = y.shape[-1]
    sizes = list(_attr(node, "qkv_hidden_sizes", []) or ([width // 3] * 3 if isinstance(width, int) else []))
    if len(sizes) != 3 or sum(sizes) != width:
        raise Unsupported(f"Attention's weights give {width} columns, not q, k, v of qkv_hidden_sizes {sizes}")
    q, k, v = (_heads(t, heads, name, node) for t, name in zip(y.split(sizes, axis=-1), ("q", "k", "v")))
    causal = _causal_top_left(node, q, k)
    return [join_heads(grouped_attention(q, k, v, _masks(node, ins, 3, 5, q), causal, _scale(node)))]


def _dim_of(v, node, name: str):
    """A dim the file computes from the graph's dims (a known scalar, or a
    tensor moved or cast from one, ``MOVES``): blockc needs it when the
    graph is built."""
    while is_tensor(v):
        producer = v.value.producer
        if producer is None or producer.op not in (*MOVES, "dim_value", "constant"):
            break
        if producer.op == "dim_value":
            return producer.attrs["value"]
        if producer.op == "constant":
            v = producer.attrs["value"]
            break
        v = type(v)(producer.inputs[0])
    if is_tensor(v):
        raise Unsupported(f"GroupQueryAttention's {name} is computed at run time (blockc needs it known)")
    values = set(dims_of(v))
    if len(values) != 1:
        raise Unsupported(f"GroupQueryAttention with {name} differing between rows: blockc's attention takes "
                          f"one key count for every row")
    return values.pop()


def _through_moves(value):
    """The node that made ``value``, past any ``MOVES`` (a cast to int32)."""
    producer = value.producer
    while producer is not None and producer.op in MOVES:
        producer = producer.inputs[0].producer
    return producer


def _mask_keys_last(v):
    """``seqlens_k`` written as ONNX Runtime GenAI writes it, ``ReduceSum(attention_mask, 1) - 1``:
    the mask's last key, its width less one, where the mask holds no zero (blockc's
    attention takes one key count for every row; ``generate`` feeds such masks).
    None where ``v`` is not so made."""
    sub = _through_moves(v.value) if is_tensor(v) else None
    if sub is None or sub.op != "sub":
        return None
    one, total = _through_moves(sub.inputs[1]), _through_moves(sub.inputs[0])
    if one is None or one.op != "constant" or np.asarray(one.attrs["value"]).tolist() not in (1, [1]):
        return None
    if total is None or total.op != "reduce_sum" or total.attrs.get("keepdims"):
        return None
    mask = total.inputs[0]
    if len(mask.shape) != 2 or [a % 2 for a in total.attrs["axes"]] != [1]:
        return None
    return mask.shape[1] - 1


def _key_count(node, ins):
    """``(total, seqlens_k)`` as dims: both known, or ``seqlens_k`` made from the mask (``_mask_keys_last``)."""
    total = _dim_of(ins[6], node, "total_sequence_length")
    last = _mask_keys_last(ins[5])
    return total, (last if last is not None else _dim_of(ins[5], node, "seqlens_k"))


def _packed_qkv(node, ins, heads: int, kv_heads: int):
    """query, key, value ``[batch, heads, seq, size]``: given apart, or packed in
    ``query`` as ``[batch, seq, (num_heads + 2 * kv_num_heads) * size]`` (key and value left out)."""
    q = tensor(ins[0])
    given = [input_at(ins, i) is not None for i in (1, 2)]
    if all(given):
        return (_heads(q, heads, "query", node),
                *(_heads(x, kv_heads, name, node) for x, name in ((ins[1], "key"), (ins[2], "value"))))
    if any(given):
        raise Unsupported("GroupQueryAttention with only one of key and value")
    width, parts = q.shape[-1], heads + 2 * kv_heads
    if q.ndim != 3 or not isinstance(width, int) or not heads or not kv_heads or width % parts:
        raise Unsupported(f"GroupQueryAttention's packed query {list(q.shape)} is not "
                          f"[batch, seq, ({heads} + 2 * {kv_heads}) heads * size]")
    size = width // parts
    packed = q.split([heads * size, kv_heads * size, kv_heads * size], axis=-1)
    return tuple(split_heads(x, n, size) for x, n in zip(packed, (heads, kv_heads, kv_heads)))


def _gqa_rotary(node, ins, total, seq):
    """``do_rotary``: each query and key turned at its position, the last ``seq``
    of ``total`` (the positions GroupQueryAttention derives from ``seqlens_k``):
    the caches' rows ``[total - seq, total)``, which bounds ``total`` by them."""
    if input_at(ins, 7) is None or input_at(ins, 8) is None:
        raise Unsupported("GroupQueryAttention with do_rotary=1 and no cos_cache and sin_cache")
    interleaved = bool(_attr(node, "rotary_interleaved", 0))
    cos, sin = (tensor(pair_table(tensor(t), interleaved, concat)).slice(0, total - seq, total)
                for t in (ins[7], ins[8]))
    return rotary_rows(cos, sin, apply("arange", n=seq), interleaved)


def _group_query_attention(node, ins, ctx):
    _require(node, ins, ("query",))
    if len(ins) < 7 or ins[5] is None or ins[6] is None:
        raise Unsupported("GroupQueryAttention without seqlens_k and total_sequence_length")
    _refuse_inputs(node, ins, {9: "position_ids", 11: "head_sink"})
    _refuse_attrs(node, {"local_window_size": -1, "softcap": 0.0, "smooth_softmax": 0, "qk_output": 0})
    heads, kv_heads = _attr(node, "num_heads", 0), _attr(node, "kv_num_heads", 0)
    q, k, v = _packed_qkv(node, ins, heads, kv_heads)
    seq = q.shape[2]
    total, last = _key_count(node, ins)
    if last != total - 1:
        raise Unsupported(f"GroupQueryAttention with seqlens_k {last}, not total_sequence_length - 1 = {total - 1}")
    if _attr(node, "do_rotary", 0):
        rotary = _gqa_rotary(node, ins, total, seq)
        q, k = rotary.rotate(q), rotary.rotate(k)
    elif input_at(ins, 7) is not None or input_at(ins, 8) is not None:
        raise Unsupported("GroupQueryAttention with cos_cache and sin_cache but do_rotary=0")
    past = input_at(ins, 3)
    if (past is None) != (input_at(ins, 4) is None):
        raise Unsupported("GroupQueryAttention with only one of past_key and past_value")
    if past is None:
        if total != seq:
            raise Unsupported(f"GroupQueryAttention without a past over {seq} rows and {total} in all")
        present = (k, v)
    elif tensor(past).shape[2] == total - seq:
        present = tuple(concat([tensor(p, x), x], 2) for p, x in ((past, k), (ins[4], v)))
    else:   # a cache buffer: the step's rows written at [total - seq, total), the first total rows read
        present = tuple(cache_write(tensor(p, x), x, 2, total - seq) for p, x in ((past, k), (ins[4], v)))
    keys = present if past is None or present[0].shape[2] == total else tuple(p.slice(2, 0, total) for p in present)
    mask = tensor(ins[10], q) if input_at(ins, 10) is not None else None
    y = grouped_attention(q, *keys, mask, True, _scale(node))
    return [join_heads(y), *present]


# ---- ONNX Runtime's own ops in the ONNX domain -------------------------------------
def _simplified_layer_norm(node, ins, ctx):
    """SimplifiedLayerNormalization (ONNX Runtime registers it in the ONNX domain, since 1):
    RMS normalization over the axes from ``axis`` on, times ``scale``."""
    _require(node, ins, ("X", "scale"))
    _refuse_outputs(node, ctx, {1: "inv_std_var"})
    x = tensor(ins[0])
    stash = _attr(node, "stash_type", 1)
    if stash != DType.float32.onnx_code:
        raise Unsupported(f"SimplifiedLayerNormalization with stash_type={stash} (blockc computes in float32, 1)")
    y = normalize_from(axis_of(node, x.ndim), "rmsnorm", x, [ins[1]], eps=float(_attr(node, "epsilon", 1e-5)))
    return [y, None]


# ONNX Runtime's ops registered in the ONNX domain (at every opset), beside ai.onnx's own
ONNX_DOMAIN_RULES = {
    "SimplifiedLayerNormalization": Rule(_simplified_layer_norm),
}


RULES = {
    "SkipLayerNormalization": _skip_norm("layernorm", 2),
    "SkipSimplifiedLayerNormalization": _skip_norm("rmsnorm", 1),
    **{act.contrib: _bias_activation(act) for act in ACTIVATIONS.values() if act.contrib},
    "RotaryEmbedding": Rule(_rotary, since=VERSION, until=VERSION),
    "MultiHeadAttention": Rule(_multi_head_attention, since=VERSION, until=VERSION),
    "Attention": Rule(_qkv_attention, since=VERSION, until=VERSION),
    "GroupQueryAttention": Rule(_group_query_attention, since=VERSION, until=VERSION),
}
