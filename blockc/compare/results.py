"""What ``blockc compare`` found, row by row and pair by pair.

A ``Row`` is one contestant's results at one shape (the ``results`` entries
of the JSON document, ``Row.to_json``); ``latencies``, ``speedups``,
``ratios`` and ``verdicts`` turn the timed blocks (``{key: [Interleaved or
None per block]}``) into the rows' figures and the document's ``ratios`` and
``verdicts``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..errors import BlockcError
from ..report.numerics import max_abs_error
from ..runtime.timing import Interleaved, RatioInterval, paired_speedup, ratio_interval

# The key suffix of an A/A control: a second fresh session of a contestant, timed like any other, whose ratio to
# the first shows how far apart two identical contestants come out on this machine (``verdicts``). compare --tp
# hands it to the ranks, which name their control with it (``parallel.launch.time_cases``).
AA = " (A/A)"


@dataclass
class Row:
    """One contestant's results at one shape; ``to_json`` is its ``results`` entry."""

    backend: str
    variant: str
    form: str
    peer: bool
    shape: dict[str, int] = field(default_factory=dict)
    status: str = "ok"                   # ok, error or skipped (then ``error`` says why)
    error: str = ""
    latency_ms: dict | None = None
    speedup_vs_standard: float | None = None
    ir_nodes: int | None = None
    kernels: int | None = None
    bytes_modelled: int | None = None
    bandwidth_gbps: float | None = None
    fraction_of_peak: float | None = None
    max_abs_error: float | None = None

    @property
    def key(self) -> str:
        return f"{self.backend}/{self.variant}/{self.form}"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fail(self, error: str) -> None:
        self.status, self.error = "error", error

    def skip(self, reason: str) -> None:
        self.status, self.error = "skipped", reason

    def copy(self) -> Row:
        return dataclasses.replace(self, shape=dict(self.shape))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def max_error(outputs, oracle) -> float:
    """The largest absolute error of ``outputs`` against the float64 ``oracle``'s."""
    missing = [k for k in oracle if k not in outputs]
    if missing:
        raise BlockcError(f"the run produced no output {', '.join(missing)}")
    worst = 0.0
    for k, ref in oracle.items():
        got = np.asarray(outputs[k])
        if got.shape != ref.shape:
            raise BlockcError(f"output {k} has shape {list(got.shape)}, expected {list(ref.shape)}")
        err = max_abs_error(got, ref)
        if err != err:
            return err
        worst = max(worst, err)
    return worst


def pooled(runs) -> Interleaved:
    """Every timed run of ``runs`` (``Interleaved``, one a block) as one: a latency over all blocks."""
    return Interleaved([x for t in runs for x in t.samples], [m for t in runs for m in t.round_medians])


def latencies(contestants, times: dict, peak) -> None:
    """Each row's latency: every timed run of every block, pooled."""
    for c in contestants:
        ran = [t for t in times[c.key] if t is not None]
        row = c.row
        if not row.ok or not ran:
            continue
        together = pooled(ran)
        lat = together.timing
        row.latency_ms = {"median": lat.median_s * 1e3, "min": lat.min_s * 1e3, "max": lat.max_s * 1e3,
                          "repeats": lat.repeats, "round_medians": [x * 1e3 for x in together.round_medians]}
        if row.bytes_modelled is not None and lat.median_s > 0:
            row.bandwidth_gbps = row.bytes_modelled / lat.median_s / 1e9
            if peak:
                row.fraction_of_peak = row.bandwidth_gbps / peak


def speedups(rows: list[Row]) -> None:
    """Each row against the standard form's row of the same backend and
    variant: the ratio of the two medians the table prints beside it."""
    medians = {r.key: r.latency_ms["median"] for r in rows if r.latency_ms}
    for r in rows:
        base = f"{r.backend}/{r.variant}/standard"
        if r.key in medians and base in medians and not r.peer:
            r.speedup_vs_standard = medians[base] / medians[r.key]


def interval(times: dict, base: str, other: str) -> tuple[RatioInterval, bool] | None:
    """How much faster ``other`` is than ``base``: one ratio per block in
    which both ran -- paired round by round where they were timed in the
    same group, else the ratio of their medians -- as a geometric mean with a
    95% interval over blocks; and whether every block's ratio was paired."""
    ratios, paired = [], True
    for a, b in zip(times.get(base, ()), times.get(other, ())):
        if a is None or b is None:
            continue
        if a.group == b.group:
            ratios.append(paired_speedup(a, b))
        else:
            ratios.append(a.timing.median_s / b.timing.median_s)
            paired = False
    return (ratio_interval(ratios), paired) if ratios else None


def interval_doc(iv: RatioInterval, paired: bool) -> dict:
    return {"speedup": iv.ratio, "low": iv.low, "high": iv.high, "blocks": iv.n, "verdict": iv.verdict,
            "paired": paired}


def _pairs(rows: list[Row]) -> list[tuple[str, str]]:
    """Fused against standard and decomposed on each backend and variant,
    and against every peer on the same device."""
    pairs = []
    for r in rows:
        if r.peer or r.form != "fused":
            continue
        for other in ("standard", "decomposed"):
            pairs.append((r.key, f"{r.backend}/{r.variant}/{other}"))
        pairs += [(r.key, p.key) for p in rows if p.peer and p.backend == r.backend and p.variant in ("", r.variant)]
        if r.backend == "ort-cpu":   # torch's rows run on the same CPU
            pairs += [(r.key, p.key) for p in rows if p.peer and p.backend == "torch"]
    return pairs


def ratios(rows: list[Row], times: dict, shape) -> list[dict]:
    """Pair by pair at one shape (``_pairs``), each with its interval."""
    out = []
    for a, b in _pairs(rows):
        got = interval(times, b, a)
        if got is not None:
            out.append({"shape": dict(shape), "a": a, "b": b, **interval_doc(*got)})
    return out


def resolved(effect: RatioInterval, aa: RatioInterval) -> bool:
    """Whether ``effect`` is a difference this machine resolves: its
    interval is off 1, the A/A control's is not, and the two do not overlap
    (an A/A spread as wide as the effect says the machine cannot tell them apart)."""
    return (effect.verdict in ("faster", "slower") and aa.verdict == "no difference resolved"
            and (effect.low > aa.high or effect.high < aa.low))


def verdicts(contestants, times: dict, shape) -> list[dict]:
    """Per backend and variant: what fusion bought (fused against standard),
    the A/A control beside it, what it cost in accuracy, and whether the
    difference is resolved."""
    rows = {c.key: c.row for c in contestants}
    out = []
    for c in contestants:
        if not c.key.endswith(AA):
            continue
        standard = c.key[:-len(AA)]
        fused = standard.rsplit("/", 1)[0] + "/fused"
        fusion, aa = interval(times, standard, fused), interval(times, standard, c.key)
        if fusion is None or aa is None:
            continue
        out.append({"shape": dict(shape), "backend": c.row.backend, "variant": c.row.variant,
                    "fusion": interval_doc(*fusion), "aa": interval_doc(*aa), "resolved": resolved(fusion[0], aa[0]),
                    "max_abs_error": {"fused": rows[fused].max_abs_error,
                                      "standard": rows[standard].max_abs_error}})
    return out
