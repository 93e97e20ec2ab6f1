"""The forms a model's graph exists in.

* ``standard``   -- as traced: layernorm, softmax, gelu are single ops;
* ``decomposed`` -- those ops lowered to primitive math (mean, sub, exp, ...);
* ``fused``      -- the standard form through the optimization pipeline.
"""
from __future__ import annotations

from ..errors import BlockcError
from ..ir.graph import Graph
from ..progress import DECOMPOSING, Progress, ticker
from .decompose import decompose
from .manager import optimize

FORMS = ("decomposed", "standard", "fused")  # least to most optimized


def to_form(graph: Graph, form: str, *, progress: Progress | None = None, **optimize_options) -> Graph:
    """``graph`` (a standard-form trace) in ``form``; ``optimize_options`` go
    to ``blockc.passes.manager.optimize`` for the fused form. ``progress``
    (``blockc.progress``) hears of each pass of the fused form, and of the
    decomposition as one step."""
    if form == "standard":
        return graph
    if form == "decomposed":
        tick = ticker(progress, DECOMPOSING, 1)
        graph = decompose(graph).graph
        tick(1)
        return graph
    if form == "fused":
        return optimize(graph, progress=progress, **optimize_options).graph
    raise BlockcError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
