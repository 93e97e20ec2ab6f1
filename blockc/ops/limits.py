"""What a graph's inputs may hold without any op reading out of bounds.

Three kinds of limit follow from the graph alone, so every backend (and the
generated C API) enforces the same ones, whatever model the graph came from:

* **ids**: a graph input used as a ``gather``'s indices (a token embedding),
  or as any op's ids (its declaration's ``indexes``: a ``rotary``'s
  positions), must hold ids in ``[0, rows)`` of the table it indexes.
  Negative ids are refused too: they would silently take rows from the end.
  ``rows`` may be symbolic: a generation step gathers positions from the
  table's first ``past+seq`` rows, so each position must lie below
  ``past+seq`` (checked once the feeds bind the dims).
* **dims**: an op that reads or writes a fixed-size axis up to a symbolic
  end (its declaration's ``bounds``: the position table sliced to ``seq``,
  a preallocated cache written up to ``total``) bounds that end:
  ``seq <= 1024``, ``total <= 1001``.
* **sizes**: every value of the graph, its dims bound, must be a tensor that
  can exist: elements and bytes countable in int64 (``ir/types.size_problem``).
  An ONNX input ``f32[2**62, 2**62]``, or ``--dim`` sizes whose product
  overflows, are refused naming the value, before anything is allocated or
  any memory planned.

``runtime/bindings.input_problems`` checks feeds against the ids and dims
before any run, and the CLI and ``compare`` check ``--dim`` sizes with
``dims_over`` and ``size_over`` (as ``runtime/feeds.check_feeds`` does the
sizes a user's arrays bind; not every run's feeds: arrays that exist fit,
and a decode step should not pay for it);
``codegen/cuda/lower`` renders the dim limits into ``blockc_run``, and has
the gathers of an id input report an id out of range to it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

from ..ir.dims import Dim, Sym, evaluate, is_plain_symbol
from ..ir.graph import Graph
from ..ir.types import size_problem
from .registry import get


@dataclass(frozen=True)
class DimLimit:
    """``dim <= limit``, because of ``why``."""

    dim: Dim
    limit: int
    why: str


@dataclass(frozen=True)
class Limits:
    ids: dict        # input name -> (high, why): its values must lie in [0, high); high an int or a Dim
    dims: list       # DimLimit, the tightest per dim expression
    graph: Graph | None = field(default=None, repr=False, compare=False)   # what ``sizes`` is read from

    @functools.cached_property
    def sizes(self) -> dict:
        """(shape, itemsize) -> the first value of that size, inputs first: one
        check per distinct size. Made when ``size_over`` first asks: every run
        and decode step checks its feeds against the limits, and none reads it."""
        return _sizes(self.graph) if self.graph is not None else {}

    def __bool__(self) -> bool:
        return bool(self.ids or self.dims)

    def dims_over(self, sizes: Mapping[str, int]) -> list[tuple[DimLimit, int]]:
        """Each dim limit ``sizes`` exceed, with the dim's size there (a limit
        on a dim ``sizes`` does not bind is passed over)."""
        over = []
        for d in self.dims:
            if d.dim.symbols <= sizes.keys():
                n = evaluate(d.dim, sizes)
                if n > d.limit:
                    over.append((d, n))
        return over

    def fit_defaults(self, sizes: Mapping[str, int], defaulted) -> tuple[dict[str, int], list[str]]:
        """``sizes`` with each of the ``defaulted`` dims (a command's default,
        not asked for) that exceeds its limit lowered to the limit, and a
        note for each one lowered: a default must fit the model it is for.
        A dim the user asked for is left as it is, for the caller to refuse."""
        fitted, notes = dict(sizes), []
        for d in self.dims:
            name = str(d.dim)
            if is_plain_symbol(d.dim) and name in defaulted and fitted.get(name, 0) > d.limit:
                notes.append(f"{name}={d.limit}, not the default {fitted[name]}: the model's maximum ({d.why})")
                fitted[name] = d.limit
        return fitted, notes

    def size_over(self, sizes: Mapping[str, int]) -> str | None:
        """Why a value of the graph cannot exist at ``sizes`` (``ir/types.size_problem``),
        naming the first such value and its shape, or None."""
        for (shape, itemsize), v in self.sizes.items():
            if all(isinstance(d, int) or d.symbols <= sizes.keys() for d in shape):
                concrete = [evaluate(d, sizes) for d in shape]
                too_big = size_problem(concrete, itemsize)
                if too_big:
                    used = {s: sizes[s] for d in shape if not isinstance(d, int) for s in sorted(d.symbols)}
                    at = f" at {', '.join(f'{k}={n}' for k, n in used.items())} is {concrete} and" if used else ""
                    return f"{_value(v)} {v.type}{at} {too_big}"
        return None


def _value(v) -> str:
    if v.kind == "input":
        return f"input {v.name!r}"
    if v.kind == "param":
        return f"weight {v.name!r}"
    where = f" ({v.producer.loc})" if v.producer.loc else ""
    return f"the output of {v.producer.op}{where}"


def _sizes(graph: Graph) -> dict:
    sizes: dict = {}
    values = [*graph.inputs, *graph.params.values(), *(o for n in graph.nodes for o in n.outputs)]
    for v in values:
        sizes.setdefault((v.shape, v.dtype.itemsize), v)
    return sizes


def _table(v) -> str:
    return repr(v.name) if v.name else "a table"


def _named(v):
    """``v``, or where it has no name the named value it is a part or a
    written copy of: what made it is an op with ``bounds`` (a slice, a
    cache write), whose first input it comes from."""
    while not v.name and v.producer is not None and get(v.producer.op).bounds is not None:
        v = v.producer.inputs[0]
    return v


def _holds(x, axis: int, size: int) -> str:
    """Why an end along ``axis`` of ``x`` is at most ``size``."""
    named, axis = _named(x), axis % x.type.rank
    return f"{_table(named)} has {size} rows" if axis == 0 else f"{_table(named)} holds {size} positions on axis {axis}"


def _indexes(table, rows: Dim) -> str:
    """Why ids of a gather from ``table`` must lie below ``rows``."""
    source = table.producer.inputs[0] if table.producer is not None and table.producer.op == "slice" else None
    if not isinstance(rows, int) and source is not None:   # a generation step's position table
        return f"it indexes the first {rows} rows of {_table(source)}"
    return f"it indexes {_table(table)}, which has {rows} rows"


def _tighter(rows: Dim, known: Dim | None) -> bool:
    """Whether ``rows`` bounds an id input more tightly than the bound ``known``
    (None: no bound yet). A symbolic row count is taken over a fixed one: it
    is a slice of a fixed table, which the slice's dim limit bounds."""
    if known is None:
        return True
    if isinstance(rows, int) and isinstance(known, int):
        return rows < known
    return not isinstance(rows, int) and isinstance(known, int)


def graph_limits(graph: Graph) -> Limits:
    """The id ranges and dim limits ``graph``'s ops imply (see the module docstring)."""
    ids: dict[str, tuple[int, str]] = {}
    dims: dict[Dim, DimLimit] = {}
    for n in graph.nodes:
        indexes = get(n.op).indexes
        for idx, data, axis in indexes(n) if indexes else ():
            rows = data.shape[axis % data.type.rank]
            if idx.kind == "input" and _tighter(rows, ids.get(idx.name, (None,))[0]):
                ids[idx.name] = (rows, _indexes(data, rows))
        bounds = get(n.op).bounds
        for end, x, axis in bounds(n) if bounds else ():
            size = x.shape[axis % x.type.rank]
            if isinstance(size, int) and isinstance(end, Sym) and (end not in dims or size < dims[end].limit):
                dims[end] = DimLimit(end, size, _holds(x, axis, size))
    return Limits(ids, list(dims.values()), graph)
