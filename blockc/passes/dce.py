"""Dead-code elimination: drop nodes whose results nothing uses, and
parameters no node reads.

Before::

    %0:f32[4] = exp %x
    %1:f32[4] = tanh %x
    return y=%1

After::

    %0:f32[4] = tanh %x
    return y=%0
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult


def dce(graph: Graph) -> PassResult:
    # Nothing dead and every parameter read: the graph itself, not a copy.
    if not _dead(graph) and all(v.uses for v in graph.params.values()):
        return PassResult(graph, False)
    g = graph.copy()
    dead = _dead(g)
    for n in reversed(dead):
        g.remove_node(n)
    before = len(g.params)
    g.remove_unused_params()
    return PassResult(g, bool(dead) or len(g.params) != before)


def _dead(g: Graph) -> list:
    live = {id(v) for _, v in g.outputs}
    for n in reversed(g.nodes):
        if any(id(o) in live for o in n.outputs):
            live |= {id(v) for v in n.inputs}
    return [n for n in g.nodes if all(id(o) not in live for o in n.outputs)]
