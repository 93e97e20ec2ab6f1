"""Fused against unfused on ONNX Runtime (CPU), per fusion and all together.

The issue-3 target: a fused graph that ONNX Runtime runs is never slower
than the unfused one on the gpt2 block at batch 4, seq 128. Every variant
runs at ONNX Runtime's *basic* optimization level (so the fusions measured are
blockc's, not ORT's own) with 2 intra-op threads, in interleaved rounds.

    python bench/fusion_speed.py [--batch 4] [--seq 128] [--model gpt2-block] [--rounds 5]

Prints a markdown table for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
import onnxruntime

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import blockc  # noqa: E402  (the checkout's blockc, installed or not)
from blockc.passes.pipeline import FUSIONS  # noqa: E402
from blockc.runtime.ort_runner import OrtSession  # noqa: E402
from blockc.runtime.timing import measure  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-block")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median of round medians")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds measured per variant per round")
    args = ap.parse_args()

    from blockc.frontends.catalog import parse_sets
    model = blockc.build_model(args.model, parse_sets(args.set))
    graph = blockc.trace(model)
    weights = dict(blockc.init_weights(model, seed=0))
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": args.batch, "seq": args.seq}, rng) for s in model.inputs()}
    oracle = blockc.run_reference(graph, weights, feeds)

    variants = [("unfused (standard)", graph, "auto"), ("decomposed", blockc.to_form(graph, "decomposed"), "auto")]
    for f in FUSIONS:
        variants.append((f"only {f}", blockc.optimize(graph, disable=[x for x in FUSIONS if x != f]).graph, "auto"))
    fused = blockc.optimize(graph).graph
    for form in ("auto", "function", "contrib", "onnx23"):
        variants.append((f"all fusions, --fused-as {form}", fused, form))

    sessions = []
    for name, g, form in variants:
        s = OrtSession(g, weights, optimization="basic", threads=args.threads, fused_as=form)
        out = s.run(feeds)
        err = max(float(np.max(np.abs(out[k].astype(np.float64) - oracle[k]))) for k in oracle)
        sessions.append((name, g, s, err, []))
    for _ in range(args.rounds):
        for name, g, s, err, times in sessions:
            times.append(measure(lambda: s.run(feeds), warmup=2, min_repeats=5, min_time_s=args.min_time).median_s)

    base = statistics.median(sessions[0][4])
    print(f"{args.model} {' '.join(args.set)}, batch {args.batch}, seq {args.seq}; onnxruntime "
          f"{onnxruntime.__version__} CPU, basic optimization level, {args.threads} intra-op threads; "
          f"{platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d')}")
    print(f"command: python {' '.join(sys.argv)}\n")
    print("| variant | IR nodes | median ms | vs unfused | max abs err vs float64 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    worst = 0.0
    for name, g, s, err, times in sessions:
        ms = statistics.median(times) * 1e3
        ratio = base / statistics.median(times)
        if name.startswith(("only", "all")):
            worst = max(worst, statistics.median(times) / base)
        print(f"| {name} | {len(g.nodes)} | {ms:.3f} | {ratio:.2f}x | {err:.2e} |")
    print(f"\nslowest fused variant / unfused: {worst:.3f}" + ("  (target met: never slower)" if worst <= 1.0
                                                           else "  (TARGET MISSED: a fused variant is slower)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
