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

from ..ir.dims import evaluate
from ..ir.graph import Graph, Node
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
    g = Graph(name)
    inputs = []
    for i, v in enumerate(node.inputs):
        inputs.append(g.add_param(v.name, v.type) if v.kind == "param" else g.add_input(f"in{i}", v.type))
    copy = g.add_node(node.op, inputs, dict(node.attrs))
    g.set_outputs((f"out{i}", o) for i, o in enumerate(copy.outputs))
    return g


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
