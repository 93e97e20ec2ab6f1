"""Evaluating one node with its op's numpy rule: the one evaluator behind the
reference interpreter, constant folding (of a graph, and of an ONNX file's
constants as it is imported: ``fold``) and the CUDA backend's load-time
steps, so all of them compute a node the same way.

float16/bfloat16 arguments are widened to float32 before the rule runs and
results are rounded to the node's storage dtype afterwards, as GPU kernels
with float32 accumulation do (and as folding a constant must, or a folded
graph would differ from the same graph run).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import BlockcError, ShapeError
from ..ir.dims import evaluate
from ..ir.dtypes import DType
from ..ir.graph import Node
from ..ir.opdef import OpDef, get
from ..ir.types import TensorType

_NARROW = (DType.float16.numpy, DType.bfloat16.numpy)


class Env:
    """What an op's numpy rule may ask of its caller: symbol sizes, and
    whether floats are computed in float64 (the oracle) or the graph's dtypes."""

    def __init__(self, bindings: Mapping[str, int], float64: bool):
        self.bindings, self.float64 = dict(bindings), float64

    def numpy_dtype(self, dtype: DType) -> np.dtype:
        return np.dtype(np.float64) if self.float64 and dtype.is_float else dtype.numpy

    def eval_dims(self, dims) -> list[int]:
        return [evaluate(d, self.bindings) for d in dims]


def evaluate_node(node: Node, args: Sequence[np.ndarray], env: Env, where: str = "") -> list[np.ndarray]:
    """``node``'s results on ``args``, one array per output, each in
    ``env.numpy_dtype`` of the output's dtype. A numpy failure (a blockc bug
    or a bad feed) is a ``BlockcError`` naming the node (``where``)."""
    results = _run_rule(get(node.op), args, node.attrs, env, where)
    return [np.asarray(r).astype(env.numpy_dtype(o.dtype), copy=False) for o, r in zip(node.outputs, results)]


def fold(op: str, args: Sequence[np.ndarray], attrs: Mapping | None = None) -> list[np.ndarray]:
    """``op`` on known ``args``, computed now as a node of it would compute
    them: attributes defaulted and checked, operands checked by its shape
    rule (a ``ShapeError`` where they do not fit), each result in the dtype
    that rule gives. An object array holds dims (``ir/dims.py`` ``Sym``s, a
    shape computation's values) and is typed int64; a result of such dims
    stays an object array."""
    opdef = get(op)
    attrs, types = opdef.result_types([TensorType(_dtype_of(op, a), a.shape) for a in args], attrs or {})
    results = [np.asarray(r) for r in _run_rule(opdef, args, attrs, Env({}, float64=False), "")]
    return [r if r.dtype == object and not t.dtype.is_float and t.dtype != DType.bool
            else r.astype(t.dtype.numpy, copy=False) for r, t in zip(results, types)]


def _dtype_of(op: str, a: np.ndarray) -> DType:
    if a.dtype == object:
        return DType.int64
    try:
        return DType.from_numpy(a.dtype)
    except KeyError:
        raise ShapeError(f"{op}: element type {a.dtype} is not supported by blockc") from None


def _run_rule(opdef: OpDef, args: Sequence[np.ndarray], attrs: Mapping, env: Env, where: str) -> list:
    args = [a.astype(np.float32) if a.dtype in _NARROW else a for a in args]
    with np.errstate(all="ignore"):
        try:
            result = opdef.numpy_fn(args, attrs, env)
        except BlockcError:
            raise
        except Exception as e:
            raise BlockcError(f"evaluating {opdef.name}{' (' + where + ')' if where else ''} failed: {e}") from e
    return result if isinstance(result, (list, tuple)) else [result]
