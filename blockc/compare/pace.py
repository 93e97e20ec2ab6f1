"""How long compare's work takes on this machine, learnt from compare's own runs.

``blockc compare`` says up front how long it will take. Its model of a run
is the FLOP count at the best matmul rate seen here
(``machine.matmul_flops_per_s``), and of a session's preparation 0.2 s plus
a second per GB the session holds. Both are off by backend, and by a lot:
the float64 reference runs 2-4x its FLOP guess, a GPU far under it, a CUDA
build pays nvcc's seconds, and an ONNX Runtime session's optimizer costs
more than its weights' copy. A ratio does not carry from one
size to another either: a tiny model's run is all per-node overhead (the
reference ran gpt2-block's FLOPs near the model, ``tiny``'s 2500x slower
than it). So each comparison records, per workload -- the backend and
variant, a whole model or a fused kernel alone, its node count and FLOPs at
the shape -- the ratio of what it measured to what the model guessed, and
the next estimate of the same workload multiplies the model by it::

    compare-pace.json  {machine: {"ort-cpu/basic | 34 nodes | 1.21e+10 FLOP": {"run": 0.61, "prepare": 2.4}, ...}}

A workload not seen here before keeps the model (``FIRST_GUESS``).

The smallest ratio seen is kept, as for the matmul rate: other work on the
machine only ever makes a step slower, and the estimate is for a quiet
machine. Before anything is recorded, ``FIRST_GUESS`` holds the ratios the
model was once found off by here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .machine import update_record

PACE_FILE = "compare-pace.json"
ORACLE = "oracle"          # the float64 reference that checks every session
KEEP = 500                 # workloads kept per machine, the most recently measured
WHATS = ("run", "prepare")
# Ratios of measured to modelled time before any are recorded (the reference
# interpreter runs its float64 numpy 2-4x slower than float32 matmuls)
FIRST_GUESS = {"reference": {"run": 3.0}, ORACLE: {"run": 4.0}}


def pace_key(runner: str, nodes: int, flops: float, *, kernel: bool = False) -> str:
    """What a workload's ratios are kept under: what runs it (``backend/variant``,
    or ``ORACLE``), whether it is a fused kernel timed alone, and its size."""
    return f"{runner}{'/kernel' if kernel else ''} | {nodes} nodes | {flops:.4g} FLOP"


def modelled_run_s(flops: float, rate: float) -> float:
    """A run's time by the FLOP model."""
    return flops / rate


def modelled_prepare_s(session_bytes: int) -> float:
    """A session's preparation by the model: a fixed cost, and its weights copied at ~1 GB/s."""
    return 0.2 + session_bytes / 1e9


@dataclass
class Pace:
    """The measured-to-modelled ratios known on this machine."""

    ratios: dict[str, dict[str, float]] = field(default_factory=dict)

    def factor(self, key: str, what: str) -> float:
        known = self.ratios.get(key, {}).get(what)
        if known is not None:
            return known
        return FIRST_GUESS.get(key.split(" | ")[0].split("/")[0], {}).get(what, 1.0)


def _valid(entry) -> dict[str, dict[str, float]]:
    """The well-formed part of a recorded entry (a hand-edited or half-written file loses the rest)."""
    if not isinstance(entry, dict):
        return {}
    return {k: {w: float(r) for w, r in v.items() if w in WHATS and isinstance(r, (int, float))
                and math.isfinite(r) and r > 0}
            for k, v in entry.items() if isinstance(k, str) and isinstance(v, dict)}


def load_pace() -> Pace:
    """The ratios recorded on this machine (none where the cache cannot be read)."""
    return Pace(_valid(update_record(PACE_FILE, lambda entry: entry, fallback={})))


def record_pace(observed: dict[str, dict[str, float]]) -> Pace:
    """Merge ``observed`` ratios (key -> {"run"/"prepare": ratio}) into this
    machine's record, keeping the smallest of each, and return the result."""
    def merge(entry):
        known = _valid(entry)
        for key, ratios in _valid(observed).items():
            kept = known.pop(key, {})   # and put back last: the most recent are kept
            known[key] = {w: min(r, kept[w]) if w in kept else r for w, r in {**kept, **ratios}.items()}
        return dict(list(known.items())[-KEEP:])
    return Pace(_valid(update_record(PACE_FILE, merge, fallback=_valid(observed))))
