"""Tensor parallelism on this machine's CPU: ``--tp 2`` against ``--tp 1``
on gloo, and the all-reduces' share of a ``--tp 2`` step.

It runs ``blockc compare --tp 2``'s measurement (``compare/tensor_parallel.py``:
blocks of fresh sessions, a 95% interval on the ratio, an A/A control, the
split outputs checked against one rank's) and prints its fused rows. Each rank runs its graph on the PyTorch backend
(eager); ``parallel/worker.time_rank`` times the step and, separately, the step's
collectives alone (the same ops on tensors of the same shapes, in order), so
the share is measured, not modelled. This machine has two cores shared with
other jobs, so two ranks compete for them: expect no speedup. The bytes each
rank all-reduces are the communication model's
(``report/communication.py``: ``2·b·s·d`` per block plus the embedding's).

    python bench/tp_cpu.py [--model gpt2] [--set layers=2 vocab=50304] [--batch 1] [--seq 128] [--blocks 5]
                           [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from blockc.compare.table import with_interval  # noqa: E402
from blockc.compare.tensor_parallel import compare_tp  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--set", nargs="*", default=["layers=2", "vocab=50304"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()
    overrides = dict(kv.split("=", 1) for kv in args.set)
    # what ``blockc compare --tp 2`` measures; the table is its fused rows
    report = compare_tp(args.model, 2, overrides=overrides, batch=args.batch, seq=args.seq, blocks=args.blocks)
    if not report["outputs_ok"]:
        print(f"the split outputs are not one rank's: {report['outputs']}", file=sys.stderr)
        return 1
    rows = {(r["form"], r["tp"]): r for r in report["results"]}
    verdict = next(v for v in report["verdicts"] if v["form"] == "fused")
    ratio, aa = verdict["split"], verdict["aa"]
    one, two, sent = rows["fused", 1], rows["fused", 2], report["all_reduce_bytes_per_rank"]
    result = {"model": args.model, "overrides": overrides, **report["shape"], "tp1_step_ms": one["step_ms"],
              "tp2_step_ms": two["step_ms"], "tp2_collectives_ms": two["collectives_ms"],
              "collectives": two["collectives"], "all_reduce_bytes_per_rank": sent, "share": two["share"],
              "compare": report}
    print(f"| model | b×s | --tp 1 step | --tp 2 step | 2 vs 1 [95%] | A/A [95%] | collectives alone | share "
          f"| all-reduced per rank |\n"
          f"| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
          f"| {args.model} {' '.join(args.set)} | {args.batch}×{args.seq} | {result['tp1_step_ms']:.1f} ms "
          f"| {result['tp2_step_ms']:.1f} ms | {with_interval(ratio)} "
          f"| {with_interval(aa)} "
          f"| {result['tp2_collectives_ms']:.2f} ms ({result['collectives']}) "
          f"| {result['share']:.0%} | {sent / 1e6:.2f} MB |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
