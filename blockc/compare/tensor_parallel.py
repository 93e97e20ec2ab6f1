"""``blockc compare --tp N``: the model's step split over N ranks beside the
same step on one, on the backends a rank runs (torch eager,
torch.compile), unfused (standard form) and fused, by compare's own method,
with the collectives' share of a step and a check that the split outputs
are the unsplit ones.

The method is ``blockc compare``'s (``compare/run.py``, from
``bench/cpu_targets.py``): ``blocks`` independent repetitions, each of
fresh sessions of every contestant in shuffled order, timed in interleaved
rounds; a ratio is the geometric mean over blocks of each block's ratio
(paired round by round), with a 95% bootstrap interval; and an A/A control
-- a second one-rank session of each backend's standard form -- shows how
far apart two identical contestants come out. One launch of N ranks holds
every contestant, the one-rank ones on rank 0 (``parallel/rank_timing.py``
says why sessions, not launches, are made fresh each block, and how the
ranks stay in step). A split step is as slow as its slowest rank: each
run's time is the slowest rank's. The bytes each rank all-reduces are the
communication model's (``report/communication.py``).

Before timing, every contestant runs once: each rank's split outputs must
equal the one-rank outputs within ``TOLERANCE`` (absolute and relative, as
numpy's ``allclose``: float32's sums taken in another order), reported in
``outputs``; ``outputs_ok`` false fails the command.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np

from ..errors import BlockcError
from ..frontends import build_model, trace
from ..frontends.module import check_seed
from ..parallel.launch import Case, check_rank_backend, rank_backends, time_cases
from ..parallel.rank_timing import contestant_key
from ..passes.shard import shard
from ..report.communication import collective_bytes
from ..runtime.interface import HOST_CLOCK
from ..runtime.timing import Interleaved
from .results import AA, interval, interval_doc, max_error, pooled, resolved

SCHEMA = "blockc.compare-tp/2"
FORMS = ("standard", "fused")   # what a rank's graph is: sharded, then fused or not (``worker.py``)
TOLERANCE = 1e-5                # float32 outputs split over ranks against one rank's


@dataclass(frozen=True)
class TpRow:
    """One contestant on ``tp`` ranks: the median of its steps (each the
    slowest rank's) over every block, and its slowest rank's collectives
    alone (how many, how long, their share)."""
    backend: str
    form: str
    tp: int
    step_ms: float
    collectives_ms: float
    collectives: int

    @property
    def share(self) -> float:
        return self.collectives_ms / self.step_ms if self.step_ms > 0 else 0.0


def check_tp_options(backends, tp: int, blocks: int, rounds: int, warmup: int, repeats: int) -> tuple[str, ...]:
    """The backends asked for, each one a rank runs, and the counts; else refused by name."""
    backends = tuple(check_rank_backend(b, option="--backends") for b in backends)
    if not backends:
        raise BlockcError(f"compare --tp times the backends a rank runs: give --backends from "
                          f"{' and '.join(rank_backends())}")
    if tp < 2:
        raise BlockcError(f"compare --tp N times N ranks against one: give --tp 2 or more (not {tp})")
    if min(blocks, rounds, repeats) < 1 or warmup < 0:
        raise BlockcError(f"--blocks, --rounds and --repeats must be at least 1 and --warmup at least 0, got "
                          f"{blocks}, {rounds}, {repeats} and {warmup}")
    return backends


def compare_tp(model: str, tp: int, *, overrides: Mapping[str, str] | None = None,
               backends=None, batch: int = 1, seq: int = 128, seed: int = 0,
               weights: str | None = None, pad_vocab: bool = False, blocks: int = 5, rounds: int = 2,
               warmup: int = 2, repeats: int = 4, timeout: float = 900.0) -> dict:
    """The comparison as the JSON document ``--json`` writes (docs/compare-report.md);
    ``backends``: the default rank backend where not given."""
    backends = check_tp_options(rank_backends()[:1] if backends is None else backends, tp, blocks, rounds, warmup, repeats)
    overrides, dims = dict(overrides or {}), {"batch": batch, "seq": seq}
    built = build_model(model, overrides)
    rng = np.random.default_rng(check_seed(seed, "--seed"))
    feeds = {s.name: s.sample(dims, rng) for s in built.inputs()}
    sent = sum(c.sent for c in collective_bytes(shard(trace(built), tp, pad_vocab=pad_vocab).graphs[0], dims)
               if c.op == "all_reduce")
    contestants = [(backend, form) for backend in backends for form in FORMS]
    cases = [Case(model, feeds, overrides=overrides, seed=seed, weights=weights, pad_vocab=pad_vocab,
                  fused=form == "fused", backend=backend) for backend, form in contestants]
    ranks = time_cases(cases, tp, blocks=blocks, rounds=rounds, warmup=warmup, repeats=repeats, seed=seed + 1,
                       control=AA, timeout=timeout)
    times, rows, outputs = {}, [], []
    for (backend, form), timed in zip(contestants, ranks):
        times.update(_case_times(backend, form, tp, timed))
        rows += _case_rows(backend, form, tp, timed, times)
        outputs.append(_output_check(backend, form, timed))
    return {"schema": SCHEMA, "model": model, "settings": overrides, "tp": tp, "pad_vocab": pad_vocab,
            "shape": dims, "timing": {"blocks": blocks, "rounds": rounds, "warmup": warmup, "repeats": repeats,
                                      "clock": HOST_CLOCK, "sessions": "fresh each block, in one launch"},
            "all_reduce_bytes_per_rank": sent,
            "results": [{**asdict(r), "share": r.share} for r in rows],
            "ratios": _ratios(backends, tp, times), "verdicts": _verdicts(backends, tp, times),
            "outputs": outputs, "outputs_ok": all(o["ok"] for o in outputs)}


def _slowest(parts: list[dict]) -> Interleaved:
    """One block of a split contestant: each run the slowest rank's (the ranks ran the same count, in step)."""
    return Interleaved([max(s) for s in zip(*(p["samples"] for p in parts))],
                       [max(m) for m in zip(*(p["round_medians"] for p in parts))])


def _case_times(backend: str, form: str, tp: int, timed: list[dict]) -> dict[str, list[Interleaved]]:
    """Each contestant's blocks: a split one's, run by run its slowest rank; a one-rank one's, rank 0's."""
    split = contestant_key(backend, form, tp)
    out = {split: [_slowest([r["blocks"][b][split] for r in timed]) for b in range(len(timed[0]["blocks"]))]}
    for key in timed[0]["blocks"][0]:
        if key != split:
            out[key] = [Interleaved(blk[key]["samples"], blk[key]["round_medians"]) for blk in timed[0]["blocks"]]
    return out


def _case_rows(backend: str, form: str, tp: int, timed: list[dict], times: dict) -> list[TpRow]:
    def median_ms(key: str) -> float:
        return pooled(times[key]).timing.median_s * 1e3
    slowest = max(timed, key=lambda r: r["collectives_s"])
    return [TpRow(backend, form, 1, median_ms(contestant_key(backend, form, 1)), 0.0, 0),
            TpRow(backend, form, tp, median_ms(contestant_key(backend, form, tp)), slowest["collectives_s"] * 1e3,
                  slowest["collectives"])]


def _output_check(backend: str, form: str, timed: list[dict]) -> dict:
    """Every rank's split outputs against rank 0's one-rank outputs."""
    one = timed[0]["one"]
    ok = all(np.allclose(r["split"][k], one[k], rtol=TOLERANCE, atol=TOLERANCE) for r in timed for k in one)
    worst = max(max_error(r["split"], one) for r in timed)
    return {"backend": backend, "form": form, "max_abs_error": worst, "tolerance": TOLERANCE, "ok": bool(ok)}


def _ratios(backends, tp: int, times: dict) -> list[dict]:
    """N ranks against one per backend and form; fused against standard per backend and rank count."""
    pairs = [(contestant_key(b, f, tp), contestant_key(b, f, 1)) for b in backends for f in FORMS]
    pairs += [(contestant_key(b, "fused", n), contestant_key(b, "standard", n)) for b in backends for n in (1, tp)]
    return [{"a": a, "b": b, **interval_doc(*interval(times, b, a))} for a, b in pairs]


def _verdicts(backends, tp: int, times: dict) -> list[dict]:
    """Per backend and form: what the split bought, beside the backend's A/A control."""
    out = []
    for b in backends:
        one = contestant_key(b, "standard", 1)
        aa = interval(times, one, contestant_key(b, "standard", 1, AA))
        for f in FORMS:
            split = interval(times, contestant_key(b, f, 1), contestant_key(b, f, tp))
            out.append({"backend": b, "form": f, "split": interval_doc(*split), "aa": interval_doc(*aa),
                        "resolved": resolved(split[0], aa[0])})
    return out


def format_tp(report: dict) -> str:
    """What ``blockc compare --tp`` prints: the medians, the verdicts with their intervals, the outputs' check."""
    from .table import verdict_words, with_interval
    t = report["timing"]
    lines = [f"{report['model']} on {report['tp']} ranks against 1, batch={report['shape']['batch']} "
             f"seq={report['shape']['seq']}: {t['blocks']} blocks of fresh sessions, {t['rounds']} interleaved "
             f"rounds, {t['repeats']} steps a block (a split step is its slowest rank's); "
             f"{report['all_reduce_bytes_per_rank']:,} bytes all-reduced per rank per step",
             f"  {'backend':<14} {'form':<9} {'ranks':>5} {'median ms':>10} {'collectives ms':>15} {'share':>6}"]
    for r in report["results"]:
        lines.append(f"  {r['backend']:<14} {r['form']:<9} {r['tp']:>5} {r['step_ms']:>10.2f} "
                     f"{r['collectives_ms']:>15.2f} {r['share']:>6.0%}")
    lines.append(f"{report['tp']} ranks against 1, geometric mean over blocks [95% interval], >1 means faster; "
                 f"A/A: a second one-rank standard session against the first")
    for v in report["verdicts"]:
        lines.append(f"  {v['backend']:<14} {v['form']:<9} {with_interval(v['split']):>22}  A/A "
                     f"{with_interval(v['aa']):>22}  {verdict_words(v, 'split')}")
    lines.append(f"outputs on {report['tp']} ranks against 1 (within {TOLERANCE:g}, absolute and relative):")
    for o in report["outputs"]:
        lines.append(f"  {o['backend']:<14} {o['form']:<9} max |diff| {o['max_abs_error']:.2g}  "
                     f"{'ok' if o['ok'] else 'FAILED'}")
    return "\n".join(lines)


def output_failure(report: dict) -> str:
    """Why the split outputs fail the check ('' when they pass)."""
    bad = [o for o in report["outputs"] if not o["ok"]]
    return "; ".join(f"{o['backend']} {o['form']} on {report['tp']} ranks differs from one rank by up to "
                     f"{o['max_abs_error']:.3g} (more than {o['tolerance']:g})" for o in bad)
