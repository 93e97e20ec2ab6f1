"""Recognise SiLU written out as ``x * sigmoid(x)`` (how ONNX spells it below
opset 24, and how torch.onnx exports Hugging Face's ``silu``).

Before::

    %1:f32[b,s,d] = sigmoid %x
    %2:f32[b,s,d] = mul %x, %1

After::

    %1:f32[b,s,d] = silu %x

Either operand order. The sigmoid stays where something else reads it too.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Op, Rule, Var, apply_rules

X = Var("x")
RULES = [Rule("x * sigmoid(x) -> silu", Op("mul", X, Op("sigmoid", X), commutative=True, name="root"),
              lambda b, m: {"root": b.op("silu", m["x"])}, kind="silu")]


def recompose_silu(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
