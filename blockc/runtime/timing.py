"""Timing a callable the way benchmarks here do: warm up, then repeat until
both a minimum count and a minimum measured time are reached; report the
median, min and max.

``measure`` is blockc's one timing loop: ``blockc compare``, the benches and
the child process that runs a compiled CUDA library all time through it.
What a run's time is -- the host clock around the call, or a device's own
clock (CUDA events recorded on the run's stream before and after it) -- is
its ``clock`` parameter.
This module imports nothing from blockc (and numpy only inside the
functions that need it), so that child process can load it by path and
start in stdlib time.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

Clock = Callable[[Callable[[], object]], float]   # runs a callable once; returns the seconds it took


def host_clock(fn: Callable[[], object]) -> float:
    """The host clock (``time.perf_counter``) around one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def event_clock(start: Callable[[], object], stop: Callable[[], float]) -> Clock:
    """A device's own clock: ``start()`` marks the stream before the run (a
    CUDA event recorded on it), ``stop()`` marks it after, waits for that mark
    and returns the seconds between the two. That is the time the device took
    from the run's first launch to its last kernel's end, gaps the host left
    between launches included, without the host's own wait at the end (which
    a host clock would add: a synchronize's wake-up, and the Python around it)."""
    def clock(fn: Callable[[], object]) -> float:
        start()
        fn()
        return stop()
    return clock


@dataclass
class Timing:
    median_s: float
    min_s: float
    max_s: float
    repeats: int
    samples: list[float] = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, samples: list[float]) -> "Timing":
        """The statistics of per-run ``samples`` (seconds)."""
        return cls(statistics.median(samples), min(samples), max(samples), len(samples), list(samples))

    def __str__(self) -> str:
        return f"{self.median_s * 1e3:.3f} ms (min {self.min_s * 1e3:.3f}, max {self.max_s * 1e3:.3f}, n={self.repeats})"


def measure(fn: Callable[[], object], *, warmup: int = 3, min_repeats: int = 10, min_time_s: float = 1.0,
            max_repeats: int = 10_000, clock: Clock = host_clock, runs_per_sample: int = 1) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then take samples by ``clock`` until
    both ``min_repeats`` samples and ``min_time_s`` seconds are reached (at most
    ``max_repeats`` samples). A sample is the clock around ``runs_per_sample``
    back-to-back runs, divided by their number: what the clock itself costs
    each time it is read (an event recorded and waited for: 3-10 us of host
    time) is spread over them, which a run of a few microseconds needs."""
    if runs_per_sample < 1:
        raise ValueError(f"runs_per_sample must be at least 1, not {runs_per_sample}")

    def runs() -> None:
        for _ in range(runs_per_sample):
            fn()
    sample = runs if runs_per_sample > 1 else fn   # one run: no loop between the two clock reads
    for _ in range(warmup):
        clock(fn)
    times: list[float] = []
    total = 0.0
    while (len(times) < min_repeats or total < min_time_s) and len(times) < max_repeats:
        dt = clock(sample)
        times.append(dt / runs_per_sample)
        total += dt
    return Timing.of(times)


@dataclass
class Interleaved:
    """One contestant's times from ``measure_interleaved``: every run pooled,
    and the median of each round (for pairing with another contestant's)."""

    samples: list[float]
    round_medians: list[float]
    group: int | None = 0   # contestants timed together share a group; only they pair round by round

    @property
    def timing(self) -> Timing:
        return Timing.of(self.samples)


def measure_interleaved(fns: dict[str, Callable[[], object]], *, rounds: int = 3, warmup: int = 3,
                        min_repeats: int = 10, min_time_s: float = 1.0,
                        on_round: Callable[[int], None] = lambda _: None) -> dict[str, Interleaved]:
    """Time several callables in ``rounds`` interleaved rounds.

    On a shared or throttling machine the speed drifts within seconds (here,
    by +-8% between one-second slices); timing A fully and then B puts that
    drift into the A/B ratio. Interleaving spreads it over every contestant,
    and per-round medians let a ratio be taken round by round
    (``paired_speedup``), where drift cancels. Each contestant gets
    ``warmup`` untimed runs once, then in every round one slice of at least
    ``min_repeats / rounds`` runs and ``min_time_s / rounds`` seconds.
    ``on_round(i)`` is called as round ``i`` starts.

    Why slices and not run-by-run alternation: each ONNX Runtime session
    has its own thread pool, whose threads spin for a while after a run;
    alternating sessions run by run made every run twice as slow here, as
    the idle pools' spinning took the cores. A slice pays that once.
    """
    rounds = max(1, rounds)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    out = {name: Interleaved([], []) for name in fns}
    per_round_repeats = max(1, -(-min_repeats // rounds))
    for i in range(rounds if fns else 0):
        on_round(i)
        for name, fn in fns.items():
            fn()  # untimed: lets the previous contestant's threads settle
            t = measure(fn, warmup=0, min_repeats=per_round_repeats, min_time_s=min_time_s / rounds)
            out[name].round_medians.append(t.median_s)
            out[name].samples.extend(t.samples)
    return out


def paired_speedup(base: Interleaved, other: Interleaved) -> float:
    """How much faster ``other`` is than ``base``: the median over rounds of
    base's round median / other's round median."""
    return statistics.median(b / o for b, o in zip(base.round_medians, other.round_medians))


@dataclass
class RatioInterval:
    """A speed ratio over independent repetitions, with a confidence interval."""

    ratio: float      # geometric mean
    low: float
    high: float
    n: int

    MIN_FOR_VERDICT = 5   # below this a bootstrap interval is mostly the resampling's own artefact

    @property
    def verdict(self) -> str:
        if self.n < self.MIN_FOR_VERDICT:
            return "too few repetitions"
        if self.low > 1:
            return "faster"
        if self.high < 1:
            return "slower"
        return "no difference resolved"

    def __str__(self) -> str:
        return f"{self.ratio:.3f}x (95% CI {self.low:.3f}-{self.high:.3f}, n={self.n})"


def ratio_interval(ratios: list[float], *, confidence: float = 0.95, resamples: int = 10_000,
                   seed: int = 0) -> RatioInterval:
    """The geometric mean of ``ratios`` with a bootstrap percentile interval.

    Each ratio must come from an independent repetition -- on this machine,
    a fresh pair of ONNX Runtime sessions: two sessions of the *same* graph
    run persistently up to ~4% apart (where their weights and packed GEMM
    panels land in memory), so the rounds of one session pair are not
    independent, and an interval over them claims more than it knows.
    The bootstrap needs no distribution assumed (numpy only; ``seed``
    makes it reproducible).
    """
    import numpy as np

    if not ratios or min(ratios) <= 0:
        raise ValueError("ratio_interval needs at least one positive ratio")
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    if len(logs) == 1:
        r = float(np.exp(logs[0]))
        return RatioInterval(r, r, r, 1)
    rng = np.random.default_rng(seed)
    means = logs[rng.integers(0, len(logs), size=(resamples, len(logs)))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return RatioInterval(float(np.exp(logs.mean())), float(np.exp(lo)), float(np.exp(hi)), len(logs))


def measure_in_blocks(makers: dict[str, Callable[[], tuple[Callable[[], object], Callable[[], None]]]], *,
                      blocks: int, rounds: int = 2, warmup: int = 3, min_time_s: float = 0.4, seed: int = 1,
                      min_repeats: int | None = None, progress: Callable = iter) -> list[dict[str, Interleaved]]:
    """Time contestants in ``blocks`` independent repetitions.

    ``makers[name]()`` prepares a fresh contestant and returns ``(run,
    close)``. Each block prepares every contestant anew, in an order shuffled
    by ``seed`` (so no one always gets the first, or the last, memory), times
    them with ``measure_interleaved`` (``min_time_s`` per contestant over the
    block's ``rounds``) and closes them. One dict per block; a ratio per
    block is ``paired_speedup(block[a], block[b])``, and ``ratio_interval``
    over the blocks says how sure it is. This is the design for differences
    of a few per cent on a machine where the same graph in two sessions runs
    persistently apart: the session is the unit that repeats.
    ``min_repeats`` (default ``2 * rounds``): the least timed runs of each
    contestant per block; with ``min_time_s=0`` exactly that many (rounded up
    to a multiple of ``rounds``), which processes that must run in step (the
    ranks of a split model) need. ``progress`` wraps the block range.
    """
    import numpy as np

    order = np.random.default_rng(seed)
    out = []
    for _ in progress(range(blocks)):
        names = list(makers)
        order.shuffle(names)
        ready = {}
        try:
            for n in names:
                ready[n] = makers[n]()
            out.append(measure_interleaved({n: run for n, (run, _) in ready.items()}, rounds=rounds,
                                           warmup=warmup, min_repeats=min_repeats or 2 * rounds,
                                           min_time_s=min_time_s))
        finally:
            for _, close in ready.values():
                close()
    return out
