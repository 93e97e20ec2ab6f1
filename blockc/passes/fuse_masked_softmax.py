"""Fuse scale + mask + softmax into one ``masked_softmax``.

Before::

    %17:f32[b,h,s,s] = matmul %7, %16
    %18:f32[] = constant {value=dense<f32[]: [0.125]>}
    %19:f32[b,h,s,s] = mul %17, %18
    %20:bool[s,s] = causal_mask {rows=seq, cols=seq}
    %21:f32[] = constant {value=dense<f32[]: [-3.4028234663852886e+38]>}
    %22:f32[b,h,s,s] = where %20, %19, %21
    %23:f32[b,h,s,s] = softmax %22 {axis=-1}

After::

    %17:f32[b,h,s,s] = matmul %7, %16
    %18:f32[b,h,s,s] = masked_softmax %17 {scale=0.125, mask="none", causal=true, fill=-3.4028234663852886e+38}

Variants matched: scale as ``mul`` by a constant (either side) or ``div`` by
one, or no scale; an additive mask (``add``, either side), a boolean mask
(``where(mask, s, fill)``), a causal mask (``where(causal_mask, s, fill)``,
computed from indices by the fused op), or a causal mask with an additive
or boolean one, in either order.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Const, Op, Or, Rule, Var, apply_rules


def _causal(t):
    return Op("where", Op("causal_mask", name="causal", consume=False), t, Const("fill"), name="causal_where")


def _boolean(t):
    return Op("where", Var("bool_mask"), t, Const("bool_fill"), name="bool_where")


def _additive(t):
    return Op("add", t, Var("add_mask"), commutative=True, name="add_mask_op")


def masked_scores(x):
    """Every accepted way of scaling and masking the scores ``x``."""
    s = Or(Op("mul", x, Const("scale"), commutative=True), Op("div", x, Const("divisor")), x)
    return Or(_causal(_additive(s)), _additive(_causal(s)), _causal(_boolean(s)), _boolean(_causal(s)),
              _causal(s), _boolean(s), _additive(s), s)


def check_masks(m, scores) -> str | None:
    """Why the matched scale/mask cannot be folded into one fused op, or None."""
    if "causal" in m:
        c = m["causal"]
        if (c.attrs["rows"], c.attrs["cols"]) != tuple(scores.shape[-2:]):
            return f"the causal mask is [{c.attrs['rows']},{c.attrs['cols']}], the scores end in " \
                   f"[{scores.shape[-2]},{scores.shape[-1]}]"
    if "fill" in m and "bool_fill" in m and float(m["fill"].reshape(-1)[0]) != float(m["bool_fill"].reshape(-1)[0]):
        return "the causal and boolean masks fill with different values"
    if "add_mask" in m and m["add_mask"].dtype != scores.dtype:
        return f"the additive mask is {m['add_mask'].dtype.name}, the scores {scores.dtype.name}"
    return None


def mask_attrs(m) -> tuple[dict, list]:
    """The fused op's attributes and mask inputs for a match."""
    attrs = {"scale": 1.0, "mask": "none", "causal": "causal" in m}
    if "scale" in m:
        attrs["scale"] = float(m["scale"].reshape(-1)[0])
    elif "divisor" in m:
        attrs["scale"] = 1.0 / float(m["divisor"].reshape(-1)[0])
    masks = []
    if "add_mask" in m:
        attrs["mask"], masks = "additive", [m["add_mask"]]
    elif "bool_mask" in m:
        attrs["mask"], masks = "bool", [m["bool_mask"]]
    for key in ("fill", "bool_fill"):
        if key in m:
            attrs["fill"] = float(m[key].reshape(-1)[0])
    return attrs, masks


def _check(m):
    if not any(k in m for k in ("scale", "divisor", "add_mask", "bool_mask", "causal")):
        return "a plain softmax: no scale or mask to fuse"
    softmax = m["root"]
    axis = softmax.attrs["axis"] % softmax.inputs[0].type.rank
    if axis != softmax.inputs[0].type.rank - 1:
        return f"softmax is over axis {softmax.attrs['axis']}, not the last"
    return check_masks(m, softmax.outputs[0])


def _rewrite(b, m):
    attrs, masks = mask_attrs(m)
    return {"root": b.op("masked_softmax", m["x"], *masks, **attrs)}


RULES = [Rule("scale+mask+softmax", Op("softmax", masked_scores(Var("x")), name="root"), _rewrite, _check,
              "masked_softmax")]


def fuse_masked_softmax(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
