"""The forms a model's graph exists in.

* ``standard``   -- as traced: layernorm, softmax, gelu are single ops;
* ``decomposed`` -- those ops lowered to primitive math (mean, sub, exp, ...).

(The ``fused`` form arrives with the fusion passes.)
"""
from __future__ import annotations

from .errors import BlockcError
from .ir.graph import Graph
from .passes.decompose import decompose

FORMS = ("standard", "decomposed")


def to_form(graph: Graph, form: str) -> Graph:
    """``graph`` (a standard-form trace) in ``form``."""
    if form == "standard":
        return graph
    if form == "decomposed":
        return decompose(graph).graph
    raise BlockcError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
