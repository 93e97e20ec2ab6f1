"""Per-op CUDA expressions for elementwise kernels: the only place that knows
how an elementwise op is spelled in C. Arithmetic is done in ``float`` (or
``bool`` for conditions); loads and stores convert from and to the storage
type, so float16/bfloat16 data get float32 math."""
from __future__ import annotations

import math

import numpy as np

from ...ir.dtypes import DType

UNARY = {
    "neg": "(-{0})",
    "exp": "expf({0})",
    "sqrt": "sqrtf({0})",
    "reciprocal": "(1.0f / {0})",
    "tanh": "tanhf({0})",
    "erf": "erff({0})",
    "relu": "fmaxf({0}, 0.0f)",
}

BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "pow": "powf({0}, {1})",
}

GELU = {
    "none": "blockc_gelu_erf({0})",
    "tanh": "blockc_gelu_tanh({0})",
}

ELEMENTWISE = frozenset(UNARY) | frozenset(BINARY) | {"gelu", "where", "cast", "causal_mask", "constant"}


def float_literal(x: float) -> str:
    """A C float literal that rounds to the same float32 as ``x``."""
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    with np.errstate(over="ignore"):
        f = float(np.float32(x))
    if math.isinf(f):  # a float64 value past float32's range
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return f"{f!r}f"  # repr of a float always has '.' or 'e', and round-trips


def literal(value: np.ndarray, dtype: DType) -> str:
    """A scalar constant's C expression in the compute type."""
    v = value.reshape(-1)[0]
    if dtype == DType.bool:
        return "true" if bool(v) else "false"
    if dtype.is_float:
        return float_literal(float(v))
    return f"{int(v)}LL"


def expr(op: str, attrs: dict, args: list[str], out_dtype: DType) -> str:
    """The C expression computing ``op`` on argument expressions ``args``."""
    if op in UNARY:
        return UNARY[op].format(*args)
    if op in BINARY:
        return BINARY[op].format(*args)
    if op == "gelu":
        return GELU[attrs["approximate"]].format(*args)
    if op == "where":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if op == "cast":
        target = DType.parse(attrs["to"])
        if target == DType.bool:
            return f"({args[0]} != 0)"
        if target.is_float:
            return f"((float)({args[0]}))"
        return f"((long long)({args[0]}))"
    raise KeyError(op)
