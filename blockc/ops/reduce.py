"""Reductions over a set of axes."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.types import TensorType
from ._rules import norm_axis
from .registry import BOOL, DIMS, REQUIRED, define

# name: (numpy, ONNX op, torch function)
_REDUCE = {
    "reduce_mean": (np.mean, "ReduceMean", "mean"),
    "reduce_sum": (np.sum, "ReduceSum", "sum"),
    "reduce_max": (np.max, "ReduceMax", "amax"),
}


def _declare(name, fn, onnx_type, torch_name):
    op = define(name, ("x",), attrs={"axes": (DIMS, REQUIRED), "keepdims": (BOOL, True)},
                doc=f"{name.split('_')[1]} over `axes`")

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
