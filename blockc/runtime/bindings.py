"""The one check of feeds against a graph's inputs, and the symbolic dims
they bind.

``input_problems`` is the checker: names, dtypes, ranks, sizes, dims that
disagree between inputs, and the limits the graph implies
(``ops/limits.py``: ids inside their embedding table, a sequence no longer
than the position table), each problem one message. Two paths read it:

* ``bind_inputs`` raises the first problem: every backend, before it runs,
  so a feed one backend refuses, every backend refuses, with the same message;
* ``runtime/feeds.check_feeds`` lists them all, for arrays a user gave
  (``blockc run --inputs``).
"""
from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np

from ..errors import InputsError, WeightsError
from ..ir.dims import evaluate, is_plain_symbol
from ..ir.graph import Graph
from ..ops.limits import graph_limits


def bind_inputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The symbol sizes ``feeds`` imply; the first way they do not fit
    ``graph``'s inputs (``input_problems``) is raised as an ``InputsError``."""
    bindings: dict[str, int] = {}
    for problem in input_problems(graph, feeds, bindings):
        raise InputsError(problem, [problem])
    return bindings


def checked_weights(graph: Graph, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each of ``graph``'s parameters with its array from ``weights``; a
    ``WeightsError`` naming (the first ten of) those missing, or the first
    of another shape. The backends that build from the weights they are
    given check them so, before anything else."""
    missing = [name for name in graph.params if name not in weights]
    if missing:
        raise WeightsError(f"no weights for {len(missing)} parameter(s): {', '.join(missing[:10])}"
                           + (" ..." if len(missing) > 10 else ""))
    arrays = {}
    for name, v in graph.params.items():
        arrays[name] = w = np.asarray(weights[name])
        if tuple(w.shape) != v.type.concrete_shape({}):
            raise WeightsError(f"weight {name!r} has shape {list(w.shape)}, the graph expects {v.type}")
    return arrays


def input_problems(graph: Graph, feeds: Mapping[str, np.ndarray], bindings: dict[str, int]) -> Iterator[str]:
    """Each way ``feeds`` do not fit ``graph``'s inputs, one message each:
    names, then each input's dtype, rank, sizes and ids, then the dims the
    inputs share, then the graph's dim limits.

    ``bindings`` comes in holding the sizes known beforehand (a ``--dim``,
    which binds a dim no input shows on its own, as ``past`` inside
    ``past+seq``) and is filled with the size of every dim an input shows,
    which wins over a known one. A caller that stops at the first message
    (``bind_inputs``) pays for no check after it.
    """
    takes = {v.name for v in graph.inputs}
    unexpected = [name for name in feeds if name not in takes]
    if unexpected:
        yield (f"unexpected array{'s' if len(unexpected) > 1 else ''} {', '.join(map(repr, unexpected))} "
               f"(the graph takes {', '.join(f'{v.name}: {v.type}' for v in graph.inputs)})")
    limits = graph_limits(graph)   # each check, not cached: graphs change in place, and a check is
                                   # once per run or runner, outside any timed loop
    seen: dict[str, list[tuple[str, int, int]]] = {}  # symbol -> (input, axis, size) where it appears
    compound, symbolic_ids = [], []
    for v in graph.inputs:
        if v.name not in feeds:
            yield f"missing input {v.name!r}: {v.type}"
            continue
        a = feeds[v.name]
        if not isinstance(a, np.ndarray):
            yield f"input {v.name!r}: a {type(a).__name__}, not a numpy array"
            continue
        if a.dtype != v.dtype.numpy:
            yield f"input {v.name!r}: dtype {a.dtype}, expected {v.dtype.name}"
        if a.ndim != v.type.rank:
            yield f"input {v.name!r}: rank {a.ndim} (shape {list(a.shape)}), expected rank {v.type.rank}: {v.type}"
            continue
        for axis, (d, n) in enumerate(zip(v.shape, a.shape)):
            if isinstance(d, int):
                if d != n:
                    yield f"input {v.name!r}: axis {axis} is {n}, expected {d} ({v.type})"
            elif is_plain_symbol(d):
                seen.setdefault(next(iter(d.symbols)), []).append((v.name, axis, n))
            else:
                compound.append((v.name, axis, d, n))
        if v.name in limits.ids and a.dtype.kind in "iu" and a.size:  # even at a wrong integer dtype
            if isinstance(limits.ids[v.name][0], int):
                yield from _ids_problem(v.name, a, *limits.ids[v.name])
            else:
                symbolic_ids.append((v.name, a))   # its range is known once the dims are bound

    for sym, where in seen.items():
        sizes = sorted({n for _, _, n in where})
        if len(sizes) > 1:
            yield (f"dimension '{sym}' disagrees between inputs: "
                   + ", ".join(f"{n} in {name} axis {axis}" for name, axis, n in where))
            continue
        bindings[sym] = sizes[0]
    for name, axis, d, n in compound:
        if not d.symbols <= bindings.keys():
            missing = ", ".join(sorted(d.symbols - bindings.keys()))
            yield f"input {name!r}: axis {axis} is '{d}', and no input determines {missing}"
        elif evaluate(d, bindings) != n:
            yield f"input {name!r}: axis {axis} is {n}, expected {d} = {evaluate(d, bindings)}"
    for limit, n in limits.dims_over(bindings):
        yield f"dimension '{limit.dim}' is {n}, over the model's maximum of {limit.limit} ({limit.why})"
    for name, a in symbolic_ids:
        high, why = limits.ids[name]
        if high.symbols <= bindings.keys():
            yield from _ids_problem(name, a, evaluate(high, bindings), f"{why}, {high} = {evaluate(high, bindings)}")


def _ids_problem(name: str, a: np.ndarray, high: int, why: str) -> Iterator[str]:
    low_id, high_id = a.min(), a.max()   # two reductions; the mask only when one is out
    if low_id < 0 or high_id >= high:
        outside = int(((a < 0) | (a >= high)).sum())
        yield (f"input {name!r}: {outside} of {a.size} ids out of range [0, {high}) "
               f"(min {low_id}, max {high_id}; {why})")

