"""Running generated CUDA: emulated on the CPU (``cuda-emu``) or on a GPU (``cuda``).

Builds are cached under ``~/.cache/blockc`` (``$BLOCKC_CACHE``) by a hash of
the generated source and the build flags. Either way the library runs in a
child process with a timeout, so a crash or an emulator abort becomes a
``BlockcError`` carrying the message, never a dead test run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

from ..codegen.cuda import build as cuda_build
from ..codegen.cuda.lower import CudaModel, generate
from ..errors import BlockcError
from ..ir.dims import evaluate
from ..ir.graph import Graph
from .bindings import bind_inputs


def _built(model: CudaModel, tag: str, flags: tuple) -> tuple[Path, Path]:
    key = cuda_build.source_hash(model, tag, *flags)
    out = Path(cuda_build.cache_dir()) / f"{model.graph.name[:32].replace('/', '_')}-{tag}-{key}"
    return out, out / f"libblockc_model_{tag}.so"


def emulated_library(model: CudaModel, *, sanitize: str | None = None) -> tuple[Path, Path]:
    """(build dir, library) for the emulated build, compiled unless cached."""
    from ..codegen.cuda import toolchain
    tag = f"emu-{sanitize or 'fibers'}"
    out, so = _built(model, tag, ())
    if not so.exists():
        cuda_build.write_build(model, str(out))
        toolchain.compile_emulated([str(out / "model.cu")], so, sanitize=sanitize,
                                   extra_flags=["-DBLOCKC_EMULATE", f"-I{out}"])
    return out, so


def gpu_library(model: CudaModel, *, archs=("sm_80", "sm_90"), gemm: str = "tiled") -> tuple[Path, Path]:
    from ..codegen.cuda import toolchain
    found = toolchain.find_nvcc()
    if found.path is None:
        raise BlockcError(f"no nvcc: {found.reason}")
    out, so = _built(model, "gpu", (gemm, *archs))
    if not so.exists():
        cuda_build.write_build(model, str(out), archs=archs, gemm=gemm)
        cmd = cuda_build.nvcc_command(found.path, archs, gemm=gemm, out=str(so))
        proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BlockcError(f"nvcc failed:\n{proc.stderr[-4000:]}")
    return out, so


def _output_shapes(model: CudaModel, bindings) -> list:
    return [(name, v.dtype, tuple(evaluate(d, bindings) for d in v.shape)) for name, v in model.outputs]


def run_model_emulated(model: CudaModel, feeds: Mapping[str, np.ndarray], *, sanitize: str | None = None,
                       timeout: float = 300.0) -> dict[str, np.ndarray]:
    from ..codegen.cuda.emulator import run_emulated
    bindings = bind_inputs(model.graph, feeds)
    _, so = emulated_library(model, sanitize=sanitize)
    # The weights of *this* model: a cached build may have been made with others.
    image = np.frombuffer(cuda_build.weights_blob(model.params), dtype=np.uint8)
    outs = [np.zeros(shape, dtype=dtype.numpy) for _, dtype, shape in _output_shapes(model, bindings)]
    args = [image] + [np.ascontiguousarray(feeds[name]) for name, _ in model.inputs] + outs
    ints = [bindings[s] for s in model.symbols] + [int(image.nbytes)]
    result = run_emulated(str(so), "blockc_entry", args + ints, timeout=timeout,
                          sanitize="auto" if sanitize else None)
    produced = result[1 + len(model.inputs):]
    return {name: a for (name, _), a in zip(model.outputs, produced)}


def cuda_available() -> tuple[bool, str]:
    """Whether a CUDA GPU and driver can be used here, and why not."""
    import ctypes
    for lib in ("libcuda.so.1", "libcuda.so"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return False, "the CUDA driver is installed but sees no GPU"
        return True, f"{count.value} GPU(s)"
    return False, "no CUDA driver (libcuda) on this machine"


def run_model_gpu(model: CudaModel, feeds: Mapping[str, np.ndarray], *, gemm: str = "tiled",
                  archs=("sm_80", "sm_90"), timeout: float = 300.0, repeats: int = 1) -> dict[str, np.ndarray]:
    outputs, _ = _run_child(model, feeds, gemm=gemm, archs=archs, timeout=timeout, extra={"repeats": repeats})
    return outputs


def time_model_gpu(model: CudaModel, feeds: Mapping[str, np.ndarray], *, gemm: str = "tiled",
                   archs=("sm_80", "sm_90"), timeout: float = 600.0, warmup: int = 3, min_repeats: int = 10,
                   min_time_s: float = 1.0) -> list[float]:
    """Seconds per run on the GPU: after ``warmup`` runs, runs until both
    ``min_repeats`` and ``min_time_s`` are reached, each timed on the host
    clock from the launch to a device synchronize (so it includes launch
    overhead, as a user's call does)."""
    _, times = _run_child(model, feeds, gemm=gemm, archs=archs, timeout=timeout,
                          extra={"time": {"warmup": warmup, "min_repeats": min_repeats, "min_time_s": min_time_s}})
    return times


def _run_child(model: CudaModel, feeds, *, gemm, archs, timeout, extra) -> tuple[dict[str, np.ndarray], list]:
    ok, why = cuda_available()
    if not ok:
        raise BlockcError(f"--backend cuda needs a GPU: {why} (use --backend cuda-emu to run the same source "
                          f"emulated on the CPU)")
    bindings = bind_inputs(model.graph, feeds)
    _, so = gpu_library(model, archs=archs, gemm=gemm)
    with tempfile.TemporaryDirectory(prefix="blockc-cuda-run-") as io:
        spec = {"dims": [bindings[s] for s in model.symbols], "inputs": [], "outputs": [], **extra}
        for k, (name, _) in enumerate(model.inputs):
            (Path(io) / f"in{k}").write_bytes(np.ascontiguousarray(feeds[name]).tobytes())
            spec["inputs"].append({"file": f"in{k}"})
        shapes = _output_shapes(model, bindings)
        for k, (_, dtype, shape) in enumerate(shapes):
            spec["outputs"].append({"file": f"out{k}", "nbytes": int(np.prod(shape, dtype=np.int64)) * dtype.itemsize})
        (Path(io) / "spec.json").write_text(json.dumps(spec))
        # The weights of *this* model: a cached build may have been made with others.
        (Path(io) / "weights.bin").write_bytes(cuda_build.weights_blob(model.params))
        try:
            proc = subprocess.run([sys.executable, "-m", "blockc.runtime._cuda_child", str(so),
                                   str(Path(io) / "weights.bin"), io], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BlockcError(f"the CUDA run took longer than {timeout:.0f} s") from None
        if proc.returncode != 0:
            raise BlockcError(f"the CUDA run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        outputs = {name: np.frombuffer((Path(io) / f"out{k}").read_bytes(), dtype=dtype.numpy).reshape(shape)
                   for k, (name, dtype, shape) in enumerate(shapes)}
        times_file = Path(io) / "times.json"
        return outputs, json.loads(times_file.read_text()) if times_file.exists() else []


def run_cuda(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray], *,
             emulate: bool, gemm: str = "tiled", **kw) -> dict[str, np.ndarray]:
    """Generate, build (cached) and run ``graph``; emulated on the CPU or on a GPU."""
    if emulate and gemm != "tiled":
        raise BlockcError("cuBLAS cannot be emulated: use gemm='tiled' for emulation")
    model = generate(graph, weights, gemm=gemm)
    return run_model_emulated(model, feeds, **kw) if emulate else run_model_gpu(model, feeds, gemm=gemm, **kw)
