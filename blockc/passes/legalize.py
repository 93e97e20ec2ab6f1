"""Legalize a graph for a target: every op the target cannot lower itself is
replaced by its decomposition, again and again, until every op is one the
target has (or has no decomposition, which the target then reports).

The one "decompose what I cannot run" for every backend: ONNX export keeps
the ops ONNX has, the PyTorch backend the ops with a ``torch`` lowering, the
CUDA backend those with a kernel family. The nodes a decomposition makes keep
the ``origin`` of the node they replace, so a kernel or an ONNX node made
from a decomposed ``attention`` still says which IR nodes it computes.

Before, for a target without ``attention``::

    %9:f32[b,h,s,d] = attention %3, %5, %7 {scale=0.125, mask="none", causal=true, ...}

After::

    %9:f32[b,h,d,s]  = transpose %5 {perm=[0,1,3,2]}
    %10:f32[b,h,s,s] = matmul %3, %9
    %11:f32[b,h,s,s] = masked_softmax %10 {scale=0.125, mask="none", causal=true, ...}
    %12:f32[b,h,s,d] = matmul %11, %7
"""
from __future__ import annotations

from typing import Callable

from ..ir.graph import Graph
from ..ir.opdef import OpDef
from ..ops import registry
from .base import PassResult
from .decompose import decompose


def legalize(graph: Graph, lowers: Callable[[OpDef], bool]) -> PassResult:
    """``graph`` with every op for which ``lowers(opdef)`` is false, and that
    has a decomposition, decomposed (the input is returned when none is)."""
    ops = {name for name, d in registry.OPS.items() if d.decompose_fn is not None and not lowers(d)}
    if not any(n.op in ops for n in graph.nodes):
        return PassResult(graph, False)
    return decompose(graph, ops=ops)
