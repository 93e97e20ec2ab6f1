"""Recognise LayerNorm and RMSNorm written as mean/variance arithmetic.

Before (the decomposed form)::

    %1:f32[b,s,1] = reduce_mean %x {axes=[-1], keepdims=true}
    %2:f32[b,s,d] = sub %x, %1
    %3:f32[b,s,d] = mul %2, %2
    %4:f32[b,s,1] = reduce_mean %3 {axes=[-1], keepdims=true}
    %5:f32[]      = constant {value=dense<f32[]: [1e-05]>}
    %6:f32[b,s,1] = add %4, %5
    %7:f32[b,s,1] = sqrt %6
    %8:f32[b,s,d] = div %2, %7
    %9:f32[b,s,d] = mul %8, @gamma
    %10:f32[b,s,d] = add %9, @beta

After::

    %1:f32[b,s,d] = layernorm %x, @gamma, @beta {eps=1e-05}

Variants matched: ``pow(xc, 2)`` for ``xc*xc``; ``xc * reciprocal(sigma)`` or
``xc * (1 / sigma)`` for the division; operands of add/mul in either order. RMSNorm likewise:
``x / sqrt(mean(x*x) + eps) * gamma``.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Const, Op, Or, Rule, Var, apply_rules


def _square(v):
    return Or(Op("mul", v, v), Op("pow", v, Const("two")))


def _normalize(num, denom):
    # 1/sigma as reciprocal, or as div(1, sigma) (torch.rsqrt through the TorchScript exporter)
    inverse = Or(Op("reciprocal", denom), Op("div", Const("one"), denom))
    return Or(Op("div", num, denom), Op("mul", num, inverse, commutative=True))


X = Var("x")
XC = Op("sub", X, Op("reduce_mean", X, name="mean"), name="xc")
SIGMA = Op("sqrt", Op("add", Op("reduce_mean", _square(XC), name="var"), Const("eps"), commutative=True))
LAYERNORM = Op("add", Op("mul", _normalize(XC, SIGMA), Var("gamma"), commutative=True), Var("beta"),
               commutative=True, name="root")

RMS = Op("sqrt", Op("add", Op("reduce_mean", _square(X), name="var"), Const("eps"), commutative=True))
RMSNORM = Op("mul", _normalize(X, RMS), Var("gamma"), commutative=True, name="root")


def _last_axis(node) -> bool:
    axes = node.attrs["axes"]
    return len(axes) == 1 and axes[0] % node.inputs[0].type.rank == node.inputs[0].type.rank - 1 \
        and node.attrs["keepdims"]


def _check(m):
    for key in ("mean", "var"):
        if key in m and not _last_axis(m[key]):
            return f"the {key} is not over the last axis"
    if "two" in m and float(m["two"].reshape(-1)[0]) != 2.0:
        return "the power is not 2"
    if "one" in m and float(m["one"].reshape(-1)[0]) != 1.0:
        return "the numerator of 1/sigma is not 1"
    eps = float(m["eps"].reshape(-1)[0])
    if not 0 <= eps < 1e-1:
        return f"eps={eps} does not look like a norm's epsilon"
    d = m["x"].shape[-1]
    for key in ("gamma", "beta"):
        if key in m and (m[key].shape != (d,) or m[key].dtype != m["x"].dtype):
            return f"{key} is {m[key].type}, not a vector of the last axis"
    return None


def _check_rms(m):
    x = m["x"].producer
    if x is not None and x.op == "sub" and x.inputs[1].producer is not None \
            and x.inputs[1].producer.op == "reduce_mean" and x.inputs[1].producer.inputs[0] is x.inputs[0]:
        return "the input is centred (x - mean(x)): this is the inside of a LayerNorm"
    return _check(m)


def _eps(m) -> float:
    return float(np.float64(m["eps"].reshape(-1)[0]))


RULES = [
    Rule("mean/var arithmetic -> layernorm", LAYERNORM,
         lambda b, m: {"root": b.op("layernorm", m["x"], m["gamma"], m["beta"], eps=_eps(m))}, _check, "layernorm"),
    Rule("mean-square arithmetic -> rmsnorm", RMSNORM,
         lambda b, m: {"root": b.op("rmsnorm", m["x"], m["gamma"], eps=_eps(m))}, _check_rms, "rmsnorm"),
]


def recompose_norms(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
