"""Evaluating one node with its op's numpy rule: the one evaluator behind the
reference interpreter, constant folding and the CUDA backend's load-time
steps, so all three compute a node the same way.

float16/bfloat16 arguments are widened to float32 before the rule runs and
results are rounded to the node's storage dtype afterwards, as GPU kernels
with float32 accumulation do (and as folding a constant must, or a folded
graph would differ from the same graph run).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import BlockcError
from ..ir.dims import evaluate
from ..ir.dtypes import DType
from ..ir.graph import Node
from ..ir.opdef import get

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
    args = [a.astype(np.float32) if a.dtype in _NARROW else a for a in args]
    with np.errstate(all="ignore"):
        try:
            result = get(node.op).numpy_fn(args, node.attrs, env)
        except BlockcError:
            raise
        except Exception as e:
            raise BlockcError(f"evaluating {node.op}{' (' + where + ')' if where else ''} failed: {e}") from e
    results = result if isinstance(result, (list, tuple)) else [result]
    return [np.asarray(r).astype(env.numpy_dtype(o.dtype), copy=False) for o, r in zip(node.outputs, results)]
