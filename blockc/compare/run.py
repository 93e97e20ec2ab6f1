"""``blockc compare``: fused against unfused, measured side by side with the peers.

``plan_comparison`` checks everything a user can get wrong -- the model, its
settings, backends, peers, shapes against the model's limits, the output
paths -- before anything is measured. ``run_comparison`` then measures, for
each shape, every form (decomposed, standard, fused) on every available
backend and variant, and every available peer, with one timing protocol;
checks each against the float64 reference; and returns the JSON document
described in docs/compare-report.md.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import BlockcError
from ..frontends.catalog import DEFAULT_MODEL, build_model, parse_sets
from ..frontends.module import available_memory
from ..ir.graph import Graph
from ..runtime.backend import HOST_CLOCK, Backend, backend_names, compare_backends, make_backend
from ..passes.forms import FORMS
from .peers import PEERS, make_peer

SCHEMA = "blockc.compare/1"


@dataclass
class CompareOptions:
    """What to compare; the CLI's flags one to one."""

    model: str = DEFAULT_MODEL
    settings: list[str] = field(default_factory=list)
    dtype: str | None = None          # None: the model's own
    backends: tuple[str, ...] = field(default_factory=compare_backends)
    peers: tuple[str, ...] = PEERS
    batches: tuple[int, ...] = (1,)
    seqs: tuple[int, ...] = (128,)
    dims: dict[str, int] = field(default_factory=dict)   # other symbolic dims a user model has
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    warmup: int = 3
    min_repeats: int = 10
    min_time_s: float = 0.5
    rounds: int = 3                   # interleaved timing rounds (runtime.timing.measure_interleaved)
    sessions: int = 1                 # sessions per contestant, pooled (placement noise)
    fused_as: str = "auto"
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


def plan_comparison(o: CompareOptions) -> Plan:
    """Validate ``o`` and trace the model in every form; measures nothing."""
    from ..passes.forms import to_form
    from ..frontends import trace
    from ..ir.verify import verify
    from ..passes.manager import optimize

    unknown = [b for b in o.backends if b not in backend_names()]
    if unknown:
        raise BlockcError(f"unknown backend {', '.join(map(repr, unknown))}; backends: {', '.join(backend_names())}")
    unknown = [p for p in o.peers if p not in PEERS]
    if unknown:
        raise BlockcError(f"unknown peer {', '.join(map(repr, unknown))}; peers: {', '.join(PEERS)} (or none)")
    if o.dtype not in (None, "float32", "float16"):
        raise BlockcError(f"--dtype {o.dtype}: compare runs float32 or float16")
    for name, values in (("--batch", o.batches), ("--seq", o.seqs)):
        if not values or any(v <= 0 for v in values):
            raise BlockcError(f"{name} needs positive integers, got {', '.join(map(str, values)) or 'none'}")
    if min(o.threads, o.min_repeats, o.rounds, o.sessions) < 1 or o.warmup < 0 or o.min_time_s < 0:
        raise BlockcError("--threads, --repeats, --rounds and --sessions must be at least 1, --warmup and "
                          "--min-time at least 0")
    if any(v <= 0 for v in o.dims.values()):
        raise BlockcError(f"--dim sizes must be positive, got {o.dims}")
    if o.peak_gbps is not None and not o.peak_gbps > 0:
        raise BlockcError(f"--peak-gbps must be positive, got {o.peak_gbps}")

    sets = parse_sets(o.settings)
    if o.dtype is not None:
        if sets.get("dtype", o.dtype) != o.dtype:
            raise BlockcError(f"--set dtype={sets['dtype']} contradicts --dtype {o.dtype}")
        sets["dtype"] = o.dtype
    model = build_model(o.model, sets)
    traced = trace(model)
    symbols = traced.symbols()
    limits = model.max_dims()
    shapes = []
    for b in o.batches:
        for s in o.seqs:
            shape = {k: v for k, v in {"batch": b, "seq": s, **o.dims}.items() if k in symbols}
            for k, v in shape.items():
                if k in limits and v > limits[k]:
                    raise BlockcError(f"{k}={v} exceeds {o.model}'s maximum of {limits[k]} "
                                      f"(its max positions); use a smaller --{k if k in ('batch', 'seq') else 'dim'}")
            missing = [k for k in symbols if k not in shape]
            if missing:
                raise BlockcError(f"{o.model} has dimension(s) {', '.join(missing)} with no size: "
                                  f"give them with --dim NAME=INT")
            if shape not in shapes:
                shapes.append(shape)
    graphs = {"standard": traced, "decomposed": to_form(traced, "decomposed"), "fused": optimize(traced).graph}
    for g in graphs.values():
        verify(g)
    # The attention fusion swallows the masked softmax; its kernel is timed from this graph.
    kernel_graphs = [graphs["fused"], optimize(traced, disable=["fuse_attention"]).graph] if o.kernels else []
    weights = None
    if o.weights:
        from ..frontends.weights import check_weights, load_weights
        weights = dict(load_weights(o.weights))
        check_weights(model, weights)

    backends = [(b, *b.availability()) for b in (make_backend(n, fused_as=o.fused_as) for n in o.backends)]
    peers = [(p, *p.availability()) for p in (make_peer(n, model) for n in o.peers)]
    if not any(ok for _, ok, _ in backends + peers):
        reasons = "; ".join(f"{b.name}: {why}" for b, _, why in backends + peers) or "none were asked for"
        raise BlockcError(f"nothing to compare: no backend or peer asked for can run here ({reasons})")
    return Plan(o, model, graphs, shapes, backends, peers, kernel_graphs, weights)


Progress = Callable[[str], None]   # called with a description as each measurement starts


def planned_steps(plan: Plan) -> int:
    """How many progress steps ``run_comparison`` reports (for a progress bar):
    one per session prepared, one per interleaved round of the host-timed
    ones, one per session that times itself on a device."""
    rounds, sessions = plan.options.rounds, plan.options.sessions

    def steps(contestants: list[Backend]) -> int:
        device = sum(b.times_itself for b in contestants)
        return sessions * (len(contestants) + device) + (rounds if len(contestants) > device else 0)

    per_shape = [b for b, ok, _ in plan.backends if ok for _ in b.variants for f in FORMS if b.supports(f)]
    per_shape += [p for p, ok, _ in plan.peers if ok for _ in p.variants]
    total = steps(per_shape)
    if plan.options.kernels:
        from .kernels import first_fused_nodes
        total += len(first_fused_nodes(plan.kernel_graphs)) * steps([b for b, _ in _kernel_backends(plan)])
    return total * len(plan.shapes)


def _kernel_backends(plan: Plan) -> list[tuple[Backend, str]]:
    """Where fused kernels are timed alone: each backend that names a
    ``kernel_variant`` (ONNX Runtime at the basic level, so blockc's fused ops
    as written and not ORT's re-fusions; generated CUDA)."""
    return [(b, b.kernel_variant) for b, ok, _ in plan.backends if ok and b.kernel_variant is not None]


def run_comparison(plan: Plan, progress: Progress = lambda _: None) -> dict:
    """Measure everything ``plan`` holds; returns the ``blockc.compare/1`` document."""
    from ..frontends import init_weights
    from .machine import describe_machine, gpu_name, versions
    o = plan.options
    # materialised once: every run reads them
    weights = plan.weights if plan.weights is not None else dict(init_weights(plan.model, seed=o.seed))

    gpu = gpu_name()[0] if any(ok and b.on_gpu for b, ok, _ in plan.backends) else None
    report = {
        "schema": SCHEMA, "model": o.model, "settings": parse_sets(o.settings),
        "dtype": plan.model.dtype.name,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": o.command, "machine": describe_machine(gpu=gpu, peak_gbps=o.peak_gbps), "versions": versions(),
        "timing": {"warmup": o.warmup, "min_repeats": o.min_repeats, "min_time_s": o.min_time_s,
                   "rounds": o.rounds, "sessions": o.sessions, "threads": o.threads,
                   "clock": "; ".join(sorted({b.clock for b, ok, _ in plan.backends if ok} | {HOST_CLOCK}))},
        "shapes": plan.shapes,
        "forms": {f: {"ir_nodes": len(g.nodes), "ops": g.op_counts()} for f, g in plan.graphs.items()},
        "backends": [_listing(b, ok, why, o.threads) for b, ok, why in plan.backends],
        "peers": [_listing(p, ok, why, o.threads) for p, ok, why in plan.peers],
        "results": [], "ratios": [], "kernels": [],
    }
    peak = report["machine"]["peak_gbps"]
    for shape in plan.shapes:
        rows, times = _measure_shape(plan, weights, shape, peak, progress)
        report["results"].extend(rows)
        report["ratios"].extend(_ratios(rows, times, shape))
        if o.kernels:
            report["kernels"].extend(_measure_kernels(plan, weights, shape, peak, progress))
    for entry, (p, ok, _) in zip(report["peers"], plan.peers):
        if ok and getattr(p, "fused", None):
            entry["fused_ops"] = dict(p.fused)   # what ONNX Runtime's optimizer fused, by its own count
    return report


def _listing(b: Backend, ok: bool, why: str, threads: int) -> dict:
    return {"name": b.name, "available": ok, "reason": "" if ok else why, "detail": b.detail(threads) if ok else ""}


def _feeds(plan: Plan, shape: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(plan.options.seed)
    return {s.name: s.sample(shape, rng) for s in plan.model.inputs()}


def _measure_shape(plan: Plan, weights, shape, peak, progress) -> tuple[list[dict], dict]:
    """Every form on every backend and every peer at ``shape``: the rows, and
    each measured row's interleaved times (by ``row_key``) for pairing."""
    from ..report.traffic import total_bytes
    from ..runtime.reference import run_reference
    o = plan.options
    feeds = _feeds(plan, shape)
    oracle = run_reference(plan.graphs["standard"], weights, feeds, float64=True)
    contestants = []    # (row, how to prepare it)
    for b, ok, _ in plan.backends:
        for variant in (b.variants if ok else ()):
            for form in FORMS:
                if b.supports(form):
                    g = plan.graphs[form]
                    row = _row(b.name, variant, form, False, shape)
                    row.update(ir_nodes=len(g.nodes), bytes_modelled=total_bytes(g, shape))
                    contestants.append((row, lambda b=b, g=g, v=variant: b.compile(g, weights, variant=v,
                                                                                   threads=o.threads)))
    for p, ok, _ in plan.peers:
        for variant in (p.variants if ok else ()):
            contestants.append((_row(p.row_backend, variant, p.name, True, shape),
                                lambda p=p, v=variant: p.compile(plan.graphs["standard"], weights, variant=v,
                                                                 threads=o.threads)))
    times = _time_contestants(contestants, feeds, oracle, o, peak, progress, _shape_text(shape))
    rows = [row for row, _ in contestants]
    _speedups(rows, times)
    return rows, times


def _time_contestants(contestants, feeds, oracle, o: CompareOptions, peak, progress, where: str) -> dict:
    """Prepare each contestant (``o.sessions`` times) and check its outputs
    against the oracle, then time them in interleaved rounds; failures land
    in their rows.

    Several sessions per contestant, pooled, average out where each one's
    weights and packed GEMM panels land in memory: two ONNX Runtime sessions
    of the same graph differ persistently by up to ~4% on this project's VM.

    Contestants are timed together while memory lasts: each ONNX Runtime
    session keeps an arena as large as its biggest run (a 2-layer GPT-2 at
    batch 8, seq 512 holds ~2 GB of logits and probabilities), and ten of
    them at once do not fit in 24 GiB. When less than ``_memory_floor``
    remains, the sessions prepared so far are timed as one group and closed
    before the next are prepared. Returns ``{row key: Interleaved}`` for the
    rows that ran, each tagged with its group (``.group``).
    """
    from ..runtime.timing import Interleaved
    measured: dict = {}            # "row key#session" -> Interleaved
    group: dict = {}
    groups, biggest = 0, 0
    rows = {row_key(row): row for row, _ in contestants}
    for row, prepare in contestants:
        for i in range(o.sessions):
            if row["status"] != "ok":
                break
            progress(f"preparing {row_key(row)} {where}")
            before = available_memory()
            compiled = None
            try:
                compiled = prepare()
                row["kernels"] = compiled.kernels
                err = _max_error(compiled.run(feeds), oracle)
                row["max_abs_error"] = max(err, row["max_abs_error"] or 0.0)
                group[f"{row_key(row)}#{i}"] = compiled
            except (BlockcError, MemoryError) as e:
                row["status"], row["error"] = "error", str(e) or "out of memory"
                if compiled is not None:
                    compiled.close()
            after = available_memory()
            if before is not None and after is not None:
                biggest = max(biggest, before - after)
                if after < _memory_floor(biggest) and group:
                    measured.update(_time_group(group, groups, rows, feeds, o, progress, where))
                    group, groups = {}, groups + 1
    if group:
        measured.update(_time_group(group, groups, rows, feeds, o, progress, where))

    times = {}
    for key, row in rows.items():
        parts = [t for k, t in measured.items() if k.rsplit("#", 1)[0] == key]
        if row["status"] != "ok" or not parts:
            continue
        groups = {t.group for t in parts}
        pooled = Interleaved([x for t in parts for x in t.samples],
                             [float(np.median(r)) for r in zip(*(t.round_medians for t in parts))],
                             group=groups.pop() if len(groups) == 1 else None)  # None: split, pairs with none
        times[key] = pooled
        lat = pooled.timing
        row["latency_ms"] = {"median": lat.median_s * 1e3, "min": lat.min_s * 1e3, "max": lat.max_s * 1e3,
                             "repeats": lat.repeats, "round_medians": [x * 1e3 for x in pooled.round_medians]}
        if row["bytes_modelled"] is not None and lat.median_s > 0:
            row["bandwidth_gbps"] = row["bytes_modelled"] / lat.median_s / 1e9
            if peak:
                row["fraction_of_peak"] = row["bandwidth_gbps"] / peak
    return times


def _memory_floor(biggest: int) -> int:
    """Keep room for two more of the largest contestant seen, and 2 GiB."""
    return max(2 * biggest, 2 << 30)


def _time_group(group: dict, group_id: int, rows: dict, feeds, o: CompareOptions, progress,
                where: str) -> dict:
    """Time one group's sessions interleaved and close them; a session that
    fails marks its row. Returns ``{"row key#session": Interleaved}``."""
    from ..runtime.timing import Interleaved, measure_interleaved

    def row_of(k: str) -> dict:
        return rows[k.rsplit("#", 1)[0]]
    measured: dict = {}
    try:
        on_host = {k: (lambda r=r: r.run(feeds)) for k, r in group.items() if not r.times_itself}
        try:
            measured.update(measure_interleaved(on_host, rounds=o.rounds, warmup=o.warmup,
                                                min_repeats=o.min_repeats, min_time_s=o.min_time_s,
                                                on_round=lambda i: progress(f"timing round {i + 1}/{o.rounds} "
                                                                            f"{where}")))
        except BlockcError as e:  # a runtime that ran once but fails later: every host row says so
            for k in on_host:
                row_of(k).update(status="error", error=f"failed while timing: {e}")
        for k, r in group.items():
            if r.times_itself:  # a device clock, or a child process: the runtime times itself
                progress(f"timing {k.rsplit('#', 1)[0]} {where}")
                try:
                    samples = r.time(feeds, warmup=o.warmup, min_repeats=o.min_repeats,
                                     min_time_s=o.min_time_s).samples
                    measured[k] = Interleaved(samples, [float(np.median(samples))] * o.rounds)
                except BlockcError as e:
                    row_of(k).update(status="error", error=f"failed while timing: {e}")
        for t in measured.values():
            t.group = group_id
        return measured
    finally:
        for r in group.values():
            r.close()


def _shape_text(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _row(backend, variant, form, peer, shape) -> dict:
    return {"backend": backend, "variant": variant, "form": form, "peer": peer, "shape": dict(shape),
            "status": "ok", "error": "", "latency_ms": None, "speedup_vs_standard": None, "ir_nodes": None,
            "kernels": None, "bytes_modelled": None, "bandwidth_gbps": None, "fraction_of_peak": None,
            "max_abs_error": None}


def _max_error(outputs, oracle) -> float:
    missing = [k for k in oracle if k not in outputs]
    if missing:
        raise BlockcError(f"the run produced no output {', '.join(missing)}")
    worst = 0.0
    for k, ref in oracle.items():
        got = np.asarray(outputs[k]).astype(np.float64)
        if got.shape != ref.shape:
            raise BlockcError(f"output {k} has shape {list(got.shape)}, expected {list(ref.shape)}")
        if got.size:
            worst = max(worst, float(np.max(np.abs(got - ref))))
    return worst


def row_key(row: dict) -> str:
    return f"{row['backend']}/{row['variant']}/{row['form']}"


def _speedup(times: dict, base: str, other: str) -> tuple[float, bool]:
    """(how much faster ``other`` is than ``base``, whether it was paired round
    by round): paired when both were timed in the same group, else the ratio
    of their medians."""
    from ..runtime.timing import paired_speedup
    a, b = times[base], times[other]
    if a.group is not None and a.group == b.group:
        return paired_speedup(a, b), True
    return a.timing.median_s / b.timing.median_s, False


def _speedups(rows: list[dict], times: dict) -> None:
    """Each row against the standard form's row of the same backend and
    variant, paired round by round (see ``runtime.timing.paired_speedup``)."""
    for r in rows:
        base = f"{r['backend']}/{r['variant']}/standard"
        if row_key(r) in times and base in times and r["backend"] != "torch":
            r["speedup_vs_standard"] = _speedup(times, base, row_key(r))[0]


def _ratios(rows: list[dict], times: dict, shape) -> list[dict]:
    """Pair by pair at one shape: fused against standard and decomposed on each
    backend and variant, and against every peer on the same device."""
    pairs = []
    for r in rows:
        if r["peer"] or r["form"] != "fused":
            continue
        for other in ("standard", "decomposed"):
            pairs.append((row_key(r), f"{r['backend']}/{r['variant']}/{other}"))
        if r["backend"] == "ort-cpu":
            pairs.append((row_key(r), f"ort-cpu/{r['variant']}/ort-optimizer"))
            pairs += [(row_key(r), f"torch//{peer}") for peer in ("torch-eager", "torch-compile")]
    out = []
    for a, b in pairs:
        if a in times and b in times:
            speedup, paired = _speedup(times, b, a)
            out.append({"shape": dict(shape), "a": a, "b": b, "speedup": speedup, "paired": paired})
    return out


def _measure_kernels(plan: Plan, weights, shape, peak, progress) -> list[dict]:
    from ..runtime.reference import run_reference
    from .kernels import first_fused_nodes, isolate, kernel_cost, sample_feeds
    o = plan.options
    entries = []
    for label, node in first_fused_nodes(plan.kernel_graphs):
        g = isolate(node, f"{node.op}_alone")
        feeds = sample_feeds(g, shape, np.random.default_rng(o.seed))
        params = {name: weights[name] for name in g.params}
        nbytes, flops = kernel_cost(g.nodes[0], shape)
        oracle = run_reference(g, params, feeds, float64=True)
        contestants = []
        for b, variant in _kernel_backends(plan):
            row = _row(b.name, variant, node.op, False, shape)
            row["bytes_modelled"] = nbytes
            contestants.append((row, lambda b=b, v=variant: b.compile(g, params, variant=v, threads=o.threads)))
        _time_contestants(contestants, feeds, oracle, o, peak, progress, f"kernel {_shape_text(shape)}")
        for row, _ in contestants:
            entries.append({"backend": row["backend"], "variant": row["variant"], "op": node.op, "shape": dict(shape),
                            "node": label, "status": row["status"], "error": row["error"],
                            "median_ms": row["latency_ms"]["median"] if row["latency_ms"] else None,
                            "bytes_modelled": nbytes, "flops_modelled": flops,
                            "bandwidth_gbps": row["bandwidth_gbps"], "fraction_of_peak": row["fraction_of_peak"],
                            "max_abs_error": row["max_abs_error"]})
    return entries
