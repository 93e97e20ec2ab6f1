"""Constant folding: a node whose inputs are all constants becomes a
constant (computed by the op's own numpy rule, in the graph's dtype).

Before::

    %0:f32[] = constant {value=dense<f32[]: [64.0]>}
    %1:f32[] = sqrt %0
    %2:f32[batch,seq,seq] = div %s, %1

After::

    %0:f32[] = constant {value=dense<f32[]: [8.0]>}
    %1:f32[batch,seq,seq] = div %s, %0

Results larger than ``MAX_ELEMENTS`` stay computed: a folded constant is
stored in the model file, and a big one costs more to load than to compute.
"""
from __future__ import annotations

import numpy as np

from ..ir.builder import Builder
from ..ir.dims import Sym
from ..ir.graph import Graph
from ..ops.evaluate import Env, evaluate_node
from .base import PassResult

MAX_ELEMENTS = 1 << 16


def _foldable(n) -> bool:
    if n.op == "constant" or not n.inputs:
        return False  # causal_mask has no inputs but symbolic size; constants are already folded
    if not all(v.producer is not None and v.producer.op == "constant" for v in n.inputs):
        return False
    return all(isinstance(d, int) for o in n.outputs for d in o.shape) and \
        all(int(np.prod(o.shape, dtype=np.int64)) <= MAX_ELEMENTS for o in n.outputs) and \
        not any(isinstance(a, Sym) or (isinstance(a, tuple) and any(isinstance(x, Sym) for x in a))
                for a in n.attrs.values())


def constant_fold(graph: Graph) -> PassResult:
    if not any(_foldable(n) for n in graph.nodes):
        return PassResult(graph, False)  # nothing to fold: the graph itself, not a copy
    g = graph.copy()
    changed = False
    env = Env({}, float64=False)
    for n in list(g.nodes):
        if not _foldable(n):
            continue
        results = evaluate_node(n, [v.producer.attrs["value"] for v in n.inputs], env)
        b = Builder(g, before=n, loc=n.loc)
        for out, r in zip(n.outputs, results):
            c = b.op("constant", value=np.array(r).reshape(tuple(int(d) for d in out.shape)))
            c.producer.origin = n.origin
            g.replace_all_uses(out, c)
        g.remove_node(n)
        changed = True
    return PassResult(g, changed)
