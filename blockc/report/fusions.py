"""The fusion report: every candidate site, matched or rejected with the
reason; which original nodes went into which fused op; node counts and
modelled memory traffic before and after.

The JSON form is versioned (``schema``) and documented in
``docs/fusion-report.md``; fields are only ever added within a version.
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping

from ..files import format_bytes
from ..ir.graph import Graph
from ..passes.manager import OptimizeResult
from ..passes.pipeline import FUSIONS, RECOMPOSITIONS
from .traffic import total_bytes

SCHEMA = "blockc.fusion-report/1"
RANKS_SCHEMA = "blockc.fusion-report-ranks/1"


def build_report(model_name: str, graph: Graph, result: OptimizeResult, bindings: Mapping[str, int],
                 settings: Mapping[str, str] | None = None, form: str = "standard",
                 onnx_encodings: list | None = None) -> dict:
    """The report as plain data (what ``--json`` writes)."""
    fusion_sites = [s for s in result.sites if s.pass_name in FUSIONS + RECOMPOSITIONS]
    counts: dict[str, dict] = {}
    for s in fusion_sites:
        c = counts.setdefault(s.kind, {"category": "fusion" if s.pass_name in FUSIONS else "recompose",
                                       "fused": 0, "rejected": 0, "near_misses": 0})
        if s.fused:
            c["fused"] += 1
        else:
            c["rejected"] += 1
            c["near_misses"] += _near_miss(s)
    forms = {}
    for d in onnx_encodings or []:
        forms[tuple(d["nodes"])] = d
    before, after = total_bytes(graph, bindings), total_bytes(result.graph, bindings)
    sites = []
    for s in fusion_sites:
        entry = {"pass": s.pass_name, "kind": s.kind, "rule": s.rule, "anchor": s.anchor, "anchor_op": s.anchor_op,
                 "status": "fused" if s.fused else "rejected", "reason": s.reason, "matched_nodes": s.depth,
                 "near_miss": _near_miss(s),
                 "nodes": s.nodes, "ops": s.ops, "result": s.result}
        if tuple(s.nodes) in forms:
            entry["onnx_form"] = forms[tuple(s.nodes)]["form"]
            entry["onnx_form_reason"] = forms[tuple(s.nodes)]["reason"]
        sites.append(entry)
    return {
        "schema": SCHEMA,
        "model": model_name,
        "settings": dict(settings or {}),
        "form": form,
        "dims": dict(bindings),
        "disabled": list(result.disabled),
        "nodes": {"before": len(graph.nodes), "after": len(result.graph.nodes)},
        "ops_after": dict(sorted(Counter(n.op for n in result.graph.nodes).items())),
        "traffic_bytes": {"before": before, "after": after, "saved": before - after},
        "counts": counts,
        "sites": sites,
        "passes": [{"name": p.name, "seconds": round(p.seconds, 6), "changed": p.changed,
                    "nodes_before": p.nodes_before, "nodes_after": p.nodes_after} for p in result.stats],
    }


def ranks_report(model_name: str, reports: list[dict], *, pad_vocab: bool = False) -> dict:
    """The reports of a model split over ``len(reports)`` tensor-parallel
    ranks (``--tp``) as one object: each rank's report, in rank order, with
    its ``rank``."""
    return {"schema": RANKS_SCHEMA, "model": model_name, "tp": len(reports), "pad_vocab": pad_vocab,
            "ranks": [{"rank": r, **report} for r, report in enumerate(reports)]}


def _near_miss(site) -> bool:
    """Rejected after matching more than the anchor node itself."""
    return not site.fused and site.depth > 1


def format_report(report: dict, *, verbose: bool = False) -> str:
    """A terminal rendering of ``build_report``'s data."""
    lines = []
    dims = ", ".join(f"{k}={v}" for k, v in report["dims"].items())
    n, t = report["nodes"], report["traffic_bytes"]
    lines.append(f"{report['model']} ({report['form']} form), {dims}")
    lines.append(f"  nodes: {n['before']} -> {n['after']}")
    saved = t["saved"] / t["before"] if t["before"] else 0.0
    lines.append(f"  modelled memory traffic: {format_bytes(t['before'])} -> {format_bytes(t['after'])} "
                 f"({saved:.1%} less)")
    if report["disabled"]:
        lines.append(f"  disabled: {', '.join(report['disabled'])}")
    lines.append("")
    lines.append(f"  {'fusion':<24} {'fused':>6} {'rejected':>9}  (near misses)")
    for kind, c in report["counts"].items():
        if c["category"] == "fusion" or c["fused"] or c["near_misses"] or verbose:
            label = kind if c["category"] == "fusion" else f"{kind} (recomposed)"
            lines.append(f"  {label:<24} {c['fused']:>6} {c['rejected']:>9}  ({c['near_misses']})")
    lines.append("")
    for s in report["sites"]:
        if s["status"] == "fused":
            form = f"  [onnx: {s['onnx_form']}: {s['onnx_form_reason']}]" if "onnx_form" in s else ""
            lines.append(f"  fused    {s['kind']:<16} {' '.join(s['nodes'])} ({'+'.join(s['ops'])}) -> "
                         f"{s['result']}{form}")
    for s in report["sites"]:
        if s["status"] == "rejected" and (verbose or s["near_miss"]):
            lines.append(f"  rejected {s['kind']:<16} at {s['anchor']} ({s['anchor_op']}): {s['reason']}")
    hidden = sum(1 for s in report["sites"] if s["status"] == "rejected" and not s["near_miss"])
    if hidden and not verbose:
        lines.append(f"  ({hidden} other candidates did not get past their first node; --verbose lists them)")
    return "\n".join(lines)
