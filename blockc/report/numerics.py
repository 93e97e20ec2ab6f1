"""Numeric A/B: does a fusion change the numbers more than float32 does anyway?

For each fusion alone, then all together, the fused graph runs in float32
and is compared with the float64 reference of the unfused graph. A fusion
passes when its error is at most ``2 ×`` the unfused float32 graph's error
plus a tiny absolute floor. A failure names the first value where the fused
graph departs from the unfused one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..ir.graph import Graph, Node
from ..passes.manager import label_origins, optimize
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


@dataclass
class CheckResult:
    backend: str
    variants: list[Variant] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.variants)


def _max_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def check_fusions(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray], *,
                  run: Callable[[Graph], dict] | None = None, backend: str = "reference",
                  floor: float = FLOOR) -> CheckResult:
    """A/B every fusion on ``graph``. ``run(graph) -> outputs`` runs a graph on
    the backend under test in float32 (default: the reference interpreter)."""
    run = run or (lambda g: run_reference(g, weights, feeds, float64=False))
    oracle = run_reference(graph, weights, feeds, float64=True)
    base = run(graph)
    base_err = {k: _max_err(base[k], oracle[k]) for k in oracle}
    result = CheckResult(backend)
    result.variants.append(Variant("unfused", 0, base_err, dict(base_err), True))
    for name in list(FUSIONS) + ["all"]:
        disable = [] if name == "all" else [f for f in FUSIONS if f != name]
        opt = optimize(graph, disable=disable)
        fused = sum(1 for s in opt.sites if s.fused and s.pass_name in FUSIONS)
        out = run(opt.graph)
        errors = {k: _max_err(out[k], oracle[k]) for k in oracle}
        limits = {k: 2 * base_err[k] + floor for k in oracle}
        ok = all(errors[k] <= limits[k] for k in oracle)
        v = Variant(name, fused, errors, limits, ok)
        if not ok:
            v.divergence = locate_divergence(graph, opt.graph, weights, feeds, floor)
        result.variants.append(v)
    return result


def locate_divergence(graph: Graph, fused: Graph, weights, feeds, floor: float = FLOOR) -> str:
    """The first fused-graph value whose float32 error against the float64
    reference exceeds the criterion, named by the original node it replaces."""
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
        err_fused = _max_err(test[n.outputs[0]], ref)
        err_plain = _max_err(plain[orig.outputs[0]], ref)
        if err_fused > 2 * err_plain + floor * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0):
            return (f"first divergence at {label} ({orig.op}), now computed by {n.op} "
                    f"(from {' '.join(n.origin)}): error {err_fused:.3g} against {err_plain:.3g} unfused")
    return "the outputs diverge, but no single intermediate value does (a rounding accumulation)"


def format_check(result: CheckResult) -> str:
    lines = [f"numeric A/B on {result.backend} (float32 against the float64 reference; "
             f"limit = 2 × unfused error + {FLOOR:g})"]
    lines.append(f"  {'variant':<22} {'sites':>5}  {'output':<20} {'max |err|':>10} {'limit':>10}  result")
    for v in result.variants:
        for i, k in enumerate(v.errors):
            status = "" if i else ("ok" if v.passed else "FAIL")
            lines.append(f"  {v.name if i == 0 else '':<22} {v.fused_sites if i == 0 else '':>5}  {k:<20} "
                         f"{v.errors[k]:>10.3g} {v.limits[k]:>10.3g}  {status}")
        if v.divergence:
            lines.append(f"    {v.divergence}")
    lines.append("PASS" if result.passed else "FAIL")
    return "\n".join(lines)
