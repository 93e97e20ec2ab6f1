"""``blockc compare --tp N``: the model's step split over N ranks beside
the same on one, on the backends a rank runs (torch eager, torch.compile),
unfused (standard form) and fused, with the collectives' share of a step.

Every contestant runs through the launcher (``parallel/launch.time_cases``),
``--tp 1`` too, so both sides pay the same process and lowering: one launch
per rank count, every contestant a case of it. Each rank times its step
with the house clock (``runtime/timing.measure``: ``warmup`` untimed runs,
the median of ``repeats`` timed ones, the same count on every rank so their
collectives stay paired) and then the step's collectives alone, on tensors
of the same shapes in the same order (``worker.time_rank``). A split step
is as slow as its slowest rank: that rank's step and collectives are the
row's. The bytes each rank all-reduces are the communication model's
(``report/communication.py``).

    standard  torch-eager  --tp 1  483 ms
    standard  torch-eager  --tp 2  584 ms  collectives 133 ms (23%)

Unlike ``blockc compare`` without ``--tp``, the contestants are timed in
sequence, once each, not in interleaved rounds of fresh sessions repeated
in blocks: no interval, no A/A control, no verdict (docs/compare-report.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np

from ..errors import BlockcError
from ..frontends import build_model, trace
from ..frontends.module import check_seed
from ..parallel.launch import RANK_BACKENDS, Case, time_cases
from ..passes.shard import shard
from ..report.communication import collective_bytes
from ..runtime.interface import HOST_CLOCK

SCHEMA = "blockc.compare-tp/1"
FORMS = ("standard", "fused")   # what a rank's graph is: sharded, then fused or not (``worker.py``)


@dataclass(frozen=True)
class TpRow:
    """One contestant on ``tp`` ranks: its slowest rank's median step and
    that rank's collectives alone (how many, how long, their share)."""
    backend: str
    form: str
    tp: int
    step_ms: float
    collectives_ms: float
    collectives: int

    @property
    def share(self) -> float:
        return self.collectives_ms / self.step_ms if self.step_ms > 0 else 0.0


def check_tp_backends(backends) -> tuple[str, ...]:
    """The backends asked for, each one a rank runs, else refused by name."""
    backends = tuple(backends)
    bad = [b for b in backends if b not in RANK_BACKENDS]
    if bad or not backends:
        raise BlockcError(f"compare --tp times the backends a rank runs, {' and '.join(RANK_BACKENDS)}: give "
                          f"--backends from those (not {', '.join(bad) or 'none'})")
    return backends


def compare_tp(model: str, tp: int, *, overrides: Mapping[str, str] | None = None,
               backends=("torch-eager",), batch: int = 1, seq: int = 128, seed: int = 0,
               weights: str | None = None, pad_vocab: bool = False, warmup: int = 3, repeats: int = 20,
               timeout: float = 900.0) -> dict:
    """The comparison as the JSON document ``--json`` writes (see the module)."""
    backends, overrides, dims = check_tp_backends(backends), dict(overrides or {}), {"batch": batch, "seq": seq}
    if warmup < 0 or repeats < 1:
        raise BlockcError(f"--warmup must be >= 0 and --repeats >= 1, got {warmup} and {repeats}")
    built = build_model(model, overrides)
    rng = np.random.default_rng(check_seed(seed, "--seed"))
    feeds = {s.name: s.sample(dims, rng) for s in built.inputs()}
    sent = sum(c.sent for c in collective_bytes(shard(trace(built), tp, pad_vocab=pad_vocab).graphs[0], dims)
               if c.op == "all_reduce")
    contestants = [(b, f) for b in backends for f in FORMS]
    cases = [Case(model, feeds, overrides=overrides, seed=seed, weights=weights, pad_vocab=pad_vocab,
                  fused=form == "fused", compile=backend == "torch-compile") for backend, form in contestants]
    rows = []
    for ranks in sorted({1, tp}):
        for (backend, form), timed in zip(contestants, time_cases(cases, ranks, timeout=timeout, warmup=warmup,
                                                                  repeats=repeats)):
            slowest = max(timed, key=lambda r: r["step_s"])
            rows.append(TpRow(backend, form, ranks, slowest["step_s"] * 1e3, slowest["collectives_s"] * 1e3,
                              slowest["collectives"]))
    return {"schema": SCHEMA, "model": model, "settings": overrides, "tp": tp, "pad_vocab": pad_vocab,
            "shape": dims, "timing": {"warmup": warmup, "repeats": repeats, "clock": HOST_CLOCK},
            "all_reduce_bytes_per_rank": sent,
            "results": [{**asdict(r), "share": r.share} for r in rows]}


def format_tp(report: dict) -> str:
    """The table ``blockc compare --tp`` prints: each row beside its ``--tp 1`` and its standard form."""
    rows = report["results"]
    by = {(r["backend"], r["form"], r["tp"]): r for r in rows}
    lines = [f"{report['model']} on {report['tp']} ranks against 1, batch={report['shape']['batch']} "
             f"seq={report['shape']['seq']}: median of {report['timing']['repeats']} steps of the slowest rank; "
             f"{report['all_reduce_bytes_per_rank']:,} bytes all-reduced per rank per step",
             f"  {'backend':<14} {'form':<9} {'ranks':>5} {'step ms':>10} {'vs 1 rank':>10} {'vs standard':>12} "
             f"{'collectives ms':>15} {'share':>6}"]
    for r in rows:
        one = by[(r["backend"], r["form"], 1)]
        standard = by[(r["backend"], "standard", r["tp"])]
        lines.append(f"  {r['backend']:<14} {r['form']:<9} {r['tp']:>5} {r['step_ms']:>10.2f} "
                     f"{one['step_ms'] / r['step_ms']:>9.2f}x {standard['step_ms'] / r['step_ms']:>11.2f}x "
                     f"{r['collectives_ms']:>15.2f} {r['share']:>6.0%}")
    return "\n".join(lines)
