"""Fuse MatMul + bias Add + ReLU/GELU into one ``matmul_bias_act``.

Before::

    %31:f32[b,s,256] = matmul %30, @ffn.fc1.weight
    %32:f32[b,s,256] = add %31, @ffn.fc1.bias
    %33:f32[b,s,256] = gelu %32 {approximate="tanh"}

After::

    %31:f32[b,s,256] = matmul_bias_act %30, @ffn.fc1.weight, @ffn.fc1.bias {activation="gelu_tanh"}
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Op, Rule, Var, apply_rules

PATTERN = Op(("relu", "gelu"), Op("add", Op("matmul", Var("x"), Var("w")), Var("bias"), commutative=True),
             name="root")


def _activation(node) -> str:
    if node.op == "relu":
        return "relu"
    return "gelu_tanh" if node.attrs["approximate"] == "tanh" else "gelu"


def _check(m):
    out = m["root"].outputs[0]
    if m["bias"].shape != out.shape[-1:]:
        return f"the added tensor is {m['bias'].type}, not a bias of the last axis"
    return None


RULES = [Rule("matmul+bias+activation", PATTERN,
              lambda b, m: {"root": b.op("matmul_bias_act", m["x"], m["w"], m["bias"],
                                         activation=_activation(m["root"]))}, _check, "bias_activation")]


def fuse_bias_activation(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
