"""Fuse MatMul + bias Add + an activation (``ops/activations.py``) into one ``matmul_bias_act``.

Before::

    %31:f32[b,s,256] = matmul %30, @ffn.fc1.weight
    %32:f32[b,s,256] = add %31, @ffn.fc1.bias
    %33:f32[b,s,256] = gelu %32 {approximate="tanh"}

After::

    %31:f32[b,s,256] = matmul_bias_act %30, @ffn.fc1.weight, @ffn.fc1.bias {activation="gelu_tanh"}

The pattern matches every op some activation applies, read from the
registry when the pass runs, so a newly declared activation fuses too.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops.activations import activation_of, activation_ops
from .base import PassResult
from .rewrite import Op, Rule, Var, apply_rules


def _check(m):
    root = m["root"]
    if activation_of(root) is None:   # an op some activation applies, with other attributes
        return f"{root.op} with {dict(root.attrs)} is no declared activation"
    if m["bias"].shape != root.outputs[0].shape[-1:]:
        return f"the added tensor is {m['bias'].type}, not a bias of the last axis"
    return None


def rules() -> list[Rule]:
    """The rule, over the activations declared now."""
    pattern = Op(activation_ops(), Op("add", Op("matmul", Var("x"), Var("w")), Var("bias"), commutative=True),
                 name="root")
    return [Rule("matmul+bias+activation", pattern,
                 lambda b, m: {"root": b.op("matmul_bias_act", m["x"], m["w"], m["bias"],
                                            activation=activation_of(m["root"]).name)}, _check, "bias_activation")]


def fuse_bias_activation(graph: Graph) -> PassResult:
    return apply_rules(graph, rules())
