"""Numeric A/B: does a fusion change the numbers more than float32 does anyway?

For each fusion, then all together, the fused graph runs in float32 and is
compared with the float64 reference of the unfused graph. A fusion runs
alone where it finds the sites it finds in the whole pipeline; one that
builds on earlier fusions (``fuse_qkv_attention`` rewrites what
``fuse_qkv`` and ``fuse_attention`` made) runs after the fewest of them it
needs to find those sites (``prerequisites``: every earlier fusion, then
each dropped in turn if the count stays), the others disabled, and the
report says so: its sites are its own, its error is the group's. A fusion
passes when its error is at most ``2 ×`` the unfused float32 graph's error
plus a tiny absolute floor. A failure names the first value where the fused
graph departs from the unfused one.

Non-finite outputs fail, whoever makes them: a NaN or Inf in the float64
reference (NaN weights, say) fails the unfused run with the first node whose
reference result is not finite, and the fusions are not compared (an error of
NaN says nothing about a fusion); a float32 run that is not finite where the
reference is fails its variant and names the first node where its float32
result is not finite.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..ir.graph import Graph, Node
from ..passes.manager import OptimizeResult, label_origins, optimize
from ..passes.pipeline import FUSIONS
from ..runtime.reference import run_reference

FLOOR = 1e-6


@dataclass
class Variant:
    name: str                  # "unfused", a fusion pass name, or "all"
    fused_sites: int
    errors: dict               # output -> max |error| vs the float64 reference
    limits: dict               # output -> allowed error
    passed: bool
    divergence: str = ""
    after: tuple = ()          # the earlier fusions it ran after (its prerequisites)


@dataclass
class CheckResult:
    backend: str
    variants: list[Variant] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.variants)


def error_limit(unfused_error: float, floor: float = FLOOR) -> float:
    """The most error a result may have against the float64 reference: twice
    the error the unfused graph has anyway in float32 (``unfused_error``),
    plus ``floor`` where float32 is exact. ``blockc check`` holds each fusion
    to it, ``blockc run --check`` each output."""
    return 2 * unfused_error + floor


_ERROR_CHUNK = 1 << 20   # values widened at a time: 8 MiB of float64, whatever the outputs' size


def max_abs_error(got: np.ndarray, ref: np.ndarray) -> float:
    """``max |got - ref|`` in float64; NaN where either holds a NaN (or
    both an Inf of one sign), 0 for empty arrays. Widened a chunk at a time:
    a GPT-2's logits at batch 8, seq 512 are 1.6 GB in float32, and widening
    them whole with the difference and its absolute value beside them would
    take three times that again."""
    got, ref = np.ravel(np.asarray(got)), np.ravel(np.asarray(ref))
    worst = 0.0
    for i in range(0, got.size, _ERROR_CHUNK):
        err = float(np.max(np.abs(got[i:i + _ERROR_CHUNK].astype(np.float64) - ref[i:i + _ERROR_CHUNK])))
        if err != err:   # NaN: max() would drop it
            return err
        worst = max(worst, err)
    return worst


def non_finite_outputs(outputs: Mapping[str, np.ndarray]) -> list[str]:
    """``"logits: 12 of 3072 values NaN/Inf"`` for each output that is not all finite."""
    found = []
    for name, a in outputs.items():
        a = np.asarray(a)
        if a.dtype.kind == "V" or a.dtype.kind in "fc":
            bad = int((~np.isfinite(a.astype(np.float64))).sum())
            if bad:
                found.append(f"{name}: {bad} of {a.size} values NaN/Inf")
    return found


def first_non_finite(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray], *,
                     float64: bool = True) -> str:
    """Where the reference run of ``graph`` (in float64, or in the graph's
    dtypes) first makes a value that is not finite: the node, as ``blockc
    show`` numbers it, its op, and which of its inputs already were (a weight
    holding NaN, say); or that every intermediate value is finite."""
    labelled = label_origins(graph)
    captured: dict = {}
    run_reference(labelled, weights, feeds, float64=float64, capture=captured)
    where = "float64 reference" if float64 else "reference in the graph's dtypes"
    for n in labelled.nodes:
        for o in n.outputs:
            a = captured.get(o)
            if a is None or not (a.dtype.kind in "fc" or a.dtype.kind == "V"):
                continue
            bad = int((~np.isfinite(a.astype(np.float64))).sum())
            if not bad:
                continue
            inputs = [v.name for v in n.inputs if v.kind in ("param", "input") and v.name
                      and not np.isfinite(np.asarray(weights[v.name] if v.kind == "param" else feeds[v.name],
                                                     np.float64)).all()]
            reads = (f", reading {', '.join(map(repr, inputs))}, which already "
                     f"{'holds' if len(inputs) == 1 else 'hold'} NaN/Inf") if inputs else ""
            return (f"the {where} is first not finite at {n.origin[0]} ({n.op}): {bad} of {a.size} values"
                    f"{reads}")
    return f"every value of the {where} is finite"


def run_check_failure(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray],
                      outputs: Mapping[str, np.ndarray], oracle: Mapping[str, np.ndarray], where: str) -> str:
    """``blockc run --check``: why ``outputs``, ``graph`` run on ``where``,
    fail against ``oracle``, its float64 reference; "" where they pass. An
    output fails when it is not finite (said with where the values first
    stopped being finite), or when its error is over ``error_limit`` of the
    error the reference interpreter has in the graph's own dtypes: the error
    ``blockc check`` allows a fusion over the unfused graph's."""
    bad = non_finite_outputs(outputs)
    if bad:
        if non_finite_outputs(oracle):
            origin = first_non_finite(graph, weights, feeds)
        else:
            origin = (f"the float64 reference is finite, so {where} made them; "
                      + first_non_finite(graph, weights, feeds, float64=False))
        return f"the outputs are not finite ({'; '.join(bad)}); {origin}"
    plain = run_reference(graph, weights, feeds, float64=False)
    over = []
    for name in oracle:
        err, anyway = max_abs_error(outputs[name], oracle[name]), max_abs_error(plain[name], oracle[name])
        if err > error_limit(anyway):
            over.append(f"{name}: max |err| {err:.3g} is over its limit {error_limit(anyway):.3g} (2 x the "
                        f"reference interpreter's {anyway:.3g} in the graph's dtypes + {FLOOR:g})")
    return f"{where} is further from the float64 reference than blockc check allows: {'; '.join(over)}" \
        if over else ""


def check_fusions(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray], *,
                  run: Callable[[Graph], dict] | None = None, backend: str = "reference",
                  floor: float = FLOOR, variants: list[FusionVariant] | None = None) -> CheckResult:
    """A/B every fusion on ``graph``. ``run(graph) -> outputs`` runs a graph on
    the backend under test in float32 (default: the reference interpreter).
    ``variants``: ``fusion_variants(graph)``, made once by a caller that
    checks several backends (None: made here)."""
    run = run or (lambda g: run_reference(g, weights, feeds, float64=False))
    oracle = run_reference(graph, weights, feeds, float64=True)
    base = run(graph)
    base_err = {k: max_abs_error(base[k], oracle[k]) for k in oracle}
    result = CheckResult(backend)
    bad_oracle, bad_base = non_finite_outputs(oracle), non_finite_outputs(base)
    if bad_oracle:
        # Nothing to compare against: every error is NaN, and no fusion is to blame.
        why = (f"the outputs are not finite ({'; '.join(bad_oracle)}); "
               f"{first_non_finite(graph, weights, feeds)}; fusions not compared")
        result.variants.append(Variant("unfused", 0, base_err, dict(base_err), False, why))
        return result
    if bad_base:
        why = (f"the float32 outputs are not finite ({'; '.join(bad_base)}) although the float64 "
               f"reference's are; {first_non_finite(graph, weights, feeds, float64=False)}; fusions not compared")
        result.variants.append(Variant("unfused", 0, base_err, dict(base_err), False, why))
        return result
    result.variants.append(Variant("unfused", 0, base_err, dict(base_err), True))
    for fv in variants if variants is not None else fusion_variants(graph):
        out = run(fv.graph)
        errors = {k: max_abs_error(out[k], oracle[k]) for k in oracle}
        limits = {k: error_limit(base_err[k], floor) for k in oracle}
        ok = all(errors[k] <= limits[k] for k in oracle)
        v = Variant(fv.name, fv.sites, errors, limits, ok, after=fv.after)
        if non_finite_outputs(out):
            where = locate_divergence(graph, fv.graph, weights, feeds, floor, rounding="")
            v.divergence = (f"the outputs are not finite ({'; '.join(non_finite_outputs(out))}); "
                            + (where or "the reference interpreter runs this fused graph to finite values, so "
                                        f"{backend} made the NaN/Inf"))
        elif not ok:
            v.divergence = locate_divergence(graph, fv.graph, weights, feeds, floor)
        result.variants.append(v)
    return result


@dataclass
class FusionVariant:
    """One graph ``check_fusions`` runs: a fusion alone (after its
    prerequisites), or all of them."""

    name: str                  # a fusion pass name, or "all"
    after: tuple               # the earlier fusions it runs after
    graph: Graph               # ``graph`` optimized with just those enabled
    sites: int                 # the sites it fused (all: every fusion's)


def fusion_variants(graph: Graph) -> list[FusionVariant]:
    """Each fusion after its ``prerequisites``, then all: what ``check_fusions``
    runs, the same on every backend, so ``blockc check`` makes it once."""
    pipelines = _Pipelines(graph)
    variants = []
    for name in FUSIONS:
        after = prerequisites(graph, name, pipelines)
        variants.append(FusionVariant(name, after, pipelines.result((name, *after)).graph,
                                      pipelines.sites(name, after)))
    everything = pipelines.result(FUSIONS)
    variants.append(FusionVariant("all", (), everything.graph,
                                  sum(1 for s in everything.sites if s.fused and s.pass_name in FUSIONS)))
    return variants


class _Pipelines:
    """``graph`` optimized with a set of fusions enabled, once per set: finding
    each fusion's prerequisites asks about the same sets again and again (the
    same set, each time, for every fusion it enables)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._results: dict[frozenset, OptimizeResult] = {}

    def result(self, enabled) -> OptimizeResult:
        key = frozenset(enabled)
        if key not in self._results:
            self._results[key] = optimize(self.graph, disable=[f for f in FUSIONS if f not in key])
        return self._results[key]

    def sites(self, fusion: str, enabled) -> int:
        """The sites ``fusion`` fuses with ``enabled`` fusions run too."""
        return sum(1 for s in self.result((fusion, *enabled)).sites if s.fused and s.pass_name == fusion)


def prerequisites(graph: Graph, fusion: str, pipelines: _Pipelines | None = None) -> tuple:
    """The fewest earlier fusions ``fusion`` must run after to find on
    ``graph`` the sites it finds in the whole pipeline: () when it finds them
    alone; else every earlier fusion, each dropped in turn if the count stays.
    ``pipelines``: the optimized graphs already made for ``graph``."""
    pipelines = pipelines or _Pipelines(graph)
    earlier = list(FUSIONS[:FUSIONS.index(fusion)])
    target = pipelines.sites(fusion, earlier)
    if not earlier or pipelines.sites(fusion, ()) == target:
        return ()
    needed = list(earlier)
    for f in earlier:
        trial = [g for g in needed if g != f]
        if pipelines.sites(fusion, trial) == target:
            needed = trial
    return tuple(needed)


ROUNDING = "the outputs diverge, but no single intermediate value does (a rounding accumulation)"


def locate_divergence(graph: Graph, fused: Graph, weights, feeds, floor: float = FLOOR, *,
                      rounding: str = ROUNDING) -> str:
    """The first fused-graph value whose float32 error against the float64
    reference exceeds the criterion (or is not finite), named by the original
    node it replaces; ``rounding`` where no single value does."""
    labelled = label_origins(graph)
    by_label: dict[str, Node] = {n.origin[0]: n for n in labelled.nodes}
    exact, plain, test = {}, {}, {}
    run_reference(labelled, weights, feeds, float64=True, capture=exact)
    run_reference(labelled, weights, feeds, float64=False, capture=plain)
    run_reference(fused, weights, feeds, float64=False, capture=test)
    for n in fused.nodes:
        if n.op == "constant" or not n.origin:
            continue
        label = max(n.origin, key=lambda s: int(s[1:]) if s[1:].isdigit() else -1)
        orig = by_label.get(label)
        if orig is None or orig.outputs[0].shape != n.outputs[0].shape:
            continue
        ref = exact[orig.outputs[0]]
        err_fused = max_abs_error(test[n.outputs[0]], ref)
        err_plain = max_abs_error(plain[orig.outputs[0]], ref)
        if not np.isfinite(err_fused) or \
                err_fused > 2 * err_plain + floor * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0):
            return (f"first divergence at {label} ({orig.op}), now computed by {n.op} "
                    f"(from {' '.join(n.origin)}): error {err_fused:.3g} against {err_plain:.3g} unfused")
    return rounding


def format_check(result: CheckResult) -> str:
    lines = [f"numeric A/B on {result.backend} (float32 against the float64 reference; "
             f"limit = 2 × unfused error + {FLOOR:g}; each fusion alone, or after the fusions it builds on)"]
    lines.append(f"  {'variant':<22} {'sites':>5}  {'output':<20} {'max |err|':>10} {'limit':>10}  result")
    for v in result.variants:
        for i, k in enumerate(v.errors):
            status = "" if i else ("ok" if v.passed else "FAIL")
            lines.append(f"  {v.name if i == 0 else '':<22} {v.fused_sites if i == 0 else '':>5}  {k:<20} "
                         f"{v.errors[k]:>10.3g} {v.limits[k]:>10.3g}  {status}")
        if v.after:
            lines.append(f"    ran after {', '.join(v.after)} (it finds fewer sites without them); "
                         f"sites: its own; error: of them together")
        if v.divergence:
            lines.append(f"    {v.divergence}")
    lines.append("PASS" if result.passed else "FAIL")
    return "\n".join(lines)
