"""Fuse the whole attention core -- QKᵀ, scale, mask, softmax, ·V -- into
one ``attention`` op. A pass of its own, so it can be switched off and the
masked-softmax fusion stays visible on its own.

Before::

    %16:f32[b,h,d,s] = transpose %11 {perm=[0,1,3,2]}
    %17:f32[b,h,s,s] = matmul %7, %16
    %18:f32[b,h,s,s] = masked_softmax %17 {scale=0.25, mask="none", causal=true, fill=-3.4e+38}
    %19:f32[b,h,s,e] = matmul %18, %15

After::

    %16:f32[b,h,s,e] = attention %7, %11, %15 {scale=0.25, mask="none", causal=true, fill=-3.4e+38}

Also matched when masked-softmax fusion is off: ``softmax`` over any
scale/mask form that ``fuse_masked_softmax`` accepts. Kᵀ may be any
transpose (e.g. the head split and the swap merged into ``perm=[0,2,3,1]``);
the fused op then reads K through the remaining transpose.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .fuse_masked_softmax import check_masks, mask_attrs, masked_scores
from .rewrite import Op, Or, Rule, Var, apply_rules

KT = Or(Op("transpose", Var("k_in"), name="kt"), Var("kt_value"))
QK = Op("matmul", Var("q"), KT, name="qk")
PROBS = Or(Op("masked_softmax", QK, name="fused_softmax"), Op("softmax", masked_scores(QK), name="softmax"))
PATTERN = Op("matmul", PROBS, Var("v"), name="root")


def _check(m):
    if "softmax" in m:
        sm = m["softmax"]
        if sm.attrs["axis"] % sm.inputs[0].type.rank != sm.inputs[0].type.rank - 1:
            return "softmax is not over the last axis"
        return check_masks(m, m["qk"].outputs[0])
    return None


def _key(b, m):
    """K as [..., k_len, d_k], undoing the transpose that made Kᵀ."""
    if "kt" in m:
        perm = list(m["kt"].attrs["perm"])
        perm[-2], perm[-1] = perm[-1], perm[-2]
        k_in = m["k_in"]
        return k_in if perm == sorted(perm) else b.op("transpose", k_in, perm=perm)
    rank = m["kt_value"].type.rank
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return b.op("transpose", m["kt_value"], perm=perm)


def _rewrite(b, m):
    if "fused_softmax" in m:
        fs = m["fused_softmax"]
        attrs, masks = dict(fs.attrs), list(fs.inputs[1:])
    else:
        attrs, masks = mask_attrs(m)
    return {"root": b.op("attention", m["q"], _key(b, m), m["v"], *masks, **attrs)}


RULES = [Rule("attention core", PATTERN, _rewrite, _check, "attention")]


def fuse_attention(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
