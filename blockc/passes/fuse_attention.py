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
the fused op then reads K through the remaining transpose. A constant
factor on q, K or Kᵀ joins the scale: torch's SDPA splits its scale as
√scale on q and on Kᵀ, and the dynamo exporter writes both.

The probabilities may pass a NaN guard first, ``where(isnan(p), 0, p)``
(imported as ``where(not(equal(p, p)), 0, p)``), which torch's
scaled_dot_product_attention writes for rows whose every score is -inf. It
is dropped when the masks are finite (constant fills, an additive mask made
by ``where`` of finite constants, as Hugging Face builds it): softmax then
gives no NaN the guard could catch, only what NaN inputs would already give.

A boolean mask written as an additive one, ``where(allowed, 0, -inf)`` (what
torch's SDPA is given by Hugging Face, and so what TorchScript and Optimum
export), keeps its guard's meaning another way: a fully masked row is all
-inf, its softmax NaN, the guard's zeros. The fused op takes ``allowed`` as
its boolean mask and is ``guarded``: a row with no key to attend gives zeros
(``ops/masking.guard_rows``), where an unguarded one averages the values::

    %20:bool[b,1,s,s] = ...
    %42:f32[b,1,s,s] = where %20, %zero, %neg_inf
    %43:f32[b,h,s,s] = masked_softmax %39, %42 {mask="additive", ...}
    %46:f32[b,h,s,s] = where %45, %zero, %43             # %45: isnan(%43)
    %47:f32[b,h,s,e] = matmul %46, %32

becomes::

    %47:f32[b,h,s,e] = attention %q, %k, %32, %20 {mask="bool", ..., guarded=true}
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from ..ops.masking import DEFAULT_FILL
from .base import PassResult
from .fuse_masked_softmax import check_masks, mask_attrs, masked_scores
from .rewrite import Const, Op, Or, Rule, Var, apply_rules, optional


def _scaled(p, name: str) -> Or:
    """``p``, maybe times a constant ``{name}_scale``."""
    return optional(lambda x: Op("mul", x, Const(f"{name}_scale"), commutative=True, name=f"{name}_scaled"), p)


# torch's SDPA splits its scale as √scale on q and on Kᵀ (the dynamo exporter writes both).
KT = _scaled(Or(Op("transpose", _scaled(Var("k_in"), "k"), name="kt"), Var("kt_value")), "kt")
QK = Op("matmul", _scaled(Var("q"), "q"), KT, name="qk")
PROBS = Or(Op("masked_softmax", QK, name="fused_softmax"), Op("softmax", masked_scores(QK), name="softmax"))
NAN_GUARDED = Op("where", Op("logical_not", Op("equal", PROBS, PROBS)), Const("nan_fill"), PROBS, name="nan_guard")
PATTERN = Op("matmul", Or(NAN_GUARDED, PROBS), Var("v"), name="root")


def _check(m):
    unscaled = {"q": m["q"], "k": m.get("k_in"), "kt": m["kt"].outputs[0] if "kt" in m else m.get("kt_value")}
    for name, x in unscaled.items():
        scaled = m.get(f"{name}_scaled")
        if scaled is not None and scaled.outputs[0].type != x.type:
            return f"the scale on {name} broadcasts it from {x.type} to {scaled.outputs[0].type}"
    if "softmax" in m:
        sm = m["softmax"]
        if sm.attrs["axis"] % sm.inputs[0].type.rank != sm.inputs[0].type.rank - 1:
            return "softmax is not over the last axis"
        reason = check_masks(m, m["qk"].outputs[0])
        if reason:
            return reason
    if "nan_guard" in m and _disguised_boolean(*_attrs_and_masks(m)) is None:
        return _nan_possible(*_attrs_and_masks(m))
    return None


def _attrs_and_masks(m):
    if "fused_softmax" in m:
        fs = m["fused_softmax"]
        return dict(fs.attrs), list(fs.inputs[1:])
    return mask_attrs(m)


def _nan_possible(attrs, masks) -> str | None:
    """Why the softmax may give NaN (so its NaN guard must stay), or None."""
    guard = "the NaN guard after softmax must stay"
    if "fill" in attrs and not np.isfinite(attrs["fill"]):
        return f"the mask fills with {attrs['fill']}: a fully masked row is NaN, and {guard}"
    if attrs["mask"] != "additive":
        return None
    values = _constant_leaves(masks[0])
    if values is None:
        return f"the additive mask is computed at run time and may hold -inf: {guard}"
    if not all(np.isfinite(v).all() for v in values):
        return f"the additive mask holds -inf: {guard}"
    return None


def _disguised_boolean(attrs, masks) -> tuple[Value, bool] | None:
    """Where the additive mask is a boolean one, ``where(c, finite, -inf)``
    (or ``where(c, -inf, finite)``), its condition and whether True allows;
    None otherwise. A finite scalar on the allowed keys shifts a whole row's
    scores alike, which softmax does not see."""
    if attrs["mask"] != "additive" or not np.isfinite(attrs.get("fill", DEFAULT_FILL)):
        return None
    node = masks[0].producer
    if node is None or node.op != "where":
        return None
    values = [_scalar_constant(x) for x in node.inputs[1:]]
    if None in values:
        return None
    picks = [bool(np.isneginf(v)) for v in values]
    if picks == [False, True] and np.isfinite(values[0]):
        return node.inputs[0], True
    if picks == [True, False] and np.isfinite(values[1]):
        return node.inputs[0], False
    return None


def _scalar_constant(v: Value) -> float | None:
    node = v.producer
    if node is None or node.op != "constant" or node.attrs["value"].size != 1:
        return None
    return float(node.attrs["value"].reshape(-1)[0])


def _constant_leaves(v: Value) -> list | None:
    """The arrays ``v`` takes its values from: a constant, or ``where`` of two; None otherwise."""
    node = v.producer
    if node is not None and node.op == "constant":
        return [node.attrs["value"]]
    if node is not None and node.op == "where":
        leaves = [_constant_leaves(x) for x in node.inputs[1:]]
        return None if None in leaves else leaves[0] + leaves[1]
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
    attrs, masks = _attrs_and_masks(m)
    for name in ("q_scale", "k_scale", "kt_scale"):
        if name in m:
            attrs["scale"] *= float(m[name].reshape(-1)[0])
    boolean = _disguised_boolean(attrs, masks) if "nan_guard" in m and _nan_possible(attrs, masks) else None
    if boolean is None:
        return {"root": b.op("attention", m["q"], _key(b, m), m["v"], *masks, **attrs)}
    cond, allows = boolean
    allowed = cond if allows else b.op("logical_not", cond)
    attrs = {**attrs, "mask": "bool", "guarded": True}   # a row with no key gives zeros, as the NaN guard did
    return {"root": b.op("attention", m["q"], _key(b, m), m["v"], allowed, **attrs)}


RULES = [Rule("attention core", PATTERN, _rewrite, _check, "attention")]


def fuse_attention(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
