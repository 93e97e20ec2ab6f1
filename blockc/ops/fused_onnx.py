"""The fused ops' runtime-op ONNX forms: ``contrib`` (ONNX Runtime's
``com.microsoft`` ops) and ``onnx23`` (opset-23 ``Attention`` and
``RMSNormalization``).

Each lowering is registered on its op's ``OpDef`` with
``@op.onnx_encoding(form)``, so the registry stays the one place the exporter
looks an op up. They sit in this file rather than beside the declarations in
``fused.py`` because they are target-specific and about as long as the
declarations themselves: most of each is the conditions under which the
runtime op means *exactly* what the fused op's ``decompose`` rule means. A
lowering that cannot express a node raises ``NotApplicable`` with the reason,
before emitting anything, and the exporter uses the ``function`` form (the
decomposition wrapped in an ONNX function, built generically by
``blockc/codegen/fused_encodings.py``) instead.

Masks. ``masked_softmax`` *replaces* masked scores by ``fill``; the runtime
ops *add* a bias. The two agree when the bias is so negative that adding it
swamps any real score (``MASK_BIAS``, -1e30: a float32 ulp there is ~7.6e22),
including on a fully masked row, where both give the uniform average. So a
node is only lowered with a mask when its ``fill`` is at least that negative,
and the bias emitted is ``MASK_BIAS`` itself, not ``fill``: ONNX Runtime's
``Attention`` treats float32's lowest value like -inf and outputs zeros for a
fully masked row. Boolean masks are turned into such a bias for the same
reason (a boolean ``attn_mask`` row of all False gives zeros, not the
average).
"""
from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType
from .fused import add_layernorm, add_rmsnorm, attention, masked_softmax, matmul_bias_act, qkv_attention
from .nn import emit_causal_mask
from .registry import NotApplicable

MS = "com.microsoft"
MASK_BIAS = -1e30
_FLOATS = (DType.float32, DType.float16)


def _dtype(node, op_type: str) -> DType:
    dtype = node.outputs[0].dtype
    if dtype not in _FLOATS:
        raise NotApplicable(f"{op_type} takes float32 or float16 in ONNX Runtime, not {dtype.name}")
    return dtype


def _never(reason: str):
    """A form the op has no runtime op for: always declines, saying why."""
    def lower(e, node, ins):
        raise NotApplicable(reason)
    return lower


# ---- add_layernorm / add_rmsnorm ---------------------------------------------------
def _skip_norm(op_type: str, e, node, ins):
    x, r = node.inputs[:2]
    _dtype(node, op_type)
    if x.type.rank != 3:
        raise NotApplicable(f"{op_type} takes a 3-D input [batch,seq,hidden], got {x.type}")
    if r.shape not in (x.shape, (1,) + x.shape[1:], x.shape[1:]):
        raise NotApplicable(f"{op_type} takes a skip of the input's shape, [1,seq,hidden] or [seq,hidden], "
                            f"got {r.type} for {x.type}")
    with_sum = node.attrs["with_sum"]
    # Outputs: output, mean, inv_std_var, input_skip_bias_sum; the middle two are training-only.
    outs = e.emit(op_type, ins, n=4 if with_sum else 1, domain=MS, unused=(1, 2), epsilon=node.attrs["eps"])
    return [outs[0], outs[3]] if with_sum else [outs]


add_layernorm.onnx_encoding("contrib")(lambda e, node, ins: _skip_norm("SkipLayerNormalization", e, node, ins))
add_rmsnorm.onnx_encoding("contrib")(lambda e, node, ins: _skip_norm("SkipSimplifiedLayerNormalization", e, node, ins))
add_layernorm.onnx_encoding("onnx23")(_never("ONNX has no fused add + layernorm op"))


@add_rmsnorm.onnx_encoding("onnx23")
def _(e, node, ins):
    if e.opset < 23:
        raise NotApplicable(f"RMSNormalization needs opset 23, exporting at opset {e.opset}")
    _dtype(node, "RMSNormalization")
    s = e.emit("Add", ins[:2])
    y = e.emit("RMSNormalization", [s, ins[2]], axis=-1, epsilon=node.attrs["eps"])
    return [y, s] if node.attrs["with_sum"] else [y]


# ---- matmul_bias_act ---------------------------------------------------------------
@matmul_bias_act.onnx_encoding("contrib")
def _(e, node, ins):
    act = node.attrs["activation"]
    if act == "relu":
        raise NotApplicable("com.microsoft has no bias + ReLU op (FusedMatMul takes no bias, FusedGemm is 2-D only)")
    op_type = "BiasGelu" if act == "gelu" else "FastGelu"  # FastGelu is the tanh approximation
    _dtype(node, op_type)
    return [e.emit(op_type, [e.emit("MatMul", ins[:2]), ins[2]], domain=MS)]


matmul_bias_act.onnx_encoding("onnx23")(_never("ONNX has no fused matmul + bias + activation op"))


# ---- masked_softmax ----------------------------------------------------------------
masked_softmax.onnx_encoding("contrib")(_never("com.microsoft has no masked softmax op with CPU kernels "
                                                      "(BiasSoftmax runs on CUDA and ROCm only)"))
masked_softmax.onnx_encoding("onnx23")(_never("ONNX has no masked softmax op"))


# ---- attention -----------------------------------------------------------------------
def _attention_shapes(node, op_type: str):
    """(batch, heads, q_len, k_len, head_size, v_head_size) of a 4-D attention
    whose q, k, v agree on batch; declines anything else."""
    q, k, v = (x.type for x in node.inputs[:3])
    if not q.rank == k.rank == v.rank == 4:
        raise NotApplicable(f"{op_type} takes 4-D [batch,heads,seq,head_size] q, k, v; got rank {q.rank}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise NotApplicable(f"{op_type} cannot broadcast the batch of q {q}, k {k}, v {v}")
    if k.shape[1] != v.shape[1]:
        raise NotApplicable(f"{op_type} takes k and v with the same heads, got k {k}, v {v}")
    return q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]


def _needs_bias(node, square: bool) -> bool:
    """Whether the masking must be passed as an additive bias (rather than
    none, or the op's own causal flag)."""
    return node.attrs["mask"] != "none" or (node.attrs["causal"] and not square)


def _check_fill(node, op_type: str, dtype: DType, bias: bool) -> None:
    """Decline masking that an added bias (``bias``: one held in a tensor of
    ``dtype``) would not reproduce exactly."""
    if node.attrs["mask"] == "none" and not node.attrs["causal"]:
        return
    if node.attrs["fill"] > MASK_BIAS:
        raise NotApplicable(f"{op_type} adds its mask, which matches replacing masked scores by fill="
                            f"{node.attrs['fill']:g} only for a fill <= {MASK_BIAS:g}")
    if bias and dtype != DType.float32:
        raise NotApplicable(f"a {dtype.name} mask bias cannot hold {MASK_BIAS:g}")


def _mask_bias(e, node, ins, dtype: DType, batch, heads, q_len, k_len, causal: bool | None = None) -> str:
    """The node's mask, causal mask (``causal``: None for the node's own
    flag) and fill as one additive bias of shape [batch or 1, heads or 1,
    q_len, k_len] (the runtime ops want the last two dims exact)."""
    keep = add = None
    mask_shape = ()
    if node.attrs["mask"] != "none":
        mask_shape = (1,) * (4 - node.inputs[3].type.rank) + tuple(node.inputs[3].shape)
        if node.attrs["mask"] == "bool":
            keep = ins[3]
        else:
            add = ins[3]
    if node.attrs["causal"] if causal is None else causal:
        tril = emit_causal_mask(e, q_len, k_len)
        keep = tril if keep is None else e.emit("And", [keep, tril])
    big = e.const(np.array(MASK_BIAS, dtype.numpy))
    if keep is None:
        bias = add
    else:
        bias = e.emit("Where", [keep, add if add is not None else e.const(np.array(0, dtype.numpy)), big])
    lead = [1 if not mask_shape or mask_shape[i] == 1 else full for i, full in enumerate((batch, heads))]
    return e.emit("Expand", [bias, e.dims(lead + [q_len, k_len])])


@attention.onnx_encoding("contrib")
def _(e, node, ins):
    dtype = _dtype(node, "MultiHeadAttention")
    batch, heads, q_len, k_len, head, v_head = _attention_shapes(node, "MultiHeadAttention")
    if node.inputs[1].shape[1] != heads:
        raise NotApplicable(f"MultiHeadAttention takes k with q's {heads} heads, got {node.inputs[1].type}")
    if not isinstance(heads, int) or not isinstance(head, int) or head != v_head:
        raise NotApplicable(f"MultiHeadAttention needs fixed heads and one head size for q, k, v; got "
                            f"{node.inputs[0].type}, {node.inputs[2].type}")
    if node.attrs["scale"] == 0.0:
        raise NotApplicable("MultiHeadAttention reads scale=0 as 'unset' (1/sqrt(head_size))")
    square = q_len == k_len
    padding = (node.attrs["mask"] == "bool" and not node.attrs["causal"]
               and tuple(node.inputs[3].shape) == (batch, 1, 1, k_len))
    _check_fill(node, "MultiHeadAttention", dtype, bias=True)  # mask_filter_value, too, must hold MASK_BIAS
    # Inputs: query, key, value, bias, key_padding_mask, attention_bias. The
    # query goes in as [batch,seq,heads*head]; key and value stay BNSH.
    query = e.emit("Reshape", [e.emit("Transpose", [ins[0]], perm=[0, 2, 1, 3]),
                               e.const(np.array([0, 0, heads * head], np.int64))])
    inputs = [query, ins[1], ins[2]]
    attrs = dict(num_heads=heads, scale=node.attrs["scale"], mask_filter_value=MASK_BIAS)
    if padding:  # [batch,1,1,k_len] booleans: the key padding mask, int32 [batch,k_len]
        flat = e.emit("Reshape", [ins[3], e.const(np.array([0, -1], np.int64))])
        inputs += ["", e.emit("Cast", [flat], to=int(DType.int32.onnx_code))]
    elif _needs_bias(node, square):
        inputs += ["", "", _mask_bias(e, node, ins, dtype, batch, heads, q_len, k_len)]
    elif node.attrs["causal"]:
        attrs["unidirectional"] = 1  # top-left aligned: right only for a square q/k
    out = e.emit("MultiHeadAttention", inputs, domain=MS, **attrs)
    out = e.emit("Reshape", [out, e.const(np.array([0, 0, heads, head], np.int64))])
    return [e.emit("Transpose", [out], perm=[0, 2, 1, 3])]


@attention.onnx_encoding("onnx23")
def _(e, node, ins):
    if e.opset < 23:
        raise NotApplicable(f"Attention needs opset 23, exporting at opset {e.opset}")
    dtype = _dtype(node, "Attention")
    batch, heads, q_len, k_len, _, _ = _attention_shapes(node, "Attention")
    kv_heads = node.inputs[1].shape[1]
    if kv_heads not in (1, heads):
        raise NotApplicable(f"Attention takes q heads that k/v heads divide; q has {heads}, k {kv_heads}")
    scale = node.attrs["scale"]
    if scale <= 0.0:
        raise NotApplicable(f"Attention scales q and k by sqrt(scale): scale={scale:g} has no real square root")
    square = q_len == k_len
    attrs = dict(scale=scale)
    inputs = list(ins[:3])
    _check_fill(node, "Attention", dtype, bias=_needs_bias(node, square))
    if _needs_bias(node, square):
        inputs.append(_mask_bias(e, node, ins, dtype, batch, heads, q_len, k_len))
    elif node.attrs["causal"]:
        attrs["is_causal"] = 1  # aligned to past_key, of which there is none: right for a square q/k
    return [e.emit("Attention", inputs, **attrs)]


# ---- qkv_attention -------------------------------------------------------------------
def _qkv_common(node, op_type: str):
    """(dtype, heads, head size, v head size) once the node's masking and fill
    are ones ``op_type`` reproduces exactly; declines anything else."""
    dtype = _dtype(node, op_type)
    heads, (dq, _, dv) = node.attrs["heads"], node.attrs["sizes"]
    _check_fill(node, op_type, dtype, bias=_needs_bias(node, square=True))
    return dtype, heads, dq // heads, dv // heads


@qkv_attention.onnx_encoding("contrib")
def _(e, node, ins):
    # com.microsoft.Attention: inputs input, weights, bias, mask_index, past,
    # attention_bias; the projection, the heads and the causal mask all inside.
    dtype, heads, head, v_head = _qkv_common(node, "Attention")
    if node.attrs["scale"] == 0.0:
        raise NotApplicable("com.microsoft.Attention reads scale=0 as 'unset' (1/sqrt(head_size))")
    x = node.inputs[0]
    batch, seq = x.shape[:2]
    attrs = dict(num_heads=heads, scale=node.attrs["scale"], mask_filter_value=MASK_BIAS)
    if head != v_head:
        attrs["qkv_hidden_sizes"] = list(node.attrs["sizes"])
    inputs = list(ins[:3])
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    if mask is not None and node.attrs["mask"] == "bool" and tuple(mask.shape) == (batch, 1, 1, seq) \
            and not node.attrs["causal"]:
        flat = e.emit("Reshape", [ins[3], e.const(np.array([0, -1], np.int64))])   # key padding, [batch, seq]
        inputs.append(e.emit("Cast", [flat], to=int(DType.int32.onnx_code)))
    elif mask is not None:
        # Anything else, causal part included, as one attention_bias: with
        # mask_index *and* unidirectional, ONNX Runtime masks a fully padded
        # row unevenly (the causal part differently from the padding) where
        # the fused op averages it uniformly.
        inputs += ["", "", _mask_bias(e, node, ins, dtype, batch, heads, seq, seq)]
    elif node.attrs["causal"]:
        attrs["unidirectional"] = 1   # q and k are the same sequence here: square, top-left aligned
    return [e.emit("Attention", inputs, domain=MS, **attrs)]


@qkv_attention.onnx_encoding("onnx23")
def _(e, node, ins):
    # The projection as MatMul + Add + Split, then opset-23 Attention on 3-D
    # [batch, seq, heads*head] q, k, v (q_num_heads/kv_num_heads), whose output
    # is 3-D too: no head split or join is written at all.
    if e.opset < 23:
        raise NotApplicable(f"Attention needs opset 23, exporting at opset {e.opset}")
    dtype, heads, _, _ = _qkv_common(node, "Attention")
    scale = node.attrs["scale"]
    if scale <= 0.0:
        raise NotApplicable(f"Attention scales q and k by sqrt(scale): scale={scale:g} has no real square root")
    batch, seq = node.inputs[0].shape[:2]
    y = e.emit("Add", [e.emit("MatMul", ins[:2]), ins[2]])
    q, k, v = e.emit("Split", [y, e.const(np.array(node.attrs["sizes"], np.int64))], n=3, axis=-1)
    attrs = dict(scale=scale, q_num_heads=heads, kv_num_heads=heads)
    inputs = [q, k, v]
    if _needs_bias(node, square=True):
        inputs.append(_mask_bias(e, node, ins, dtype, batch, heads, seq, seq))
    elif node.attrs["causal"]:
        attrs["is_causal"] = 1
    return [e.emit("Attention", inputs, **attrs)]
