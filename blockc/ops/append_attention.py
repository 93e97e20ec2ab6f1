"""``append_attention``: an exporter's cache step as one op. The step's keys
and values are appended to the past (``concat`` along the rows, a present
one step longer, as torch.onnx and Optimum write a with-past decoder), and
the step's queries attend over the present::

    %20:f32[b,h,past+seq,d] = concat %"past_key_values.0.key", %17 {axis=2}
    %21:f32[b,h,past+seq,d] = concat %"past_key_values.0.value", %19 {axis=2}
    %22:f32[b,h,seq,d]      = attention %15, %20, %21, %4 {..., guarded=true}

is ``%22, %20, %21 = append_attention %15, %17, %19, %past_k, %past_v, %4``
(``passes/fuse_cache_attention.py``). Unlike ``cache_attention`` (a buffer
written in place) the present is a new tensor each step; what fusing it
buys is ONNX Runtime's attention ops taking the past themselves:
``com.microsoft.MultiHeadAttention`` (``contrib``) and opset-23
``Attention`` (``onnx23``) read ``past_key``/``past_value`` and return the
concatenated ``present_key``/``present_value``, so the step is one op and
no separate Concat per cache.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.types import TensorType
from .fused import ATTENTION_ATTRS, attention, attention_attrs, attention_flops, kv_as_read
from .fused_onnx import MASK_BIAS, MS, Heads, check_fill, emit_guard, mask_bias, needs_opset_23, runtime_dtype
from .registry import NotApplicable, define
from .tensor import concat

append_attention = define(
    "append_attention", ("q", "k", "v", "past_k", "past_v", "*mask"), outputs=3, attrs=dict(ATTENTION_ATTRS),
    fused=True, colour="#FF9DA6",
    flops=lambda node, bindings: attention_flops(node.inputs[0].shape, node.outputs[1].shape[2],
                                                 node.outputs[0].shape[-1], bindings),
    doc="the presents: past_k, past_v with k, v appended along axis 2 (rows); then attention of q over them; "
        "returns the output and both presents. q is [b, heads, seq, d] or grouped [b, kv_heads, group, seq, d] "
        "(the presents then read as [b, kv_heads, 1, total, d])")


@append_attention.infer
def _(types, attrs):
    q, k, v, past_k, past_v = types[:5]
    if q.rank not in (4, 5) or k.rank != 4 or v.rank != 4:
        raise ShapeError(f"append_attention: q must be [b, heads, seq, d] or [b, kv_heads, group, seq, d] and "
                         f"k, v [b, kv_heads, seq, d]; got {q}, {k}, {v}")
    presents = [concat.infer_fn([past, new], {"axis": 2}) for past, new in ((past_k, k), (past_v, v))]
    reads = [TensorType(p.dtype, kv_as_read(p.shape, q.rank == 5)) for p in presents]
    out = attention.infer_fn([q, *reads, *types[5:]], attention_attrs(attrs))
    return [out, *presents]


@append_attention.numpy
def _(xs, attrs, env):
    q, k, v, past_k, past_v = xs[:5]
    presents = [np.concatenate([past, new], axis=2) for past, new in ((past_k, k), (past_v, v))]
    reads = [p.reshape(kv_as_read(p.shape, q.ndim == 5)) for p in presents]
    return [attention.numpy_fn([q, *reads, *xs[5:]], dict(attrs), env), *presents]


@append_attention.decompose
def _(b, node, ins):
    q, k, v, past_k, past_v = ins[:5]
    presents = [b.op("concat", past, new, axis=2) for past, new in ((past_k, k), (past_v, v))]
    reads = presents
    if q.type.rank == 5:
        # 0 copies the batch, -1 infers the total
        reads = [b.op("reshape", p, shape=list(kv_as_read((0, p.type.shape[1], -1, p.type.shape[3]), True)))
                 for p in presents]
    return [b.op("attention", q, *reads, *ins[5:], **node.attrs), *presents]


def _checked(node, op_type: str):
    """The node's heads read as the runtime op takes them (``Heads`` over q
    and the presents), once its masking is one ``op_type`` adds exactly."""
    dtype = runtime_dtype(node, op_type)
    shapes = Heads(_AsAttention(node), op_type)
    check_fill(node, op_type, dtype, bias=node.attrs["mask"] != "none" or node.attrs["causal"])
    if not isinstance(shapes.head, int) or shapes.head != shapes.v_head:
        raise NotApplicable(f"{op_type} needs one fixed head size for q, k and v; got {node.inputs[0].type}, "
                            f"{node.inputs[2].type}")
    return dtype, shapes


class _AsAttention:
    """The node as the attention it ends in (q over the presents as read), for ``Heads``."""

    def __init__(self, node):
        grouped = node.inputs[0].type.rank == 5
        reads = [_Read(o.type, grouped) for o in node.outputs[1:]]
        self.inputs = [node.inputs[0], *reads, *node.inputs[5:]]
        self.attrs = node.attrs


class _Read:
    def __init__(self, t: TensorType, grouped: bool):
        self.type = TensorType(t.dtype, kv_as_read(t.shape, grouped))
        self.shape = self.type.shape


def _bias(e, node, ins, dtype, shapes):
    """The mask and causal mask as one additive bias ``[b or 1, heads or 1, seq, total]``, or None."""
    if node.attrs["mask"] == "none" and not node.attrs["causal"]:
        return None
    view = _AsAttention(node)
    mask = shapes.mask(e, view, [*ins[:3], *ins[5:]]) if node.attrs["mask"] != "none" else None
    return mask_bias(e, view, [*ins[:3], *ins[5:]], dtype, shapes.batch, shapes.heads, shapes.q_len,
                      shapes.k_len, mask=mask)


@append_attention.onnx_encoding("contrib")
def _(e, node, ins):
    """``com.microsoft.MultiHeadAttention`` with past_key and past_value; it
    takes the step's keys and values packed ``[b, seq, heads*size]`` (a 4-D
    key would be read as cross-attention, which takes no past)."""
    dtype, shapes = _checked(node, "MultiHeadAttention")
    if shapes.grouped or shapes.kv_heads != shapes.heads:
        raise NotApplicable("MultiHeadAttention takes one K/V head per query head; grouped-query attention's "
                            "past is GroupQueryAttention's shared buffer, not an appended present")
    if node.attrs["scale"] == 0.0:
        raise NotApplicable("MultiHeadAttention reads scale=0 as 'unset' (1/sqrt(head_size))")
    heads, size = shapes.heads, shapes.head

    def packed(x):   # [b, heads, seq, size] -> [b, seq, heads*size]
        return e.emit("Reshape", [e.emit("Transpose", [x], perm=[0, 2, 1, 3]),
                                  e.const(np.array([0, 0, heads * size], np.int64))])
    bias = _bias(e, node, ins, dtype, shapes)
    inputs = [packed(ins[0]), packed(ins[1]), packed(ins[2]), "", "", bias or "", ins[3], ins[4]]
    out, present_k, present_v = e.emit("MultiHeadAttention", inputs, n=3, domain=MS, num_heads=heads,
                                       scale=node.attrs["scale"], mask_filter_value=MASK_BIAS)
    out = e.emit("Transpose", [e.emit("Reshape", [out, e.const(np.array([0, 0, heads, size], np.int64))])],
                 perm=[0, 2, 1, 3])
    return [_guarded(e, node, ins, out, shapes), present_k, present_v]


def _guarded(e, node, ins, out, shapes):
    return emit_guard(e, node, out, ins[5] if node.attrs["mask"] != "none" else None, shapes.q_len, shapes.k_len)


@append_attention.onnx_encoding("onnx23")
def _(e, node, ins):
    """Opset-23 ``Attention`` with past_key and past_value (4-D, so fewer K/V
    heads than query heads are grouped as blockc groups them); its causal
    flag is aligned at the past's end, so the causal mask goes in the bias."""
    needs_opset_23(e, "Attention")
    dtype, shapes = _checked(node, "Attention")
    if node.attrs["scale"] <= 0.0:
        raise NotApplicable(f"Attention scales q and k by sqrt(scale): scale={node.attrs['scale']:g} has no real "
                            f"square root")
    bias = _bias(e, node, ins, dtype, shapes)
    inputs = [shapes.query(e, ins[0]), ins[1], ins[2], bias or "", ins[3], ins[4]]
    out, present_k, present_v = e.emit("Attention", inputs, n=3, scale=node.attrs["scale"])
    return [_guarded(e, node, ins, shapes.output(e, out), shapes), present_k, present_v]
