"""The memory-traffic model: bytes read plus bytes written by each op.

Computed from the IR's types with symbolic dims bound (``seq=512``): every
op reads each distinct input once and writes each output once -- the
traffic of an ideal kernel that keeps nothing between ops, which is what a
fusion saves. ``reshape`` is a view and moves nothing. Matmul operands count
once each (a well-tiled GEMM's DRAM traffic, ignoring re-reads). Nodes that
depend only on parameters and constants (the transposed tied head, the
concatenated QKV weights) run once at load time and are not counted. An op
whose ideal kernel moves less declares how much (its ``traffic`` in the
registry): a causal softmax reads only the scores its rows can see. An op
that picks entries of a table by ids (its declaration's ``indexes``: an
embedding lookup, a rotary's positions) reads of that table only the
entries its ids pick, at most the whole table: GPT-2's lookup of 128
tokens reads 128 rows of its 50257, not 154 MB.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..ir.dims import evaluate
from ..ir.graph import Graph, Node
from ..ir.load_time import load_time_nodes
from ..ir.opdef import get
from ..ops._rules import numel

ZERO_COPY = frozenset({"reshape"})


@dataclass
class NodeTraffic:
    node: Node
    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


def node_traffic(node: Node, bindings: Mapping[str, int]) -> NodeTraffic:
    if node.op in ZERO_COPY:
        return NodeTraffic(node, 0, 0)
    rule = get(node.op).traffic
    if rule is not None:
        return NodeTraffic(node, *rule(node, bindings))
    picked = _picked_bytes(node, bindings)
    seen, read = set(), 0
    for v in node.inputs:
        if id(v) not in seen:
            seen.add(id(v))
            read += picked.get(id(v), v.type.nbytes(bindings))
    written = sum(o.type.nbytes(bindings) for o in node.outputs)
    return NodeTraffic(node, read, written)


def _picked_bytes(node: Node, bindings: Mapping[str, int]) -> dict[int, int]:
    """For each table ``node`` indexes by ids, the bytes of the entries they
    pick (one entry per id, at most the whole table), by ``id(table)``."""
    indexes = get(node.op).indexes
    picked: dict[int, int] = {}
    for ids, table, axis in indexes(node) if indexes else ():
        whole = table.type.nbytes(bindings)
        entries = evaluate(table.shape[axis % table.type.rank], bindings)
        picked[id(table)] = min(whole, whole // entries * numel(ids.shape, bindings)) if entries else whole
    return picked


def graph_traffic(graph: Graph, bindings: Mapping[str, int]) -> list[NodeTraffic]:
    static = load_time_nodes(graph)
    return [node_traffic(n, bindings) for n in graph.nodes if id(n) not in static]


def total_bytes(graph: Graph, bindings: Mapping[str, int]) -> int:
    return sum(t.total for t in graph_traffic(graph, bindings))


def step_traffic(graph: Graph, nodes: list[Node], bindings: Mapping[str, int]) -> NodeTraffic:
    """The traffic of one kernel that computes ``nodes`` of ``graph`` together
    (a GEMM and its epilogue, a chain of elementwise ops): it reads what
    enters the group -- each value once, a strided view as the bytes it
    covers -- and writes what leaves it (used by a node outside, or a graph
    output); values that stay inside never reach memory. One node alone
    counts as ``node_traffic`` does. ``nodes[-1]`` stands for the kernel."""
    if len(nodes) == 1:
        return node_traffic(nodes[0], bindings)
    inside = {id(n) for n in nodes}
    made = {id(o) for n in nodes for o in n.outputs}
    outputs = {id(v) for _, v in graph.outputs}
    seen, read, written = set(), 0, 0
    for n in nodes:
        for v in n.inputs:
            if id(v) not in made and id(v) not in seen:
                seen.add(id(v))
                read += v.type.nbytes(bindings)
        for o in n.outputs:
            if id(o) in outputs or any(id(user) not in inside for user in o.users()):
                written += o.type.nbytes(bindings)
    return NodeTraffic(nodes[-1], read, written)
