"""Import rules for ONNX's neural-network operators that blockc has as ops of
their own: Softmax, LayerNormalization (and its training outputs), Gelu and
Dropout (inference only)."""
from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ..tensor import apply
from .convert import Rule, Unsupported, _attr, _scalar, axis_of, is_tensor, normalize_from, tensor


def _dropout(node, ins, ctx):
    x = ins[0]
    ratio = _scalar(ins[1]) if len(ins) > 1 and ins[1] is not None else _attr(node, "ratio", 0.5)
    # opset 12 takes the mode as an input; before opset 7 an is_test attribute said it (training by default)
    training = ins[2] if len(ins) > 2 and ins[2] is not None else node.opset < 7 and not _attr(node, "is_test", 0)
    if is_tensor(training) or is_tensor(ratio):
        raise Unsupported("Dropout whose ratio or training mode is computed at run time")
    if bool(_scalar(training)) and float(ratio) != 0.0:
        raise Unsupported("Dropout in training mode (it draws random numbers)")
    shape = list(x.shape) if is_tensor(x) else list(np.shape(x))
    if not is_tensor(x) or all(isinstance(d, int) for d in shape):
        return [x, np.ones(shape, dtype=bool)]
    return [x, apply("expand", tensor(np.array(True)), shape=shape)]


def _last_axis(node, x, default):
    if axis_of(node, x.ndim, default) != x.ndim - 1:
        raise Unsupported(f"{node.op_type} over axis {_attr(node, 'axis', default)} of a rank-{x.ndim} tensor "
                          f"(blockc's is the last axis)")


def _softmax(node, ins, ctx):
    (x,) = ins
    if node.opset < 13:   # before 13 Softmax ran over the axes from `axis` on, flattened: one axis only when last
        _last_axis(node, x, 1)
        return [x.softmax(-1)]
    axis = axis_of(node, x.ndim)
    if axis == x.ndim - 1:
        return [x.softmax(-1)]
    swap = list(range(x.ndim))
    swap[axis], swap[-1] = swap[-1], swap[axis]   # blockc's softmax is over the last axis; a swap undoes itself
    return [x.permute(swap).softmax(-1).permute(swap)]


def _layernorm(node, ins, ctx):
    x, gamma = ins[0], ins[1]
    eps = float(_attr(node, "epsilon", 1e-5))
    axis = axis_of(node, x.ndim)
    beta = ins[2] if len(ins) > 2 and ins[2] is not None else _zeros(list(x.shape[axis:]), x.dtype)
    stats = _layernorm_stats(node, x, axis, eps) if any(o and ctx.used(o) for o in node.output[1:]) else []
    return [normalize_from(axis, "layernorm", x, [gamma, beta], eps=eps), *stats]


def _zeros(shape: list, dtype: DType):
    """Zeros of ``shape`` (an omitted bias: blockc's norms take one of the normalized shape)."""
    if all(isinstance(d, int) for d in shape):
        return np.zeros(shape, dtype.numpy)
    return apply("expand", tensor(np.zeros((), dtype.numpy)), shape=shape)


def _layernorm_stats(node, x, axis, eps):
    """LayerNormalization's optional Mean and InvStdDev outputs (a training graph's), computed
    apart in its stash_type so that Y stays one layernorm for the fusions."""
    stash = DType.from_onnx(_attr(node, "stash_type", 1))
    xs = x if x.dtype == stash else x.cast(stash)
    axes = list(range(axis, x.ndim))
    mean = apply("reduce_mean", xs, axes=axes, keepdims=True)
    centered = xs - mean
    var = apply("reduce_mean", centered * centered, axes=axes, keepdims=True)
    return [mean, apply("reciprocal", apply("sqrt", var + np.array(eps, stash.numpy)))]


def _gelu(node, ins, ctx):
    return [ins[0].gelu(_attr(node, "approximate", "none"))]



# ONNX op type -> how it is imported (ai.onnx)
RULES: dict[str, Rule] = {
    "Gelu": Rule(_gelu, since=20), "Dropout": Rule(_dropout), "Softmax": Rule(_softmax),
    "LayerNormalization": Rule(_layernorm, since=17),
}
