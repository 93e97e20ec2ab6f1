"""Timing a callable the way benchmarks here do: warm up, then repeat until
both a minimum count and a minimum measured time are reached; report the
median, min and max."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class Timing:
    median_s: float
    min_s: float
    max_s: float
    repeats: int

    def __str__(self) -> str:
        return f"{self.median_s * 1e3:.3f} ms (min {self.min_s * 1e3:.3f}, max {self.max_s * 1e3:.3f}, n={self.repeats})"


def measure(fn: Callable[[], object], *, warmup: int = 3, min_repeats: int = 10, min_time_s: float = 1.0,
            max_repeats: int = 10_000) -> Timing:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    total = 0.0
    while (len(times) < min_repeats or total < min_time_s) and len(times) < max_repeats:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
    return Timing(statistics.median(times), min(times), max(times), len(times))
