"""``blockc compare``: fused against unfused, measured side by side with the peers.

``plan_comparison`` checks everything a user can get wrong -- the model, its
settings, backends, peers, shapes against the model's limits, the output
paths, the memory the run needs -- before anything is measured.
``run_comparison`` then measures, for each shape, every form (decomposed,
standard, fused) on every available backend and variant, and every
available peer, with one timing protocol; checks each against the float64
reference; and returns the JSON document described in
docs/compare-report.md.

The protocol is the one ``bench/cpu_targets.py`` set as the house standard
for claims of a few per cent: ``blocks`` independent repetitions, each of
which prepares a *fresh* session of every contestant (in shuffled order),
times them in ``rounds`` interleaved rounds and closes them. Two sessions of
the same graph run persistently apart on a shared machine (by where their
weights land in memory), so the session is the unit that repeats; a ratio
is the geometric mean over blocks of each block's ratio, with a 95%
bootstrap interval, and an A/A control -- a second session of the standard
form, timed like any other -- shows how far apart two identical contestants
come out. The verdict per backend says whether fusion's difference is
resolved: its interval lies on one side of 1 while the A/A control's
straddles it.
"""
from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import BlockcError
from ..frontends.catalog import DEFAULT_MODEL, build_model, parse_sets
from ..frontends.module import check_seed
from ..files import format_bytes
from ..ir.graph import Graph
from ..ops.limits import graph_limits
from ..passes.forms import FORMS
from ..progress import MEASURING, Progress
from ..report.compare_html import SCHEMA
from ..runtime.backend import (HOST_CLOCK, Backend, Compiled, backend_names, check_distinct, compare_backends,
                               make_backend, split_options)
from ..runtime.timing import Interleaved, measure_interleaved
from ..runtime.threads import default_threads
from . import memory
from .pace import BOOKKEEPING, ORACLE, Pace, load_pace, modelled_prepare_s, modelled_run_s, pace_key, record_pace
from .peers import PEERS, make_peer
from .results import AA, Row, latencies, max_error, ratios, speedups, verdicts


# The sequence lengths compare measures where --seq gives none (lowered to a
# model's maximum where it has a smaller one).
DEFAULT_SEQS = (128,)


@dataclass
class CompareOptions:
    """What to compare; the CLI's flags one to one."""

    model: str = DEFAULT_MODEL
    settings: list[str] = field(default_factory=list)
    dtype: str | None = None          # None: the model's own
    backends: tuple[str, ...] = field(default_factory=compare_backends)
    peers: tuple[str, ...] = PEERS
    batches: tuple[int, ...] = (1,)
    seqs: tuple[int, ...] | None = None   # None: DEFAULT_SEQS, each fitted to the model's limits
    dims: dict[str, int] = field(default_factory=dict)   # other symbolic dims a user model has
    threads: int = field(default_factory=default_threads)   # $BLOCKC_THREADS, else every core
    blocks: int = 5                   # independent repetitions, each of fresh sessions
    warmup: int = 2                   # per session
    min_repeats: int = 4              # per session, over its block's rounds
    min_time_s: float = 0.2           # per session, over its block's rounds
    rounds: int = 2                   # interleaved timing rounds in each block
    max_memory: int | None = None     # bytes; None: half the memory available
    fused_as: str | None = None       # for the backends that take it (ONNX Runtime's); None: their default
    peak_gbps: float | None = None
    seed: int = 0
    weights: str | None = None
    kernels: bool = True
    command: str = ""


@dataclass
class Plan:
    options: CompareOptions
    model: object
    graphs: dict[str, Graph]             # form -> graph
    shapes: list[dict[str, int]]
    backends: list[tuple[Backend, bool, str]]    # (backend, available, reason)
    peers: list[tuple[Backend, bool, str]]
    kernel_graphs: list[Graph]           # where the fused kernels timed alone come from
    weights: dict | None = None          # --weights, loaded and checked once; None: seeded init at run time
    budget: int | None = None            # bytes the contestants of one group may hold together
    holding: int = 0                     # what compare itself holds: the weights, the float64 oracle
    notes: list[str] = field(default_factory=list)   # defaults lowered to fit the model (Limits.fit_defaults)


@dataclass
class Contestant:
    """One thing timed: a form on a backend and variant, a peer, or an A/A control."""

    key: str                             # ``backend/variant/form``; an A/A control's ends in AA
    row: Row                             # its results (an A/A control's are not reported)
    backend: Backend
    variant: str
    graph: Graph
    estimate: int                        # host bytes it holds (compare/memory.py)
    build: int = 0                       # and more it holds while it is prepared (memory.build_bytes)
    params: dict = field(repr=False, default_factory=dict)
    kernel: bool = False                 # a fused kernel timed alone (``_kernel_contestants``)
    prepared_s: list[float] = field(default_factory=list)   # how long each block's preparation took

    def pace_key(self, flops: float) -> str:
        """What this contestant's measured pace is kept under (``compare/pace.py``)."""
        return pace_key(f"{self.backend.name}/{self.variant}", len(self.graph.nodes), flops, kernel=self.kernel)

    def prepare(self, threads: int) -> Compiled:
        return self.backend.compile(self.graph, self.params, variant=self.variant, threads=threads,
                                    count_kernels=True)


def plan_comparison(o: CompareOptions) -> Plan:
    """Validate ``o`` and trace the model in every form; measures nothing."""
    from ..passes.forms import to_form
    from ..frontends import trace
    from ..ir.verify import verify
    from ..passes.manager import optimize

    options = _check_options(o)
    sets = parse_sets(o.settings)
    if o.dtype is not None:
        if sets.get("dtype", o.dtype) != o.dtype:
            raise BlockcError(f"--set dtype={sets['dtype']} contradicts --dtype {o.dtype}")
        sets["dtype"] = o.dtype
    model = build_model(o.model, sets)
    traced = trace(model)
    shapes, notes = _shapes(o, traced)
    graphs = {"standard": traced, "decomposed": to_form(traced, "decomposed"), "fused": optimize(traced).graph}
    for g in graphs.values():
        verify(g)
    # The attention fusion swallows the masked softmax; its kernel is timed from this graph.
    kernel_graphs = [graphs["fused"], optimize(traced, disable=["fuse_attention"]).graph] if o.kernels else []
    budget, holding = _budget(o, graphs, shapes)
    weights = None
    if o.weights:
        from ..frontends.weights import check_weights, load_weights
        weights = dict(load_weights(o.weights))
        check_weights(model, weights)

    backends = [(b, *b.availability()) for b in (make_backend(n, **options[n]) for n in o.backends)]
    peers = [(p, *p.availability()) for p in (make_peer(n, model, graphs["fused"]) for n in o.peers)]
    if not any(ok for _, ok, _ in backends + peers):
        reasons = "; ".join(f"{b.name}: {why}" for b, _, why in backends + peers) or "none were asked for"
        raise BlockcError(f"nothing to compare: no backend or peer asked for can run here ({reasons})")
    return Plan(o, model, graphs, shapes, backends, peers, kernel_graphs, weights,
                None if budget is None else budget - holding, holding, notes)


def _check_options(o: CompareOptions) -> dict[str, dict]:
    """Refuse what ``o`` gets wrong by itself; returns each backend's options."""
    unknown = [b for b in o.backends if b not in backend_names()]
    if unknown:
        raise BlockcError(f"unknown backend {', '.join(map(repr, unknown))}; backends: {', '.join(backend_names())}")
    unknown = [p for p in o.peers if p not in PEERS]
    if unknown:
        raise BlockcError(f"unknown peer {', '.join(map(repr, unknown))}; peers: {', '.join(PEERS)} (or none)")
    if not o.backends:   # the peers and the forms are measured against blockc's backends: no verdict without one
        raise BlockcError(f"no backend to compare: --backends needs at least one of {', '.join(backend_names())}")
    options = split_options(o.backends, {"fused_as": o.fused_as} if o.fused_as else {})   # none takes it: refused
    for flag, names in (("--backends", o.backends), ("--peers", o.peers)):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:   # each would be measured, and its rows printed, as many times
            raise BlockcError(f"{flag} names {', '.join(twice)} more than once: each is measured once")
    check_distinct(o.backends, options, flag="--backends")   # ort and ort-cpu: one backend, measured twice
    if o.dtype not in (None, "float32", "float16"):
        raise BlockcError(f"--dtype {o.dtype}: compare runs float32 or float16")
    for name, values in (("--batch", o.batches), ("--seq", o.seqs or DEFAULT_SEQS)):
        if not values or any(v <= 0 for v in values):
            raise BlockcError(f"{name} needs positive integers, got {', '.join(map(str, values)) or 'none'}")
    if min(o.threads, o.min_repeats, o.rounds, o.blocks) < 1 or o.warmup < 0 or o.min_time_s < 0:
        raise BlockcError("--threads, --repeats, --rounds and --blocks must be at least 1, --warmup and "
                          "--min-time at least 0")
    if any(v <= 0 for v in o.dims.values()):
        raise BlockcError(f"--dim sizes must be positive, got {o.dims}")
    check_seed(o.seed, "--seed")
    if o.peak_gbps is not None and not o.peak_gbps > 0:
        raise BlockcError(f"--peak-gbps must be positive, got {o.peak_gbps}")
    return options


def _shapes(o: CompareOptions, traced: Graph) -> tuple[list[dict[str, int]], list[str]]:
    """Every shape asked for, checked against the model's limits (defaults
    lowered to fit them); and notes of what was lowered."""
    symbols = traced.symbols()
    limits = graph_limits(traced)
    shapes, notes = [], []
    for b in o.batches:
        for s in o.seqs or DEFAULT_SEQS:
            shape = {k: v for k, v in {"batch": b, "seq": s, **o.dims}.items() if k in symbols}
            shape, lowered = limits.fit_defaults(shape, defaulted=() if o.seqs else ("seq",))
            notes += [n for n in lowered if n not in notes]
            for limit, n in limits.dims_over(shape):
                k = str(limit.dim)
                raise BlockcError(f"{k}={n} exceeds {o.model}'s maximum of {limit.limit} ({limit.why}); "
                                  f"use a smaller --{k if k in ('batch', 'seq') else 'dim'}")
            too_big = limits.size_over(shape)   # before any memory is planned from these sizes
            if too_big:
                raise BlockcError(too_big)
            missing = [k for k in symbols if k not in shape]
            if missing:
                raise BlockcError(f"{o.model} has dimension(s) {', '.join(missing)} with no size: "
                                  f"give them with --dim NAME=INT")
            if shape not in shapes:
                shapes.append(shape)
    return shapes, notes


def _budget(o: CompareOptions, graphs: dict[str, Graph], shapes: list[dict[str, int]]) -> tuple[int | None, int]:
    """The memory budget (None: unknown) and what compare itself holds
    (``memory.holding_bytes``); refused where that alone passes the budget."""
    budget = o.max_memory if o.max_memory is not None else memory.default_budget()
    holding = max(memory.holding_bytes(graphs["standard"], s, max(memory.run_bytes(g, s) for g in graphs.values()))
                  for s in shapes)
    if budget is not None and holding > budget:
        raise BlockcError(f"the weights and the float64 reference that checks every run need about "
                          f"{format_bytes(holding)} by themselves, more than the budget of {format_bytes(budget)}"
                          f"{'' if o.max_memory is not None else ' (half the memory available)'}; "
                          f"use smaller shapes or a smaller model, or raise --max-memory")
    return budget, holding


class _Steps:
    """``run_comparison``'s steps, told to a ``blockc.progress`` callback as
    stage ``MEASURING``: ``step(detail)`` as each session is prepared (or
    skipped), ``planned_steps`` in all; ``note(detail)`` as each timing
    round starts, within the step under way."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def step(self, detail: str) -> None:
        if self.progress is not None:
            self.progress(MEASURING, self.done, self.total, detail)
        self.done += 1

    def note(self, detail: str) -> None:
        if self.progress is not None:
            self.progress(MEASURING, max(0, self.done - 1), self.total, detail)

    def end(self) -> None:
        if self.progress is not None:
            self.progress(MEASURING, self.total, self.total, "")


def _contestants(plan: Plan, shape: dict[str, int]) -> list[Contestant]:
    """Every form on every available backend and variant, each standard
    form's A/A control, and every peer, at ``shape`` (weights bound later)."""
    from ..report.traffic import total_bytes
    out = []
    for b, ok, _ in plan.backends:
        for variant in (b.variants if ok else ()):
            for form in FORMS:
                if b.supports(form):
                    g = plan.graphs[form]
                    row = Row(b.name, variant, form, False, dict(shape), ir_nodes=len(g.nodes),
                              bytes_modelled=total_bytes(g, shape))
                    need, build = memory.session_bytes(b, g, shape), memory.build_bytes(b, g, shape)
                    out.append(Contestant(row.key, row, b, variant, g, need, build))
                    if form == "standard":
                        out.append(Contestant(row.key + AA, row.copy(), b, variant, g, need, build))
    for p, ok, _ in plan.peers:
        for variant in (p.variants if ok else ()):
            row = Row(p.row_backend, variant, p.name, True, dict(shape))
            g = plan.graphs["standard"]
            out.append(Contestant(row.key, row, p, variant, g, memory.session_bytes(p, g, shape),
                                  memory.build_bytes(p, g, shape)))
    return out


def _kernel_contestants(plan: Plan) -> list[tuple[str, object, list[Contestant]]]:
    """(node label, node, contestants) for each fused op kind timed alone."""
    from .kernels import first_fused_nodes, isolate
    out = []
    for label, node in first_fused_nodes(plan.kernel_graphs):
        g = isolate(node, f"{node.op}_alone")
        out.append((label, node, [Contestant(f"{b.name}/{variant}/{node.op}", Row(b.name, variant, node.op, False),
                                             b, variant, g, 0, kernel=True) for b, variant in _kernel_backends(plan)]))
    return out


def planned_steps(plan: Plan) -> int:
    """How many steps ``run_comparison`` reports: one per session prepared
    (or skipped), in every block."""
    per_shape = len(_contestants(plan, plan.shapes[0]))
    if plan.options.kernels:
        per_shape += sum(len(c) for _, _, c in _kernel_contestants(plan))
    return per_shape * len(plan.shapes) * plan.options.blocks


def planned_seconds(plan: Plan, pace: Pace | None = None) -> float:
    """About how long ``run_comparison`` takes on a quiet machine: each
    session's preparation and timed runs in every block, and the float64
    oracle at each shape, each by its model (``compare/pace.py``) times the
    ratio this machine last measured to it (``pace``, else the record),
    and compare's own bookkeeping around each session."""
    pace = pace or load_pace()
    return pace.factor(BOOKKEEPING, "run") * plan.options.blocks * _sessions(plan) + _steps_seconds(plan, pace)


def _steps_seconds(plan: Plan, pace: Pace) -> float:
    """``planned_seconds`` less compare's own bookkeeping: the sessions and the oracle."""
    from ..report.flops import total_flops
    from .machine import matmul_flops_per_s
    o, rate, total = plan.options, matmul_flops_per_s(), 0.0
    for shape in plan.shapes:
        for c in _contestants(plan, shape) + _kernel_list(plan):
            need, flops = c.estimate or memory.session_bytes(c.backend, c.graph, shape), total_flops(c.graph, shape)
            key = c.pace_key(flops)
            run = pace.factor(key, "run") * modelled_run_s(flops, rate)
            prepare = pace.factor(key, "prepare") * modelled_prepare_s(need)
            timed = max(o.min_time_s, o.min_repeats * run) + (o.warmup + o.rounds) * run
            total += o.blocks * (prepare + timed) + 2 * run     # the first block checks each session twice
        standard = plan.graphs["standard"]
        flops = total_flops(standard, shape)
        total += pace.factor(pace_key(ORACLE, len(standard.nodes), flops), "run") * modelled_run_s(flops, rate)
    return total


def _kernel_list(plan: Plan) -> list[Contestant]:
    return [c for _, _, cs in _kernel_contestants(plan) for c in cs] if plan.options.kernels else []


def _sessions(plan: Plan) -> int:
    """How many sessions one block prepares, at every shape."""
    return sum(len(_contestants(plan, s)) + len(_kernel_list(plan)) for s in plan.shapes)


def _bookkeeping_pace(plan: Plan, elapsed_s: float) -> dict[str, dict[str, float]]:
    """What the comparison took beyond its steps' models scaled by the paces
    just recorded, per session: compare's own work around each."""
    rest = elapsed_s - _steps_seconds(plan, load_pace())
    return {BOOKKEEPING: {"run": max(rest, 1e-3) / max(1, plan.options.blocks * _sessions(plan))}}


def measured_pace(contestants: list[Contestant], times: dict, shape) -> dict[str, dict[str, float]]:
    """What ``contestants`` took at ``shape`` against the model, as ratios
    (``compare/pace.py``): the median run of every block, the median preparation."""
    from ..report.flops import total_flops
    from .machine import matmul_flops_per_s
    rate, out = matmul_flops_per_s(), {}
    for c in contestants:
        ran = [s for t in times.get(c.key, ()) if t is not None for s in t.samples]
        flops = total_flops(c.graph, shape)
        ratios = out.setdefault(c.pace_key(flops), {})
        if ran and flops:
            ratios["run"] = float(np.median(ran)) / modelled_run_s(flops, rate)
        if c.prepared_s:
            need = c.estimate or memory.session_bytes(c.backend, c.graph, shape)
            ratios["prepare"] = float(np.median(c.prepared_s)) / modelled_prepare_s(need)
    return out


def _oracle_pace(graph: Graph, shape, seconds: float) -> dict[str, dict[str, float]]:
    """The float64 oracle's run at ``shape`` against the model, as a ratio."""
    from ..report.flops import total_flops
    from .machine import matmul_flops_per_s
    flops = total_flops(graph, shape)
    return {pace_key(ORACLE, len(graph.nodes), flops): {"run": seconds / modelled_run_s(flops, matmul_flops_per_s())}
            } if flops else {}


def describe_plan(plan: Plan) -> list[str]:
    """What the run will do, said before it starts."""
    o = plan.options
    per_shape = _contestants(plan, plan.shapes[0])
    aa = sum(c.key.endswith(AA) for c in per_shape)
    groups = [memory.plan_groups({c.key: c.estimate for c in cs}, plan.budget, {c.key: c.build for c in cs})
              for cs in (_contestants(plan, s) for s in plan.shapes)]
    largest = max((g.estimate for gs, _ in groups for g in gs), default=0)
    too_big = list(dict.fromkeys(k for _, big in groups for k in big))
    shapes = "; ".join(_shape_text(s) for s in plan.shapes)
    lines = [f"measuring {len(per_shape) - aa} contestants and {aa} A/A control(s) at {len(plan.shapes)} "
             f"shape(s) ({shapes}) in {o.blocks} blocks of fresh sessions, {o.rounds} interleaved rounds each",
             f"memory: about {format_bytes(largest + plan.holding)} at most ({format_bytes(plan.holding)} for "
             f"the weights and the float64 reference, the rest for sessions timed together); "
             f"{memory.describe_budget(None if plan.budget is None else plan.budget + plan.holding, o.max_memory is not None)}"]
    lines[:0] = plan.notes
    if too_big:
        lines.append(f"over the budget, not run: {', '.join(too_big)}")
    pace = load_pace()
    basis = ("each step's model scaled by what earlier comparisons measured here" if pace.ratios else
             "a first guess from FLOPs and bytes: no comparison has been recorded here yet")
    lines.append(f"time: about {_duration(planned_seconds(plan, pace))} on a quiet machine ({basis}; "
                 f"longer where other work shares the cores)")
    return lines


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _kernel_backends(plan: Plan) -> list[tuple[Backend, str]]:
    """Where fused kernels are timed alone: each backend that names a
    ``kernel_variant`` (ONNX Runtime at the basic level, so blockc's fused ops
    as written and not ORT's re-fusions; generated CUDA)."""
    return [(b, b.kernel_variant) for b, ok, _ in plan.backends if ok and b.kernel_variant is not None]


def run_comparison(plan: Plan, progress: Progress | None = None) -> dict:
    """Measure everything ``plan`` holds; returns the ``blockc.compare`` document.
    ``progress`` (``blockc.progress``) is told each step, with a detail."""
    with memory.collecting_only_new():   # the collections between groups walk only what compare made
        return _run_comparison(plan, progress)


def _run_comparison(plan: Plan, progress: Progress | None) -> dict:
    from ..frontends import init_weights
    o = plan.options
    steps = _Steps(progress, planned_steps(plan))
    started = time.perf_counter()
    watch = memory.Watch()   # the peak reported is this comparison's, not what the process did before
    # materialised once: every run reads them
    weights = plan.weights if plan.weights is not None else dict(init_weights(plan.model, seed=o.seed))
    report = _document(plan)
    observed = []
    for shape in plan.shapes:
        found = _measure_shape(plan, shape, weights, steps, watch, report["machine"]["peak_gbps"])
        for part in ("results", "ratios", "verdicts", "kernels"):
            report[part].extend(getattr(found, part))
        report["memory"]["groups"].extend(found.groups)
        report["memory"]["largest_group_bytes"] = max(report["memory"]["largest_group_bytes"], found.largest)
        observed += found.paces
    for entry, (p, ok, _) in zip(report["peers"], plan.peers):
        if ok:
            entry["detail"] = p.detail(o.threads)   # again: how it ran may be known only once it has
        if ok and getattr(p, "fused", None):
            entry["fused_ops"] = dict(p.fused)   # what ONNX Runtime's optimizer fused, by its own count
    steps.end()
    for paces in observed:   # what the next comparison's estimate goes by (compare/pace.py)
        record_pace(paces)
    report["timing"]["elapsed_s"] = time.perf_counter() - started
    record_pace(_bookkeeping_pace(plan, report["timing"]["elapsed_s"]))
    report["memory"]["peak_growth_bytes"] = watch.peak_growth()
    report["memory"]["peak_at"] = watch.peak_at
    return report


def _document(plan: Plan) -> dict:
    """The ``blockc.compare`` document before anything is measured."""
    from .machine import describe_machine, gpu_name, versions
    o = plan.options
    gpu = gpu_name()[0] if any(ok and b.on_gpu for b, ok, _ in plan.backends) else None
    return {
        "schema": SCHEMA, "model": o.model, "settings": parse_sets(o.settings),
        "dtype": plan.model.dtype.name,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": o.command, "machine": describe_machine(gpu=gpu, peak_gbps=o.peak_gbps), "versions": versions(),
        "timing": {"blocks": o.blocks, "rounds": o.rounds, "warmup": o.warmup, "min_repeats": o.min_repeats,
                   "min_time_s": o.min_time_s, "threads": o.threads,
                   "clock": "; ".join(sorted({b.clock for b, ok, _ in plan.backends if ok} | {HOST_CLOCK})),
                   "planned_s": planned_seconds(plan), "elapsed_s": 0.0},
        "memory": {"budget_bytes": None if plan.budget is None else plan.budget + plan.holding,
                   "holding_bytes": plan.holding, "largest_group_bytes": 0, "peak_growth_bytes": None,
                   "peak_at": None, "groups": []},
        "shapes": plan.shapes,
        "forms": {f: {"ir_nodes": len(g.nodes), "ops": g.op_counts()} for f, g in plan.graphs.items()},
        "backends": [_listing(b, ok, why, o.threads) for b, ok, why in plan.backends],
        "peers": [_listing(p, ok, why, o.threads) for p, ok, why in plan.peers],
        "verdicts": [], "results": [], "ratios": [], "kernels": [],
    }


@dataclass
class _AtShape:
    """What ``_measure_shape`` found at one shape: the document's entries,
    and the paces measured (``compare/pace.py``)."""

    results: list[dict]
    ratios: list[dict]
    verdicts: list[dict]
    kernels: list[dict]
    groups: list[dict]      # the memory log: per group timed, what was planned and what it took
    largest: int            # the largest group's estimate
    paces: list[dict]


def _measure_shape(plan: Plan, shape: dict[str, int], weights, steps: _Steps, watch: memory.Watch,
                   peak) -> _AtShape:
    """Every contestant at ``shape`` checked against the float64 oracle and
    timed, then the fused kernels alone."""
    contestants = _contestants(plan, shape)
    for c in contestants:
        c.params = weights
    feeds = _feeds(plan, shape)
    began = time.perf_counter()
    oracle = _oracle(plan.graphs["standard"], weights, feeds)
    oracle_s = time.perf_counter() - began
    one_run = max(memory.run_bytes(g, shape) for g in plan.graphs.values())
    times, largest, groups = _measure(contestants, feeds, oracle, plan, steps, _shape_text(shape), watch, one_run)
    rows = [c.row for c in contestants if not c.key.endswith(AA)]
    latencies(contestants, times, peak)
    speedups(rows)
    paces = [measured_pace(contestants, times, shape), _oracle_pace(plan.graphs["standard"], shape, oracle_s)]
    kernels = []
    if plan.options.kernels:
        kernels, more = _measure_kernels(plan, weights, shape, peak, steps, watch)
        paces += more
    return _AtShape([r.to_json() for r in rows], ratios(rows, times, shape), verdicts(contestants, times, shape),
                    kernels, groups, largest, paces)


def _listing(b: Backend, ok: bool, why: str, threads: int) -> dict:
    return {"name": b.name, "available": ok, "reason": "" if ok else why, "detail": b.detail(threads) if ok else ""}


def _feeds(plan: Plan, shape: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(plan.options.seed)
    return {s.name: s.sample(shape, rng) for s in plan.model.inputs()}


def _oracle(graph: Graph, weights, feeds) -> dict[str, np.ndarray]:
    from ..runtime.reference import run_reference
    return run_reference(graph, weights, feeds, float64=True)


@dataclass
class _Measuring:
    """What one ``_measure`` call works with throughout."""

    by_key: dict[str, Contestant]
    feeds: dict
    oracle: dict
    options: CompareOptions
    progress: _Steps
    watch: memory.Watch
    where: str
    grouping: memory.Grouping


def _measure(contestants: list[Contestant], feeds, oracle, plan: Plan, progress: _Steps,
             where: str, watch: memory.Watch, one_run: int) -> tuple[dict[str, list], int, list[dict]]:
    """Time ``contestants`` in ``blocks`` blocks of fresh sessions, in groups
    within the memory budget that ``memory.Grouping`` plans, cuts and learns
    from (``one_run``: a run's need by ``memory.run_bytes``). The first block
    also checks each session against ``oracle`` (``_check``).
    Returns ``{key: [Interleaved or None per block]}`` (each tagged with
    ``.group``, unique across blocks), the largest group's estimate, and per
    group timed what its cut planned the process would grow to at most and
    how far it grew while the group was timed."""
    o = plan.options
    grouping = memory.Grouping({c.key: c.estimate for c in contestants}, {c.key: c.build for c in contestants},
                               plan.budget, plan.holding, one_run)
    m = _Measuring({c.key: c for c in contestants}, feeds, oracle, o, progress, watch, where, grouping)
    for key, need in grouping.too_big.items():
        m.by_key[key].row.skip(memory.over_budget_reason(need, plan.budget, plan.budget + plan.holding))
    times: dict[str, list] = {c.key: [None] * o.blocks for c in contestants}
    order = np.random.default_rng(o.seed + 1)
    log = []
    for block in range(o.blocks):
        for key in grouping.too_big:
            progress.step(f"block {block + 1}/{o.blocks}: {key} skipped (memory) {where}")
        for keys in grouping.block(first=block == 0):
            order.shuffle(keys)    # no one always gets the first, or the last, memory
            log.append(_run_group(m, keys, block, len(log), times))
            memory.release_freed()   # what the group's closed sessions left
    return times, grouping.largest(), log


def _run_group(m: _Measuring, keys: list[str], block: int, serial: int, times: dict) -> dict:
    """Prepare one group's sessions (cut where the budget says), time them
    (``serial`` tags their timings) and close them; returns its log entry."""
    keys, ready, planned = _prepare_group(m, keys, block)
    m.grouping.close(keys)
    watch = m.watch
    watch.stretch(f"timing {', '.join(ready)} {m.where}")
    held = watch.growth()
    for key, t in _time_group(ready, m.by_key, m.feeds, m.options, m.progress,
                              f"block {block + 1}/{m.options.blocks} {m.where}").items():
        t.group = serial
        times[key][block] = t
    # what timing took beyond what the ready sessions held: runs after the first grow
    # ONNX Runtime's arenas, and freed temporaries stay with glibc until the group closes
    peak = watch.stretch(f"releasing {m.where}")
    if None not in (peak, held, watch.start):
        m.grouping.learned_timing(peak - watch.start - held)
    # growth, as peak_growth counts it: at least 0 (the process may shrink below where it began)
    return {"at": f"block {block + 1} {m.where}", "sessions": list(ready),
            "planned_bytes": None if planned is None else max(0, planned),
            "peak_bytes": None if None in (peak, watch.start) else max(0, peak - watch.start)}


def _prepare_group(m: _Measuring, keys: list[str], block: int) -> tuple[list[str], dict[str, Compiled], int | None]:
    """Prepare ``keys`` in turn until the budget says to cut (the rest go to
    the next group); returns the keys kept, the sessions ready, and what the
    last one's cut planned the process would grow to."""
    ready, planned = {}, None
    for i, key in enumerate(keys):
        growth = m.watch.growth()
        if m.grouping.cut_here(keys, i, growth):
            # what is ready already holds more than estimated: time it, the rest form the next group
            keys = m.grouping.cut(keys, i)
            break
        planned = m.grouping.planned(keys, i, growth)
        m.progress.step(f"block {block + 1}/{m.options.blocks}: preparing {key} {m.where}")
        compiled = _prepare(m, m.by_key[key], block, growth) if m.by_key[key].row.ok else None
        if compiled is not None:
            ready[key] = compiled
    return keys, ready, planned


def _prepare(m: _Measuring, c: Contestant, block: int, growth: int | None) -> Compiled | None:
    """A fresh session of ``c``, checked in the first block; None where it
    failed (its row says why)."""
    compiled = None
    try:
        m.watch.stretch(f"preparing {c.key} {m.where}")
        began = time.perf_counter()
        compiled = c.prepare(m.options.threads)
        c.prepared_s.append(time.perf_counter() - began)
        if block == 0:
            _check(m, c, compiled, growth)
        return compiled
    except (BlockcError, MemoryError) as e:
        c.row.fail((f"block {block + 1}: " if block else "") + (str(e) or "out of memory"))
        if compiled is not None:
            compiled.close()
        return None


def _check(m: _Measuring, c: Contestant, compiled: Compiled, growth: int | None) -> None:
    """Check a session's outputs against the oracle (its row's error and
    kernel count) and run it once more, measuring what its preparation and
    its runs took beyond what stays (``growth``: the process's before it)."""
    m.grouping.learned_build(_beyond_kept(m.watch, f"checking {c.key} {m.where}"))
    c.row.kernels = compiled.kernels
    c.row.max_abs_error = max_error(compiled.run(m.feeds), m.oracle)
    # and again: ONNX Runtime allocates on its second run the memory pattern its first
    # recorded, beside the first run's blocks, so only then does its arena reach the
    # size it keeps while the group is timed (and the next session's cut sees it)
    compiled.run(m.feeds)
    # what the runs took beyond what stays (an arena made by the runs stays)
    m.grouping.learned_runs(c.key, _beyond_kept(m.watch, f"holding {c.key} {m.where}"), growth, m.watch.growth())


def _beyond_kept(watch: memory.Watch, next_stretch: str) -> int:
    """How far the stretch that ends now peaked above what the process holds
    after it (0 where either is unknown); ``next_stretch`` begins."""
    peak, after = watch.stretch(next_stretch), watch.growth()
    return 0 if None in (peak, after, watch.start) else max(0, peak - watch.start - after)


def _time_group(ready: dict[str, Compiled], by_key: dict, feeds, o: CompareOptions, progress: _Steps,
                where: str) -> dict[str, Interleaved]:
    """Time one group's sessions interleaved, then close them; a session that
    fails marks its row."""
    measured: dict[str, Interleaved] = {}
    try:
        # feeds checked once here, not in every timed run
        on_host = {k: r.runner(feeds) for k, r in ready.items() if not r.times_itself}
        try:
            measured.update(measure_interleaved(on_host, rounds=o.rounds, warmup=o.warmup,
                                                min_repeats=o.min_repeats, min_time_s=o.min_time_s,
                                                on_round=lambda i: progress.note(f"timing round {i + 1}/{o.rounds}, "
                                                                                 f"{where}")))
        except BlockcError as e:  # a runtime that ran once but fails later: every host row says so
            for k in on_host:
                by_key[k].row.fail(f"failed while timing: {e}")
        for k, r in ready.items():
            if r.times_itself:  # a device clock, or a child process: the runtime times itself
                progress.note(f"timing {k}, {where}")
                try:
                    samples = r.time(feeds, warmup=o.warmup, min_repeats=o.min_repeats,
                                     min_time_s=o.min_time_s).samples
                    measured[k] = Interleaved(samples, [float(np.median(samples))] * o.rounds)
                except BlockcError as e:
                    by_key[k].row.fail(f"failed while timing: {e}")
        return {k: t for k, t in measured.items() if by_key[k].row.ok}
    finally:
        for r in ready.values():
            r.close()


def _shape_text(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _measure_kernels(plan: Plan, weights, shape, peak, progress: _Steps, watch: memory.Watch
                     ) -> tuple[list[dict], list[dict]]:
    """Each fused op kind timed alone: its report entries, and what its
    sessions took against the model (``measured_pace``)."""
    from .kernels import kernel_cost, sample_feeds
    o = plan.options
    entries, paces = [], []
    for label, node, contestants in _kernel_contestants(plan):
        g = contestants[0].graph if contestants else None
        if g is None:
            continue
        feeds = sample_feeds(g, shape, np.random.default_rng(o.seed))
        params = {name: weights[name] for name in g.params}
        nbytes, flops = kernel_cost(g.nodes[0], shape)
        for c in contestants:
            c.params = params
            c.row.shape, c.row.bytes_modelled = dict(shape), nbytes
            c.estimate, c.build = memory.session_bytes(c.backend, g, shape), memory.build_bytes(c.backend, g, shape)
        times, _, _ = _measure(contestants, feeds, _oracle(g, params, feeds), plan, progress,
                               f"kernel {_shape_text(shape)}", watch, memory.run_bytes(g, shape))
        latencies(contestants, times, peak)
        paces.append(measured_pace(contestants, times, shape))
        entries += [_kernel_entry(c.row, node.op, label, flops) for c in contestants]
    return entries, paces


def _kernel_entry(row: Row, op: str, label: str, flops: float) -> dict:
    """A fused kernel's entry in the document's ``kernels``."""
    return {"backend": row.backend, "variant": row.variant, "op": op, "shape": dict(row.shape), "node": label,
            "status": row.status, "error": row.error,
            "median_ms": row.latency_ms["median"] if row.latency_ms else None,
            "bytes_modelled": row.bytes_modelled, "flops_modelled": flops, "bandwidth_gbps": row.bandwidth_gbps,
            "fraction_of_peak": row.fraction_of_peak, "max_abs_error": row.max_abs_error}
