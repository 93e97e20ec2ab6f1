"""Each fused op kind measured alone: the first node of each kind in the
fused graph, cut out into a one-node graph of its own (its tensor inputs
become graph inputs, its parameters stay parameters) and timed on a backend
at the comparison's shape.

This is the number behind "the fused softmax reaches N% of peak bandwidth":
bytes modelled (``report.traffic``) over the measured time of that kernel
alone, next to its modelled FLOPs (``report.flops``) for a roofline.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ir.dims import Sym, evaluate, is_plain_symbol
from ..ir.dtypes import DType
from ..ir.graph import Graph, Node
from ..ir.types import TensorType
from ..ops.registry import fused_ops
from ..report.flops import node_flops
from ..report.traffic import node_traffic


def first_fused_nodes(graphs: list[Graph]) -> list[tuple[str, Node]]:
    """(label, node) of the first node of each fused op kind in ``graphs``, in
    order; the label lists the unoptimized graph's nodes it came from (``%2+%3``)."""
    seen: dict[str, tuple[str, Node]] = {}
    for graph in graphs:
        for i, n in enumerate(graph.nodes):
            if n.op in fused_ops() and n.op not in seen:
                seen[n.op] = ("+".join(n.origin) if n.origin else f"#{i}", n)
    return list(seen.values())


def isolate(node: Node, name: str) -> Graph:
    """A graph holding ``node`` alone: tensor inputs become inputs ``in0..``."""
    return isolate_nodes([node], name)


def isolate_nodes(nodes: list[Node], name: str, outputs: tuple = ()) -> Graph:
    """A graph holding ``nodes`` (in order; one kernel's worth, say a GEMM and
    its epilogue): the values entering them become inputs ``in0..`` (a
    parameter stays a parameter, a constant is copied), and the values that
    leave them -- read by a node outside, unread, or among ``outputs`` (the
    enclosing graph's) -- its outputs ``out0..``."""
    g = Graph(name)
    inside = {id(n) for n in nodes}
    new: dict[int, object] = {}
    for n in nodes:
        for v in n.inputs:
            if id(v) in new:
                continue
            if v.kind == "param":
                new[id(v)] = g.add_param(v.name, v.type)
            elif v.producer is not None and id(v.producer) not in inside and v.producer.op == "constant":
                new[id(v)] = g.add_node("constant", [], dict(v.producer.attrs)).outputs[0]
            elif v.producer is None or id(v.producer) not in inside:
                new[id(v)] = g.add_input(f"in{len(g.inputs)}", v.type)
        copy = g.add_node(n.op, [new[id(v)] for v in n.inputs], dict(n.attrs))
        for o, c in zip(n.outputs, copy.outputs):
            new[id(o)] = c
    _bind_summed_dims(g)
    leaving = {id(v) for v in outputs}
    g.set_outputs((f"out{i}", new[id(o)]) for i, o in enumerate(
        o for n in nodes for o in n.outputs
        if id(o) in leaving or not o.uses or any(id(user) not in inside for user in o.users())))
    return g


def _bind_summed_dims(g: Graph) -> None:
    """A dim that the cut-out inputs hold only inside a sum (a decode
    step's keys, ``past+seq``, with ``seq`` its queries') gets an input of
    its own length, ``dim_NAME: i64[NAME]``: its feeds then bind it as the
    whole graph's did, and the backends' checks can tell every dim."""
    plain, summed = set(), set()
    for v in g.inputs:
        for d in v.shape:
            (plain if is_plain_symbol(d) else summed).update(getattr(d, "symbols", ()))
    for name in sorted(summed - plain):
        g.add_input(f"dim_{name}", TensorType(DType.int64, (Sym.var(name),)))


def sample_feeds(graph: Graph, bindings: Mapping[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for v in graph.inputs:
        shape = tuple(evaluate(d, bindings) for d in v.shape)
        if v.dtype.name == "bool":
            feeds[v.name] = rng.random(shape) < 0.8
        elif v.dtype.is_float:
            feeds[v.name] = rng.standard_normal(shape).astype(v.dtype.numpy)
        else:
            feeds[v.name] = np.zeros(shape, v.dtype.numpy)
    return feeds


def kernel_cost(node: Node, bindings: Mapping[str, int]) -> tuple[int, int]:
    """(bytes modelled, FLOPs modelled) of ``node`` at ``bindings``."""
    return node_traffic(node, bindings).total, node_flops(node, bindings)
