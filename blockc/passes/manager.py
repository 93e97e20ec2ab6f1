"""The pass manager: runs the pipeline, verifies its result (and, to name
the pass that broke a graph, each pass's), records what each pass did, and
collects every fusion site for the report."""
from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, TextIO

from ..errors import BlockcError
from ..ir.graph import Graph
from ..ir.printer import result_numbers
from ..ir.verify import verify
from ..progress import OPTIMIZING, Progress, ticker
from .pipeline import default_pipeline
from .rewrite import Site


@dataclass
class PassStat:
    name: str
    seconds: float
    changed: bool
    nodes_before: int
    nodes_after: int


@dataclass
class OptimizeResult:
    graph: Graph
    stats: list[PassStat] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)


def pass_names() -> list[str]:
    """Each pass's name once, in pipeline order: what ``disable`` and ``print_after`` accept."""
    return list(dict.fromkeys(p.__name__ for p in default_pipeline()))


def label_origins(graph: Graph, *, keep: bool = False) -> Graph:
    """A copy whose nodes are labelled with their printed names (``%12``), so
    reports can say which original nodes went into which fused op. ``keep``:
    nodes that already have an origin (an optimized graph's) keep it."""
    g = graph.copy()
    numbers = result_numbers(g)
    for n in g.nodes:
        if not (keep and n.origin):
            n.origin = (f"%{numbers[id(n)]}",)
    return g


def optimize(graph: Graph, *, disable: Iterable[str] = (), print_after: Iterable[str] = (),
             print_after_all: bool = False, check: bool = True, out: TextIO | None = None,
             progress: Progress | None = None) -> OptimizeResult:
    """Run the default pipeline on ``graph`` (which is not changed).

    ``disable`` names passes to skip; ``print_after`` names passes whose
    output IR is printed to ``out`` (stdout by default); ``check`` runs the
    verifier on the result, and where it fails (or a pass fails) runs the
    pipeline again verifying after every pass, so the error names the pass
    that broke the graph (after every pass from the start where
    ``verifies_each_pass``); ``progress`` (``blockc.progress``) hears of each
    pass done.
    """
    names = pass_names()
    disable, print_after = list(disable), list(print_after)
    unknown = [n for n in disable + print_after if n not in names]
    if unknown:
        raise BlockcError(f"unknown pass {', '.join(repr(n) for n in unknown)}; passes: {', '.join(names)}")
    out = out or sys.stdout
    with _collector_paused():
        return _run_pipeline(graph, disable, print_after, print_after_all, check, out, progress)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while the pipeline runs.

    Every pass returns a fresh copy of the graph, whose nodes and values
    point at each other, so each copy outlives the young generations and
    counts towards a full collection, which scans everything alive. As the
    graph grows, full collections come more often *and* cost more: at GPT-3
    depth (96 layers) they were a third of the pipeline's time and made it
    grow faster than the depth. Most of what a pass makes lives until the
    pass ends, so collecting midway frees little; the superseded copies (a
    few MB each at that size) are collected in one sweep once the collector
    is back on.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


VERIFY_EACH_PASS = "BLOCKC_VERIFY_EACH_PASS"


def verifies_each_pass() -> bool:
    """Whether the verifier runs after every pass, not only on the result:
    ``BLOCKC_VERIFY_EACH_PASS=1`` (the test suite sets it, as LLVM's tests
    run ``-verify-each``). One check of the result misses a pass that breaks
    the graph where a later one hides it (dead code removed, a value folded)."""
    return os.environ.get(VERIFY_EACH_PASS, "") == "1"


def _run_pipeline(graph: Graph, disable: list, print_after: list, print_after_all: bool, check: bool,
                  out: TextIO, progress: Progress | None) -> OptimizeResult:
    # Verifying after every pass was two thirds of the pipeline's time (a 12-layer Llama: 0.43 s against
    # 0.19 s) for what one check of the result tells a user; only a broken graph pays for naming its pass.
    each = check and verifies_each_pass()
    try:
        result = _passes(graph, disable, print_after, print_after_all, each, out, progress)
        if check and not each:
            verify(result.graph)
        return result
    except (MemoryError, RecursionError):
        raise   # a second run would fail the same way, slower
    except Exception:
        if check and not each:   # the pass that broke the graph, if one did: raised with its name
            _passes(graph, disable, [], False, True, io.StringIO(), None)
        raise


def _passes(graph: Graph, disable: list, print_after: list, print_after_all: bool, check_each: bool,
            out: TextIO, progress: Progress | None) -> OptimizeResult:
    g = label_origins(graph)
    result = OptimizeResult(g, disabled=disable)
    verified = None  # a pass that changes nothing returns its input: verified already
    passes = [p for p in default_pipeline() if p.__name__ not in disable]
    tick = ticker(progress, OPTIMIZING, len(passes))
    for done, p in enumerate(passes, 1):
        name = p.__name__
        before = len(g.nodes)
        t0 = time.perf_counter()
        r = p(g)
        seconds = time.perf_counter() - t0
        if check_each and r.graph is not verified:
            try:
                verify(r.graph)
            except BlockcError as e:
                raise BlockcError(f"the graph is invalid after pass {name}: {e}") from None
            verified = r.graph
        g = r.graph
        for s in r.sites:
            s.pass_name = name
        result.sites += r.sites
        result.stats.append(PassStat(name, seconds, r.changed, before, len(g.nodes)))
        if print_after_all or name in print_after:
            out.write(f"// ----- after {name} ({'changed' if r.changed else 'no change'}) -----\n{g}")
        tick(done)
    result.graph = g
    return result
