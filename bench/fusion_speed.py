"""Fused against unfused on ONNX Runtime (CPU), per fusion and all together.

The issue-3 target: a fused graph that ONNX Runtime runs is never slower
than the unfused one on the gpt2 block at batch 4, seq 128. Every variant
runs at ONNX Runtime's *basic* optimization level (so the fusions measured are
blockc's, not ORT's own) with 2 intra-op threads. The run is --blocks
independent repetitions, each with a fresh session per variant timed in
interleaved rounds; a variant's speedup is the geometric mean over blocks of
its ratio to that block's unfused session, with a 95% bootstrap interval, and
a second unfused session per block (an A/A control) shows the method on a
pair known to be equal. A verdict is "faster" or "slower" only when the
whole interval lies on one side of 1.

    python bench/fusion_speed.py [--batch 4] [--seq 128] [--model gpt2-block] [--blocks 24]

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
from blockc.runtime.backend import make_backend  # noqa: E402
from blockc.compare.machine import cpu_name  # noqa: E402
from blockc.runtime.timing import measure_in_blocks, paired_speedup, ratio_interval  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import track  # noqa: E402


# A fusion that rewrites what others made is measured with them.
BUILDS_ON = {"fuse_qkv_attention": ("fuse_qkv", "fuse_attention")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-block")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=24,
                    help="independent repetitions, each with fresh sessions; the interval is over these")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per block; paired round by round")
    ap.add_argument("--min-time", type=float, default=0.4, help="seconds measured per session per block")
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
        keep = {f, *BUILDS_ON.get(f, ())}
        label = f"only {f}" + (f" (with {', '.join(BUILDS_ON[f])})" if f in BUILDS_ON else "")
        variants.append((label, blockc.optimize(graph, disable=[x for x in FUSIONS if x not in keep]).graph, "auto"))
    fused = blockc.optimize(graph).graph
    for form in ("auto", "function", "contrib", "onnx23"):
        variants.append((f"all fusions, --fused-as {form}", fused, form))

    # Each repetition ("block") creates one fresh session per variant, times
    # them in interleaved rounds and takes each variant's ratio to the unfused
    # session of that block; then the sessions go (runtime.timing.
    # measure_in_blocks: two sessions of the *same* graph run persistently up
    # to ~4% apart here, more than most fusions change, so only new sessions
    # average that out). A second unfused session per block (the A/A control)
    # shows the method on a pair known to be equal.
    variants.append(("unfused again (A/A control)", graph, "auto"))
    def compile(g, form):   # blockc's ONNX Runtime CPU backend at the basic level
        return make_backend("ort-cpu", fused_as=form).compile(g, weights, variant="basic", threads=args.threads)

    errors = {}
    for name, g, form in variants:
        with compile(g, form) as c:
            out = c.run(feeds)
        errors[name] = max(float(np.max(np.abs(out[k].astype(np.float64) - oracle[k]))) for k in oracle)

    def maker(g, form):
        def make():
            c = compile(g, form)
            return c.runner(feeds), c.close   # feeds checked once, not inside the timing
        return make

    bar = lambda it: track(it, description="blocks of fresh sessions", transient=True,  # noqa: E731
                           console=Console(stderr=True))
    blocks = measure_in_blocks({name: maker(g, form) for name, g, form in variants}, blocks=args.blocks,
                               rounds=args.rounds, min_time_s=args.min_time, progress=bar)
    ratios = {n: [paired_speedup(b["unfused (standard)"], b[n]) for b in blocks] for n, _, _ in variants}
    samples = {n: [x for b in blocks for x in b[n].samples] for n, _, _ in variants}
    intervals = {n: ratio_interval(r) for n, r in ratios.items()}
    nodes = {name: len(g.nodes) for name, g, _ in variants}

    print(f"{' '.join([args.model, *args.set])}, batch {args.batch}, seq {args.seq}; onnxruntime "
          f"{onnxruntime.__version__} CPU, basic optimization level, {args.threads} intra-op threads; "
          f"{cpu_name()}, {time.strftime('%Y-%m-%d')}")
    print(f"command: python {' '.join(sys.argv)}")
    print(f"{args.blocks} blocks of fresh sessions (one per variant, created in shuffled order), each timed in "
          f"{args.rounds} interleaved rounds of >= {args.min_time / args.rounds:.2f} s per session; a variant's "
          "ratio is the geometric mean over blocks of its ratio to that block's unfused session, with a 95% "
          "bootstrap interval over blocks\n")
    print("| variant | IR nodes | median ms | vs unfused | 95% interval | verdict | max abs err vs float64 |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for name, iv in intervals.items():
        med = statistics.median(samples[name]) * 1e3
        verdict = "(baseline)" if name == "unfused (standard)" else iv.verdict
        print(f"| {name} | {nodes[name]} | {med:.3f} | {iv.ratio:.3f}x | {iv.low:.3f}-{iv.high:.3f} | "
              f"{verdict} | {errors[name]:.2e} |")
    default = intervals["all fusions, --fused-as auto"]
    slower = [n for n, iv in intervals.items() if n.startswith(("only", "all")) and iv.verdict == "slower"]
    print(f"\ndefault fused graph (--fused-as auto): {default}: {default.verdict}; "
          f"A/A control {intervals['unfused again (A/A control)']}")
    print("fused variants measurably slower than unfused: " + (", ".join(slower) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
