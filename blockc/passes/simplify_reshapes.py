"""Reshape/transpose chain simplification.

Rules:

* ``transpose(transpose(x, p), q)`` -> ``transpose(x, p∘q)``, nothing if that is the identity;
* ``reshape(reshape(x))`` -> ``reshape(x)``;
* a reshape to the same shape, or an identity transpose -> ``x``.

Before::

    %1:f32[batch,4,seq,16] = transpose %0 {perm=[0,2,1,3]}
    %2:f32[batch,4,16,seq] = transpose %1 {perm=[0,1,3,2]}

After::

    %1:f32[batch,4,16,seq] = transpose %0 {perm=[0,2,3,1]}
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Op, Rule, Var, apply_rules


def _compose(b, m):
    inner, outer = m["inner"].attrs["perm"], m["root"].attrs["perm"]
    perm = [inner[i] for i in outer]
    x = m["x"]
    return {"root": x if perm == sorted(perm) else b.op("transpose", x, perm=perm)}


def _merge_reshapes(b, m):
    x, out = m["x"], m["root"].outputs[0]
    target = [0 if i < x.type.rank and d == x.shape[i] else d for i, d in enumerate(out.shape)]
    return {"root": x if tuple(out.shape) == tuple(x.shape) else b.op("reshape", x, shape=target)}


def _same_shape(m):
    return None if m["root"].outputs[0].shape == m["x"].shape else "the reshape changes the shape"


def _identity_perm(m):
    perm = list(m["root"].attrs["perm"])
    return None if perm == sorted(perm) else "not an identity permutation"


RULES = [
    Rule("transpose∘transpose", Op("transpose", Op("transpose", Var("x"), name="inner"), name="root"), _compose),
    Rule("reshape∘reshape", Op("reshape", Op("reshape", Var("x"), name="inner"), name="root"), _merge_reshapes),
    Rule("identity reshape", Op("reshape", Var("x"), name="root"), lambda b, m: {"root": m["x"]}, _same_shape),
    Rule("identity transpose", Op("transpose", Var("x"), name="root"), lambda b, m: {"root": m["x"]},
         _identity_perm),
]


def simplify_reshapes(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
