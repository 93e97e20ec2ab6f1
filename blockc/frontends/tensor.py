"""Traced tensors: what DSL code computes with.

A ``Tensor`` wraps an IR value of the graph being traced. Its operators and
methods add nodes, so ordinary-looking model code (``x @ w + b``,
``x.softmax(-1)``) becomes IR. A shape or dtype mistake is reported as a
``ModelError`` that names the user's file and line.
"""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import numpy as np

from ..errors import BlockcError, ModelError, at_user_line
from ..ir.dims import Dim
from ..ir.dtypes import DType
from ..ir.graph import Graph, Value, traced_loc

_GRAPH: list[Graph] = []


@contextlib.contextmanager
def tracing(graph: Graph):
    """Make ``graph`` the target of every DSL op inside the block."""
    _GRAPH.append(graph)
    try:
        yield graph
    finally:
        _GRAPH.pop()


def current_graph() -> Graph:
    if not _GRAPH:
        raise ModelError(at_user_line("DSL ops run only while a model is traced (blockc.trace(model))"))
    return _GRAPH[-1]


def _apply(op: str, inputs: Sequence["Tensor"], **attrs) -> list["Tensor"]:
    g = current_graph()
    try:
        node = g.add_node(op, [t.value for t in inputs], attrs, loc=traced_loc())
    except ModelError:
        raise
    except BlockcError as e:
        raise ModelError(at_user_line(str(e))) from None
    return [Tensor(v) for v in node.outputs]


def apply(op: str, *inputs: "Tensor", **attrs) -> "Tensor":
    """Add one ``op`` node; returns its single result."""
    return _apply(op, inputs, **attrs)[0]


def constant(value, dtype: DType | str) -> "Tensor":
    dtype = DType.parse(dtype) if isinstance(dtype, str) else dtype
    arr = np.asarray(value, dtype=np.float64 if dtype.is_float else None).astype(dtype.numpy)
    return apply("constant", value=arr)


def as_tensor(x, like: "Tensor") -> "Tensor":
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (int, float, np.number, np.ndarray)):
        return constant(x, like.dtype)
    raise ModelError(at_user_line(f"cannot use a {type(x).__name__} as a tensor"))


class Tensor:
    """A value in the graph being traced, with PyTorch-like operators."""

    __slots__ = ("value",)

    def __init__(self, value: Value):
        self.value = value

    @property
    def shape(self) -> tuple:
        return self.value.shape

    @property
    def dtype(self) -> DType:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return len(self.value.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.value.type})"

    # -- arithmetic -----------------------------------------------------------
    def __add__(self, o): return apply("add", self, as_tensor(o, self))
    def __radd__(self, o): return apply("add", as_tensor(o, self), self)
    def __sub__(self, o): return apply("sub", self, as_tensor(o, self))
    def __rsub__(self, o): return apply("sub", as_tensor(o, self), self)
    def __mul__(self, o): return apply("mul", self, as_tensor(o, self))
    def __rmul__(self, o): return apply("mul", as_tensor(o, self), self)
    def __truediv__(self, o): return apply("div", self, as_tensor(o, self))
    def __rtruediv__(self, o): return apply("div", as_tensor(o, self), self)
    def __pow__(self, o): return apply("pow", self, as_tensor(o, self))
    def __neg__(self): return apply("neg", self)
    def __matmul__(self, o): return apply("matmul", self, as_tensor(o, self))

    # -- math -------------------------------------------------------------------
    def exp(self): return apply("exp", self)
    def sqrt(self): return apply("sqrt", self)
    def tanh(self): return apply("tanh", self)
    def erf(self): return apply("erf", self)
    def relu(self): return apply("relu", self)
    def silu(self): return apply("silu", self)
    def reciprocal(self): return apply("reciprocal", self)

    def gelu(self, approximate: str = "none"):
        return apply("gelu", self, approximate=approximate)

    def softmax(self, axis: int = -1):
        return apply("softmax", self, axis=axis)

    def mean(self, axes, keepdims: bool = True):
        return apply("reduce_mean", self, axes=_axes(axes), keepdims=keepdims)

    def sum(self, axes, keepdims: bool = True):
        return apply("reduce_sum", self, axes=_axes(axes), keepdims=keepdims)

    def max(self, axes, keepdims: bool = True):
        return apply("reduce_max", self, axes=_axes(axes), keepdims=keepdims)

    # -- shape --------------------------------------------------------------------
    def reshape(self, *shape: Dim):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
        return apply("reshape", self, shape=list(shape))

    def permute(self, *perm: int):
        perm = perm[0] if len(perm) == 1 and isinstance(perm[0], (list, tuple)) else perm
        return apply("transpose", self, perm=list(perm))

    def transpose(self, a: int, b: int):
        """Swap axes ``a`` and ``b`` (PyTorch's ``transpose``)."""
        perm = list(range(self.ndim))
        try:
            perm[a], perm[b] = perm[b], perm[a]
        except IndexError:
            raise ModelError(at_user_line(f"transpose({a}, {b}) on a rank-{self.ndim} tensor")) from None
        return self.permute(perm)

    @property
    def T(self):
        return self.transpose(-2, -1)

    def slice(self, axis: int, start: Dim, end: Dim):
        return apply("slice", self, axis=axis, start=start, end=end)

    def split(self, sizes: Sequence[Dim], axis: int = -1) -> list["Tensor"]:
        return _apply("split", [self], axis=axis, sizes=list(sizes))

    def cast(self, dtype: DType | str):
        return apply("cast", self, to=(dtype.name if isinstance(dtype, DType) else DType.parse(dtype).name))


def _axes(axes) -> list:
    return [axes] if isinstance(axes, int) else list(axes)


# -- functional forms -------------------------------------------------------------
def where(cond: Tensor, x, y) -> Tensor:
    ref = x if isinstance(x, Tensor) else y
    return apply("where", cond, as_tensor(x, ref), as_tensor(y, ref))


def concat(tensors: Sequence[Tensor], axis: int) -> Tensor:
    return _apply("concat", list(tensors), axis=axis)[0]


def cache_write(cache: Tensor, update: Tensor, axis: int, start: Dim) -> Tensor:
    """``cache`` with ``update`` written at ``[start, start+len)`` along ``axis`` (``ops/kv_cache.py``)."""
    return apply("cache_write", cache, update, axis=axis, start=start)


def causal_mask(rows: Dim, cols: Dim) -> Tensor:
    return apply("causal_mask", rows=rows, cols=cols)


def gather(table: Tensor, indices: Tensor) -> Tensor:
    return apply("gather", table, indices, axis=0)


def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    return apply("layernorm", x, gamma, beta, eps=eps)


def rms_norm(x: Tensor, gamma: Tensor, eps: float = 1e-6) -> Tensor:
    return apply("rmsnorm", x, gamma, eps=eps)


def scale_for(d_k: int) -> float:
    return 1.0 / math.sqrt(d_k)
