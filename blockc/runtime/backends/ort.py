"""``ort``, ``ort-cpu``, ``ort-cuda``: ONNX Runtime as a backend.

Why compare measures two ONNX Runtime levels: at its default level ONNX
Runtime fuses LayerNorm, SkipLayerNorm, GELU and more by itself, which would
hide what blockc's own passes buy. ``basic`` does constant folding and
redundant-node elimination only, so the fusions measured there are blockc's;
``all`` is what a user gets by default. Both are reported.
"""
from __future__ import annotations

import os
import tempfile

from ..interface import Backend, Compiled, CompileHints, Registration

# ONNX Runtime and the exporter are imported when used: registering this
# backend (every CLI start) costs nothing.


def count_onnx_nodes(path: str) -> int | None:
    """Nodes in an ONNX file (ONNX Runtime's saved optimized graph), or None if unreadable."""
    import onnx
    try:
        return len(onnx.load(path, load_external_data=False).graph.node)
    except Exception:  # a count is a nicety: never fail a measurement over it
        return None


class OrtCompiled(Compiled):
    """A session as a ``Compiled``; its ``cached`` steps keep their state in
    ONNX Runtime (``ort_runner.OrtCachedStep``: IO binding, a cache written in place)."""

    def __init__(self, session, **kw):
        super().__init__(session.run_unchecked, **kw)
        self.session = session

    def cached(self, carry, state):
        return self.session.cached(carry, state)


class OrtBackend(Backend):
    """blockc's ONNX export run by ONNX Runtime. Options: ``provider`` (cpu,
    cuda or auto) and ``fused_as`` (how fused ops are written in ONNX); the
    variants are ONNX Runtime's graph optimization levels ``basic`` and ``all``."""

    variants = ("basic", "all")
    kernel_variant = "basic"   # blockc's fused ops as written, not ONNX Runtime's re-fusions
    # The session reads the caller's arrays (``OrtSession``); ONNX Runtime adds its prepacked matmul weights and
    # folded constants (a transposed tied head). Kept from the serialized days' measurement: an upper bound.
    weight_copies = 2.0
    # Its CPU arena grows by doubling regions, and again on the second run, where ONNX Runtime allocates
    # the memory pattern the first run recorded beside the first run's blocks: after that it stays at
    # 1.1x (fused), 1.2x (standard), 1.5x (decomposed) the activations, measured on a 2-layer GPT-2 at
    # batch 2, seq 512 over four runs, both levels.
    arena_copies = 1.5
    # No serialized model any more: 0.31x (GPT-2 small) to 0.70x (2 layers) more at its peak, measured
    # (1.86x and 3.16x the same way with the weights serialized)
    build_copies = 0.75

    def __init__(self, *, provider: str = "cpu", fused_as: str = "auto"):
        self.provider, self.fused_as = provider, fused_as

    @property
    def on_gpu(self) -> bool:
        return self.provider == "cuda"

    def availability(self):
        import onnxruntime
        if self.provider != "cuda":
            return True, ""
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return False, "this onnxruntime has no CUDA execution provider (pip install onnxruntime-gpu)"
        from ..cuda_runner import cuda_available
        ok, why = cuda_available()
        return (True, "") if ok else (False, why)

    @property
    def title(self) -> str:
        return f"ONNX Runtime ({self.provider}, fused ops as {self.fused_as})"

    @property
    def label(self) -> str:
        return f"ort ({self.provider}, --fused-as {self.fused_as})"

    def detail(self, threads):
        import onnxruntime
        ep = "CUDAExecutionProvider" if self.provider == "cuda" else "CPUExecutionProvider"
        return (f"onnxruntime {onnxruntime.__version__}, {ep}, {threads} intra-op threads, sequential execution, "
                f"graph optimization level basic and all; fused ops written as --fused-as {self.fused_as}"
                + ("; run() includes host-device copies" if self.provider == "cuda" else ""))

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False,
                hints=CompileHints()):
        from ..ort_runner import OrtSession
        options = dict(provider=self.provider, optimization=variant or self.variants[0], threads=threads,
                       fused_as=self.fused_as, prepack=hints.packs_weights)
        if not count_kernels:   # saving the optimized model was a third of a GPT-2's start: only when asked
            session = OrtSession(graph, weights, **options)
            return OrtCompiled(session, graph=graph, close=session.close)
        folder = tempfile.TemporaryDirectory(prefix="blockc-ort-")
        optimized = os.path.join(folder.name, "optimized.onnx")   # the graph ONNX Runtime runs: its kernels
        try:
            session = OrtSession(graph, weights, **options, optimized_model_path=optimized)
        except BaseException:
            folder.cleanup()
            raise

        def close():
            session.close()
            folder.cleanup()
        return OrtCompiled(session, graph=graph, kernels=count_onnx_nodes(optimized), close=close)


REGISTRATIONS = (Registration("ort", OrtBackend),
                 Registration("ort-cpu", OrtBackend, {"provider": "cpu"}, compare=True),
                 Registration("ort-cuda", OrtBackend, {"provider": "cuda"}, compare=True))
