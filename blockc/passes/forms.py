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

A warm start need not even trace: ``form_of`` keys the same entry (under
``$BLOCKC_CACHE/model``) by a description of the model known before tracing
(``frontends/trace_key.py``: a built-in model's class, name, config and
step), the options and the code version, and traces only on a miss.
"""
from __future__ import annotations

import json
from typing import Callable

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
        if not _cacheable(form, optimize_options):   # printing after passes: the passes must run
            return optimize(graph, progress=progress, **optimize_options).graph
        return optimized(graph, progress, **optimize_options)
    raise BlockcError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")


# optimize's options that change only the result, not what it prints: each with its default and its value as
# the cache key holds it (the passes disabled are a set)
_CACHED_OPTIONS = {"disable": ((), sorted), "check": (True, lambda check: check)}
_PRINTING = ("print_after", "print_after_all")   # optimize's options that ask for printing, when not empty
_PRINT_OUT = "out"                               # where it prints: nothing asked, nothing printed there


def _cacheable(form: str, optimize_options: dict) -> bool:
    """Whether ``form`` with these options may come from the compile cache:
    the fused form, asked for nothing but its result. Decided on the values:
    an empty ``print_after`` or a false ``print_after_all`` asks for no
    printing, as leaving it out does, so callers pass their options as given."""
    printing = any(optimize_options.get(name) for name in _PRINTING)
    others = set(optimize_options) - {*_CACHED_OPTIONS, *_PRINTING, _PRINT_OUT}
    return form == "fused" and not printing and not others


def optimized(graph: Graph, progress: Progress | None = None, **optimize_options) -> Graph:
    """``optimize(graph).graph``, from the compile cache when this trace was
    optimized with these options by this code before (see the module
    docstring); made and kept there otherwise."""
    return _kept("ir", print_graph(graph), optimize_options,
                 lambda: optimize(graph, progress=progress, **optimize_options).graph)


def form_of(source: str | None, make_trace: Callable[[], Graph], form: str, *, progress: Progress | None = None,
            **optimize_options) -> Graph:
    """``to_form(make_trace(), form, ...)``, without calling ``make_trace``
    where this form of the model ``source`` describes was kept before (the
    fused form, with options that change only the result: see the module
    docstring). ``source``: ``frontends.trace_key`` of the model traced,
    None where only its trace can say what it is (then it is traced)."""
    if source is None or not _cacheable(form, optimize_options):
        return to_form(make_trace(), form, progress=progress, **optimize_options)
    return _kept("model", source, optimize_options, lambda: optimized(make_trace(), progress, **optimize_options))


def _kept(kind: str, source: str, optimize_options: dict, make: Callable[[], Graph]) -> Graph:
    """``make()``, the fused graph of what ``source`` names, kept in the cache
    as ``KIND/KEY/fused.json`` under a key of ``source``, the options that
    change the result and the code version; made now, the graph itself
    (what it would be without a cache), else the one read back."""
    options = {name: keyed(optimize_options.get(name, default)) for name, (default, keyed) in _CACHED_OPTIONS.items()}
    fresh = []

    def dump() -> bytes:
        fresh.append(make())
        return _dump(fresh[0])
    # made now: the graph itself, not the entry parsed back (a cold start would parse each graph twice, once a kind)
    loaded = cached_value(kind, cache_key(source, json.dumps(options), code_version()), "fused.json", dump,
                          lambda data: None if fresh else _load(data))
    return fresh[0] if fresh else loaded


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
