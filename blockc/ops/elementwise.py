"""Elementwise ops: arithmetic, unary math, where, cast, constant."""
from __future__ import annotations

import numpy as np
import scipy.special

from ..errors import ShapeError
from ..ir.dtypes import DType
from ..ir.types import TensorType
from ._rules import broadcast_shapes, elementwise, same_dtype
from .registry import REQUIRED, STR, TENSOR, define

# ---- binary arithmetic ----------------------------------------------------
_BINARY = {
    "add": (np.add, "Add"),
    "sub": (np.subtract, "Sub"),
    "mul": (np.multiply, "Mul"),
    "div": (np.divide, "Div"),
    "pow": (np.power, "Pow"),
}


def _declare_binary(name, fn, onnx_type):
    op = define(name, ("a", "b"), doc=f"elementwise {name} with numpy broadcasting")
    op.infer(lambda types, attrs: elementwise(name, types))
    op.numpy(lambda xs, attrs, env: fn(xs[0], xs[1]))
    op.onnx(lambda e, node, ins: [e.emit(onnx_type, ins)])


for _name, (_fn, _onnx) in _BINARY.items():
    _declare_binary(_name, _fn, _onnx)

# ---- unary math -------------------------------------------------------------
_UNARY = {
    "neg": (np.negative, "Neg", False),
    "exp": (np.exp, "Exp", True),
    "sqrt": (np.sqrt, "Sqrt", True),
    "reciprocal": (np.reciprocal, "Reciprocal", True),
    "tanh": (np.tanh, "Tanh", True),
    "erf": (scipy.special.erf, "Erf", True),
    "relu": (lambda x: np.maximum(x, np.zeros((), x.dtype)), "Relu", False),
}


def _declare_unary(name, fn, onnx_type, floats):
    op = define(name, ("x",), doc=f"elementwise {name}")
    op.infer(lambda types, attrs: elementwise(name, types, floats=floats))
    op.numpy(lambda xs, attrs, env: fn(xs[0]))
    op.onnx(lambda e, node, ins: [e.emit(onnx_type, ins)])


for _name, (_fn, _onnx, _floats) in _UNARY.items():
    _declare_unary(_name, _fn, _onnx, _floats)

# ---- where ------------------------------------------------------------------
where = define("where", ("cond", "x", "y"), doc="cond ? x : y, broadcasting all three")


@where.infer
def _(types, attrs):
    cond, x, y = types
    if cond.dtype != DType.bool:
        raise ShapeError(f"where: the condition must be bool, got {cond.dtype.name}")
    dtype = same_dtype("where", [x, y])
    return TensorType(dtype, broadcast_shapes("where", cond.shape, x.shape, y.shape))


where.numpy(lambda xs, attrs, env: np.where(*xs))
where.onnx(lambda e, node, ins: [e.emit("Where", ins)])

# ---- cast -----------------------------------------------------------------
cast = define("cast", ("x",), attrs={"to": (STR, REQUIRED)}, doc="convert the element type")


@cast.infer
def _(types, attrs):
    try:
        return types[0].with_dtype(DType.parse(attrs["to"]))
    except KeyError:
        raise ShapeError(f"cast: unknown dtype {attrs['to']!r}") from None


cast.numpy(lambda xs, attrs, env: xs[0].astype(env.numpy_dtype(DType.parse(attrs["to"]))))
cast.onnx(lambda e, node, ins: [e.emit("Cast", ins, to=DType.parse(node.attrs["to"]).onnx_code)])

# ---- constant -------------------------------------------------------------
constant = define("constant", (), attrs={"value": (TENSOR, REQUIRED)}, doc="a literal tensor")


@constant.infer
def _(types, attrs):
    v = attrs["value"]
    try:
        dtype = DType.from_numpy(v.dtype)
    except KeyError:
        raise ShapeError(f"constant: unsupported element type {v.dtype}") from None
    return TensorType(dtype, tuple(int(d) for d in v.shape))


constant.numpy(lambda xs, attrs, env: attrs["value"].astype(env.numpy_dtype(DType.from_numpy(attrs["value"].dtype))))
constant.onnx(lambda e, node, ins: [e.const(node.attrs["value"])])
