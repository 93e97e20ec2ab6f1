"""Comparisons, boolean logic, ``arange`` and ``expand``: what attention
masks are computed with when a model spells them out (Hugging Face's
exports build the causal and padding masks from index ranges, comparisons
and ``and``), rather than using ``causal_mask``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.dtypes import DType
from ..ir.types import TensorType
from ._rules import broadcast_shapes, fmt, same_dtype
from .registry import DIM, DIMS, REQUIRED, define

# ---- comparisons: bool results ----------------------------------------------
# name: (numpy, ONNX op, torch function, C operator)
_COMPARE = {
    "equal": (np.equal, "Equal", "eq", "=="),
    "less": (np.less, "Less", "lt", "<"),
    "less_equal": (np.less_equal, "LessOrEqual", "le", "<="),
    "greater": (np.greater, "Greater", "gt", ">"),
    "greater_equal": (np.greater_equal, "GreaterOrEqual", "ge", ">="),
}
# name: (numpy, ONNX op, torch function, C operator): bool operands and result
_LOGIC = {
    "logical_and": (np.logical_and, "And", "logical_and", "&&"),
    "logical_or": (np.logical_or, "Or", "logical_or", "||"),
}


def _declare_binary(name, fn, onnx_type, torch_name, c_op, *, bools: bool):
    op = define(name, ("a", "b"), doc=f"elementwise {name} with numpy broadcasting, a bool result",
                cuda="elementwise", cuda_expr=f"({{0}} {c_op} {{1}})")

    @op.infer
    def _(types, attrs):
        dtype = same_dtype(name, types)
        if bools and dtype != DType.bool:
            raise ShapeError(f"{name}: needs bool operands, got {dtype.name}")
        return TensorType(DType.bool, broadcast_shapes(name, *(t.shape for t in types)))

    op.numpy(lambda xs, attrs, env: fn(xs[0], xs[1]))
    op.onnx(lambda e, node, ins: [e.emit(onnx_type, ins)])
    op.torch(lambda b, node, xs: b.call(getattr(b.torch, torch_name), *xs))


for _name, _rules in _COMPARE.items():
    _declare_binary(_name, *_rules, bools=False)
for _name, _rules in _LOGIC.items():
    _declare_binary(_name, *_rules, bools=True)

logical_not = define("logical_not", ("x",), doc="elementwise not of a bool tensor", cuda="elementwise",
                     cuda_expr="(!{0})", flops=0)


@logical_not.infer
def _(types, attrs):
    if types[0].dtype != DType.bool:
        raise ShapeError(f"logical_not: needs a bool tensor, got {types[0].dtype.name}")
    return types[0]


logical_not.numpy(lambda xs, attrs, env: np.logical_not(xs[0]))
logical_not.onnx(lambda e, node, ins: [e.emit("Not", ins)])
logical_not.torch(lambda b, node, xs: b.call(b.torch.logical_not, xs[0]))

# ---- arange -----------------------------------------------------------------
arange = define("arange", (), attrs={"n": (DIM, REQUIRED)}, doc="int64[n]: 0, 1, ..., n-1 (n may be symbolic)",
                cuda="elementwise", cuda_expr="{index}", flops=0)


@arange.infer
def _(types, attrs):
    if isinstance(attrs["n"], int) and attrs["n"] < 0:
        raise ShapeError(f"arange: negative length {attrs['n']}")
    return TensorType(DType.int64, (attrs["n"],))


arange.numpy(lambda xs, attrs, env: np.arange(env.eval_dims([attrs["n"]])[0], dtype=np.int64))
arange.onnx(lambda e, node, ins: [e.emit("Range", [e.const(np.array(0, np.int64)), e.scalar_dim(node.attrs["n"]),
                                                   e.const(np.array(1, np.int64))])])
arange.torch(lambda b, node, xs: b.call(b.torch.arange, b.dim(node.attrs["n"]), dtype=b.torch.int64))

# ---- dim_value --------------------------------------------------------------
dim_value = define("dim_value", (), attrs={"value": (DIM, REQUIRED)}, cuda="elementwise", cuda_expr="{value}",
                   flops=0,
                   doc="int64[]: the size of a (symbolic) dimension, as data (index arithmetic over a sequence)")
dim_value.infer(lambda types, attrs: TensorType(DType.int64, ()))
dim_value.numpy(lambda xs, attrs, env: np.array(env.eval_dims([attrs["value"]])[0], np.int64))
dim_value.onnx(lambda e, node, ins: [e.scalar_dim(node.attrs["value"])])
dim_value.torch(lambda b, node, xs: b.call(b.torch.tensor, b.dim(node.attrs["value"]), dtype=b.torch.int64))

# ---- expand -----------------------------------------------------------------
# An elementwise identity on CUDA: the elementwise kernels already read each
# input at its broadcast offset, and so it joins the chain that reads it.
expand = define("expand", ("x",), attrs={"shape": (DIMS, REQUIRED)}, cuda="elementwise", cuda_expr="{0}", flops=0,
                moves_data=True,
                doc="broadcast to a shape, numpy (ONNX Expand) rules: the result is the broadcast of both")


@expand.infer
def _(types, attrs):
    shape = broadcast_shapes("expand", types[0].shape, tuple(attrs["shape"]))
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ShapeError(f"expand: negative dimension in {fmt(shape)}")
    return types[0].with_shape(shape)


@expand.numpy
def _(xs, attrs, env):
    x = xs[0]
    target = env.eval_dims(attrs["shape"])
    return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(target))).copy()


expand.onnx(lambda e, node, ins: [e.emit("Expand", [ins[0], e.dims(node.attrs["shape"])])])


@expand.torch
def _(b, node, xs):
    return b.method("expand", xs[0], [b.dim(d) for d in node.outputs[0].shape])
