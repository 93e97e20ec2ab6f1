"""Reductions over a set of axes, and the running sum along one."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.types import TensorType
from ._rules import norm_axis
from .registry import BOOL, DIMS, INT, REQUIRED, define

# name: (numpy, ONNX op, torch function)
_REDUCE = {
    "reduce_mean": (np.mean, "ReduceMean", "mean"),
    "reduce_sum": (np.sum, "ReduceSum", "sum"),
    "reduce_max": (np.max, "ReduceMax", "amax"),
}


def _declare(name, fn, onnx_type, torch_name):
    op = define(name, ("x",), attrs={"axes": (DIMS, REQUIRED), "keepdims": (BOOL, True)},
                cuda="reduce", doc=f"{name.split('_')[1]} over `axes`")

    @op.infer
    def _(types, attrs):
        (x,) = types
        if not x.dtype.is_float and name == "reduce_mean":
            raise ShapeError(f"{name}: needs a floating-point tensor, got {x.dtype.name}")
        axes = {norm_axis(name, a, x.rank) for a in attrs["axes"]}
        if not attrs["axes"]:
            raise ShapeError(f"{name}: needs at least one axis")
        shape = [1 if i in axes else d for i, d in enumerate(x.shape) if attrs["keepdims"] or i not in axes]
        return TensorType(x.dtype, tuple(shape))

    op.numpy(lambda xs, attrs, env: fn(xs[0], axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"]))
    op.onnx(lambda e, node, ins: [e.emit(onnx_type, [ins[0], e.const(np.array(node.attrs["axes"], np.int64))],
                                         keepdims=int(node.attrs["keepdims"]))])
    op.torch(lambda b, node, xs: b.call(getattr(b.torch, torch_name), xs[0], dim=tuple(node.attrs["axes"]),
                                        keepdim=node.attrs["keepdims"]))


for _name, _rules in _REDUCE.items():
    _declare(_name, *_rules)


# ---- cumsum ------------------------------------------------------------------
# Hugging Face's masking code finds packed sequences with a running sum over
# the positions (``(diff(position_ids) != 1).cumsum(-1)``), which every export
# without an attention mask carries. The decomposed form writes it as the sum
# of each position's prefix (O(n^2), over the mask's short int rows); the CUDA
# backend runs it as a scan instead (``codegen/cuda/kernels/scan.py``).
cumsum = define("cumsum", ("x",), attrs={"axis": (INT, REQUIRED), "exclusive": (BOOL, False),
                                         "reverse": (BOOL, False)}, cuda="scan",
                doc="running sum along `axis`: out[i] = sum of x[j] for j <= i (j < i where exclusive; "
                    "j >= i, j > i where reverse): ONNX CumSum")


@cumsum.infer
def _(types, attrs):
    (x,) = types
    norm_axis("cumsum", attrs["axis"], x.rank)
    if x.dtype.name == "bool":
        raise ShapeError("cumsum: needs a numeric tensor, got bool")
    return x


@cumsum.numpy
def _(xs, attrs, env):
    x, axis = xs[0], attrs["axis"]
    x = np.flip(x, axis) if attrs["reverse"] else x
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if attrs["exclusive"]:   # the sum before each position: shifted one along, a zero first
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=axis)),
                              np.delete(out, -1, axis=axis)], axis=axis)
    return np.flip(out, axis) if attrs["reverse"] else out


cumsum.onnx(lambda e, node, ins: [e.emit("CumSum", [ins[0], e.const(np.array(node.attrs["axis"], np.int64))],
                                         exclusive=int(node.attrs["exclusive"]), reverse=int(node.attrs["reverse"]))])


@cumsum.torch
def _(b, node, xs):
    axis = node.attrs["axis"]
    flip = (lambda t: b.call(b.torch.flip, t, (axis,))) if node.attrs["reverse"] else (lambda t: t)
    x = flip(xs[0])
    out = b.call(b.torch.cumsum, x, dim=axis)
    return flip(b.call(b.torch.sub, out, x) if node.attrs["exclusive"] else out)


@cumsum.decompose
def _(b, node, ins):
    # out[i] = sum over j of (j <= i ? x[j] : 0) (j < i, j >= i, j > i as the
    # attributes say): x with a new axis for i after the summed one (j), and
    # that [n, n] triangle shaped to broadcast against it.
    (x,) = ins
    rank = x.type.rank
    axis = norm_axis("cumsum", node.attrs["axis"], rank)
    n = x.type.shape[axis]
    i = b.op("arange", n=n)
    compare = {(False, False): "less_equal", (True, False): "less",
               (False, True): "greater_equal", (True, True): "greater"}[node.attrs["exclusive"], node.attrs["reverse"]]
    taken = b.op(compare, b.op("reshape", i, shape=[n, 1]), b.op("reshape", i, shape=[1, n]))
    taken = b.op("reshape", taken, shape=[n, n] + [1] * (rank - 1 - axis))
    spread = b.op("reshape", x, shape=list(x.type.shape[:axis + 1]) + [1] + list(x.type.shape[axis + 1:]))
    zero = b.op("constant", value=np.zeros((), x.type.dtype.numpy))
    return [b.op("reduce_sum", b.op("where", taken, spread, zero), axes=[axis], keepdims=False)]
