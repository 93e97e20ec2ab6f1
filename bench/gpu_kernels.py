"""The GPU measurement kit: the first thing to run when a GPU is at hand.

It measures the two GPU targets of docs/PERFORMANCE.md on blockc's generated
CUDA, every time taken by CUDA events in the model's child process
(``Compiled.time``: the one timing loop, on the device's clock, each sample
20 back-to-back runs between two events):

1. **Row kernels at the memory roofline.** The fused add+LayerNorm and the
   causal masked softmax, each a one-node graph with a symbolic row length
   (the launcher picks its tier at run time, as for a model's softmax), at
   row lengths 256 to 16K, in float32, float16 and bfloat16, over a working
   set of ``--working-set-mb`` (default 512 MB: ten times an H100's 50 MB L2,
   so no run is served from cache). Achieved GB/s is the traffic model's
   bytes (``report.traffic``: what an ideal kernel must move) over the median
   time; the target is 90% of the GPU's published peak at every length of 1K
   and more.
2. **The block against its roofline.** ``gpt2-block`` at batch 8, seq 512,
   float16, timed whole; each of its GEMM launches (a GEMM with its epilogue,
   ``lower.kernel_steps``) cut out and timed alone on cuBLASLt; every other
   launch at its bytes at peak bandwidth. The target: the block within 15%
   of that sum.

Each figure is the median over ``--blocks`` freshly compiled sessions of
each one's median run, with the range of the blocks beside it.

    python bench/gpu_kernels.py [--json FILE] [--dtypes float32,float16,bfloat16] [--blocks 3]

Without a GPU, ``--emulate`` runs the same plan on ``cuda-emu`` at toy sizes:
its times mean nothing (the emulator runs on the CPU), and it exists so the
kit is known to run before a GPU is lent (tests/codegen/cuda/test_gpu_kit.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import blockc  # noqa: E402  (the checkout's blockc, installed or not)
from blockc.codegen.cuda.dtypes import CUDA_DTYPES  # noqa: E402
from blockc.codegen.cuda.kernels import family_of  # noqa: E402
from blockc.codegen.cuda.kernels.gemm import GEMM  # noqa: E402
from blockc.codegen.cuda.lower import kernel_steps  # noqa: E402
from blockc.compare.kernels import isolate_nodes, sample_feeds  # noqa: E402
from blockc.compare.machine import gpu_name, gpu_peak_gbps  # noqa: E402
from blockc.errors import BlockcError  # noqa: E402
from blockc.report.traffic import node_traffic, step_traffic  # noqa: E402
from blockc.runtime.backend import make_backend  # noqa: E402

ROW_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
TARGET_FRACTION = 0.90     # of peak bandwidth, at row lengths >= TARGET_FROM
TARGET_FROM = 1024
BLOCK_SLACK = 1.15         # the block's time over its roofline, at most
# On a GPU each sample is 20 back-to-back runs between two events: an event
# around each run alone adds 3-10 us of host time to it (timing.measure).
GPU_TIMING = {"warmup": 5, "min_repeats": 50, "min_time_s": 0.5, "runs_per_sample": 20}
# The block both kits time: (model, its settings, dims) on a GPU, and the toy
# one --emulate runs. One toy block for both kits, so the emulated quick kit
# finds the full kit's build of it in the cache (tests/codegen/cuda/test_gpu_kit.py).
GPU_BLOCK = ("gpt2-block", {"dtype": "float16"}, {"batch": 8, "seq": 512})
EMULATED_BLOCK = ("gpt2-block", {"d_model": "64", "heads": "2", "dtype": "float16"}, {"batch": 1, "seq": 16})

# Each row kernel as blockc's IR text: symbolic rows and row length `n`.
# The softmax is causal from the bottom right over `q` rows of `n` keys each.
ROW_GRAPHS = {
    "add_layernorm": """graph add_layernorm(%x: {t}[rows,n], %r: {t}[rows,n]) {{
  param @g: {t}[n]
  param @b: {t}[n]
  %0:{t}[rows,n], %1:{t}[rows,n] = add_layernorm %x, %r, @g, @b {{eps=1e-05, with_sum=true}}
  return y=%0, sum=%1
}}
""",
    "masked_softmax": """graph masked_softmax(%s: {t}[rows,q,n]) {{
  %0:{t}[rows,q,n] = masked_softmax %s {{scale=0.125, mask="none", causal=true, fill={fill}}}
  return y=%0
}}
""",
}
# The dtypes both row kernels generate, by the name --dtypes takes, in the CUDA table's order.
ROW_DTYPES = {d.name: d for d in CUDA_DTYPES if all(d in family_of(op).dtypes for op in ROW_GRAPHS)}


def row_case(op: str, dtype: str, n: int, working_bytes: int) -> tuple:
    """(graph, dims, weights) of one row kernel at row length ``n``, its rows
    enough for ``working_bytes`` read and written."""
    # The causal fill is what a traced model's attention writes: the dtype's lowest value (frontends/layers.py).
    t = ROW_DTYPES[dtype]
    graph = blockc.parse_graph(ROW_GRAPHS[op].format(t=t, fill=t.lowest))
    itemsize = np.dtype(graph.inputs[0].dtype.numpy).itemsize
    if op == "add_layernorm":
        per_row = 4 * n * itemsize                     # x and r read, y and the sum written
        dims = {"rows": max(1, working_bytes // per_row), "n": n}
    else:
        q = min(n, 512)
        per_matrix = 2 * q * n * itemsize              # about: the causal rows read (most of n), all written
        dims = {"rows": max(1, working_bytes // per_matrix), "q": q, "n": n}
    weights = {name: np.ones([dims[str(d)] if not isinstance(d, int) else d for d in v.shape], v.dtype.numpy)
               for name, v in graph.params.items()}
    return graph, dims, weights


def time_blocks(backend, graph, weights, dims, *, blocks: int, timing: dict) -> dict:
    """Median seconds per run over ``blocks`` freshly compiled sessions."""
    feeds = sample_feeds(graph, dims, np.random.default_rng(0))
    medians = []
    for _ in range(blocks):
        with backend.compile(graph, weights) as compiled:
            medians.append(compiled.time(feeds, **timing).median_s)
    return {"median_s": statistics.median(medians), "min_s": min(medians), "max_s": max(medians),
            "blocks": blocks}


def row_kernels(backend, dtypes, lengths, working_bytes, peak, blocks, timing) -> list[dict]:
    rows = []
    for op in ROW_GRAPHS:
        for dtype in dtypes:
            for n in lengths:
                graph, dims, weights = row_case(op, dtype, n, working_bytes)
                nbytes = node_traffic(graph.nodes[-1], dims).total
                t = time_blocks(backend, graph, weights, dims, blocks=blocks, timing=timing)
                gbps = nbytes / t["median_s"] / 1e9
                row = {"op": op, "dtype": dtype, "row_length": n, "dims": dims, "bytes": nbytes, **t,
                       "gbps": gbps, "fraction_of_peak": gbps / peak if peak else None}
                if peak and n >= TARGET_FROM:
                    row["target_met"] = gbps >= TARGET_FRACTION * peak
                rows.append(row)
                print(_row_line(row), flush=True)
    return rows


def _row_line(r: dict) -> str:
    frac = "n/a" if r["fraction_of_peak"] is None else f"{100 * r['fraction_of_peak']:.1f}%"
    met = {True: "met", False: "NOT met"}.get(r.get("target_met"), "-")
    return (f"| {r['op']} | {r['dtype']} | {r['row_length']} | {r['bytes'] / 1e6:,.1f} | "
            f"{r['median_s'] * 1e6:,.1f} [{r['min_s'] * 1e6:,.1f}-{r['max_s'] * 1e6:,.1f}] | "
            f"{r['gbps']:,.1f} | {frac} | {met} |")


def block_roofline(backend, name, sets, dims, peak, blocks, timing) -> dict:
    """The block timed whole, its GEMM launches alone, and the roofline."""
    model = blockc.build_model(name, sets)
    weights = dict(blockc.init_weights(model))
    fused = blockc.optimize(blockc.trace(model)).graph
    whole = time_blocks(backend, fused, weights, dims, blocks=blocks, timing=timing)
    graph, steps = kernel_steps(fused, weights)
    params = {v.name: weights.get(v.name) for v in graph.params.values()}
    launches, roofline = [], 0.0
    for k, nodes in enumerate(steps):
        traffic = step_traffic(graph, nodes, dims)
        if family_of(nodes[0].op) is GEMM:
            alone = isolate_nodes(nodes, f"{name}_gemm{k}", tuple(v for _, v in graph.outputs))
            own = {p: params[p] for p in alone.params}
            t = time_blocks(backend, alone, own, dims, blocks=blocks, timing=timing)["median_s"]
            how = "measured alone"
        else:
            t = traffic.total / (peak * 1e9) if peak else None
            how = "bytes at peak"
        roofline = None if roofline is None or t is None else roofline + t   # no peak: no roofline
        launches.append({"nodes": [n.op for n in nodes], "bytes": traffic.total, "seconds": t, "how": how})
    ratio = whole["median_s"] / roofline if roofline else None
    return {"model": name, "set": sets, "dims": dims, "block": whole, "launches": launches,
            "roofline_s": roofline, "ratio": ratio,
            "target_met": None if ratio is None else ratio <= BLOCK_SLACK}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulate", action="store_true",
                    help="cuda-emu at toy sizes, no GPU: proves the kit runs; its times mean nothing")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--lengths", default=",".join(map(str, ROW_LENGTHS)), help="row lengths to sweep")
    ap.add_argument("--working-set-mb", type=float, default=512.0)
    ap.add_argument("--blocks", type=int, default=3, help="freshly compiled sessions per figure")
    ap.add_argument("--peak-gbps", type=float, default=None, help="the GPU's peak (default: its data sheet's)")
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args(argv)

    dtypes = [d for d in args.dtypes.split(",") if d]
    bad = [d for d in dtypes if d not in ROW_DTYPES]
    if bad:
        ap.error(f"--dtypes: {', '.join(bad)} (choose from {', '.join(ROW_DTYPES)})")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.emulate:
        backend = make_backend("cuda-emu")
        device, peak = "cuda-emu (the CPU: times mean nothing)", args.peak_gbps
        timing = {"warmup": 0, "min_repeats": 2, "min_time_s": 0.0}
        block = EMULATED_BLOCK
    else:
        backend = make_backend("cuda")
        try:
            backend.require()
        except BlockcError as e:   # no GPU here: say so plainly, and what runs instead
            print(f"gpu_kernels: error: {e} (--emulate runs the kit on the CPU)", file=sys.stderr)
            return 2
        device, why = gpu_name()
        peak = args.peak_gbps or (gpu_peak_gbps(device) if device else None)
        if peak is None:
            print(f"no published peak for {device or why}: give --peak-gbps", file=sys.stderr)
        timing = GPU_TIMING
        block = GPU_BLOCK

    print(f"device: {device}; peak {peak or 'unknown'} GB/s; command: python {' '.join(sys.argv)}\n")
    print("| kernel | dtype | row length | MB moved | us, median [blocks' range] | GB/s | of peak | "
          f"target ({TARGET_FRACTION:.0%} from {TARGET_FROM}) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    rows = row_kernels(backend, dtypes, lengths, int(args.working_set_mb * 1e6), peak, args.blocks, timing)
    result = block_roofline(backend, *block, peak, args.blocks, timing)
    us = lambda s: "unknown (no peak)" if s is None else f"{s * 1e6:,.1f} us"   # noqa: E731
    print(f"\n{result['model']} {result['set']} at {result['dims']}: "
          f"{result['block']['median_s'] * 1e6:,.1f} us [{result['block']['min_s'] * 1e6:,.1f}-"
          f"{result['block']['max_s'] * 1e6:,.1f}] against a roofline of {us(result['roofline_s'])}")
    for launch in result["launches"]:
        print(f"  {'+'.join(launch['nodes'])}: {launch['bytes'] / 1e6:,.1f} MB, {us(launch['seconds'])} "
              f"({launch['how']})")
    if result["ratio"] is not None:
        print(f"block / roofline = {result['ratio']:.3f} (target <= {BLOCK_SLACK}): "
              f"{'met' if result['target_met'] else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "peak_gbps": peak, "emulated": args.emulate, "row_kernels": rows,
                       "block": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
