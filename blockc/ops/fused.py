"""Fused ops made by the fusion passes.

Each one's ``decompose`` rule is its exact meaning in standard ops: it is
what the ``function`` ONNX encoding emits as the function body, what a
target without a kernel for the op runs (``passes.legalize``), and what the
numbers of a fused graph are checked against. Masks mean what
``ops/masking.py`` says, on every target.
"""
from __future__ import annotations

import operator

import numpy as np

from ..errors import ShapeError
from ..ir.dims import evaluate
from ..ir.dtypes import DType
from ..ir.types import TensorType
from ._rules import broadcast_shapes, elementwise, fmt, matmul_flops, numel, same_dtype
from .activations import ACTIVATIONS
from .masking import DEFAULT_FILL, apply_masks, causal_mask_array, causal_visible, fill_for, guard_rows
from .nn import layernorm_numpy, rmsnorm_numpy, torch_causal_mask, torch_layernorm, torch_rmsnorm
from .registry import BOOL, DIMS, FLOAT, INT, REQUIRED, STR, define, get

MASK_KINDS = ("none", "additive", "bool")


def _mask_rule(op: str, scores: TensorType, masks: list[TensorType], attrs) -> None:
    kind = attrs["mask"]
    if kind not in MASK_KINDS:
        raise ShapeError(f"{op}: mask must be one of {', '.join(MASK_KINDS)}, got {kind!r}")
    if (kind == "none") != (not masks) or len(masks) > 1:
        raise ShapeError(f"{op}: mask={kind!r} takes {'no' if kind == 'none' else 'one'} mask input")
    if masks:
        m = masks[0]
        want = DType.bool if kind == "bool" else scores.dtype
        if m.dtype != want:
            raise ShapeError(f"{op}: a {kind} mask must be {want.name}, got {m.dtype.name}")
        if broadcast_shapes(op, m.shape, scores.shape) != scores.shape:
            raise ShapeError(f"{op}: mask {fmt(m.shape)} does not broadcast to {fmt(scores.shape)}")
    if scores.rank < 2 and attrs["causal"]:
        raise ShapeError(f"{op}: a causal mask needs rank >= 2")


def _apply_mask(b, s, masks, attrs):
    """The standard-op form of scale, mask and causal mask on scores ``s``."""
    rows, cols = s.shape[-2:] if s.type.rank >= 2 else (None, None)
    return apply_masks(s, masks, attrs, mul=lambda x, k: b.op("mul", x, b.const(k, x.dtype)),
                       add=lambda x, m: b.op("add", x, m), where=lambda c, x, f: b.op("where", c, x, f),
                       fill=b.const(attrs["fill"], s.dtype), causal=lambda: b.op("causal_mask", rows=rows, cols=cols))


def _numpy_mask(s, masks, attrs, env):
    return apply_masks(s, masks, attrs, mul=lambda x, k: x * np.asarray(k, x.dtype), add=np.add, where=np.where,
                       fill=np.asarray(attrs["fill"], s.dtype), causal=lambda: causal_mask_array(*s.shape[-2:]))


def torch_masked_scores(b, node, s, masks, rows, cols):
    """scale, then the additive / boolean mask, then the causal mask, on scores ``s``."""
    fill = fill_for(node.attrs["fill"], node.outputs[0].dtype.lowest)
    return apply_masks(s, masks, node.attrs, mul=lambda x, k: b.call(b.torch.mul, x, k),
                       add=lambda x, m: b.call(b.torch.add, x, m), where=lambda c, x, f: b.call(b.torch.where, c, x, f),
                       fill=fill, causal=lambda: torch_causal_mask(b, rows, cols))


def _softmax_last(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


_MASK_ATTRS = {"scale": (FLOAT, 1.0), "mask": (STR, "none"), "causal": (BOOL, False),
               "fill": (FLOAT, DEFAULT_FILL)}
# The attention ops add ``guarded``: a query row with no key to attend gives
# zeros (masking.guard_rows), as PyTorch's SDPA and the files it exports do.
ATTENTION_ATTRS = {**_MASK_ATTRS, "guarded": (BOOL, False)}


def attention_attrs(attrs: dict) -> dict:
    """What of a node's ``attrs`` is ``attention``'s own (a fused op built on it passes these on)."""
    return {name: attrs[name] for name in ATTENTION_ATTRS}
MASKED_SOFTMAX_FLOPS = 6  # per score: scale, mask, max, subtract, exp, sum, divide

# ---- masked_softmax ------------------------------------------------------------
def causal_traffic(scored_from: int, scores_shape):
    """The traffic rule of a masked op whose inputs from ``scored_from`` on
    are the scores and masks, ``scores_shape(node)`` the scores' ``(rows,
    cols)``: an ideal causal kernel loads only the entries its rows see of
    each of those as large as the scores, every other input once, and
    writes every output."""
    def rule(node, bindings) -> tuple[int, int]:
        rows, cols = (evaluate(d, bindings) for d in scores_shape(node))
        seen, read = set(), 0
        for k, v in enumerate(node.inputs):
            if id(v) in seen:
                continue
            seen.add(id(v))
            nbytes = v.type.nbytes(bindings)
            if node.attrs["causal"] and k >= scored_from and rows * cols and v.type.rank >= 2 \
                    and tuple(evaluate(d, bindings) for d in v.shape[-2:]) == (rows, cols):
                nbytes = nbytes * causal_visible(rows, cols) // (rows * cols)
            read += nbytes
        return read, sum(o.type.nbytes(bindings) for o in node.outputs)
    return rule


masked_softmax = define("masked_softmax", ("x", "*mask"), attrs=dict(_MASK_ATTRS),
                        doc="softmax(mask(x * scale)) over the last axis; the causal mask from indices",
                        fused=True, colour="#E45756", cuda="softmax", flops=MASKED_SOFTMAX_FLOPS,
                        traffic=causal_traffic(0, lambda node: node.inputs[0].shape[-2:]))


@masked_softmax.infer
def _(types, attrs):
    x = types[0]
    if not x.dtype.is_float:
        raise ShapeError(f"masked_softmax: needs a floating-point tensor, got {x.dtype.name}")
    _mask_rule("masked_softmax", x, types[1:], attrs)
    return x


masked_softmax.numpy(lambda xs, attrs, env: _softmax_last(_numpy_mask(xs[0], xs[1:], attrs, env)))


@masked_softmax.decompose
def _(b, node, ins):
    return [b.op("softmax", _apply_mask(b, ins[0], ins[1:], node.attrs), axis=-1)]


@masked_softmax.torch
def _(b, node, xs):
    shape = node.inputs[0].shape
    return b.call(b.torch.softmax, torch_masked_scores(b, node, xs[0], xs[1:], shape[-2], shape[-1]), -1)


# ---- attention ------------------------------------------------------------------------
def attention_flops(q, keys, dv, bindings) -> int:
    """QKᵀ and PV, plus the masked softmax on the scores, of queries of shape
    ``q`` over ``keys`` keys with values ``dv`` wide."""
    scores = numel(q[:-1], bindings) * evaluate(keys, bindings)
    return scores * (2 * evaluate(q[-1], bindings) + 2 * evaluate(dv, bindings) + MASKED_SOFTMAX_FLOPS)


def _attention_flops(node, bindings) -> int:
    return attention_flops(node.inputs[0].shape, node.inputs[1].shape[-2], node.outputs[0].shape[-1], bindings)


attention = define("attention", ("q", "k", "v", "*mask"), attrs=dict(ATTENTION_ATTRS),
                   doc="softmax(mask(q kᵀ * scale)) v over the last two axes; k is [..., k_len, d_k]; guarded: "
                       "a query row with no key to attend gives zeros, not the mean of v",
                   fused=True, colour="#F58518", cuda="attention", flops=_attention_flops,
                   traffic=causal_traffic(3, lambda node: (node.inputs[0].shape[-2], node.inputs[1].shape[-2])))


def takes_queries(op: str) -> bool:
    """Whether ``op``'s first input is queries ``[b, heads, seq, d]`` (or
    grouped ``[b, kv_heads, group, seq, d]``): an op that declares it ``q``,
    as attention and the cache steps built on it do."""
    return get(op).inputs[:1] == ("q",)


@attention.infer
def _(types, attrs):
    q, k, v = types[:3]
    dtype = same_dtype("attention", [q, k, v], floats=True)
    if not (q.rank == k.rank == v.rank and q.rank >= 2):
        raise ShapeError(f"attention: q, k, v must have the same rank >= 2, got {q}, {k}, {v}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"attention: q {fmt(q.shape)}, k {fmt(k.shape)}, v {fmt(v.shape)} do not fit")
    batch = broadcast_shapes("attention", q.shape[:-2], k.shape[:-2], v.shape[:-2])
    _mask_rule("attention", TensorType(dtype, batch + (q.shape[-2], k.shape[-2])), types[3:], attrs)
    check_guard("attention", attrs)
    return TensorType(dtype, batch + (q.shape[-2], v.shape[-1]))


def check_guard(op: str, attrs) -> None:
    if attrs["guarded"] and attrs["mask"] == "additive":
        raise ShapeError(f"{op}: guarded takes a boolean mask or none: an additive mask forbids no key, so no "
                         f"row is left without one")


def numpy_guard(out, masks, attrs, rows: int, cols: int):
    """``out`` with the rows that see no key zeroed where ``attrs`` say guarded."""
    return guard_rows(out, masks, attrs, logical_and=np.logical_and, causal=lambda: causal_mask_array(rows, cols),
                      any_key=lambda a: a.any(axis=-1, keepdims=True), where=np.where,
                      zero=np.zeros((), out.dtype))


def decompose_guard(b, out, masks, attrs, rows, cols):
    """``numpy_guard`` in standard ops (``rows``, ``cols``: the scores' dims)."""
    def any_key(allowed):
        seen = b.op("reduce_max", b.op("cast", allowed, to=DType.float32.name), axes=[-1], keepdims=True)
        return b.op("cast", seen, to=DType.bool.name)
    return guard_rows(out, masks, attrs, logical_and=lambda x, y: b.op("logical_and", x, y),
                      causal=lambda: b.op("causal_mask", rows=rows, cols=cols), any_key=any_key,
                      where=lambda c, x, f: b.op("where", c, x, f), zero=b.const(0.0, out.type.dtype))


def torch_guard(b, out, masks, attrs, rows, cols):
    """``numpy_guard`` in torch calls."""
    return guard_rows(out, masks, attrs, logical_and=lambda x, y: b.call(b.torch.logical_and, x, y),
                      causal=lambda: torch_causal_mask(b, rows, cols),
                      any_key=lambda a: b.method("any", a, -1, keepdim=True),
                      where=lambda c, x, f: b.call(b.torch.where, c, x, f), zero=0.0)


@attention.numpy
def _(xs, attrs, env):
    q, k, v = xs[:3]
    out = _softmax_last(_numpy_mask(q @ np.swapaxes(k, -1, -2), xs[3:], attrs, env)) @ v
    return numpy_guard(out, xs[3:], attrs, q.shape[-2], k.shape[-2])


@attention.decompose
def _(b, node, ins):
    # Into masked_softmax, not further: a backend with a masked_softmax kernel
    # but no attention kernel still gets the fused softmax.
    q, k, v = ins[:3]
    perm = list(range(k.type.rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    scores = b.op("matmul", q, b.op("transpose", k, perm=perm))
    attrs = {name: node.attrs[name] for name in _MASK_ATTRS}
    out = b.op("matmul", b.op("masked_softmax", scores, *ins[3:], **attrs), v)
    return [decompose_guard(b, out, ins[3:], node.attrs, q.type.shape[-2], k.type.shape[-2])]


@attention.torch
def _(b, node, xs):
    q, k, v = xs[:3]
    tq, tk, tv = (x.type for x in node.inputs[:3])
    rows, cols = tq.shape[-2], tk.shape[-2]
    if tq.rank != 4 or not tq.shape[:-2] == tk.shape[:-2] == tv.shape[:-2]:
        # Broadcast batch dims: spell it out rather than lean on the SDPA kernels.
        scores = b.call(b.torch.matmul, q, b.call(b.torch.transpose, k, -2, -1))
        probs = b.call(b.torch.softmax, torch_masked_scores(b, node, scores, xs[3:], rows, cols), -1)
        return torch_guard(b, b.call(b.torch.matmul, probs, v), xs[3:], node.attrs, rows, cols)
    return torch_guard(b, _sdpa(b, node, q, k, v, xs[3:], rows, cols), xs[3:], node.attrs, rows, cols)


def _sdpa(b, node, q, k, v, masks, rows, cols):
    """scaled_dot_product_attention with blockc's masking.

    SDPA masks with -inf and aligns is_causal to the top left; blockc fills
    with `fill` and aligns the causal mask to the bottom right (KV caches).
    An additive bias holding `fill` keeps blockc's meaning, fully masked rows
    included (they average v, they are not NaN)."""
    attrs = node.attrs
    dtype = node.outputs[0].dtype
    fill = fill_for(attrs["fill"], dtype.lowest)
    torch = b.torch

    def as_bias(allowed):
        zeros = b.call(torch.zeros_like, allowed, dtype=b.dtype(dtype))
        return b.method("masked_fill", zeros, b.call(torch.logical_not, allowed), fill)

    bias, is_causal = None, False
    if attrs["mask"] == "additive":
        bias = masks[0]
    elif attrs["mask"] == "bool":
        bias = as_bias(masks[0])
    if attrs["causal"]:
        if bias is None and rows == cols:
            is_causal = True   # top left and bottom right agree on a square mask
        else:
            allowed = torch_causal_mask(b, rows, cols)
            bias = as_bias(allowed) if bias is None else b.call(torch.where, allowed, bias, fill)
    return b.call(b.F.scaled_dot_product_attention, q, k, v, attn_mask=bias, is_causal=is_causal,
                  scale=attrs["scale"])


# ---- grouped-query attention: attention's broadcast over shared K/V heads ------------------
def kv_as_read(dims, grouped: bool) -> tuple:
    """K or V dims ``[b, kv_heads, t, d]`` as attention reads them: a grouped
    q ``[b, kv_heads, group, s, d]`` reads them as ``[b, kv_heads, 1, t, d]``
    (one K/V head per group, broadcast over its members). ``dims`` may be a
    reshape's target (0 and -1 by ONNX rules): the rule is the same."""
    return (*dims[:2], 1, *dims[2:]) if grouped else tuple(dims)


def group_heads(q, k, v, mask, kv_heads: int, reshape):
    """Grouped-query attention as ``attention`` computes it: by broadcasting,
    without copying K and V per query head. ``q`` ``[b, heads, s, d]`` is
    viewed as ``[b, kv_heads, group, s, d]``, so query head ``h`` is
    ``(h // group, h % group)`` and reads key/value head ``h // group``; ``k``
    and ``v`` ``[b, kv_heads, t, d]`` as ``[b, kv_heads, 1, t, d]`` (taken as
    they are when already 5-D); a ``mask`` over ``[..., heads, s, t]`` as one
    over ``[..., kv_heads, group, s, t]`` (one without a heads axis broadcasts
    as it is). ``reshape(x, dims)`` is the caller's (a traced tensor's, a
    builder's), dims by ONNX rules; ``ungroup_heads`` joins the output back.

    The DSL's ``grouped_attention`` and ``passes/fuse_repeat_kv.py`` (a
    repeat written out by an exporter) both build it here.
    """
    heads = q.shape[1]
    group = heads // kv_heads
    q = reshape(q, [0, kv_heads, group, -1, q.shape[-1]])
    k, v = (x if len(x.shape) == 5 else reshape(x, list(kv_as_read([0, kv_heads, -1, x.shape[-1]], True)))
            for x in (k, v))
    if mask is not None and len(mask.shape) >= 3:
        *lead, h, rows, cols = mask.shape
        if h not in (1, heads):
            raise ShapeError(f"attention mask of shape {fmt(mask.shape)} has {h} heads, the attention {heads}")
        mask = reshape(mask, [*lead, 1, 1, rows, cols] if h == 1 else [*lead, kv_heads, group, rows, cols])
    return q, k, v, mask


def ungroup_heads(o, reshape):
    """``[b, kv_heads, group, s, d]`` -> ``[b, heads, s, d]``: ``group_heads`` undone on attention's output."""
    return reshape(o, [0, o.shape[1] * o.shape[2], -1, o.shape[-1]])


# ---- qkv_attention --------------------------------------------------------------------
def _qkv_attention_flops(node, bindings) -> int:
    # the packed projection and its bias, then the core per head
    x = node.inputs[0].shape
    heads, (dq, _, dv) = node.attrs["heads"], node.attrs["sizes"]
    tokens = numel(x[:-1], bindings)
    scores = tokens * heads * evaluate(x[-2], bindings)
    width = 2 * dq + dv
    return 2 * tokens * evaluate(x[-1], bindings) * width + tokens * width \
        + scores * (2 * (dq // heads) + 2 * (dv // heads) + MASKED_SOFTMAX_FLOPS)


qkv_attention = define(
    "qkv_attention", ("x", "w", "bias", "*mask"),
    attrs={"heads": (INT, REQUIRED), "sizes": (DIMS, REQUIRED), **ATTENTION_ATTRS},
    doc="multi-head self-attention through one packed projection: q, k, v = split(x @ w + bias, sizes), "
        "each cut into `heads` heads, attention per head, the heads joined again",
    fused=True, flops=_qkv_attention_flops)


def _qkv_heads(attrs) -> tuple[int, int, int]:
    """(heads, q/k head size, v head size)."""
    h, (dq, _, dv) = attrs["heads"], attrs["sizes"]
    return h, dq // h, dv // h


@qkv_attention.infer
def _(types, attrs):
    x, w, bias = types[:3]
    dtype = same_dtype("qkv_attention", [x, w, bias], floats=True)
    sizes, heads = list(attrs["sizes"]), attrs["heads"]
    if len(sizes) != 3 or not all(isinstance(d, int) and d > 0 for d in sizes) or sizes[0] != sizes[1]:
        raise ShapeError(f"qkv_attention: sizes must be three fixed widths [q, k, v] with q = k, got {sizes}")
    if heads <= 0 or any(d % heads for d in sizes):
        raise ShapeError(f"qkv_attention: {heads} heads do not divide the widths {sizes}")
    if x.rank != 3:
        raise ShapeError(f"qkv_attention: x must be [batch, seq, hidden], got {x}")
    if w.rank != 2 or w.shape != (x.shape[-1], sum(sizes)) or bias.shape != (sum(sizes),):
        raise ShapeError(f"qkv_attention: w {fmt(w.shape)} and bias {fmt(bias.shape)} must be "
                         f"[{x.shape[-1]}, {sum(sizes)}] and [{sum(sizes)}] for x {fmt(x.shape)}")
    batch, seq = x.shape[:2]
    _mask_rule("qkv_attention", TensorType(dtype, (batch, heads, seq, seq)), types[3:], attrs)
    check_guard("qkv_attention", attrs)
    return TensorType(dtype, (batch, seq, sizes[2]))


@qkv_attention.numpy
def _(xs, attrs, env):
    x, w, bias = xs[:3]
    h, d, dv = _qkv_heads(attrs)
    dq = attrs["sizes"][0]
    y = x @ w + bias
    batch, seq = x.shape[:2]

    def heads(part, size):   # [b, s, h*size] -> [b, h, s, size]
        return part.reshape(batch, seq, h, size).transpose(0, 2, 1, 3)

    q, k, v = heads(y[..., :dq], d), heads(y[..., dq:2 * dq], d), heads(y[..., 2 * dq:], dv)
    out = _softmax_last(_numpy_mask(q @ np.swapaxes(k, -1, -2), xs[3:], attrs, env)) @ v
    out = numpy_guard(out, xs[3:], attrs, seq, seq)
    return out.transpose(0, 2, 1, 3).reshape(batch, seq, h * dv)


@qkv_attention.decompose
def _(b, node, ins):
    # Into attention, not further: a backend with an attention kernel but no
    # projection-and-attention kernel still gets the fused core.
    h, d, dv = _qkv_heads(node.attrs)
    sizes = list(node.attrs["sizes"])
    y = b.op("add", b.op("matmul", ins[0], ins[1]), ins[2])
    parts = b.node("split", y, axis=-1, sizes=sizes).outputs
    q, k, v = (b.op("transpose", b.op("reshape", p, shape=[0, 0, h, size]), perm=[0, 2, 1, 3])
               for p, size in zip(parts, (d, d, dv)))
    attrs = attention_attrs(node.attrs)
    out = b.op("attention", q, k, v, *ins[3:], **attrs)
    return [b.op("reshape", b.op("transpose", out, perm=[0, 2, 1, 3]), shape=[0, 0, h * dv])]


@qkv_attention.torch
def _(b, node, xs):
    x, w, bias = xs[:3]
    heads, sizes = node.attrs["heads"], list(node.attrs["sizes"])
    y = b.call(b.F.linear, x, b.method("t", w), bias)          # w is [in, out]; linear takes [out, in]
    parts = b.call(b.torch.split, y, sizes, dim=-1)
    q, k, v = (b.method("transpose", b.method("unflatten", b.call(operator.getitem, parts, i), -1,
                                              (heads, size // heads)), 1, 2)
               for i, size in enumerate(sizes))
    seq = node.inputs[0].shape[1]
    out = torch_guard(b, _sdpa(b, node, q, k, v, xs[3:], seq, seq), xs[3:], node.attrs, seq, seq)
    return b.method("flatten", b.method("transpose", out, 1, 2), -2)


# ---- add_layernorm / add_rmsnorm -------------------------------------------------
def _add_norm_infer(name, types, attrs, n_params):
    x, r, params = types[0], types[1], types[2:]
    out = elementwise(name, [x, r], floats=True)
    if out.shape != x.shape:
        raise ShapeError(f"{name}: the residual {fmt(r.shape)} must broadcast into the input {fmt(x.shape)}")
    for p in params:
        if p.dtype != x.dtype or p.shape != x.shape[-1:]:
            raise ShapeError(f"{name}: scale/bias must be {x.dtype.short}{fmt(x.shape[-1:])}, got {p}")
    return [out, out] if attrs["with_sum"] else [out]


add_layernorm = define("add_layernorm", ("x", "residual", "gamma", "beta"),
                       outputs=lambda attrs, n: 2 if attrs["with_sum"] else 1,
                       attrs={"eps": (FLOAT, 1e-5), "with_sum": (BOOL, False)},
                       doc="layernorm(x + residual); with_sum also returns x + residual (pre-norm stacks need it)",
                       fused=True, colour="#B279A2", cuda="row_norm", flops=8)
add_layernorm.infer(lambda types, attrs: _add_norm_infer("add_layernorm", types, attrs, 2))


@add_layernorm.numpy
def _(xs, attrs, env):
    x, r, g, b = xs
    s = x + r
    y = layernorm_numpy(s, g, b, attrs["eps"])
    return [y, s] if attrs["with_sum"] else [y]


@add_layernorm.decompose
def _(b, node, ins):
    s = b.op("add", ins[0], ins[1])
    y = b.op("layernorm", s, ins[2], ins[3], eps=node.attrs["eps"])
    return [y, s] if node.attrs["with_sum"] else [y]


add_rmsnorm = define("add_rmsnorm", ("x", "residual", "gamma"),
                     outputs=lambda attrs, n: 2 if attrs["with_sum"] else 1,
                     attrs={"eps": (FLOAT, 1e-6), "with_sum": (BOOL, False)},
                     doc="rmsnorm(x + residual); with_sum also returns x + residual",
                     fused=True, colour="#9D755D", cuda="row_norm", flops=5)
add_rmsnorm.infer(lambda types, attrs: _add_norm_infer("add_rmsnorm", types, attrs, 1))


@add_rmsnorm.numpy
def _(xs, attrs, env):
    x, r, g = xs
    s = x + r
    y = rmsnorm_numpy(s, g, attrs["eps"])
    return [y, s] if attrs["with_sum"] else [y]


@add_rmsnorm.decompose
def _(b, node, ins):
    s = b.op("add", ins[0], ins[1])
    y = b.op("rmsnorm", s, ins[2], eps=node.attrs["eps"])
    return [y, s] if node.attrs["with_sum"] else [y]


def _add_norm_torch(norm):
    def lower(b, node, xs):
        total = b.call(b.torch.add, xs[0], xs[1])
        y = norm(b, node, [total] + list(xs[2:]))
        return [y, total] if node.attrs["with_sum"] else [y]
    return lower


add_layernorm.torch(_add_norm_torch(torch_layernorm))
add_rmsnorm.torch(_add_norm_torch(torch_rmsnorm))


# ---- matmul_bias_act -----------------------------------------------------------------
matmul_bias_act = define("matmul_bias_act", ("x", "w", "bias"), attrs={"activation": (STR, "relu")},
                         doc="act(x @ w + bias), act one of ops/activations.py's ACTIVATIONS",
                         fused=True, colour="#EECA3B", cuda="gemm",
                         # the GEMM plus bias and activation per element
                         flops=lambda node, bindings: matmul_flops(node, bindings)
                         + 2 * numel(node.outputs[0].shape, bindings))


@matmul_bias_act.infer
def _(types, attrs):
    if attrs["activation"] not in ACTIVATIONS:
        raise ShapeError(f"matmul_bias_act: activation must be one of {', '.join(ACTIVATIONS)}")
    y = get("matmul").infer_fn(types[:2], {})
    bias = types[2]
    if bias.dtype != y.dtype or bias.shape != y.shape[-1:]:
        raise ShapeError(f"matmul_bias_act: bias must be {y.dtype.short}{fmt(y.shape[-1:])}, got {bias}")
    return y


@matmul_bias_act.numpy
def _(xs, attrs, env):
    act = ACTIVATIONS[attrs["activation"]]
    return get(act.op).numpy_fn([xs[0] @ xs[1] + xs[2]], dict(act.attrs), env)


@matmul_bias_act.decompose
def _(b, node, ins):
    act = ACTIVATIONS[node.attrs["activation"]]
    return [b.op(act.op, b.op("add", b.op("matmul", ins[0], ins[1]), ins[2]), **act.attrs)]


@matmul_bias_act.torch
def _(b, node, xs):
    x, w, bias = xs
    if node.inputs[1].type.rank == 2:
        # blockc's weights are [in, out]: F.linear takes [out, in], so w.t()
        # (a view; linear's addmm reads it back untransposed and adds the bias).
        y = b.call(b.F.linear, x, b.method("t", w), bias)
    else:
        y = b.call(b.torch.add, b.call(b.torch.matmul, x, w), bias)
    act = ACTIVATIONS[node.attrs["activation"]]
    return b.call(getattr(b.F, act.torch), y, **act.attrs)   # F.relu, F.gelu, F.silu
