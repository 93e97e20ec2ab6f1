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
average), and an additive mask is clamped to it from below (``Max``): a
Hugging Face export's mask holds float32's lowest value on its pads, which
the op would read as -inf, giving zeros for a left-padded row's first
queries, where the fused op (and the original file) averages the values.
Entries that low all swamp any score, so the clamp changes only a row of
nothing else, which it averages as the reference does.
"""
from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType
from .activations import ACTIVATIONS
from .fused import add_layernorm, add_rmsnorm, attention, masked_softmax, matmul_bias_act, qkv_attention
from .masking import guard_rows
from .nn import emit_causal_mask
from .registry import NotApplicable

MS = "com.microsoft"
MASK_BIAS = -1e30
_FLOATS = (DType.float32, DType.float16)


def runtime_dtype(node, op_type: str) -> DType:
    """The node's dtype, when the runtime op ``op_type`` takes it (float32 or float16)."""
    dtype = node.outputs[0].dtype
    if dtype not in _FLOATS:
        raise NotApplicable(f"{op_type} takes float32 or float16 in ONNX Runtime, not {dtype.name}")
    return dtype


def needs_opset_23(e, op_type: str) -> None:
    """The ``onnx23`` encodings write ops that opset 23 added: at an older opset they decline."""
    if e.opset < 23:
        raise NotApplicable(f"{op_type} needs opset 23, exporting at opset {e.opset}")


def _never(reason: str):
    """A form the op has no runtime op for: always declines, saying why."""
    def lower(e, node, ins):
        raise NotApplicable(reason)
    return lower


# ---- add_layernorm / add_rmsnorm ---------------------------------------------------
def _skip_norm(op_type: str, e, node, ins):
    x, r = node.inputs[:2]
    runtime_dtype(node, op_type)
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
    needs_opset_23(e, "RMSNormalization")
    runtime_dtype(node, "RMSNormalization")
    s = e.emit("Add", ins[:2])
    y = e.emit("RMSNormalization", [s, ins[2]], axis=-1, epsilon=node.attrs["eps"])
    return [y, s] if node.attrs["with_sum"] else [y]


# ---- matmul_bias_act ---------------------------------------------------------------
@matmul_bias_act.onnx_encoding("contrib")
def _(e, node, ins):
    act = ACTIVATIONS[node.attrs["activation"]]
    if act.contrib is None:
        raise NotApplicable(f"com.microsoft has no bias + {act.title} op")
    runtime_dtype(node, act.contrib)
    return [e.emit(act.contrib, [e.emit("MatMul", ins[:2]), ins[2]], domain=MS)]


matmul_bias_act.onnx_encoding("onnx23")(_never("ONNX has no fused matmul + bias + activation op"))


# ---- masked_softmax ----------------------------------------------------------------
masked_softmax.onnx_encoding("contrib")(_never("com.microsoft has no masked softmax op with CPU kernels "
                                                      "(BiasSoftmax runs on CUDA and ROCm only)"))
masked_softmax.onnx_encoding("onnx23")(_never("ONNX has no masked softmax op"))


# ---- attention -----------------------------------------------------------------------
class Heads:
    """An attention's q, k, v as the runtime ops take them, 4-D [batch, heads,
    seq, head_size]: as they are, or a grouped attention's (rank 5, the layout
    of ``ops.fused.group_heads``) read that way. Grouped, q ``[b, kv, group,
    s, d]`` is ``[b, kv*group, s, d]``, so query head ``h`` is ``(h // group,
    h % group)`` and reads K/V head ``h // group`` -- the order both
    ``Attention`` and ``GroupQueryAttention`` give a query head's K/V head --
    and K/V ``[b, kv, 1, t, d]`` are ``[b, kv, t, d]``."""

    def __init__(self, node, op_type: str):
        q, k, v = (x.type for x in node.inputs[:3])
        if not q.rank == k.rank == v.rank or q.rank not in (4, 5):
            raise NotApplicable(f"{op_type} takes 4-D [batch,heads,seq,head_size] q, k, v, or grouped 5-D "
                                f"[batch,kv_heads,group,seq,head_size] ones; got rank {q.rank}")
        if not q.shape[0] == k.shape[0] == v.shape[0]:
            raise NotApplicable(f"{op_type} cannot broadcast the batch of q {q}, k {k}, v {v}")
        if k.shape[1:-2] != v.shape[1:-2]:
            raise NotApplicable(f"{op_type} takes k and v with the same heads, got k {k}, v {v}")
        self.grouped = q.rank == 5
        self.batch, self.q_len, self.k_len = q.shape[0], q.shape[-2], k.shape[-2]
        self.head, self.v_head = q.shape[-1], v.shape[-1]
        self.heads, self.kv_heads = q.shape[1], k.shape[1]
        if self.grouped:
            kv, group = q.shape[1:3]
            if not isinstance(kv, int) or not isinstance(group, int):
                raise NotApplicable(f"{op_type} needs fixed head counts for grouped attention, got q {q}")
            self.group_shape = (kv, group)
            self.heads = kv * group
            # K/V heads [kv, 1]: grouped; [kv, group]: one per query head; [1, 1]: one for all (MQA)
            by_shape = {(kv, 1): kv, (kv, group): kv * group, (1, 1): 1}
            if tuple(k.shape[1:3]) not in by_shape:
                raise NotApplicable(f"{op_type} reads K/V head h // group for query head h; K/V heads "
                                    f"{list(k.shape[1:3])} against query heads {[kv, group]} do not say that")
            self.kv_heads = by_shape[tuple(k.shape[1:3])]

    def query(self, e, q: str) -> str:
        return e.emit("Reshape", [q, e.dims([0, self.heads, -1, self.head])]) if self.grouped else q

    def key_value(self, e, x: str, size) -> str:
        return e.emit("Reshape", [x, e.dims([0, self.kv_heads, -1, size])]) if self.grouped else x

    def output(self, e, y: str) -> str:
        """The op's [b, heads, s, dv] output in the node's layout."""
        return e.emit("Reshape", [y, e.dims([0, *self.group_shape, -1, self.v_head])]) if self.grouped else y

    def mask_shape(self, node) -> tuple | None:
        """The shape ``mask`` gives the node's mask; None without one."""
        if node.attrs["mask"] == "none":
            return None
        shape = tuple(node.inputs[3].shape)
        if not self.grouped:
            return (1,) * (4 - len(shape)) + shape
        m0, m1, m2, rows, cols = (1,) * (5 - len(shape)) + shape
        return (m0, 1 if (m1, m2) == (1, 1) else self.heads, rows, cols)

    def mask(self, e, node, ins) -> tuple[str, tuple] | None:
        """The node's mask input read as 4-D as the heads above, and its
        shape; None without one."""
        shape = self.mask_shape(node)
        if shape is None:
            return None
        given = tuple(node.inputs[3].shape)
        if not self.grouped or len(given) <= 2:   # [rows, cols] broadcasts over the heads as it is
            return ins[3], shape
        mask, heads = ins[3], shape[1]
        if heads != 1 and tuple(((1, 1) + given)[-4:-2]) != self.group_shape:
            # one per K/V head, or per member of a group: one per query head
            mask = e.emit("Expand", [mask, e.const(np.array([1, *self.group_shape, 1, 1], np.int64))])
        # 0 copies the batch axis of a 5-D mask; fewer axes have none
        lead = 0 if len(given) == 5 or mask != ins[3] else 1
        return e.emit("Reshape", [mask, e.dims([lead, heads, shape[2], -1])]), shape


def _needs_bias(node, square: bool) -> bool:
    """Whether the masking must be passed as an additive bias (rather than
    none, or the op's own causal flag)."""
    return node.attrs["mask"] != "none" or (node.attrs["causal"] and not square)


def check_fill(node, op_type: str, dtype: DType, bias: bool) -> None:
    """Decline masking that an added bias (``bias``: one held in a tensor of
    ``dtype``) would not reproduce exactly."""
    if node.attrs["mask"] == "none" and not node.attrs["causal"]:
        return
    if node.attrs["fill"] > MASK_BIAS:
        raise NotApplicable(f"{op_type} adds its mask, which matches replacing masked scores by fill="
                            f"{node.attrs['fill']:g} only for a fill <= {MASK_BIAS:g}")
    if bias and dtype != DType.float32:
        raise NotApplicable(f"a {dtype.name} mask bias cannot hold {MASK_BIAS:g}")


def clamp_bias(e, bias: str, big: str) -> str:
    """An additive mask held at ``MASK_BIAS`` (``big``) from below: float32's
    lowest, which Hugging Face's masks hold, would read as -inf to the
    runtime ops, giving zeros on a fully masked row."""
    return e.emit("Max", [bias, big])


def mask_bias(e, node, ins, dtype: DType, batch, heads, q_len, k_len,
               mask: tuple[str, tuple] | None = None) -> str:
    """The node's mask, causal mask and fill as one additive bias of shape
    [batch or 1, heads or 1, q_len, k_len] (the runtime ops want the last two
    dims exact). ``mask``: the mask input and its 4-D shape, when not the
    node's own (``Heads.mask``)."""
    keep = add = None
    mask_shape = ()
    if node.attrs["mask"] != "none":
        name, mask_shape = mask or (ins[3], (1,) * (4 - node.inputs[3].type.rank) + tuple(node.inputs[3].shape))
        if node.attrs["mask"] == "bool":
            keep = name
        else:
            add = name
    if node.attrs["causal"]:
        tril = emit_causal_mask(e, q_len, k_len)
        keep = tril if keep is None else e.emit("And", [keep, tril])
    big = e.const(np.array(MASK_BIAS, dtype.numpy))
    if add is not None:
        add = clamp_bias(e, add, big)
    if keep is None:
        bias = add
    else:
        bias = e.emit("Where", [keep, add if add is not None else e.const(np.array(0, dtype.numpy)), big])
    lead = [1 if not mask_shape or mask_shape[i] == 1 else full for i, full in enumerate((batch, heads))]
    return e.emit("Expand", [bias, e.dims(lead + [q_len, k_len])])


def emit_guard(e, node, out: str, mask: str | None, q_len, k_len, *, joined_heads: bool = False) -> str:
    """``out`` (the node's output in its own layout) with the rows that see no
    key zeroed where the node is ``guarded`` (``ops.masking.guard_rows``):
    the runtime ops are given ``MASK_BIAS``, under which such a row averages
    the values. ``mask``: the node's mask input. ``joined_heads``: ``out`` is
    ``[b, seq, heads*size]`` (qkv_attention), so a 4-D mask's ``[b, 1, seq,
    1]`` rows are read as ``[b, seq, 1]`` (``check_guard_fits`` first)."""
    def any_key(allowed):
        seen = e.emit("ReduceMax", [e.emit("Cast", [allowed], to=int(DType.float32.onnx_code)),
                                    e.const(np.array([-1], np.int64))], keepdims=1)
        seen = e.emit("Cast", [seen], to=int(DType.bool.onnx_code))
        if joined_heads and mask is not None and node.inputs[3].type.rank == 4:
            seen = e.emit("Reshape", [seen, e.const(np.array([0, -1, 1], np.int64))])
        return seen
    zero = e.const(np.array(0, node.outputs[0].dtype.numpy))
    return guard_rows(out, [mask], node.attrs, logical_and=lambda x, y: e.emit("And", [x, y]),
                      causal=lambda: emit_causal_mask(e, q_len, k_len), any_key=any_key,
                      where=lambda c, x, f: e.emit("Where", [c, x, f]), zero=zero)


def check_guard_fits(node, op_type: str) -> None:
    """Decline a guarded qkv_attention whose mask differs per head: its rows
    to zero are then per head, and the op's output has the heads joined."""
    if node.attrs["guarded"] and node.attrs["mask"] == "bool" and node.inputs[3].type.rank >= 3 \
            and node.inputs[3].type.shape[-3] != 1:
        raise NotApplicable(f"{op_type} joins the heads, and the guarded rows of a per-head mask "
                            f"{node.inputs[3].type} are per head")


def check_group_query_attention(node, dtype: DType, heads, kv_heads, size, v_size) -> None:
    """Decline what ``com.microsoft.GroupQueryAttention`` cannot mean: the
    constraints of the op itself, shared by every lowering to it."""
    if not all(isinstance(d, int) for d in (heads, kv_heads, size, v_size)) or v_size != size:
        raise NotApplicable(f"GroupQueryAttention needs fixed heads and one head size for q, k, v; got {heads} "
                            f"heads of {size} on {kv_heads} K/V heads of {v_size}")
    if size % 8:
        raise NotApplicable(f"GroupQueryAttention needs a head size that is a multiple of 8, got {size}")
    if not node.attrs["causal"]:
        raise NotApplicable("GroupQueryAttention is always causal (each query sees the keys up to its own row)")
    if node.attrs["scale"] <= 0.0:
        raise NotApplicable(f"GroupQueryAttention reads scale<=0 as 'unset' (1/sqrt(head_size)), got "
                            f"{node.attrs['scale']:g}")
    check_fill(node, "GroupQueryAttention", dtype, bias=node.attrs["mask"] != "none")


def emit_group_query_attention(e, q: str, k: str, v: str, *, heads: int, kv_heads: int, size: int, total,
                               scale: float, past: tuple[str, str] | None = None, bias: str | None = None):
    """``com.microsoft.GroupQueryAttention`` of q ``[b, heads, seq, size]``
    over k, v ``[b, kv_heads, seq, size]`` written after ``past`` (the
    caches, its past_key and past_value; None: no past, the keys are the
    queries' rows), ``total`` rows in all; ``bias``: an additive
    ``[b or 1, heads or 1, seq, total]``. Returns the output ``[b, heads, seq,
    size]`` and the present key and value ("" without a past).

    The op takes q, k, v packed ``[b, seq, heads*size]``, and each batch
    row's last key index (seqlens_k, int32 ``[b]``: ``total-1`` for every
    row, pads included, which a mask hides) and the total
    (total_sequence_length, an int32 scalar); then no rotary tables or
    position ids."""
    def packed(x, n):   # [b, n, seq, size] -> [b, seq, n*size]
        return e.emit("Reshape", [e.emit("Transpose", [x], perm=[0, 2, 1, 3]),
                                  e.const(np.array([0, 0, n * size], np.int64))])

    int32 = int(DType.int32.onnx_code)
    last_row = e.emit("Cast", [e.dims([total - 1])], to=int32)
    batch = e.emit("Slice", [e.emit("Shape", [q]), e.const(np.array([0], np.int64)), e.const(np.array([1], np.int64))])
    inputs = [packed(q, heads), packed(k, kv_heads), packed(v, kv_heads), *(past or ("", "")),
              e.emit("Expand", [last_row, batch]), e.emit("Cast", [e.scalar_dim(total)], to=int32)]
    if bias is not None:
        inputs += ["", "", "", bias]
    out, present_k, present_v = e.emit("GroupQueryAttention", inputs, n=3, domain=MS, unused=() if past else (1, 2),
                                       num_heads=heads, kv_num_heads=kv_heads, scale=scale)
    out = e.emit("Transpose", [e.emit("Reshape", [out, e.const(np.array([0, 0, heads, size], np.int64))])],
                 perm=[0, 2, 1, 3])
    return out, present_k, present_v


@attention.onnx_encoding("contrib")
def _(e, node, ins):
    dtype = runtime_dtype(node, "MultiHeadAttention")
    shapes = Heads(node, "MultiHeadAttention")
    if shapes.kv_heads != shapes.heads:
        return _grouped_contrib(e, node, ins, dtype, shapes)
    batch, heads, q_len, k_len, head = shapes.batch, shapes.heads, shapes.q_len, shapes.k_len, shapes.head
    if not isinstance(heads, int) or not isinstance(head, int) or head != shapes.v_head:
        raise NotApplicable(f"MultiHeadAttention needs fixed heads and one head size for q, k, v; got "
                            f"{node.inputs[0].type}, {node.inputs[2].type}")
    if node.attrs["scale"] == 0.0:
        raise NotApplicable("MultiHeadAttention reads scale=0 as 'unset' (1/sqrt(head_size))")
    square = q_len == k_len
    padding = (node.attrs["mask"] == "bool" and not node.attrs["causal"]
               and shapes.mask_shape(node) == (batch, 1, 1, k_len))
    check_fill(node, "MultiHeadAttention", dtype, bias=True)  # mask_filter_value, too, must hold MASK_BIAS
    # Inputs: query, key, value, bias, key_padding_mask, attention_bias. The
    # query goes in as [batch,seq,heads*head]; key and value stay BNSH.
    query = e.emit("Reshape", [e.emit("Transpose", [shapes.query(e, ins[0])], perm=[0, 2, 1, 3]),
                               e.const(np.array([0, 0, heads * head], np.int64))])
    inputs = [query, shapes.key_value(e, ins[1], head), shapes.key_value(e, ins[2], head)]
    attrs = dict(num_heads=heads, scale=node.attrs["scale"], mask_filter_value=MASK_BIAS)
    mask = shapes.mask(e, node, ins)
    if padding:  # [batch,1,1,k_len] booleans: the key padding mask, int32 [batch,k_len]
        flat = e.emit("Reshape", [mask[0], e.const(np.array([0, -1], np.int64))])
        inputs += ["", e.emit("Cast", [flat], to=int(DType.int32.onnx_code))]
    elif _needs_bias(node, square):
        inputs += ["", "", mask_bias(e, node, ins, dtype, batch, heads, q_len, k_len, mask=mask)]
    elif node.attrs["causal"]:
        attrs["unidirectional"] = 1  # top-left aligned: right only for a square q/k
    out = e.emit("MultiHeadAttention", inputs, domain=MS, **attrs)
    out = e.emit("Reshape", [out, e.const(np.array([0, 0, heads, head], np.int64))])
    out = shapes.output(e, e.emit("Transpose", [out], perm=[0, 2, 1, 3]))
    return [emit_guard(e, node, out, _mask_input(node, ins), q_len, k_len)]


def _mask_input(node, ins, at: int = 3) -> str | None:
    return ins[at] if node.attrs["mask"] != "none" else None


def _grouped_contrib(e, node, ins, dtype: DType, shapes: Heads) -> list[str]:
    """Fewer K/V heads than query heads: ``GroupQueryAttention`` without a
    past (MultiHeadAttention takes K/V with every query head)."""
    check_group_query_attention(node, dtype, shapes.heads, shapes.kv_heads, shapes.head, shapes.v_head)
    if shapes.q_len != shapes.k_len:
        raise NotApplicable(f"GroupQueryAttention without a past takes as many keys as queries; got "
                            f"{shapes.q_len} queries on {shapes.k_len} keys")
    if node.attrs["mask"] != "none":
        # Its causal mask is not part of the bias: it leaves out the keys after a row's own, so a row whose
        # every key the mask hides (a left-padded row's first queries: float32's lowest in a Hugging Face
        # mask, a False in a boolean one) averages the keys up to its own, where the op averages them all.
        raise NotApplicable(f"GroupQueryAttention masks causally apart from its bias: a row the {node.attrs['mask']} "
                            "mask hides entirely would average only the keys up to its own, not all of them")
    out, _, _ = emit_group_query_attention(
        e, shapes.query(e, ins[0]), shapes.key_value(e, ins[1], shapes.head), shapes.key_value(e, ins[2], shapes.head),
        heads=shapes.heads, kv_heads=shapes.kv_heads, size=shapes.head, total=shapes.k_len,
        scale=node.attrs["scale"])
    return [emit_guard(e, node, shapes.output(e, out), None, shapes.q_len, shapes.k_len)]


@attention.onnx_encoding("onnx23")
def _(e, node, ins):
    needs_opset_23(e, "Attention")
    dtype = runtime_dtype(node, "Attention")
    shapes = Heads(node, "Attention")
    if shapes.kv_heads not in (1, shapes.heads) and not shapes.grouped:
        raise NotApplicable(f"Attention takes q heads that k/v heads divide; q has {shapes.heads}, "
                            f"k {shapes.kv_heads}")
    scale = node.attrs["scale"]
    if scale <= 0.0:
        raise NotApplicable(f"Attention scales q and k by sqrt(scale): scale={scale:g} has no real square root")
    square = shapes.q_len == shapes.k_len
    check_fill(node, "Attention", dtype, bias=_needs_bias(node, square))
    attrs = dict(scale=scale)
    # 4-D inputs: the op reads the head counts off q and k (fewer K/V heads: grouped, head h on K/V h // group)
    inputs = [shapes.query(e, ins[0]), shapes.key_value(e, ins[1], shapes.head),
              shapes.key_value(e, ins[2], shapes.v_head)]
    if _needs_bias(node, square):
        inputs.append(mask_bias(e, node, ins, dtype, shapes.batch, shapes.heads, shapes.q_len, shapes.k_len,
                                 mask=shapes.mask(e, node, ins)))
    elif node.attrs["causal"]:
        attrs["is_causal"] = 1  # aligned to past_key, of which there is none: right for a square q/k
    out = shapes.output(e, e.emit("Attention", inputs, **attrs))
    return [emit_guard(e, node, out, _mask_input(node, ins), shapes.q_len, shapes.k_len)]


# ---- qkv_attention -------------------------------------------------------------------
def _qkv_common(node, op_type: str):
    """(dtype, heads, head size, v head size) once the node's masking and fill
    are ones ``op_type`` reproduces exactly; declines anything else."""
    dtype = runtime_dtype(node, op_type)
    heads, (dq, _, dv) = node.attrs["heads"], node.attrs["sizes"]
    check_fill(node, op_type, dtype, bias=_needs_bias(node, square=True))
    return dtype, heads, dq // heads, dv // heads


@qkv_attention.onnx_encoding("contrib")
def _(e, node, ins):
    # com.microsoft.Attention: inputs input, weights, bias, mask_index, past,
    # attention_bias; the projection, the heads and the causal mask all inside.
    dtype, heads, head, v_head = _qkv_common(node, "Attention")
    check_guard_fits(node, "com.microsoft.Attention")
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
        inputs += ["", "", mask_bias(e, node, ins, dtype, batch, heads, seq, seq)]
    elif node.attrs["causal"]:
        attrs["unidirectional"] = 1   # q and k are the same sequence here: square, top-left aligned
    out = e.emit("Attention", inputs, domain=MS, **attrs)
    return [emit_guard(e, node, out, _mask_input(node, ins), seq, seq, joined_heads=True)]


@qkv_attention.onnx_encoding("onnx23")
def _(e, node, ins):
    # The projection as MatMul + Add + Split, then opset-23 Attention on 3-D
    # [batch, seq, heads*head] q, k, v (q_num_heads/kv_num_heads), whose output
    # is 3-D too: no head split or join is written at all.
    needs_opset_23(e, "Attention")
    dtype, heads, _, _ = _qkv_common(node, "Attention")
    check_guard_fits(node, "Attention")
    scale = node.attrs["scale"]
    if scale <= 0.0:
        raise NotApplicable(f"Attention scales q and k by sqrt(scale): scale={scale:g} has no real square root")
    batch, seq = node.inputs[0].shape[:2]
    y = e.emit("Add", [e.emit("MatMul", ins[:2]), ins[2]])
    q, k, v = e.emit("Split", [y, e.const(np.array(node.attrs["sizes"], np.int64))], n=3, axis=-1)
    attrs = dict(scale=scale, q_num_heads=heads, kv_num_heads=heads)
    inputs = [q, k, v]
    if _needs_bias(node, square=True):
        inputs.append(mask_bias(e, node, ins, dtype, batch, heads, seq, seq))
    elif node.attrs["causal"]:
        attrs["is_causal"] = 1
    out = e.emit("Attention", inputs, **attrs)
    return [emit_guard(e, node, out, _mask_input(node, ins), seq, seq, joined_heads=True)]
