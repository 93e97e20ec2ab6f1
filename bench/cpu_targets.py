"""The compare issue's ONNX Runtime CPU targets, measured as intervals.

Targets: at every shape, blockc's fused graph is faster than the unfused
(standard) one, and at least as fast as ONNX Runtime's own transformer
optimizer on the same model. `blockc compare` prints one ratio per shape;
this script asks each ratio how sure it is. For every model, shape and ONNX
Runtime level it runs --blocks independent repetitions; each prepares a
fresh session of every contestant (standard, fused, the ORT optimizer's
model, and a second standard session as an A/A control), in shuffled order,
times them in interleaved rounds and closes them. A ratio is the geometric
mean over blocks, with a 95% bootstrap interval (blockc.runtime.timing.
ratio_interval); "faster" or "slower" only when the interval lies wholly on
one side of 1. Fresh sessions per block, because two sessions of the same
graph run persistently up to ~4% apart on this machine. The three ONNX
models are made once (blockc's export, and ONNX Runtime's optimizer on the
unfused one, as `blockc compare`'s peer does); every session is plain ONNX
Runtime with blockc's session options (`ort_runner.session_options`).

    python bench/cpu_targets.py [--models gpt2-block,gpt2:layers=2] [--batch 1,8] [--seq 128,512]
                                [--levels basic,all] [--blocks 12] [--json FILE]

Prints markdown for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import blockc  # noqa: E402  (the checkout's blockc, installed or not)
from blockc.compare.machine import cpu_name  # noqa: E402
from blockc.compare.peers import attention_shape  # noqa: E402
from blockc.frontends.catalog import parse_sets  # noqa: E402
from blockc.runtime.ort_runner import session_options  # noqa: E402
from blockc.runtime.timing import measure_in_blocks, paired_speedup, ratio_interval  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import track  # noqa: E402

PAIRS = (("fused", "standard"), ("fused", "ort-optimizer"), ("standard (A/A)", "standard"))


def parse_model(spec: str):
    """``gpt2:layers=2`` -> ("gpt2", {"layers": "2"})."""
    name, _, sets = spec.partition(":")
    return name, parse_sets([s for s in sets.split(",") if s])


def onnx_models(graphs, weights) -> dict[str, bytes]:
    """The three models, serialized once: blockc's unfused and fused export,
    and ONNX Runtime's transformer optimizer applied to the unfused one (as
    the compare peer does). Each block then only loads them: exporting a
    2-layer GPT-2 and running the optimizer on it anew per block made a
    block of the 2-layer model take minutes."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    from blockc.codegen.onnx_export import export_onnx
    model_type, heads, hidden = attention_shape(graphs["fused"])
    standard = export_onnx(graphs["standard"], weights)
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = optimize_model(standard, model_type=model_type, num_heads=heads, hidden_size=hidden,
                               opt_level=0, use_gpu=False)
    return {"standard": standard.SerializeToString(),
            "fused": export_onnx(graphs["fused"], weights).SerializeToString(),
            "ort-optimizer": optimized.model.SerializeToString()}


def measure_shape(protos, feeds, level, args):
    def fresh(proto):
        def prepare():
            session = onnxruntime.InferenceSession(proto, session_options(level, args.threads),
                                                   providers=["CPUExecutionProvider"])
            inputs = [i.name for i in session.get_inputs()]
            mine = {k: feeds[k] for k in inputs}
            return (lambda: session.run(None, mine)), (lambda: None)   # dropped with the block
        return prepare

    makers = {"standard": fresh(protos["standard"]), "standard (A/A)": fresh(protos["standard"]),
              "fused": fresh(protos["fused"]), "ort-optimizer": fresh(protos["ort-optimizer"])}
    bar = lambda it: track(it, description=f"{level}: blocks of fresh sessions", transient=True,  # noqa: E731
                           console=Console(stderr=True))
    blocks = measure_in_blocks(makers, blocks=args.blocks, rounds=args.rounds,
                               warmup=2, min_time_s=args.min_time, progress=bar)
    ratios = {(a, b): [paired_speedup(blk[b], blk[a]) for blk in blocks] for a, b in PAIRS}
    samples = {n: [x for blk in blocks for x in blk[n].samples] for n in makers}
    return ({pair: ratio_interval(r) for pair, r in ratios.items()},
            {n: statistics.median(s) * 1e3 for n, s in samples.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-block,gpt2:layers=2")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seq", default="128,512")
    ap.add_argument("--levels", default="basic,all")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.4, help="seconds measured per session per block")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the intervals here")
    args = ap.parse_args()

    print(f"onnxruntime {onnxruntime.__version__} CPU, {args.threads} intra-op threads; {cpu_name()}, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"command: python {' '.join(sys.argv)}")
    print(f"{args.blocks} blocks of fresh sessions per row, {args.rounds} interleaved rounds each; ratios are "
          "geometric means over blocks with 95% bootstrap intervals\n")
    records = []
    for spec in args.models.split(","):
        name, sets = parse_model(spec)
        model = blockc.build_model(name, sets)
        traced = blockc.trace(model)
        graphs = {"standard": traced, "fused": blockc.optimize(traced).graph}
        weights = dict(blockc.init_weights(model, seed=0))
        protos = onnx_models(graphs, weights)
        print(f"### {spec}\n")
        print("| shape | ORT level | standard ms | fused ms | ORT optimizer ms | fused vs standard | "
              "fused vs ORT optimizer | A/A control |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for batch in map(int, args.batch.split(",")):
            for seq in map(int, args.seq.split(",")):
                rng = np.random.default_rng(0)
                feeds = {s.name: s.sample({"batch": batch, "seq": seq}, rng) for s in model.inputs()}
                for level in args.levels.split(","):
                    iv, ms = measure_shape(protos, feeds, level, args)

                    def cell(pair):
                        i = iv[pair]
                        return f"{i.ratio:.3f}x [{i.low:.3f}–{i.high:.3f}] {i.verdict}"
                    print(f"| b{batch} s{seq} | {level} | {ms['standard']:.2f} | {ms['fused']:.2f} | "
                          f"{ms['ort-optimizer']:.2f} | {cell(PAIRS[0])} | {cell(PAIRS[1])} | {cell(PAIRS[2])} |",
                          flush=True)
                    records.append({"model": spec, "batch": batch, "seq": seq, "level": level, "median_ms": ms,
                                    "ratios": {f"{a} vs {b}": vars(iv[(a, b)]) for a, b in PAIRS}})
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "blocks": args.blocks, "rows": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
