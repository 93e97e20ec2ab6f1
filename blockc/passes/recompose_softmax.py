"""Recognise softmax written as exp/sum (the decomposed form, or an exporter's).

Before::

    %1:f32[b,h,s,s] = reduce_max %x {axes=[-1], keepdims=true}
    %2:f32[b,h,s,s] = sub %x, %1
    %3:f32[b,h,s,s] = exp %2
    %4:f32[b,h,s,1] = reduce_sum %3 {axes=[-1], keepdims=true}
    %5:f32[b,h,s,s] = div %3, %4

After::

    %1:f32[b,h,s,s] = softmax %x {axis=-1}

Also matched: no max subtraction (``exp(x) / sum(exp(x))``), and
``e * reciprocal(sum)`` for the division.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Op, Or, Rule, Var, apply_rules

X = Var("x")
EXP = Op("exp", Or(Op("sub", X, Op("reduce_max", X, name="max")), X), name="e")
SUM = Op("reduce_sum", EXP, name="sum")  # EXP in full: in mul(1/sum, e) this mention is matched first


def _axis(node):
    axes = node.attrs["axes"]
    rank = node.inputs[0].type.rank
    return axes[0] % rank if len(axes) == 1 and isinstance(axes[0], int) else None


def _check(m):
    axis = _axis(m["sum"])
    if axis is None or not m["sum"].attrs["keepdims"]:
        return "the sum is not over one axis with keepdims"
    if "max" in m and (_axis(m["max"]) != axis or not m["max"].attrs["keepdims"]):
        return "max and sum are over different axes"
    return None


def _rewrite(b, m):
    x = m["x"]
    return {"root": b.op("softmax", x, axis=_axis(m["sum"]) - x.type.rank)}


RULES = [Rule("exp/sum -> softmax", Op("div", EXP, SUM, name="root"), _rewrite, _check, "softmax"),
         Rule("exp*1/sum -> softmax", Op("mul", EXP, Op("reciprocal", SUM), name="root", commutative=True),
              _rewrite, _check, "softmax")]


def recompose_softmax(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
