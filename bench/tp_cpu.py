"""Tensor parallelism on this machine's CPU: ``--tp 2`` against ``--tp 1``
on gloo, and the all-reduces' share of a ``--tp 2`` step.

Each rank runs its graph on the PyTorch backend (eager, fused graphs);
``parallel/worker.time_rank`` times the step and, separately, the step's
collectives alone (the same ops on tensors of the same shapes, in order), so
the share is measured, not modelled. This machine has two cores shared with
other jobs, so two ranks compete for them: expect no speedup. The bytes each
rank all-reduces are the communication model's
(``report/communication.py``: ``2·b·s·d`` per block plus the embedding's).

    python bench/tp_cpu.py [--model gpt2] [--set layers=2 vocab=50304] [--batch 1] [--seq 128] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from blockc.frontends import build_model, trace  # noqa: E402
from blockc.passes.shard import shard  # noqa: E402
from blockc.report.communication import collective_bytes  # noqa: E402
from blockc.parallel.launch import Case, time_cases  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--set", nargs="*", default=["layers=2", "vocab=50304"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--json")
    args = p.parse_args()
    overrides = dict(kv.split("=", 1) for kv in args.set)
    model = build_model(args.model, overrides)
    rng = np.random.default_rng(0)
    dims = {"batch": args.batch, "seq": args.seq}
    feeds = {s.name: s.sample(dims, rng) for s in model.inputs()}
    case = Case(args.model, feeds, overrides=overrides, fused=True)
    rows = {tp: time_cases([case], tp)[0] for tp in (1, 2)}
    sent = sum(c.sent for c in collective_bytes(shard(trace(model), 2).graphs[0], dims) if c.op == "all_reduce")
    one, two = rows[1][0], max(rows[2], key=lambda r: r["step_s"])
    result = {"model": args.model, "overrides": overrides, **dims, "tp1_step_ms": one["step_s"] * 1e3,
              "tp2_step_ms": two["step_s"] * 1e3, "tp2_collectives_ms": two["collectives_s"] * 1e3,
              "collectives": two["collectives"], "all_reduce_bytes_per_rank": sent,
              "share": two["collectives_s"] / two["step_s"]}
    print(f"| model | b×s | --tp 1 step | --tp 2 step | collectives alone | share | all-reduced per rank |\n"
          f"| --- | --- | --- | --- | --- | --- | --- |\n"
          f"| {args.model} {' '.join(args.set)} | {args.batch}×{args.seq} | {result['tp1_step_ms']:.1f} ms "
          f"| {result['tp2_step_ms']:.1f} ms | {result['tp2_collectives_ms']:.2f} ms ({result['collectives']}) "
          f"| {result['share']:.0%} | {sent / 1e6:.2f} MB |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
