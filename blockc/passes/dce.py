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
    g = graph.copy()
    live = {id(v) for _, v in g.outputs}
    keep = []
    for n in reversed(g.nodes):
        if any(id(o) in live for o in n.outputs):
            keep.append(n)
            live |= {id(v) for v in n.inputs}
    dead = [n for n in g.nodes if all(id(o) not in live for o in n.outputs)]
    for n in reversed(dead):
        g.remove_node(n)
    before = len(g.params)
    g.remove_unused_params()
    return PassResult(g, bool(dead) or len(g.params) != before)
