"""Ids read the whole table, not a prefix of it: for targets where a slice
is a copy (ONNX export).

A generation step picks its positions from a table's first ``total``
rows. The slice says two things: ``total`` fits the table, and each
position id lies below ``total`` (``ops/limits.py``, checked on every feed
before any run, on every backend). On ONNX Runtime it is also a copy of
those rows at every step, a cost that grows with the past and is not the
attention's: 3 MB a step for GPT-2's position table at a past of 1000; for
a rotary model its cos and sin tables, then half their columns again for
each rotary op (``ops/rotary._caches_and_positions``), where from the
whole table that half is a constant ONNX Runtime folds once. An id below
``total`` picks the same row from the prefix as from the whole table, so
an op that indexes (its declaration's ``indexes``) a prefix from row 0,
with ids a graph input (the ids ``ops/limits.py`` checks), reads the table
itself.

Before::

    %1:f32[total,16] = slice @rope.cos {axis=0, start=0, end=total}
    %2:f32[total,16] = slice @rope.sin {axis=0, start=0, end=total}
    %16:f32[batch,4,1,16] = rotary %11, %1, %2, %position_ids {interleaved=false}

After::

    %16:f32[batch,4,1,16] = rotary %11, @rope.cos, @rope.sin, %position_ids {interleaved=false}

Run by the ONNX export only, on its own copy: the graph a backend checks
feeds against keeps the slice, and with it both limits. In an exported
file run without blockc, an id from ``total`` up to the table's rows gets
its own row where ONNX Runtime's ``Gather`` on the prefix would refuse it;
no id reads outside the table.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops.registry import get
from .base import PassResult


def _prefixes(graph: Graph) -> list[tuple]:
    """``(node, input index, whole table)`` for each table input an op indexes
    by a graph input's ids that is a slice of another table from row 0 along
    the indexed axis."""
    sites = []
    for n in graph.nodes:
        indexes = get(n.op).indexes
        for ids, data, axis in indexes(n) if indexes else ():
            cut = data.producer
            if ids.kind != "input" or cut is None or cut.op != "slice" or cut.attrs["start"] != 0:
                continue
            rank = data.type.rank
            if cut.attrs["axis"] % rank != axis % rank:
                continue
            sites.extend((n, i, cut.inputs[0]) for i, v in enumerate(n.inputs) if v is data)
    return sites


def read_whole_tables(graph: Graph) -> PassResult:
    if not _prefixes(graph):   # nothing to do: the graph itself, not a copy
        return PassResult(graph, False)
    g = graph.copy()
    sites = _prefixes(g)
    cuts = {id(node.inputs[index].producer): node.inputs[index].producer for node, index, _ in sites}
    for node, index, table in sites:
        g.set_input(node, index, table)
    for cut in cuts.values():   # a prefix something else still reads stays for it
        if not cut.outputs[0].uses and not any(v is cut.outputs[0] for _, v in g.outputs):
            g.remove_node(cut)
    return PassResult(g, True)
