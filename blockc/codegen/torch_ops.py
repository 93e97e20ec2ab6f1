"""The per-op table of the PyTorch lowering: op name -> the torch call a
PyTorch user would write for it.

Each entry is ``fn(b, node, xs)``: ``node`` is the IR node, ``xs`` its
inputs as the emitter holds them (torch.fx nodes, or tensors when the node
is folded at build time), and ``b`` the emitter (``blockc/runtime/
torch_runner.py``) with three methods:

* ``b.call(fn, *args, **kw)``    -- a call of a torch function;
* ``b.method(name, x, *args)``   -- a tensor method call, ``x.name(*args)``;
* ``b.dim(d)``                   -- an IR dim (int or symbolic) as an int or,
  for ``seq``-like dims, the expression that computes it from input sizes.

An entry returns one value, or a list for ops with several outputs. This
module imports torch: only the runner imports it, lazily.
"""
from __future__ import annotations

import operator

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from ..ir.dtypes import DType

TORCH_DTYPES = {
    DType.float32: torch.float32, DType.float16: torch.float16, DType.bfloat16: torch.bfloat16,
    DType.float64: torch.float64, DType.int64: torch.int64, DType.int32: torch.int32, DType.bool: torch.bool,
}


def to_torch(array: np.ndarray, dtype: DType, *, copy: bool) -> torch.Tensor:
    """``array`` as a tensor of ``dtype`` (cast if needed; torch has no numpy
    bridge for bfloat16, so its bits travel as int16)."""
    array = np.asarray(array)
    if array.dtype != dtype.numpy:
        array, copy = array.astype(dtype.numpy), False
    if dtype == DType.bfloat16:
        array = array.view(np.int16)
    if copy or not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if dtype == DType.bfloat16 else t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---- elementwise ---------------------------------------------------------------
def _fn(fn):
    return lambda b, node, xs: b.call(fn, *xs)


def _constant(b, node, xs):
    value = node.attrs["value"]
    return to_torch(value, DType.from_numpy(value.dtype), copy=True)


def _cast(b, node, xs):
    return b.method("to", xs[0], TORCH_DTYPES[DType.parse(node.attrs["to"])])


# ---- reductions ----------------------------------------------------------------
def _reduce(fn):
    return lambda b, node, xs: b.call(fn, xs[0], dim=tuple(node.attrs["axes"]), keepdim=node.attrs["keepdims"])


# ---- data movement -------------------------------------------------------------
def _reshape(b, node, xs):
    # ONNX rules: 0 copies the input dim, -1 is inferred; symbolic entries
    # (batch, seq) are computed from the input sizes.
    in_shape = node.inputs[0].shape
    shape = [b.dim(in_shape[i]) if d == 0 else b.dim(d) for i, d in enumerate(node.attrs["shape"])]
    return b.method("reshape", xs[0], shape)


def _split(b, node, xs):
    parts = b.call(torch.split, xs[0], [b.dim(s) for s in node.attrs["sizes"]], dim=node.attrs["axis"])
    return [b.call(operator.getitem, parts, i) for i in range(len(node.outputs))]


def _slice(b, node, xs):
    # narrow, not x[start:end]: it refuses an end past the dim (a sequence
    # longer than max_positions) where indexing would clamp silently.
    start, end = node.attrs["start"], node.attrs["end"]
    return b.call(torch.narrow, xs[0], node.attrs["axis"], b.dim(start), b.dim(end - start))


def _gather(b, node, xs):
    data, idx = xs
    axis = node.attrs["axis"] % node.inputs[0].type.rank
    if axis == 0 and node.inputs[0].type.rank == 2:
        return b.call(F.embedding, idx, data)
    return b.call(operator.getitem, data, (slice(None),) * axis + (idx,))


def _concat(b, node, xs):
    return b.call(torch.cat, list(xs), dim=node.attrs["axis"])


# ---- nn ------------------------------------------------------------------------
def _last_dim(b, node) -> tuple:
    return (b.dim(node.inputs[0].shape[-1]),)


def _layernorm(b, node, xs):
    x, gamma, beta = xs
    return b.call(F.layer_norm, x, _last_dim(b, node), gamma, beta, node.attrs["eps"])


def _rmsnorm(b, node, xs):
    x, gamma = xs
    return b.call(F.rms_norm, x, _last_dim(b, node), gamma, node.attrs["eps"])


def _causal(b, rows, cols):
    """bool[rows, cols], true where key j may be seen by query i (j <= i + cols - rows)."""
    ones = b.call(torch.ones, b.dim(rows), b.dim(cols), dtype=torch.bool)
    return b.method("tril", ones, b.dim(cols - rows))


def _fill(node, dtype: DType) -> float:
    # A fill below the dtype's range (float32's lowest in a float16 graph)
    # would overflow; the dtype's own lowest value masks the same way.
    return max(node.attrs["fill"], dtype.lowest)


def _masked_scores(b, node, s, masks, rows, cols):
    """scale, then the additive / boolean mask, then the causal mask, on scores ``s``."""
    attrs = node.attrs
    fill = _fill(node, node.outputs[0].dtype)
    if attrs["scale"] != 1.0:
        s = b.call(torch.mul, s, attrs["scale"])
    if attrs["mask"] == "additive":
        s = b.call(torch.add, s, masks[0])
    elif attrs["mask"] == "bool":
        s = b.call(torch.where, masks[0], s, fill)
    if attrs["causal"]:
        s = b.call(torch.where, _causal(b, rows, cols), s, fill)
    return s


def _masked_softmax(b, node, xs):
    shape = node.inputs[0].shape
    return b.call(torch.softmax, _masked_scores(b, node, xs[0], xs[1:], shape[-2], shape[-1]), -1)


def _attention(b, node, xs):
    q, k, v = xs[:3]
    tq, tk, tv = (x.type for x in node.inputs[:3])
    rows, cols = tq.shape[-2], tk.shape[-2]
    if tq.rank != 4 or not tq.shape[:-2] == tk.shape[:-2] == tv.shape[:-2]:
        # Broadcast batch dims: spell it out rather than lean on the SDPA kernels.
        scores = b.call(torch.matmul, q, b.call(torch.transpose, k, -2, -1))
        probs = b.call(torch.softmax, _masked_scores(b, node, scores, xs[3:], rows, cols), -1)
        return b.call(torch.matmul, probs, v)
    return _sdpa(b, node, q, k, v, xs[3:], rows, cols)


def _sdpa(b, node, q, k, v, masks, rows, cols):
    """scaled_dot_product_attention with blockc's masking.

    SDPA masks with -inf and aligns is_causal to the top left; blockc fills
    with `fill` and aligns the causal mask to the bottom right (KV caches).
    An additive bias holding `fill` keeps blockc's meaning, fully masked rows
    included (they average v, they are not NaN)."""
    attrs = node.attrs
    dtype = node.outputs[0].dtype
    fill = _fill(node, dtype)
    bias, is_causal = None, False
    if attrs["mask"] == "additive":
        bias = masks[0]
    elif attrs["mask"] == "bool":
        zeros = b.call(torch.zeros_like, masks[0], dtype=TORCH_DTYPES[dtype])
        bias = b.method("masked_fill", zeros, b.call(torch.logical_not, masks[0]), fill)
    if attrs["causal"]:
        if bias is None and rows == cols:
            is_causal = True
        else:
            allowed = _causal(b, rows, cols)
            if bias is None:
                zeros = b.call(torch.zeros_like, allowed, dtype=TORCH_DTYPES[dtype])
                bias = b.method("masked_fill", zeros, b.call(torch.logical_not, allowed), fill)
            else:
                bias = b.call(torch.where, allowed, bias, fill)
    return b.call(F.scaled_dot_product_attention, q, k, v, attn_mask=bias, is_causal=is_causal,
                  scale=attrs["scale"])


def _qkv_attention(b, node, xs):
    x, w, bias = xs[:3]
    heads, sizes = node.attrs["heads"], list(node.attrs["sizes"])
    y = b.call(F.linear, x, b.method("t", w), bias)          # w is [in, out]; linear takes [out, in]
    parts = b.call(torch.split, y, sizes, dim=-1)
    q, k, v = (b.method("transpose", b.method("unflatten", b.call(operator.getitem, parts, i), -1,
                                              (heads, size // heads)), 1, 2)
               for i, size in enumerate(sizes))
    seq = node.inputs[0].shape[1]
    out = _sdpa(b, node, q, k, v, xs[3:], seq, seq)
    return b.method("flatten", b.method("transpose", out, 1, 2), -2)


def _add_norm(norm):
    def lower(b, node, xs):
        total = b.call(torch.add, xs[0], xs[1])
        y = norm(b, node, [total] + list(xs[2:]))
        return [y, total] if node.attrs["with_sum"] else [y]
    return lower


_ACTIVATIONS = {"relu": (F.relu, {}), "gelu": (F.gelu, {}), "gelu_tanh": (F.gelu, {"approximate": "tanh"})}


def _matmul_bias_act(b, node, xs):
    x, w, bias = xs
    if node.inputs[1].type.rank == 2:
        # blockc's weights are [in, out]: F.linear takes [out, in], so w.t()
        # (a view; linear's addmm reads it back untransposed and adds the bias).
        y = b.call(F.linear, x, b.method("t", w), bias)
    else:
        y = b.call(torch.add, b.call(torch.matmul, x, w), bias)
    fn, kw = _ACTIVATIONS[node.attrs["activation"]]
    return b.call(fn, y, **kw)


LOWERINGS = {
    "add": _fn(torch.add), "sub": _fn(torch.sub), "mul": _fn(torch.mul), "div": _fn(torch.div),
    "pow": _fn(torch.pow), "neg": _fn(torch.neg), "exp": _fn(torch.exp), "sqrt": _fn(torch.sqrt),
    "reciprocal": _fn(torch.reciprocal), "tanh": _fn(torch.tanh), "erf": _fn(torch.erf), "relu": _fn(torch.relu),
    "where": _fn(torch.where),
    "cast": _cast,
    "constant": _constant,
    "reduce_mean": _reduce(torch.mean), "reduce_sum": _reduce(torch.sum), "reduce_max": _reduce(torch.amax),
    "matmul": _fn(torch.matmul),
    "transpose": lambda b, node, xs: b.method("permute", xs[0], list(node.attrs["perm"])),
    "reshape": _reshape,
    "concat": _concat,
    "split": _split,
    "slice": _slice,
    "gather": _gather,
    "softmax": lambda b, node, xs: b.call(torch.softmax, xs[0], node.attrs["axis"]),
    "gelu": lambda b, node, xs: b.call(F.gelu, xs[0], approximate=node.attrs["approximate"]),
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "causal_mask": lambda b, node, xs: _causal(b, node.attrs["rows"], node.attrs["cols"]),
    "masked_softmax": _masked_softmax,
    "attention": _attention,
    "qkv_attention": _qkv_attention,
    "add_layernorm": _add_norm(_layernorm),
    "add_rmsnorm": _add_norm(_rmsnorm),
    "matmul_bias_act": _matmul_bias_act,
}
