"""The forms a model's graph exists in.

* ``standard``   -- as traced: layernorm, softmax, gelu are single ops;
* ``decomposed`` -- those ops lowered to primitive math (mean, sub, exp, ...);
* ``fused``      -- the standard form through the optimization pipeline.
"""
from __future__ import annotations

from ..errors import BlockcError
from ..ir.graph import Graph
from .decompose import decompose
from .manager import optimize

FORMS = ("decomposed", "standard", "fused")  # least to most optimized


def to_form(graph: Graph, form: str, **optimize_options) -> Graph:
    """``graph`` (a standard-form trace) in ``form``; ``optimize_options`` go
    to ``blockc.passes.manager.optimize`` for the fused form."""
    if form == "standard":
        return graph
    if form == "decomposed":
        return decompose(graph).graph
    if form == "fused":
        return optimize(graph, **optimize_options).graph
    raise BlockcError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
