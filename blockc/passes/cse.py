"""Common-subexpression elimination: one node for each distinct
(op, inputs, attributes); equal constants are one constant.

Before::

    %0:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
    %1:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
    %2:f32[...] = where %0, %a, %c
    %3:f32[...] = where %1, %b, %c

After::

    %0:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
    %1:f32[...] = where %0, %a, %c
    %2:f32[...] = where %0, %b, %c
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from .base import PassResult


def _attr_key(v):
    if isinstance(v, np.ndarray):
        return ("array", str(v.dtype), v.shape, v.tobytes())
    return v


def _key(n):
    return n.op, tuple(id(v) for v in n.inputs), tuple((k, _attr_key(a)) for k, a in sorted(n.attrs.items()))


def _has_duplicates(g: Graph) -> bool:
    seen = set()
    for n in g.nodes:
        key = _key(n)
        if key in seen:
            return True
        seen.add(key)
    return False


def cse(graph: Graph) -> PassResult:
    if not _has_duplicates(graph):  # merging starts from a duplicate: none, no change, no copy
        return PassResult(graph, False)
    g = graph.copy()
    seen: dict = {}
    changed = False
    for n in list(g.nodes):
        key = _key(n)
        first = seen.get(key)
        if first is None:
            seen[key] = n
            continue
        for old, new in zip(n.outputs, first.outputs):
            g.replace_all_uses(old, new)
        first.origin = first.origin + tuple(o for o in n.origin if o not in first.origin)
        g.remove_node(n)
        changed = True
    return PassResult(g, changed)
