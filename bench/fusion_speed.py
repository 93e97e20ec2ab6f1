"""Fused against unfused on ONNX Runtime (CPU), per fusion and all together.

The issue-3 target: a fused graph that ONNX Runtime runs is never slower
than the unfused one on the gpt2 block at batch 4, seq 128. Every variant
runs at ONNX Runtime's *basic* optimization level (so the fusions measured are
blockc's, not ORT's own) with 2 intra-op threads, in interleaved rounds;
each speedup is the median over rounds of that round's ratio to the unfused
graph, and a second session of the unfused graph (an A/A control) shows how
far such a ratio strays from 1 by chance on this machine today.

    python bench/fusion_speed.py [--batch 4] [--seq 128] [--model gpt2-block] [--rounds 5]

Prints a markdown table for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import blockc  # noqa: E402  (the checkout's blockc, installed or not)
from blockc.passes.pipeline import FUSIONS  # noqa: E402
from blockc.runtime.ort_runner import OrtSession  # noqa: E402
from blockc.compare.machine import cpu_name  # noqa: E402
from blockc.runtime.timing import Interleaved, measure_interleaved, paired_speedup  # noqa: E402


def pooled(parts: list[Interleaved]) -> Interleaved:
    """Several sessions of one variant as one contestant: samples pooled,
    each round's median taken over all its sessions' samples in that round."""
    rounds = len(parts[0].round_medians)
    return Interleaved([x for p in parts for x in p.samples],
                       [statistics.median(p.round_medians[r] for p in parts) for r in range(rounds)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-block")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds; ratios are paired round by round")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds measured per session per round")
    ap.add_argument("--sessions", type=int, default=3, help="ONNX Runtime sessions per variant, pooled")
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

    # Each variant gets --sessions sessions, created round-robin, and its time is
    # pooled over them: two sessions of the *same* graph differ persistently by
    # up to ~4% here (where the weights and packed GEMM panels land in memory),
    # more than some fusions change. A second set of unfused sessions (the A/A
    # control) shows how far a ratio strays from 1 by chance on this machine.
    variants.append(("unfused again (A/A control)", graph, "auto"))
    sessions: dict[str, list] = {name: [] for name, _, _ in variants}
    errors = {}
    for _ in range(args.sessions):
        for name, g, form in variants:
            s = OrtSession(g, weights, optimization="basic", threads=args.threads, fused_as=form)
            out = s.run(feeds)
            errors[name] = max(float(np.max(np.abs(out[k].astype(np.float64) - oracle[k]))) for k in oracle)
            sessions[name].append(s)
    fns = {f"{name}#{i}": (lambda s=s: s.run(feeds)) for name, ss in sessions.items() for i, s in enumerate(ss)}
    raw = measure_interleaved(fns, rounds=args.rounds, warmup=3, min_repeats=3 * args.rounds,
                              min_time_s=args.min_time * args.rounds)
    times = {name: pooled([raw[f"{name}#{i}"] for i in range(args.sessions)]) for name in sessions}
    base = times["unfused (standard)"]
    noise = abs(1 - paired_speedup(base, times["unfused again (A/A control)"]))
    nodes = {name: len(g.nodes) for name, g, _ in variants}

    print(f"{' '.join([args.model, *args.set])}, batch {args.batch}, seq {args.seq}; onnxruntime "
          f"{onnxruntime.__version__} CPU, basic optimization level, {args.threads} intra-op threads; "
          f"{cpu_name()}, {time.strftime('%Y-%m-%d')}")
    print(f"command: python {' '.join(sys.argv)}")
    print(f"{args.sessions} sessions per variant, {args.rounds} interleaved rounds of >= {args.min_time} s per "
          f"session; speedups are the median over rounds of the per-round ratio to the unfused graph\n")
    print("| variant | IR nodes | median ms | vs unfused | max abs err vs float64 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    worst = None
    for name, t in times.items():
        ratio = paired_speedup(base, t)
        if name.startswith(("only", "all")):
            worst = ratio if worst is None else min(worst, ratio)
        print(f"| {name} | {nodes[name]} | {t.timing.median_s * 1e3:.3f} | {ratio:.3f}x | {errors[name]:.2e} |")
    verdict = ("met: none slower" if worst >= 1.0 else
               f"met within noise: slowest {1 - worst:.1%} behind, A/A noise {noise:.1%}" if 1 - worst <= noise else
               "MISSED: a fused variant is slower than the noise floor")
    print(f"\nslowest fused variant: {worst:.3f}x of unfused; A/A control {1 - noise:.3f}x..{1 + noise:.3f}x; "
          f"target (never slower): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
