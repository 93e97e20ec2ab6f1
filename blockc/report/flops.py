"""A floating-point operation count per node: the x axis of a roofline.

Like the traffic model it is a model, not a measurement, and each op states
its own count in its declaration (``flops``): ``matmul`` is 2·M·N·K; the
fused and normalisation ops count the arithmetic a one-pass kernel does per
element (a softmax: scale, mask, max, subtract, exp, sum, divide ~ 6;
LayerNorm: add, mean, variance, normalise, scale and shift ~ 8); data
movement none; any other op one per output element. Transcendentals count as
one, as hardware counters do not.
"""
from __future__ import annotations

from typing import Mapping

from ..ir.graph import Graph, Node
from ..ir.load_time import load_time_nodes
from ..ops._rules import numel
from ..ops.registry import get


def node_flops(node: Node, bindings: Mapping[str, int]) -> int:
    """The node's FLOPs: its op's ``flops`` rule, or that many per element of its first output."""
    rule = get(node.op).flops
    return rule(node, bindings) if callable(rule) else rule * numel(node.outputs[0].shape, bindings)


def total_flops(graph: Graph, bindings: Mapping[str, int]) -> int:
    static = load_time_nodes(graph)
    return sum(node_flops(n, bindings) for n in graph.nodes if id(n) not in static)
