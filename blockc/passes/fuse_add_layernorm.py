"""Fuse a residual add into the LayerNorm (or RMSNorm) that reads it.

Post-norm (the sum is used only by the norm)::

    %29:f32[b,s,d] = add %2, %28
    %30:f32[b,s,d] = layernorm %29, @ln1.weight, @ln1.bias {eps=1e-05}

becomes::

    %29:f32[b,s,d] = add_layernorm %2, %28, @ln1.weight, @ln1.bias {eps=1e-05, with_sum=false}

Pre-norm (the sum is the next residual, so the fused op returns it too, as
ONNX Runtime's SkipLayerNormalization does)::

    %29:f32[b,s,d], %30:f32[b,s,d] = add_layernorm %2, %28, @ln2.weight, @ln2.bias {eps=1e-05, with_sum=true}

Either operand order of the add; the operand of the full shape becomes the
input and the other (e.g. a [seq,d] position table) the residual.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Op, Rule, Var, apply_rules

SUM = Op("add", Var("a"), Var("b"), name="sum")


def _operands(m):
    a, b = m["a"], m["b"]
    out = m["sum"].outputs[0].shape
    return (a, b) if a.shape == out else (b, a)


def _check(m):
    x, r = _operands(m)
    if x.shape != m["sum"].outputs[0].shape:
        return "neither operand of the add has the sum's shape (both are broadcast)"
    return None


def _rewrite(b, m):
    x, r = _operands(m)
    norm = m["root"]
    with_sum = "sum" in m.escaping
    fused = b.node("add_" + norm.op, x, r, *norm.inputs[1:], eps=norm.attrs["eps"], with_sum=with_sum)
    out = {"root": fused.outputs[0]}
    if with_sum:
        out["sum"] = fused.outputs[1]
    return out


RULES = [
    Rule("residual add+layernorm", Op("layernorm", SUM, Var("gamma"), Var("beta"), name="root"), _rewrite, _check,
         "add_layernorm"),
    Rule("residual add+rmsnorm", Op("rmsnorm", SUM, Var("gamma"), name="root"), _rewrite, _check, "add_rmsnorm"),
]


def fuse_add_layernorm(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
