"""The backends ``blockc compare`` measures blockc's graphs on.

Each backend says whether it can run here (and why not), describes its
settings in one line, lists its variants (ONNX Runtime runs at two graph
optimization levels, see below), and prepares a graph into a ``Runnable``:
something that runs feeds many times and knows how many kernels it executes.

Why two ONNX Runtime levels: at its default level ONNX Runtime fuses
LayerNorm, SkipLayerNorm, GELU and more by itself, which would hide what
blockc's own passes buy. ``basic`` does constant folding and redundant-node
elimination only, so the fusions measured there are blockc's; ``all`` is what
a user gets by default. Both are reported.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..errors import BlockcError
from ..ir.graph import Graph


@dataclass
class Runnable:
    """A prepared graph: ``run(feeds)`` returns outputs by name."""

    run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    kernels: int | None            # what the runtime executes per run, where it can be counted
    close: Callable[[], None] = lambda: None
    # Times one run itself when the clock is not the host's (a GPU's); None: the caller times run().
    timed_run: Callable[[Mapping[str, np.ndarray], int, float, int], list[float]] | None = None


class Backend:
    name = ""
    variants: tuple[str, ...] = ("",)
    clock = "time.perf_counter"

    def availability(self) -> tuple[bool, str]:
        return True, ""

    def detail(self, threads: int) -> str:
        return ""

    def supports(self, form: str) -> bool:
        return True

    def prepare(self, graph: Graph, weights: Mapping[str, np.ndarray], variant: str, threads: int) -> Runnable:
        raise NotImplementedError


class ReferenceBackend(Backend):
    """The numpy interpreter in the graph's own dtypes: one numpy call per IR node."""

    name = "reference"

    def detail(self, threads: int) -> str:
        return "blockc's numpy interpreter in the model's dtype (the float64 oracle's float32 twin), one numpy " \
               "call per IR node; numpy's BLAS picks its own thread count"

    def prepare(self, graph, weights, variant, threads):
        from ..runtime.reference import run_reference
        return Runnable(lambda feeds: run_reference(graph, weights, feeds, float64=False), kernels=len(graph.nodes))


def count_onnx_nodes(path: str) -> int | None:
    """Nodes in an ONNX file (ONNX Runtime's saved optimized graph), or None if unreadable."""
    import onnx
    try:
        return len(onnx.load(path, load_external_data=False).graph.node)
    except Exception:  # a count is a nicety: never fail a measurement over it
        return None


class OrtBackend(Backend):
    """ONNX Runtime at the ``basic`` and ``all`` graph optimization levels."""

    variants = ("basic", "all")

    def __init__(self, provider: str, fused_as: str = "auto"):
        self.provider, self.fused_as = provider, fused_as
        self.name = f"ort-{provider}"

    def availability(self):
        import onnxruntime
        if self.provider == "cpu":
            return True, ""
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return False, "this onnxruntime has no CUDA execution provider (pip install onnxruntime-gpu)"
        from ..runtime.cuda_runner import cuda_available
        ok, why = cuda_available()
        return (True, "") if ok else (False, why)

    def detail(self, threads):
        import onnxruntime
        ep = "CUDAExecutionProvider" if self.provider == "cuda" else "CPUExecutionProvider"
        return (f"onnxruntime {onnxruntime.__version__}, {ep}, {threads} intra-op threads, sequential execution, "
                f"graph optimization level basic and all; fused ops written as --fused-as {self.fused_as}"
                + ("; run() includes host-device copies" if self.provider == "cuda" else ""))

    def prepare(self, graph, weights, variant, threads):
        from ..runtime.ort_runner import OrtSession
        folder = tempfile.TemporaryDirectory(prefix="blockc-compare-")
        optimized = os.path.join(folder.name, "optimized.onnx")
        try:
            session = OrtSession(graph, weights, provider=self.provider, optimization=variant, threads=threads,
                                 fused_as=self.fused_as, optimized_model_path=optimized)
        except BaseException:
            folder.cleanup()
            raise
        kernels = count_onnx_nodes(optimized)

        def close():
            session.close()
            folder.cleanup()
        return Runnable(session.run, kernels, close)


class CudaBackend(Backend):
    """blockc's generated CUDA (cuBLAS GEMMs) on a GPU, timed in the child process that runs it."""

    name = "cuda"
    clock = "host clock around each run and a device synchronize, in the child process"

    def availability(self):
        from ..codegen.cuda import toolchain
        from ..runtime.cuda_runner import cuda_available
        ok, why = cuda_available()
        if not ok:
            return False, why
        found = toolchain.find_nvcc()
        return (True, "") if found.path else (False, f"no nvcc: {found.reason}")

    def detail(self, threads):
        return "blockc's generated CUDA, --gemm cublas, sm_80/sm_90, one stream; per-run times from the child process"

    def supports(self, form):
        return form != "decomposed"  # elementwise chains work, but the comparison is fused vs standard

    def prepare(self, graph, weights, variant, threads):
        from ..codegen.cuda.lower import generate
        from ..runtime.cuda_runner import run_model_gpu, time_model_gpu
        model = generate(graph, weights, gemm="cublas")

        def timed(feeds, warmup, min_time_s, min_repeats):
            return time_model_gpu(model, feeds, gemm="cublas", warmup=warmup, min_time_s=min_time_s,
                                  min_repeats=min_repeats)
        return Runnable(lambda feeds: run_model_gpu(model, feeds, gemm="cublas"), len(model.steps),
                        timed_run=timed)


def make_backend(name: str, fused_as: str = "auto") -> Backend:
    if name == "reference":
        return ReferenceBackend()
    if name in ("ort-cpu", "ort-cuda"):
        return OrtBackend(name.split("-")[1], fused_as)
    if name == "cuda":
        return CudaBackend()
    raise BlockcError(f"unknown backend {name!r}; backends: {', '.join(BACKENDS)}")


BACKENDS = ("reference", "ort-cpu", "ort-cuda", "cuda")
