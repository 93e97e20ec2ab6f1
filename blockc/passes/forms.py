"""The forms a model's graph exists in.

* ``standard``   -- as traced: layernorm, softmax, gelu are single ops;
* ``decomposed`` -- those ops lowered to primitive math (mean, sub, exp, ...);
* ``fused``      -- the standard form through the optimization pipeline.

The fused form is kept in the compile cache (``files.cached_value``, under
``$BLOCKC_CACHE/ir``): its printed IR, with each node's source line and
origin, keyed by the traced graph's printed IR, the optimizer's options and
``version.code_version()``. A second optimization of the same trace by the
same code parses it back instead. Weights are never part of it: a graph
names its parameters, their values are bound when it is compiled.
"""
from __future__ import annotations

import json

from ..errors import BlockcError
from ..files import cache_key, cached_value
from ..ir.graph import Graph
from ..ir.parser import parse_graph
from ..ir.printer import print_graph
from ..progress import DECOMPOSING, Progress, ticker
from .decompose import decompose
from .manager import optimize
from ..version import code_version

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
        if set(optimize_options) - _CACHED_OPTIONS:   # printing after passes: the passes must run
            return optimize(graph, progress=progress, **optimize_options).graph
        return optimized(graph, progress, **optimize_options)
    raise BlockcError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")


_CACHED_OPTIONS = {"disable", "check"}   # optimize's options that change only the result, not what it prints


def optimized(graph: Graph, progress: Progress | None = None, **optimize_options) -> Graph:
    """``optimize(graph).graph``, from the compile cache when this trace was
    optimized with these options by this code before (see the module
    docstring); made and kept there otherwise."""
    options = {"disable": sorted(optimize_options.get("disable", ())), "check": optimize_options.get("check", True)}
    key = cache_key(print_graph(graph), json.dumps(options), code_version())
    fresh = []

    def make() -> bytes:
        fresh.append(optimize(graph, progress=progress, **optimize_options).graph)
        return _dump(fresh[0])
    loaded = cached_value("ir", key, "fused.json", make, _load)
    return fresh[0] if fresh else loaded   # made now: the graph itself (what it would be without a cache)


def _dump(graph: Graph) -> bytes:
    """The printed IR and what printing leaves out: each node's source line and origin."""
    return json.dumps({"ir": print_graph(graph), "loc": [n.loc for n in graph.nodes],
                       "origin": [list(n.origin) for n in graph.nodes]}).encode()


def _load(data: bytes) -> Graph:
    entry = json.loads(data)
    graph = parse_graph(entry["ir"])
    if not len(graph.nodes) == len(entry["loc"]) == len(entry["origin"]):
        raise ValueError("the entry's node annotations do not match its graph")
    for node, loc, origin in zip(graph.nodes, entry["loc"], entry["origin"]):
        node.loc, node.origin = loc, tuple(origin)
    return graph
