"""Lower composite ops (layernorm, rmsnorm, gelu, softmax) to primitive math.

Each op's decomposition is declared beside the op in the registry; this pass
only applies them. Before::

    %2:f32[batch,seq,64] = layernorm %0, @ln.g, @ln.b {eps=1e-05}

After::

    %2:f32[batch,seq,1]  = reduce_mean %0 {axes=[-1], keepdims=true}
    %3:f32[batch,seq,64] = sub %0, %2
    %4:f32[batch,seq,64] = mul %3, %3
    %5:f32[batch,seq,1]  = reduce_mean %4 {axes=[-1], keepdims=true}
    %6:f32[]             = constant {value=dense<f32[]: [1e-05]>}
    %7:f32[batch,seq,1]  = add %5, %6
    %8:f32[batch,seq,1]  = sqrt %7
    %9:f32[batch,seq,64] = div %3, %8
    %10:f32[batch,seq,64] = mul %9, @ln.g
    %11:f32[batch,seq,64] = add %10, @ln.b
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

from ..ir.builder import Builder
from ..ir.graph import Graph
from ..ops import registry
from .base import PassResult


def decompose(graph: Graph, ops: Iterable[str] | None = None) -> PassResult:
    """A copy of ``graph`` with ``ops`` (default: every op that has a
    decomposition) rewritten into primitive ops."""
    g = graph.copy()
    wanted = set(ops) if ops is not None else {name for name, d in registry.OPS.items() if d.decompose_fn}
    changed = False
    # A fused op decomposes into standard ops that may decompose further:
    # those are handled next, before the nodes after it.
    todo = deque(n for n in g.nodes if n.op in wanted)
    while todo:
        node = todo.popleft()
        opdef = registry.get(node.op)
        if opdef.decompose_fn is None:
            continue
        b = Builder(g, before=node, loc=node.loc)
        results = opdef.decompose_fn(b, node, list(node.inputs))
        for n in b.created:   # what a node computes is still what the original nodes did
            n.origin = node.origin
        todo.extendleft(reversed([n for n in b.created if n.op in wanted]))
        for old, new in zip(node.outputs, results):
            g.replace_all_uses(old, new)
        g.remove_node(node)
        changed = True
    return PassResult(g, changed)
