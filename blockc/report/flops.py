"""A floating-point operation count per node: the x axis of a roofline.

Like the traffic model it is a model, not a measurement: ``matmul`` is
2·M·N·K; the fused and normalisation ops count the arithmetic a one-pass
kernel does per element (a softmax: scale, mask, max, subtract, exp, sum,
divide ~ 6; LayerNorm: add, mean, variance, normalise, scale and shift ~ 8);
any other op one per output element. Transcendentals count as one, as
hardware counters do not.
"""
from __future__ import annotations

from math import prod
from typing import Mapping

from ..ir.dims import evaluate
from ..ir.graph import Graph, Node

# floating-point operations per element of the first output
PER_ELEMENT = {
    "masked_softmax": 6, "softmax": 5,
    "add_layernorm": 8, "layernorm": 7, "add_rmsnorm": 5, "rmsnorm": 4,
    "gelu": 8, "reshape": 0, "transpose": 0, "slice": 0, "concat": 0, "split": 0, "gather": 0,
    "cast": 0, "constant": 0, "causal_mask": 0,
}


def _numel(shape, bindings) -> int:
    return prod(evaluate(d, bindings) for d in shape)


def _matmul_flops(a_shape, b_shape, out_shape, bindings) -> int:
    k = evaluate(a_shape[-1], bindings)
    return 2 * k * _numel(out_shape, bindings)


def node_flops(node: Node, bindings: Mapping[str, int]) -> int:
    out = node.outputs[0]
    if node.op == "matmul":
        return _matmul_flops(node.inputs[0].shape, node.inputs[1].shape, out.shape, bindings)
    if node.op == "matmul_bias_act":  # the GEMM plus bias and activation per element
        return _matmul_flops(node.inputs[0].shape, node.inputs[1].shape, out.shape, bindings) \
            + 2 * _numel(out.shape, bindings)
    if node.op == "attention":  # QK^T and PV, plus the masked softmax on the scores
        q, k = node.inputs[0].shape, node.inputs[1].shape
        scores = _numel(q[:-1], bindings) * evaluate(k[-2], bindings)
        return 2 * scores * evaluate(q[-1], bindings) + 2 * scores * evaluate(out.shape[-1], bindings) \
            + PER_ELEMENT["masked_softmax"] * scores
    if node.op == "qkv_attention":  # the packed projection and its bias, then the core per head
        x = node.inputs[0].shape
        heads, (dq, _, dv) = node.attrs["heads"], node.attrs["sizes"]
        tokens = _numel(x[:-1], bindings)
        scores = tokens * heads * evaluate(x[-2], bindings)
        width = 2 * dq + dv
        return 2 * tokens * evaluate(x[-1], bindings) * width + tokens * width \
            + 2 * scores * (dq // heads) + 2 * scores * (dv // heads) + PER_ELEMENT["masked_softmax"] * scores
    return PER_ELEMENT.get(node.op, 1) * _numel(out.shape, bindings)


def total_flops(graph: Graph, bindings: Mapping[str, int]) -> int:
    from .traffic import load_time_nodes
    static = load_time_nodes(graph)
    return sum(node_flops(n, bindings) for n in graph.nodes if id(n) not in static)
