"""Reshape/transpose chain simplification.

Rules:

* ``transpose(transpose(x, p), q)`` -> ``transpose(x, p∘q)``, nothing if that is the identity;
* ``reshape(reshape(x))`` -> ``reshape(x)``;
* a reshape to the same shape, or an identity transpose -> ``x``;
* a transpose through merged leading axes, ``reshape(transpose(reshape(x)))``
  that merges them, transposes the rest and splits them again (torch's
  batched ``k.transpose(-2, -1)`` as the dynamo exporter writes it for
  SDPA) -> ``transpose(x)``, ``x`` reshaped first where the split differs.

Before::

    %1:f32[batch,4,seq,16] = transpose %0 {perm=[0,2,1,3]}
    %2:f32[batch,4,16,seq] = transpose %1 {perm=[0,1,3,2]}

After::

    %1:f32[batch,4,16,seq] = transpose %0 {perm=[0,2,3,1]}

and, for the transpose through merged leading axes, before::

    %1:f32[4*batch,seq,16] = reshape %0 {shape=[-1,seq,16]}
    %2:f32[4*batch,16,seq] = transpose %1 {perm=[0,2,1]}
    %3:f32[batch,4,16,seq] = reshape %2 {shape=[batch,4,16,seq]}

after::

    %1:f32[batch,4,16,seq] = transpose %0 {perm=[0,1,3,2]}
"""
from __future__ import annotations

from math import prod

from ..ir.graph import Graph
from ..ops._rules import fmt
from .base import PassResult
from .rewrite import Op, Rule, Var, apply_rules


def _compose(b, m):
    inner, outer = m["inner"].attrs["perm"], m["root"].attrs["perm"]
    perm = [inner[i] for i in outer]
    x = m["x"]
    return {"root": x if perm == sorted(perm) else b.op("transpose", x, perm=perm)}


def _reshaped(b, x, shape):
    """``x`` reshaped to ``shape`` (0 where a dim stays), or ``x`` itself when it has that shape."""
    if tuple(shape) == tuple(x.shape):
        return x
    return b.op("reshape", x, shape=[0 if i < x.type.rank and d == x.shape[i] else d for i, d in enumerate(shape)])


def _merge_reshapes(b, m):
    return {"root": _reshaped(b, m["x"], m["root"].outputs[0].shape)}


def _same_shape(m):
    return None if m["root"].outputs[0].shape == m["x"].shape else "the reshape changes the shape"


def _identity_perm(m):
    perm = list(m["root"].attrs["perm"])
    return None if perm == sorted(perm) else "not an identity permutation"


def _batched_parts(m):
    """(the split leading dims, the trailing dims of x) of a transpose through
    merged leading axes, or a reason it is not one."""
    x, merged = m["x"].shape, m["merge"].outputs[0].shape
    swapped, out = m["swap"].outputs[0].shape, m["root"].outputs[0].shape
    rest = len(merged) - 1
    if m["swap"].attrs["perm"][0] != 0:
        return "the transpose moves the merged axis"
    if rest < 1 or len(x) <= rest or tuple(x[-rest:]) != tuple(merged[1:]) or prod(x[:-rest]) != merged[0]:
        return f"the reshape of {fmt(x)} to {fmt(merged)} does not merge its leading axes"
    if len(out) <= rest or tuple(out[-rest:]) != tuple(swapped[1:]) or prod(out[:-rest]) != merged[0]:
        return f"the reshape of {fmt(swapped)} to {fmt(out)} does not split its leading axis"
    return tuple(out[:-rest]), tuple(x[-rest:])


def _check_batched(m):
    parts = _batched_parts(m)
    return parts if isinstance(parts, str) else None


def _unbatch(b, m):
    lead, trailing = _batched_parts(m)
    n = len(lead)
    perm = list(range(n)) + [n - 1 + p for p in m["swap"].attrs["perm"][1:]]
    return {"root": b.op("transpose", _reshaped(b, m["x"], lead + trailing), perm=perm)}


RULES = [
    Rule("transpose∘transpose", Op("transpose", Op("transpose", Var("x"), name="inner"), name="root"), _compose),
    Rule("reshape∘reshape", Op("reshape", Op("reshape", Var("x"), name="inner"), name="root"), _merge_reshapes),
    Rule("identity reshape", Op("reshape", Var("x"), name="root"), lambda b, m: {"root": m["x"]}, _same_shape),
    Rule("identity transpose", Op("transpose", Var("x"), name="root"), lambda b, m: {"root": m["x"]},
         _identity_perm),
    Rule("transpose through merged axes",
         Op("reshape", Op("transpose", Op("reshape", Var("x"), name="merge"), name="swap"), name="root"),
         _unbatch, _check_batched),
]


def simplify_reshapes(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
