"""Recognise GELU written out with erf or tanh.

Before::

    %1:f32[] = constant {value=dense<f32[]: [1.4142135381698608]>}
    %2:f32[b,s,d] = div %x, %1
    %3:f32[b,s,d] = erf %2
    %4:f32[] = constant {value=dense<f32[]: [1.0]>}
    %5:f32[b,s,d] = add %4, %3
    %6:f32[] = constant {value=dense<f32[]: [0.5]>}
    %7:f32[b,s,d] = mul %6, %x
    %8:f32[b,s,d] = mul %7, %5

After::

    %1:f32[b,s,d] = gelu %x {approximate="none"}

Variants: ``x * 0.7071`` for ``x / 1.4142``; ``0.5 * (x * (1 + ...))``,
``(0.5 * x) * (1 + ...)`` and ``x * (0.5 * (1 + ...))`` (torch.onnx's dynamo
exporter at opset 18, before ``Gelu`` exists); the tanh form with ``x*x*x``
or ``pow(x, 3)``.
"""
from __future__ import annotations

import math

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Const, Op, Or, Rule, Var, apply_rules

X = Var("x")
ERF_ARG = Or(Op("div", X, Const("sqrt2")), Op("mul", X, Const("inv_sqrt2"), commutative=True))
ERF_PHI = Op("add", Op("erf", ERF_ARG), Const("one"), commutative=True)
CUBE = Or(Op("mul", Op("mul", X, X), X, commutative=True), Op("pow", X, Const("three")))
INNER = Op("mul", Op("add", X, Op("mul", CUBE, Const("c"), commutative=True), commutative=True), Const("k"),
           commutative=True)
TANH_PHI = Op("add", Op("tanh", INNER), Const("one"), commutative=True)


def _gelu(phi):
    """0.5 * x * phi in each association."""
    return Or(Op("mul", Op("mul", X, Const("half"), commutative=True), phi, commutative=True, name="root"),
              Op("mul", Op("mul", X, phi, commutative=True), Const("half"), commutative=True, name="root"),
              Op("mul", X, Op("mul", phi, Const("half"), commutative=True), commutative=True, name="root"))


def _close(m, key, want) -> bool:
    return key not in m or math.isclose(float(m[key].reshape(-1)[0]), want, rel_tol=1e-3)


def _check(m):
    wants = {"half": 0.5, "one": 1.0, "sqrt2": math.sqrt(2), "inv_sqrt2": 1 / math.sqrt(2), "three": 3.0,
             "c": 0.044715, "k": math.sqrt(2 / math.pi)}
    for key, want in wants.items():
        if not _close(m, key, want):
            return f"constant {key}={float(m[key].reshape(-1)[0])} is not GELU's {want:.6g}"
    return None


RULES = [
    Rule("erf form -> gelu", _gelu(ERF_PHI), lambda b, m: {"root": b.op("gelu", m["x"])}, _check, "gelu"),
    Rule("tanh form -> gelu", _gelu(TANH_PHI), lambda b, m: {"root": b.op("gelu", m["x"], approximate="tanh")},
         _check, "gelu"),
]


def recompose_gelu(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
