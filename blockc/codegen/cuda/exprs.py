"""C spellings for elementwise kernels: literals, and each op's expression,
which lives in the op's declaration (``cuda_expr``). Arithmetic is done in
``float`` (or ``bool`` for conditions); loads and stores convert from and to
the storage type, so float16/bfloat16 data get float32 math."""
from __future__ import annotations

import math

import numpy as np

from ...ir.dtypes import DType
from ...ir.opdef import DIM, get
from .family import INLINE, family_of


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


def expr(op: str, attrs: dict, args: list[str], out_dtype: DType, *, index: str | None = None,
         dim=None) -> str:
    """The C expression computing the elementwise ``op`` on argument
    expressions ``args``: the op's own ``cuda_expr`` in the registry. A
    string rule may also name ``{index}``, the element's linear index (the C
    expression ``index``), and each dim attribute, as its run-time value
    (``dim(d)``: a C ``long long`` expression, symbols read at run time).
    A caller that gives neither (a GEMM's epilogue) cannot place such an op:
    the rule then fails with a KeyError naming what it lacks."""
    opdef = get(op)
    rule = opdef.cuda_expr
    if rule is None:
        raise KeyError(op)
    if not isinstance(rule, str):
        return rule(attrs, args, out_dtype)
    named = {} if index is None else {"index": index}
    if dim is not None:
        named.update({k: dim(v) for k, v in attrs.items() if opdef.attrs[k][0] == DIM})
    return rule.format(*args, **named)


def is_inline(v) -> bool:
    """Whether ``v`` is written into the elementwise kernels that read it
    rather than read from memory: a causal mask, a scalar constant."""
    p = v.producer
    if p is None or (p.op == "constant" and p.attrs["value"].size != 1):
        return False
    family = family_of(p.op)
    return family is not None and family.placement == INLINE


class CExpr(str):
    """A C expression that ``+``, ``-`` and ``<=`` build on, so that rules
    written with operators (``ops/masking.py``) render as C."""

    def _bin(self, op: str, other, swap: bool = False) -> "CExpr":
        a, b = (str(other), str(self)) if swap else (str(self), str(other))
        return CExpr(f"({a} {op} {b})")

    def __add__(self, other):
        return self._bin("+", other)

    def __radd__(self, other):
        return self._bin("+", other, swap=True)

    def __sub__(self, other):
        return self._bin("-", other)

    def __rsub__(self, other):
        return self._bin("-", other, swap=True)

    def __le__(self, other):
        return self._bin("<=", other)
