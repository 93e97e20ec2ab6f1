"""Predicted GPU times from the traffic model, for when no GPU was available.

A memory-bound kernel cannot finish faster than bytes / peak bandwidth. This
prints, for the gpt2 block's fused softmax and add+LayerNorm kernels and for
the whole block in standard and fused form, the bytes the traffic model
counts and the time they would take at the GPU's published peak and at 85%
of it (the issue's target; the best published kernels reach 87-90%). These
are PREDICTIONS from a model, not measurements; the GEMMs are compute-bound
and are given at the dense peak FLOP rate for the same reason.

    python bench/gpu_prediction.py [--gpu H100] [--batch 1,8] [--seq 128,512]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import blockc  # noqa: E402
from blockc.codegen.cuda.lower import legalize_for_cuda  # noqa: E402
from blockc.compare.kernels import first_fused_nodes, kernel_cost  # noqa: E402
from blockc.compare.machine import gpu_peak_gbps  # noqa: E402
from blockc.report.flops import node_flops  # noqa: E402
from blockc.report.traffic import graph_traffic  # noqa: E402

# dense float32-input TF32 tensor-core peaks (TFLOP/s), the GEMMs' ceiling
TF32_TFLOPS = {"H100": 494.0, "H200": 494.0, "A100": 156.0}


def predicted_us(nbytes: int, gbps: float, fraction: float = 1.0) -> float:
    return nbytes / (gbps * 1e9 * fraction) * 1e6


GEMM_OPS = ("matmul", "matmul_bias_act", "attention", "qkv_attention")


def block_time_us(graph, dims, gbps: float, tflops: float) -> float:
    """Each node at the slower of its memory and its compute bound."""
    total = 0.0
    for t in graph_traffic(graph, dims):
        memory = t.total / (gbps * 1e9)
        compute = node_flops(t.node, dims) / (tflops * 1e12) if t.node.op in GEMM_OPS else 0.0
        total += max(memory, compute)
    return total * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seq", default="128,512")
    args = ap.parse_args()
    gbps = gpu_peak_gbps(args.gpu)
    if gbps is None:
        sys.exit(f"no published peak listed for {args.gpu}")
    tflops = next(v for k, v in TF32_TFLOPS.items() if k in args.gpu)
    model = blockc.build_model("gpt2-block")
    standard = blockc.trace(model)
    # What the CUDA backend runs: the fused graph legalized as its lowering does
    # (ops with no kernel family decomposed; attention is one kernel now).
    fused = legalize_for_cuda(blockc.optimize(standard).graph)
    kernels = first_fused_nodes([blockc.optimize(standard, disable=["fuse_attention"]).graph])
    print(f"PREDICTIONS (traffic model, no GPU used): {args.gpu}, {gbps:.0f} GB/s peak, {tflops:.0f} TFLOP/s TF32")
    print(f"command: python {' '.join(sys.argv)}\n")
    print("| shape | kernel / graph | bytes modelled | at 100% of peak (us) | at 85% of peak (us) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for b in (int(x) for x in args.batch.split(",")):
        for s in (int(x) for x in args.seq.split(",")):
            dims = {"batch": b, "seq": s}
            for _, node in kernels:
                if node.op in ("masked_softmax", "add_layernorm"):
                    nbytes, _ = kernel_cost(node, dims)
                    print(f"| b{b} s{s} | {node.op} | {nbytes:,} | {predicted_us(nbytes, gbps):.2f} | "
                          f"{predicted_us(nbytes, gbps, 0.85):.2f} |")
            for name, g in (("block, standard", standard), ("block, fused", fused)):
                us = block_time_us(g, dims, gbps, tflops)
                print(f"| b{b} s{s} | {name} (roofline bound per node) | "
                      f"{sum(t.total for t in graph_traffic(g, dims)):,} | {us:.1f} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
