"""Predicted GPU times from the traffic model, for when no GPU was available.

A memory-bound kernel cannot finish faster than bytes / peak bandwidth. This
prints, for the gpt2 block's fused softmax and add+LayerNorm kernels and for
the whole block in standard and fused form, the bytes the traffic model
counts and the time they would take at the GPU's published peak and at 90%
of it (the issue's target for the row kernels). These are PREDICTIONS from a
model, not measurements; the GEMMs (and attention) are given at the slower
of their bytes at peak bandwidth and their FLOPs at the dense tensor-core
peak of the dtype (TF32 for float32, which blockc uses only with --tf32).

    python bench/gpu_prediction.py [--gpu H100] [--dtype float32] [--batch 1,8] [--seq 128,512]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import blockc  # noqa: E402
from blockc.codegen.cuda.lower import kernel_steps  # noqa: E402
from blockc.compare.kernels import first_fused_nodes, kernel_cost  # noqa: E402
from blockc.compare.machine import gpu_peak_gbps  # noqa: E402
from blockc.report.flops import node_flops  # noqa: E402
from blockc.report.traffic import graph_traffic, step_traffic  # noqa: E402

# dense tensor-core peaks (TFLOP/s) by input type, the GEMMs' ceiling: TF32 for
# float32, float16/bfloat16 with float32 accumulation (data sheets, SXM parts)
DENSE_TFLOPS = {"float32": {"H100": 494.0, "H200": 494.0, "A100": 156.0},
                "float16": {"H100": 989.0, "H200": 989.0, "A100": 312.0},
                "bfloat16": {"H100": 989.0, "H200": 989.0, "A100": 312.0}}


def predicted_us(nbytes: int, gbps: float, fraction: float = 1.0) -> float:
    return nbytes / (gbps * 1e9 * fraction) * 1e6


GEMM_OPS = ("matmul", "matmul_bias_act", "attention", "qkv_attention")


def bound_us(traffic, dims, gbps: float, tflops: float) -> float:
    """One kernel at the slower of its memory and (for a GEMM or attention) its compute bound."""
    memory = traffic.total / (gbps * 1e9)
    compute = node_flops(traffic.node, dims) / (tflops * 1e12) if traffic.node.op in GEMM_OPS else 0.0
    return max(memory, compute) * 1e6


def block_rows(standard, fused_steps, dims, gbps, tflops):
    """(name, bytes, us) of the standard block node by node, and of the fused
    block kernel by kernel as the CUDA backend launches it (views folded into
    attention's strides, epilogues inside their GEMMs)."""
    rows = []
    for name, traffics in (("block, standard (per node)", graph_traffic(standard, dims)),
                           ("block, fused (per CUDA kernel)", [step_traffic(fused_steps[0], nodes, dims)
                                                               for nodes in fused_steps[1]])):
        rows.append((name, sum(t.total for t in traffics), sum(bound_us(t, dims, gbps, tflops) for t in traffics)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seq", default="128,512")
    ap.add_argument("--dtype", default="float32", choices=sorted(DENSE_TFLOPS))
    args = ap.parse_args()
    gbps = gpu_peak_gbps(args.gpu)
    if gbps is None:
        sys.exit(f"no published peak listed for {args.gpu}")
    tflops = next(v for k, v in DENSE_TFLOPS[args.dtype].items() if k in args.gpu)
    model = blockc.build_model("gpt2-block", {"dtype": args.dtype})
    standard = blockc.trace(model)
    # What the CUDA backend runs: its launch steps, each the nodes one kernel computes.
    fused = kernel_steps(blockc.optimize(standard).graph, blockc.init_weights(model))
    kernels = first_fused_nodes([blockc.optimize(standard, disable=["fuse_attention"]).graph])
    print(f"PREDICTIONS (traffic model, no GPU used): {args.gpu}, {args.dtype}, {gbps:.0f} GB/s peak, "
          f"{tflops:.0f} TFLOP/s dense")
    print(f"command: python {' '.join(sys.argv)}\n")
    print("| shape | kernel / graph | bytes modelled | at 100% of peak (us) | at 90% of peak (us) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for b in (int(x) for x in args.batch.split(",")):
        for s in (int(x) for x in args.seq.split(",")):
            dims = {"batch": b, "seq": s}
            for _, node in kernels:
                if node.op in ("masked_softmax", "add_layernorm"):
                    nbytes, _ = kernel_cost(node, dims)
                    print(f"| b{b} s{s} | {node.op} | {nbytes:,} | {predicted_us(nbytes, gbps):.2f} | "
                          f"{predicted_us(nbytes, gbps, 0.90):.2f} |")
            for name, nbytes, us in block_rows(standard, fused, dims, gbps, tflops):
                print(f"| b{b} s{s} | {name}, roofline | {nbytes:,} | {us:.1f} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
