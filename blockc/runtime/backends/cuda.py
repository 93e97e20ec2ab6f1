"""``cuda`` and ``cuda-emu``: blockc's generated CUDA, on a GPU or emulated on the CPU.

Both compile the same generated source (``codegen/cuda``) into a library and
run it in a child process (``runtime/cuda_runner.py``), which also times it:
a run's time is taken there, by ``runtime.timing.measure`` on CUDA events
recorded on the run's stream before and after it (``timing.event_clock``),
not around the child process.
"""
from __future__ import annotations

import functools

from ...errors import BlockcError
from ..interface import Backend, CachedStep, Compiled, Registration
from ..timing import Timing

# The code generator, the toolchain and the runner are imported when used:
# registering these backends (every CLI start) costs nothing.


class CudaCompiled(Compiled):
    """A generated model's library: each run, and each timing, in a child process."""

    times_itself = True

    def __init__(self, model, library, *, emulated: bool, sanitize: str | None = None):
        import tempfile

        from ..cuda_runner import write_weights
        super().__init__(graph=model.graph, kernels=len(model.steps))
        self.model, self.library, self.emulated, self.sanitize = model, library, emulated, sanitize
        # The weights file is written once, here, not on every run.
        self._dir = tempfile.TemporaryDirectory(prefix="blockc-cuda-weights-")
        self._weights = write_weights(model, self._dir.name)

    def _launch(self, feeds, bindings, **kw):
        from ..cuda_runner import run_model
        return run_model(self.model, self.library, feeds, emulated=self.emulated, sanitize=self.sanitize,
                         weights=self._weights, bindings=bindings, **kw)

    def unchecked_runner(self, feeds, bindings):
        return lambda: self._launch(feeds, bindings).outputs

    def time(self, feeds, *, warmup=3, min_repeats=10, min_time_s=1.0, runs_per_sample=1):
        run = self._launch(feeds, self.check(feeds), timeout=600.0,
                           time={"warmup": warmup, "min_repeats": min_repeats, "min_time_s": min_time_s,
                                 "runs_per_sample": runs_per_sample})
        return Timing.of(run.times)

    def cached(self, carry, state):
        """A step whose carried state stays on the device: one child process
        runs every step (``cuda_runner.CudaSession``), each carried output
        written into its input's buffer through the C API, as a C user keeps
        a KV cache in place (``cache_write`` then writes only the step's
        rows). A carried output of another type than its input (the concat
        cache, one row longer each step) is carried through the host."""
        from ..cuda_runner import in_place_problem
        if any(in_place_problem(self.model, out, inp) for out, inp in carry.items()):
            return super().cached(carry, state)
        return CudaCachedStep(self, carry, state)

    def close(self):
        self._dir.cleanup()
        super().close()


class CudaCachedStep(CachedStep):
    """``Compiled.cached`` on the generated CUDA: the state in device buffers
    shared by each carried input and its output (see ``CudaCompiled.cached``)."""

    def __init__(self, compiled: CudaCompiled, carry, state):
        import numpy as np

        from ..cuda_runner import CudaSession
        super().__init__(compiled, carry, state)
        self._session = CudaSession(compiled.model, compiled.library, self.carry, self.state,
                                    emulated=compiled.emulated, weights=compiled._weights,
                                    sanitize=compiled.sanitize)
        # what the feeds are checked with: the carried inputs' shapes, no data on the host
        self.state = {name: np.broadcast_to(np.zeros((), a.dtype), a.shape) for name, a in self.state.items()}

    def run(self, feeds):
        bindings = self.compiled.check({**feeds, **self.state})
        return self._session.run(feeds, bindings)

    @property
    def counters(self) -> dict:
        """What the emulator counted in the last run (empty on a GPU)."""
        return self._session.counters

    def value(self, name):
        return self._session.read(name)

    def address(self, name):
        return self._session.address(name)

    def close(self):
        self._session.close()
        super().close()


class GeneratedCuda(Backend):
    """What the GPU and the emulated backend share."""

    kernel_variant = ""   # compare times fused kernels alone here
    build_copies = 3.0    # packing the weights into the model's blob: 2.92x more at its peak, measured on the emulator

    def supports(self, form):
        return form != "decomposed"  # elementwise chains work, but the comparison is fused vs standard


class CudaBackend(GeneratedCuda):
    """The generated CUDA built with nvcc and run on a GPU. Options: ``gemm``
    (``cublas``, cuBLASLt, the default here; or ``tiled``), ``tf32`` (float32
    GEMMs on TF32 tensor cores; its error is what ``blockc check --tf32``
    shows)."""

    clock = "CUDA events recorded on the run's stream before and after each run, in the child process"
    on_gpu = True

    def __init__(self, *, gemm: str | None = None, tf32: bool = False):
        self._requested, self._tf32 = gemm, tf32

    @functools.cached_property
    def choice(self):
        # asked when first used, so a backend only listed never looks for cuBLASLt
        from ...codegen.cuda.build import gpu_gemm
        from ...codegen.cuda.kernels.gemm import GemmChoice
        return GemmChoice(gpu_gemm(self._requested), self._tf32)

    @property
    def gemm(self) -> str:
        return self.choice.kind

    def availability(self):
        from ...codegen.cuda import toolchain
        from ..cuda_runner import cuda_available
        ok, why = cuda_available()
        if not ok:
            return False, why
        found = toolchain.find_nvcc()
        return (True, "") if found.path else (False, f"no nvcc: {found.reason}")

    def require(self):
        from ..cuda_runner import cuda_available
        ok, why = cuda_available()
        if not ok:
            raise BlockcError(f"--backend {self.name} needs a GPU: {why} (use --backend cuda-emu to run the same "
                              f"source emulated on the CPU)")
        super().require()

    @property
    def title(self) -> str:
        return "generated CUDA, on the GPU"

    @property
    def label(self) -> str:
        # The GEMM and TF32 change the numbers: blockc check reports each apart.
        return f"{self.name}[{self.gemm}{', tf32' if self.choice.tf32 else ''}]"

    def detail(self, threads):
        return f"blockc's generated CUDA, --gemm {self.gemm}{' --tf32' if self.choice.tf32 else ''}, sm_80/sm_90, " \
               "one stream, a CUDA graph per shape; per-run times from CUDA events"

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False):
        from ...codegen.cuda.lower import generate
        from ..cuda_runner import gpu_library
        model = generate(graph, weights, gemm=self.choice.kind, tf32=self.choice.tf32)
        return CudaCompiled(model, gpu_library(model), emulated=False)


class CudaEmuBackend(GeneratedCuda):
    """The same generated CUDA built with g++ against blockc's CUDA emulation
    and run on the CPU. Options: ``gemm`` (only ``tiled`` can be emulated),
    ``sanitize`` (``address`` or ``thread``: a sanitizer build); no ``tf32``."""

    # The same events, emulated: the host clock at each record (emulated streams are synchronous).
    clock = "CUDA events around each run, emulated (host time between the records), in the child process"

    # No tf32: TF32 needs a GPU's tensor cores, and the emulator runs the tiled float32 GEMM
    # (make_backend refuses it, pointing at cuda).
    def __init__(self, *, gemm: str | None = None, sanitize: str | None = None):
        from ...codegen.cuda.kernels.gemm import EMULATED_GEMM
        self.gemm, self.sanitize = gemm or EMULATED_GEMM, sanitize
        if self.gemm != "tiled":
            raise BlockcError("cuBLAS cannot be emulated: use --gemm tiled (the default) for emulation")

    def availability(self):
        from ...codegen.cuda import toolchain
        if toolchain.find_gxx() is None:
            return False, "g++ not found: the CUDA emulator needs a host C++ compiler"
        return True, ""

    @property
    def title(self) -> str:
        return "generated CUDA, emulated on the CPU"

    def detail(self, threads):
        return "blockc's generated CUDA, --gemm tiled, emulated on the CPU (g++, one fiber per CUDA thread); " \
               "per-run times from CUDA events (emulated: host time)"

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False):
        from ...codegen.cuda.lower import generate
        from ..cuda_runner import emulated_library
        model = generate(graph, weights, gemm=self.gemm)
        return CudaCompiled(model, emulated_library(model, sanitize=self.sanitize), emulated=True,
                            sanitize=self.sanitize)


REGISTRATIONS = (Registration("cuda", CudaBackend, compare=True), Registration("cuda-emu", CudaEmuBackend))
