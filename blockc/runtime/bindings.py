"""Binding symbolic dims to sizes from concrete input arrays."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import BlockcError
from ..ir.dims import Sym, evaluate
from ..ir.dtypes import DType
from ..ir.graph import Graph


def bind_inputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Symbol values implied by ``feeds``; checks names, ranks, dtypes and dims."""
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
            elif len(d.terms) == 1 and list(d.terms.items())[0][1] == 1 and len(list(d.terms)[0]) == 1:
                sym = list(d.terms)[0][0]
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
    return bindings


