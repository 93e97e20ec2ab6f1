"""Keeping ``blockc compare`` within a memory budget.

Every contestant (one compiled session of a form on a backend, or a peer)
gets an estimate before anything is prepared: the memory model
(``report/footprint.py``: weights, peak live activations, outputs) at the
shape, with the backend's own host copies of the weights
(``Backend.weight_copies``, measured per backend) and its arena. Contestants are then
timed in groups whose estimates add up to at most the budget -- by default
half the memory available when compare starts, ``--max-memory`` to change
-- beside what compare itself holds (the weights and the float64 oracle's
outputs), with room beside them for the last one's preparation, which
holds more than the session keeps (``Backend.build_copies`` of the weights:
an ONNX Runtime session is made from a serialized copy of the model). A
contestant that alone would exceed the budget is not run; its row says why.

Estimates are checked as the run goes (``Grouping``, which
``compare/run.py`` feeds what it measures): before each session after a
group's first, the process's resident memory (``resident_bytes``) is
measured, and where its growth since compare started, with that session's
estimate (plus the most a checked session held beyond its own: an
estimate that falls short once falls short for the next) and the larger
of one run's need and one preparation's, would pass
the budget, the group is cut there: what is ready is timed and closed
first. A run's need is the larger of its estimate (activations and outputs)
and the most any run of the shape has been measured to take beyond what
stays resident after it (the first block's check run of each session and
a second run, where ONNX Runtime's arena reaches the size it keeps, their
peak read from the kernel's high-water mark: an interpreter's temporaries
are not in the model); a preparation's, likewise, the larger of its
estimate and the most one was measured to take beyond what it kept. The
stretch of the run where the process peaked is named in the report. The
measure is the process's whole, so memory a closed session's runtime kept
counts against the next group; ``release_freed`` collects what closed
sessions left in reference cycles and hands what it can back after each
group.
"""
from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..files import format_bytes
from ..frontends.module import available_memory
from ..report.footprint import footprint


def default_budget() -> int | None:
    """Half the memory available now; None where it cannot be known."""
    have = available_memory()
    return None if have is None else have // 2


def resident_bytes() -> int | None:
    """This process's resident memory, where the OS says (Linux)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def reset_peak() -> None:
    """Start the peak (``peak_resident``) from now: Linux resets a process's
    high-water mark when "5" is written to its ``clear_refs``. Elsewhere the
    peak stays the process's lifetime one."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_resident() -> int | None:
    """This process's peak resident memory since ``reset_peak`` (Linux), or
    over its lifetime (``getrusage``); None where neither is known."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024   # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # kilobytes on Linux
    except (ImportError, OSError):
        return None


class Watch:
    """This process's memory as compare runs: its growth since the watch
    began, and its peak over named stretches of the run (``stretch``: the
    peak since the last stretch began, where Linux can reset the high-water
    mark) folded into the whole run's (``peak_growth``, reached in the
    stretch ``peak_at`` names)."""

    def __init__(self):
        self.start, self._peak, self._name, self.peak_at = resident_bytes(), 0, "start", None
        reset_peak()

    def growth(self) -> int | None:
        now = resident_bytes()
        return None if now is None or self.start is None else now - self.start

    def stretch(self, name: str) -> int | None:
        """End the stretch running now and begin one called ``name``; returns
        the peak resident memory of the one that ended."""
        peak = peak_resident()
        if peak is not None and peak > self._peak:
            self._peak, self.peak_at = peak, self._name
        self._name = name
        reset_peak()
        return peak

    def peak_growth(self) -> int | None:
        self.stretch("end")
        return None if self.start is None or not self._peak else max(0, self._peak - self.start)


@contextmanager
def collecting_only_new() -> Iterator[None]:
    """Within it, Python's cycle collector looks only at objects made inside.

    ``release_freed`` collects after every group, and a full collection walks
    every object the process tracks: with torch and ONNX Runtime imported
    that is some 300,000 of them, 0.14 CPU-s a collection, the same again
    for each group of a run whose groups hold one session each. What was
    made before the comparison began (modules, the caller's objects, the
    plan's graphs and weights) is moved aside with ``gc.freeze`` for the
    while, so each collection walks only what compare made -- the closed
    sessions it is there to free. Nothing alive is freed the sooner: the
    collector treats references from frozen objects as from outside. A
    caller that froze objects itself keeps its own freeze untouched."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()   # back to the oldest generation, collected as before


def release_freed() -> None:
    """Free what closed sessions left, and hand it back to the OS.

    First Python's cycle collector: a closed session is not freed when its
    last name goes if it sits in a reference cycle (a torch.fx module and its
    parameters, folded constants such as GPT-2's transposed 147 MiB embedding
    among them; ONNX Runtime's optimizer's model protos with every weight).
    The collector runs by counts of Python objects made, not by bytes, so a
    run that makes few objects and large arrays can go many groups without
    it, each group's sessions piling on the last. Then glibc: it keeps freed
    blocks in its per-thread arenas (ONNX Runtime's and torch's worker
    threads each have one), so without ``malloc_trim`` the process's
    resident memory only ratchets up from group to group and the next
    group's measurement counts the last one's garbage."""
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to ask
        pass


def session_bytes(backend, graph, shape: dict[str, int]) -> int:
    """The host memory one compiled session of ``graph`` on ``backend`` keeps
    while others run: its copies of the weights, and the arena where its
    runtime keeps its activations between runs (``Backend.arena_copies``)."""
    fp = footprint(graph, shape)
    arena = 0.0 if backend.on_gpu else backend.arena_copies * fp.activations
    return int(backend.weight_copies * fp.weights + arena)


def build_bytes(backend, graph, shape: dict[str, int]) -> int:
    """What preparing a session of ``graph`` on ``backend`` holds for a while
    beyond what the session keeps (``Backend.build_copies`` of the weights)."""
    return int(backend.build_copies * footprint(graph, shape).weights)


def run_bytes(graph, shape: dict[str, int]) -> int:
    """What one run adds while it runs: its activations (the outputs among
    them, which the caller receives) and its inputs."""
    fp = footprint(graph, shape)
    return fp.activations + fp.inputs


def holding_bytes(graph, shape: dict[str, int], largest_run: int) -> int:
    """What compare itself holds at ``shape`` besides its sessions: the
    model's weights; at first the float64 reference run that checks every
    session (the weights widened, its activations), then that run's outputs
    while the sessions run one at a time."""
    fp, fp64 = footprint(graph, shape), footprint(graph, shape, itemsize=8)
    return fp.weights + max(fp64.weights + fp64.activations, fp64.outputs + largest_run)


@dataclass
class Group:
    """Contestants prepared together and timed interleaved (pairable round by round)."""

    keys: list[str]
    estimate: int


def plan_groups(estimates: dict[str, int], budget: int | None,
                builds: dict[str, int] | None = None) -> tuple[list[Group], dict[str, int]]:
    """Split contestants (in their order) into groups whose estimates
    (``session_bytes``) add up to at most ``budget`` (what is left beside
    ``holding_bytes``), with room for the last one's preparation
    (``builds``, ``build_bytes``) beside the rest; returns the groups and
    those that alone exceed it."""
    groups: list[Group] = []
    too_big: dict[str, int] = {}
    for key, need in estimates.items():
        build = (builds or {}).get(key, 0)
        if budget is not None and need + build > budget:
            too_big[key] = need + build
        elif groups and (budget is None or groups[-1].estimate + need + build <= budget):
            groups[-1].keys.append(key)
            groups[-1].estimate += need
        else:
            groups.append(Group([key], need))
    return groups, too_big


class Grouping:
    """The contestants of one shape in groups within the budget, block after
    block; pure bookkeeping, fed the numbers the run measures.

    The first block starts from the groups the estimates plan
    (``plan_groups``; ``too_big`` holds those that alone exceed the
    budget), later blocks from the groups the first block timed. Before each
    session after a group's first, ``cut_here`` says whether the process's
    growth, with what the session will hold (``holds``) and the largest
    transient beside it (``transient``), would pass the budget; ``cut`` then
    defers the rest of the group to the next one. Each session's checked
    runs teach it what the estimates miss (``learned_build``,
    ``learned_runs``, ``learned_timing``).

        g = Grouping(estimates, builds, budget, holding, one_run)
        for keys in g.block(first=True):
            for i, key in enumerate(keys):
                if g.cut_here(keys, i, growth):
                    keys = g.cut(keys, i)
                    break
                ...                       # prepare, check: g.learned_runs(...)
            g.close(keys)                 # the first block's groups are the later blocks'
    """

    def __init__(self, estimates: dict[str, int], builds: dict[str, int], budget: int | None, holding: int,
                 one_run: int):
        self.estimates, self.builds = dict(estimates), dict(builds)
        self.budget, self.holding = budget, holding
        self.one_run = one_run       # a run's need: its estimate, or the most a check run took beyond what stayed
        self.one_build = 0           # the most a preparation was measured to take beyond what it kept
        self.one_timing = 0          # the most a group's timing took beyond what its sessions held
        self.one_over = 0            # the most a checked session held beyond its own estimate
        self.run_need: dict[str, int] = {}   # what each session's check runs took beyond what it kept
        self._planned, self.too_big = plan_groups(self.estimates, budget, self.builds)
        self.timed: list[Group] = []         # the first block's groups, as timed
        self._pending: list[Group] = []
        self._first = True

    def block(self, first: bool) -> Iterator[list[str]]:
        """The keys of each group one block prepares, in turn; a ``cut``
        puts the rest of a group first in line."""
        self._first = first
        self._pending = [Group(list(g.keys), g.estimate) for g in (self._planned if first else self.timed)]
        while self._pending:
            yield list(self._pending.pop(0).keys)

    def holds(self, key: str) -> int:
        """What a session will hold: its estimate, and the most a checked session held beyond its own."""
        return self.estimates[key] + self.one_over

    def transient(self, keys: list[str], i: int) -> int:
        """The largest need beside the sessions when ``keys[i]`` joins: the
        group's runs (each runtime's allocator may keep its run's temporaries
        until the group closes, so their sum), a preparation's, a timing's."""
        runs = sum(self.run_need.get(k, self.one_run) for k in keys[:i + 1])
        return max(runs, self.one_build, self.one_timing, self.builds.get(keys[i], 0))

    def planned(self, keys: list[str], i: int, growth: int | None) -> int | None:
        """What the process may grow to with ``keys[i]`` prepared, from its growth now."""
        return None if growth is None else growth + self.holds(keys[i]) + self.transient(keys, i)

    def cut_here(self, keys: list[str], i: int, growth: int | None) -> bool:
        """Whether what is ready (``keys[:i]``) must be timed before ``keys[i]`` is prepared."""
        planned = self.planned(keys, i, growth)
        return bool(i) and self.budget is not None and planned is not None and planned > self.budget + self.holding

    def cut(self, keys: list[str], i: int) -> list[str]:
        """Defer ``keys[i:]`` to the next group; returns the keys kept."""
        self._pending.insert(0, Group(keys[i:], sum(self.estimates[k] for k in keys[i:])))
        return keys[:i]

    def close(self, keys: list[str]) -> None:
        """A group is prepared: in the first block, it is one the later blocks start from."""
        if self._first:
            self.timed.append(Group(list(keys), sum(self.estimates[k] for k in keys)))

    def largest(self) -> int:
        """The largest estimate of the groups the first block timed."""
        return max((g.estimate for g in self.timed), default=0)

    def learned_build(self, beyond_kept: int) -> None:
        self.one_build = max(self.one_build, beyond_kept)

    def learned_runs(self, key: str, beyond_kept: int, growth_before: int | None, kept: int | None) -> None:
        """``key``'s check runs took ``beyond_kept`` beyond what stayed; the
        process grew from ``growth_before`` (before it was prepared) to ``kept``."""
        self.run_need[key] = beyond_kept
        self.one_run = max(self.one_run, beyond_kept)
        if None not in (growth_before, kept):
            self.one_over = max(self.one_over, kept - growth_before - self.estimates[key])

    def learned_timing(self, beyond_held: int) -> None:
        self.one_timing = max(self.one_timing, beyond_held)


def over_budget_reason(need: int, left: int, budget: int) -> str:
    return (f"needs about {format_bytes(need)} of memory, more than the {format_bytes(left)} that the budget of "
            f"{format_bytes(budget)} (--max-memory) leaves beside the weights and the float64 reference")


def describe_budget(budget: int | None, given: bool) -> str:
    if budget is None:
        return "no memory budget (the memory available is unknown here; --max-memory sets one)"
    return f"the budget is {format_bytes(budget)}" + ("" if given else ", half the memory available "
                                                       "(--max-memory to change)")
