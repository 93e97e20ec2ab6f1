"""The GPU measurement kit in one lent slot: a preflight, then the figures
that matter, in under 5 minutes, into one JSON.

    python bench/gpu_quick.py [--json gpu_quick.json] [--emulate]

1. **Preflight**, which stops the kit at the first failure and says what to
   fix: the CUDA driver runs the toolkit's release (``cuDriverGetVersion`` at
   least the nvcc's major.0: CUDA's minor-version compatibility), nvcc and its
   headers are one CUDA (``toolchain.find_toolkit``), and cuBLASLt of that
   major is there (``toolchain.find_cublas``).
2. **Row kernels**: add+LayerNorm and the causal softmax in float16 at row
   lengths 1K and 4K (``gpu_kernels.row_kernels``: GB/s against the peak).
3. **fp16 attention on the tensor-core path** (``BLOCKC_CUDA_TENSOR_CORES=1``,
   the default on sm_80 and later): its error against the float64 reference
   and its time.
4. **The fp16 gpt2 block** at batch 8, seq 512, timed whole (its GEMMs alone
   and the roofline are ``gpu_kernels.py``'s, which needs 6-9 minutes).

Four builds in all. Every time is the median of samples of 20 back-to-back
runs between two CUDA events (``gpu_kernels.GPU_TIMING``). ``--emulate``
runs the same plan on ``cuda-emu`` at toy sizes (its times mean nothing), so
the kit is known to run before a GPU is lent (tests/codegen/cuda/test_gpu_kit.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpu_kernels  # noqa: E402  (the full kit, beside this file)

import blockc  # noqa: E402  (the checkout's blockc, installed or not)
from blockc.codegen.cuda import toolchain  # noqa: E402
from blockc.compare.kernels import sample_feeds  # noqa: E402
from blockc.compare.machine import gpu_name, gpu_peak_gbps  # noqa: E402
from blockc.runtime.backend import make_backend  # noqa: E402
from blockc.runtime.cuda_runner import driver_version  # noqa: E402

ATTENTION = """graph attention_f16(%q: f16[{b},{h},{s},64], %k: f16[{b},{h},{s},64], %v: f16[{b},{h},{s},64]) {{
  %0:f16[{b},{h},{s},64] = attention %q, %k, %v {{scale=0.125, mask="none", causal=true, fill=-65504.0}}
  return y=%0
}}
"""
PLANS = {   # what each mode measures: row lengths, attention's (batch, heads, seq), the block
    "gpu": {"lengths": (1024, 4096), "working_bytes": 256 << 20, "attention": (8, 12, 512),
            "block": gpu_kernels.GPU_BLOCK, "timing": gpu_kernels.GPU_TIMING},
    "emulate": {"lengths": (256,), "working_bytes": 1 << 16, "attention": (1, 1, 64),
                "block": gpu_kernels.EMULATED_BLOCK,
                "timing": {"warmup": 0, "min_repeats": 2, "min_time_s": 0.0, "runs_per_sample": 2}},
}


def preflight(emulated: bool) -> list[dict]:
    """Each check: {"check", "ok", "detail"}; the first that fails ends the list."""
    checks = []

    def check(name, ok, detail):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})
        return ok
    try:
        toolkit = toolchain.find_toolkit()
    except toolchain.ToolchainError as e:
        check("nvcc and its headers are one CUDA", False, str(e).splitlines()[0])
        return checks
    check("nvcc and its headers are one CUDA", True, f"{toolkit.nvcc}: CUDA {toolkit.release}, headers in {toolkit.include}")
    if not emulated:
        driver = driver_version()
        ok = driver is not None and driver >= (toolkit.version[0], 0)
        shown = "no CUDA driver" if driver is None else "CUDA %d.%d" % driver
        if not check("the driver runs the toolkit's release", ok,
                     f"driver {shown}, toolkit CUDA {toolkit.release}" + ("" if ok else
                     f": install a driver for CUDA {toolkit.version[0]}.0 or later, or the wheels of the "
                     "driver's own CUDA")):
            return checks
    try:
        cublas = toolchain.find_cublas(toolkit)
        check("cuBLASLt", True, f"libcublasLt.so.{cublas.major} in {cublas.lib} ({cublas.where})")
    except toolchain.ToolchainError as e:
        check("cuBLASLt", emulated, str(e).splitlines()[0] + (" (the emulator runs the tiled GEMM)" if emulated else ""))
    return checks


def attention_case(backend, dims: tuple, timing: dict) -> dict:
    """fp16 causal attention on the tensor-core kernel: its largest error against float64, and its time."""
    b, h, s = dims
    graph = blockc.parse_graph(ATTENTION.format(b=b, h=h, s=s))
    feeds = sample_feeds(graph, {}, np.random.default_rng(0))
    before = os.environ.get("BLOCKC_CUDA_TENSOR_CORES")
    os.environ["BLOCKC_CUDA_TENSOR_CORES"] = "1"   # the GPU's default; the emulator's is the SIMT kernel
    try:
        with backend.compile(graph, {}) as compiled:
            got = compiled.run(feeds)["y"].astype(np.float64)
            t = compiled.time(feeds, **timing)
    finally:
        if before is None:
            del os.environ["BLOCKC_CUDA_TENSOR_CORES"]
        else:
            os.environ["BLOCKC_CUDA_TENSOR_CORES"] = before
    ref = blockc.run_reference(graph, {}, feeds, float64=True)["y"]
    return {"shape": [b, h, s, 64], "max_abs_error": float(np.max(np.abs(got - ref))),
            "max_abs_reference": float(np.max(np.abs(ref))), "median_s": t.median_s, "min_s": t.min_s,
            "max_s": t.max_s}


def block_case(backend, name: str, sets: dict, dims: dict, timing: dict) -> dict:
    model = blockc.build_model(name, sets)
    t = gpu_kernels.time_blocks(backend, blockc.optimize(blockc.trace(model)).graph,
                                dict(blockc.init_weights(model)), dims, blocks=1, timing=timing)
    return {"model": name, "set": sets, "dims": dims, **t}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulate", action="store_true", help="cuda-emu at toy sizes, no GPU: its times mean nothing")
    ap.add_argument("--peak-gbps", type=float, default=None, help="the GPU's peak (default: its data sheet's)")
    ap.add_argument("--json", default="gpu_quick.json", help="where the one JSON goes (default gpu_quick.json)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    plan = PLANS["emulate" if args.emulate else "gpu"]
    result = {"schema": "blockc.gpu-quick/1", "emulated": args.emulate, "preflight": preflight(args.emulate)}
    for c in result["preflight"]:
        print(f"preflight: {'ok  ' if c['ok'] else 'FAIL'} {c['check']}: {c['detail']}")
    ok = all(c["ok"] for c in result["preflight"])
    if ok:
        backend = make_backend("cuda-emu" if args.emulate else "cuda")
        device = "cuda-emu (the CPU: times mean nothing)" if args.emulate else gpu_name()[0]
        peak = args.peak_gbps or (None if args.emulate or not device else gpu_peak_gbps(device))
        result.update(device=device, peak_gbps=peak)
        result["row_kernels"] = gpu_kernels.row_kernels(backend, ["float16"], plan["lengths"], plan["working_bytes"],
                                                        peak, 1, plan["timing"])
        result["attention"] = attention_case(backend, plan["attention"], plan["timing"])
        print(f"attention fp16 {result['attention']['shape']}: max |error| {result['attention']['max_abs_error']:.3g}, "
              f"{result['attention']['median_s'] * 1e6:,.1f} us")
        result["block"] = block_case(backend, *plan["block"], plan["timing"])
        print(f"{plan['block'][0]} fp16 at {plan['block'][2]}: {result['block']['median_s'] * 1e6:,.1f} us")
    result["seconds"] = time.perf_counter() - started
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json} ({result['seconds']:.0f} s)")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
