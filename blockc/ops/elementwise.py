"""Elementwise ops: arithmetic, unary math, where, cast, constant."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.dtypes import DType
from ..ir.types import TensorType
from ._rules import broadcast_shapes, elementwise, same_dtype
from .registry import REQUIRED, STR, TENSOR, define


# scipy is imported on first use: importing it was a third of every command's start
def _erf(x):
    import scipy.special
    return scipy.special.erf(x)


def _expit(x):
    import scipy.special
    return scipy.special.expit(x)

# ---- binary arithmetic ----------------------------------------------------
def _divide(a, b):
    """a / b. Integers truncate toward zero (-7 / 2 is -3), as ONNX, C and
    torch's ``rounding_mode="trunc"`` do; numpy's ``//`` floors, and its
    ``/`` goes through float64, which rounds integers past 2**53."""
    if a.dtype.kind not in "iuO" or b.dtype.kind not in "iuO":
        return np.divide(a, b)
    if a.dtype.kind == "O" or b.dtype.kind == "O":
        # an imported shape computation's values: dims (never negative, so floor is truncation) beside
        # plain integers, which may be negative (a Reshape's -1): each pair divided on its own
        return _DIVIDE_EACH(a, b)
    q = np.floor_divide(a, b)
    return q + ((q < 0) & (q * b != a)).astype(q.dtype)


def _divide_one(a, b):
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        q = int(a) // int(b)
        return q + 1 if q < 0 and q * b != a else q
    return a // b


_DIVIDE_EACH = np.frompyfunc(_divide_one, 2, 1)


def _torch_div(b, node, xs):
    # torch.div of integers divides exactly, into floats
    trunc = {} if node.outputs[0].dtype.is_float else {"rounding_mode": "trunc"}
    return b.call(b.torch.div, *xs, **trunc)


# name: (numpy, ONNX op, torch function name or rule, C expression)
_BINARY = {
    "add": (np.add, "Add", "add", "({0} + {1})"),
    "sub": (np.subtract, "Sub", "sub", "({0} - {1})"),
    "mul": (np.multiply, "Mul", "mul", "({0} * {1})"),
    "div": (_divide, "Div", _torch_div, "({0} / {1})"),
    "pow": (np.power, "Pow", "pow", "powf({0}, {1})"),
}


def _declare_binary(name, fn, onnx_type, torch_name, c_expr):
    op = define(name, ("a", "b"), doc=f"elementwise {name} with numpy broadcasting",
                cuda="elementwise", cuda_expr=c_expr)
    op.infer(lambda types, attrs: elementwise(name, types))
    op.numpy(lambda xs, attrs, env: fn(xs[0], xs[1]))
    op.onnx(lambda e, node, ins: [e.emit(onnx_type, ins)])
    op.torch(torch_name if callable(torch_name) else
             lambda b, node, xs: b.call(getattr(b.torch, torch_name), *xs))


for _name, _rules in _BINARY.items():
    _declare_binary(_name, *_rules)

# ---- unary math -------------------------------------------------------------
# name: (numpy, ONNX op, floats only, torch function, C expression)
_UNARY = {
    "neg": (np.negative, "Neg", False, "neg", "(-{0})"),
    "exp": (np.exp, "Exp", True, "exp", "expf({0})"),
    "sqrt": (np.sqrt, "Sqrt", True, "sqrt", "sqrtf({0})"),
    "reciprocal": (np.reciprocal, "Reciprocal", True, "reciprocal", "(1.0f / {0})"),
    "tanh": (np.tanh, "Tanh", True, "tanh", "tanhf({0})"),
    "erf": (_erf, "Erf", True, "erf", "erff({0})"),
    "sin": (np.sin, "Sin", True, "sin", "sinf({0})"),
    "cos": (np.cos, "Cos", True, "cos", "cosf({0})"),
    # expit, not 1 / (1 + exp(-x)): no overflow warning for very negative x
    "sigmoid": (_expit, "Sigmoid", True, "sigmoid", "(1.0f / (1.0f + expf(-({0}))))"),
    "relu": (lambda x: np.maximum(x, np.zeros((), x.dtype)), "Relu", False, "relu", "fmaxf({0}, 0.0f)"),
}


def _declare_unary(name, fn, onnx_type, floats, torch_name, c_expr):
    op = define(name, ("x",), doc=f"elementwise {name}", cuda="elementwise", cuda_expr=c_expr)
    op.infer(lambda types, attrs: elementwise(name, types, floats=floats))
    op.numpy(lambda xs, attrs, env: fn(xs[0]))
    op.onnx(lambda e, node, ins: [e.emit(onnx_type, ins)])
    op.torch(lambda b, node, xs: b.call(getattr(b.torch, torch_name), *xs))


for _name, _rules in _UNARY.items():
    _declare_unary(_name, *_rules)

# ---- silu -------------------------------------------------------------------
# x * sigmoid(x), SwiGLU's gate activation. A primitive here (like relu), not a
# composite: every target has it in one step (torch's F.silu, one C
# expression), and ONNX below opset 24 spells it Sigmoid then Mul.
silu = define("silu", ("x",), doc="x * sigmoid(x) (SiLU, swish)", cuda="elementwise", flops=4,
              # x / (1 + e^-x): exp overflows to inf for x < -88 and the quotient is then -0, not NaN
              cuda_expr="({0} / (1.0f + expf(-({0}))))")
silu.infer(lambda types, attrs: elementwise("silu", types, floats=True))
# expit, not 1 / (1 + exp(-x)): no overflow warning for very negative x
silu.numpy(lambda xs, attrs, env: (xs[0] * _expit(xs[0])).astype(xs[0].dtype, copy=False))
silu.onnx(lambda e, node, ins: [e.emit("Mul", [ins[0], e.emit("Sigmoid", ins)])])
silu.torch(lambda b, node, xs: b.call(b.F.silu, xs[0]))

# ---- where ------------------------------------------------------------------
where = define("where", ("cond", "x", "y"), doc="cond ? x : y, broadcasting all three",
               cuda="elementwise", cuda_expr="({0} ? {1} : {2})")


@where.infer
def _(types, attrs):
    cond, x, y = types
    if cond.dtype != DType.bool:
        raise ShapeError(f"where: the condition must be bool, got {cond.dtype.name}")
    dtype = same_dtype("where", [x, y])
    return TensorType(dtype, broadcast_shapes("where", cond.shape, x.shape, y.shape))


where.numpy(lambda xs, attrs, env: np.where(*xs))
where.onnx(lambda e, node, ins: [e.emit("Where", ins)])
where.torch(lambda b, node, xs: b.call(b.torch.where, *xs))

# ---- cast -----------------------------------------------------------------
def _cast_c(attrs, args, out_dtype) -> str:
    # Arithmetic is float (or bool, or long long): loads and stores convert to the storage type.
    target = DType.parse(attrs["to"])
    if target == DType.bool:
        return f"({args[0]} != 0)"
    return f"((float)({args[0]}))" if target.is_float else f"((long long)({args[0]}))"


cast = define("cast", ("x",), attrs={"to": (STR, REQUIRED)}, doc="convert the element type",
              cuda="elementwise", cuda_expr=_cast_c, flops=0, moves_data=True)


@cast.infer
def _(types, attrs):
    try:
        return types[0].with_dtype(DType.parse(attrs["to"]))
    except KeyError:
        raise ShapeError(f"cast: unknown dtype {attrs['to']!r}") from None


cast.numpy(lambda xs, attrs, env: xs[0].astype(env.numpy_dtype(DType.parse(attrs["to"]))))
cast.onnx(lambda e, node, ins: [e.emit("Cast", ins, to=DType.parse(node.attrs["to"]).onnx_code)])
cast.torch(lambda b, node, xs: b.method("to", xs[0], b.dtype(DType.parse(node.attrs["to"]))))

# ---- constant -------------------------------------------------------------
constant = define("constant", (), attrs={"value": (TENSOR, REQUIRED)}, doc="a literal tensor",
                  cuda="inline", flops=0)


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
constant.torch(lambda b, node, xs: b.tensor(node.attrs["value"], DType.from_numpy(node.attrs["value"].dtype)))
