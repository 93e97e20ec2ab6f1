"""The numpy reference interpreter.

``float64=True`` (the default) runs every floating-point value in float64:
this is the oracle that every pass and backend is checked against.
``float64=False`` runs in the graph's own dtypes; float16/bfloat16 ops compute
in float32 and round their results, as GPU kernels with float32 accumulation do.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ir.graph import Graph
from ..ops.evaluate import Env, evaluate_node
from .bindings import bind_inputs, checked_weights

__all__ = ["Env", "interpret", "run_reference"]


def run_reference(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray],
                  *, float64: bool = True, capture: dict | None = None) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``feeds``; returns ``{output name: array}``.

    In float64 mode every float output is float64; otherwise outputs have the
    graph's declared dtypes. ``capture``, if given, receives every node
    result as ``{Value: array}`` (for locating where two graphs diverge).
    """
    return interpret(graph, weights, feeds, bind_inputs(graph, feeds), float64=float64, capture=capture)


def interpret(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray],
              bindings: Mapping[str, int], *, float64: bool = True,
              capture: dict | None = None) -> dict[str, np.ndarray]:
    """``run_reference`` on feeds already checked against ``graph``
    (``bindings``: the sizes they bind), without checking them again."""
    env = Env(bindings, float64)
    arrays = checked_weights(graph, weights)

    def load(v, array) -> np.ndarray:
        return np.asarray(array).astype(env.numpy_dtype(v.dtype), copy=False)

    vals: dict[int, np.ndarray] = {}
    for v in graph.inputs:
        vals[id(v)] = load(v, feeds[v.name])
    for name, v in graph.params.items():
        vals[id(v)] = load(v, arrays[name])

    # Free each intermediate after its last use: a 50257-wide logits tensor
    # should not outlive the node that reads it.
    last_use = graph.last_uses()   # an output's is past the last node: never freed

    for i, n in enumerate(graph.nodes):
        results = evaluate_node(n, [vals[id(v)] for v in n.inputs], env, where=f"node {i}")
        for out, r in zip(n.outputs, results):
            vals[id(out)] = r
            if capture is not None:
                capture[out] = r
        for v in n.inputs:
            if last_use.get(id(v)) == i and v.kind == "node":
                vals.pop(id(v), None)
    return {name: vals[id(v)] for name, v in graph.outputs}
