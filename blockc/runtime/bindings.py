"""Binding symbolic dims to sizes from concrete input arrays, and the one
check of every feed that every backend makes before it runs: names, ranks,
dtypes, dims, and the limits the graph implies (``ops/limits.py``: ids
inside their embedding table, a sequence no longer than the position
table). A feed one backend refuses, every backend refuses, with the same
message."""
from __future__ import annotations

import weakref
from typing import Mapping

import numpy as np

from ..errors import BlockcError, InputsError
from ..ir.dims import evaluate, is_plain_symbol
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ops.limits import graph_limits


def bind_inputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Symbol values implied by ``feeds``; checks names, ranks, dtypes, dims
    and the graph's limits (``check_limits``)."""
    missing = [v.name for v in graph.inputs if v.name not in feeds]
    extra = [k for k in feeds if k not in {v.name for v in graph.inputs}]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing inputs: {', '.join(missing)}")
        if extra:
            parts.append(f"unknown inputs: {', '.join(extra)}")
        raise BlockcError("; ".join(parts) + f" (the graph takes {', '.join(v.name for v in graph.inputs)})")
    bindings: dict[str, int] = {}
    deferred = []
    for v in graph.inputs:
        a = feeds[v.name]
        if not isinstance(a, np.ndarray):
            raise BlockcError(f"input {v.name!r} must be a numpy array, got {type(a).__name__}")
        if a.ndim != v.type.rank:
            raise BlockcError(f"input {v.name!r} has rank {a.ndim}, expected {v.type}")
        try:
            got = DType.from_numpy(a.dtype)
        except KeyError:
            got = None
        if got != v.dtype:
            raise BlockcError(f"input {v.name!r} has dtype {a.dtype}, expected {v.dtype.name}")
        for axis, (d, n) in enumerate(zip(v.shape, a.shape)):
            if isinstance(d, int):
                if d != n:
                    raise BlockcError(f"input {v.name!r} axis {axis} has size {n}, expected {d}")
            elif is_plain_symbol(d):
                sym = next(iter(d.symbols))
                if bindings.setdefault(sym, n) != n:
                    raise BlockcError(f"dimension '{sym}' is {bindings[sym]} in one input and {n} in "
                                      f"input {v.name!r}")
            else:
                deferred.append((v.name, axis, d, n))
    for name, axis, d, n in deferred:
        try:
            want = evaluate(d, bindings)
        except BlockcError:
            raise BlockcError(f"input {name!r} axis {axis} is '{d}', which no other input determines") from None
        if want != n:
            raise BlockcError(f"input {name!r} axis {axis} has size {n}, expected {d} = {want}")
    check_limits(graph, feeds, bindings)
    return bindings


_LIMITS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _limits(graph: Graph):
    # Once per graph, not per run: a session's run checks its feeds every time it is timed.
    key = (len(graph.nodes), len(graph.inputs))
    cached = _LIMITS.get(graph)
    if cached is None or cached[0] != key:
        cached = _LIMITS[graph] = (key, graph_limits(graph))
    return cached[1]


def check_limits(graph: Graph, feeds: Mapping[str, np.ndarray], bindings: Mapping[str, int]) -> None:
    """Refuse ids outside ``[0, rows)`` of the table they index and dims over
    what the graph's fixed-size tables hold, before anything runs: out of
    range, a backend would read out of bounds or wrap around silently."""
    limits = _limits(graph)
    problems = []
    for d in limits.dims:
        n = evaluate(d.dim, bindings)
        if n > d.limit:
            problems.append(f"dimension '{d.dim}' is {n}, over the model's maximum of {d.limit} ({d.why})")
    for name, (high, why) in limits.ids.items():
        a = feeds[name]
        if a.size:
            outside = (a < 0) | (a >= high)
            if outside.any():
                problems.append(f"input {name!r}: {int(outside.sum())} of {a.size} ids out of range [0, {high}) "
                                f"(min {a.min()}, max {a.max()}; {why})")
    if problems:
        raise InputsError("; ".join(problems), problems)


