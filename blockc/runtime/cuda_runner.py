"""Running compiled CUDA libraries: emulated on the CPU or on a GPU, always
in a child process.

One runner (``run_child``) with one protocol (``_cuda_child.py``) and one
error story, for both kinds of library and both calling conventions:

* ``run_emulated(so, entry, args)``: a hand-written kernel library's entry
  ``extern "C" int entry(void** buffers, const long long* ints)``. ``args``
  is a sequence of numpy arrays and Python ints, in any order. The arrays, in
  order, become ``buffers[0..]``: each is copied into its own 256-byte-aligned
  allocation (``cudaMalloc``'s alignment; "device" memory is host memory
  under emulation). The ints, in order, become ``ints[0..]``. The entry
  returns 0, or a ``cudaError_t`` (``return cudaGetLastError();`` is the
  usual last line). The result is the final contents of every array
  argument, in order, as new arrays (inputs are never modified).
* ``run_model(model, feeds)``: a generated model through its C API
  (``blockc_model.h``: ``blockc_create``, ``blockc_reserve``, ``blockc_run``,
  ...), the build made here and cached
  in ``files.cache_root()`` (``$BLOCKC_CACHE``, else ``~/.cache/blockc``) by
  a hash of everything that goes into it (generated source, runtime header,
  emulator sources, flags, compiler version), built under a lock and checked
  before use; emulated, or on a GPU. ``time=`` times it in
  the child with blockc's one timing loop, on CUDA events.

The child has a timeout, so a crash, an abort from the emulator's checks or
a hang never takes the caller down: each becomes a ``CudaRunCrash`` or
``CudaRunTimeout`` carrying the child's stderr, where the emulator names the
kernel, block, thread and warp lane; a non-zero status from the library is
a ``CudaRunError``. Libraries built with a sanitizer are found out from
their linked runtime (``sanitize="auto"``) and run with it preloaded; a
report makes the run fail.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..codegen.cuda import build as cuda_build
from ..codegen.cuda import toolchain
from ..codegen.cuda.lower import CudaModel
from ..errors import BlockcError
from ..files import cached_file
from ..process import run_command
from ..ir.dims import evaluate
from . import timing
from .bindings import bind_inputs

DEFAULT_TIMEOUT = 60.0
_CHILD = Path(__file__).with_name("_cuda_child.py")


class CudaRunError(BlockcError):
    """A run of a compiled CUDA library failed; ``stderr`` holds everything the child printed."""

    def __init__(self, message: str, stderr: str = "", returncode: int | None = None):
        self.stderr, self.returncode = stderr, returncode
        super().__init__(message + _excerpt(stderr))


class CudaRunCrash(CudaRunError):
    """The child died: a failed emulator check (abort), a signal, or a sanitizer report."""


class CudaRunTimeout(CudaRunError):
    """The child ran past its timeout and was killed."""


_CUDA_ERRORS = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation",
                9: "cudaErrorInvalidConfiguration", 101: "cudaErrorInvalidDevice"}


def _excerpt(stderr: str, lines: int = 40) -> str:
    """From the first emulator message or sanitizer report on, else the tail."""
    rows = stderr.rstrip().splitlines()
    if not rows:
        return ""
    starts = [i for i, r in enumerate(rows)
              if r.startswith("blockc-emu") or "ERROR: AddressSanitizer" in r or "WARNING: ThreadSanitizer" in r]
    shown = rows[starts[0]:starts[0] + lines] if starts else rows[-lines:]
    summary = [r for r in rows if r.startswith("SUMMARY:") and r not in shown]
    return "\n--- stderr ---\n" + "\n".join(shown + summary)


def linked_sanitizer(so_path: str | os.PathLike) -> str | None:
    """``"address"`` or ``"thread"`` when the library links that sanitizer's runtime."""
    data = Path(so_path).read_bytes()
    if b"libasan.so" in data:
        return "address"
    if b"libtsan.so" in data:
        return "thread"
    return None


def _child_env(sanitize: str | None, switches: Mapping[str, str] | None = None, *,
               emulated: bool = True) -> dict[str, str]:
    env = {**os.environ, **(switches or {})}
    if not emulated:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(_gpu_library_path() + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    if sanitize is None:
        return env
    env["LD_PRELOAD"] = toolchain.sanitizer_runtime(sanitize)
    if sanitize == "address":
        env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:verify_asan_link_order=0:" + env.get("ASAN_OPTIONS", "")
    else:
        env["TSAN_OPTIONS"] = "halt_on_error=1:report_signal_unsafe=0:" + env.get("TSAN_OPTIONS", "")
    return env


def _gpu_library_path() -> list[str]:
    """Where this machine's cuBLASLt is now, for the loader ahead of the
    library's RUNPATH: a cached build finds it even when the cache or the
    environment it was built in has moved."""
    try:
        return [toolchain.find_cublas().lib]
    except toolchain.ToolchainError:
        return []


def _timed_out(what: str, so_path: Path, timeout: float, stderr: str) -> CudaRunTimeout:
    return CudaRunTimeout(f"{what} in {so_path.name} did not finish within {timeout:g} s "
                          "(an endless loop in a kernel?)", stderr)


def _crashed(what: str, so_path: Path, emulated: bool, returncode: int, stderr: str) -> CudaRunCrash:
    how = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with status {returncode}"
    if "Sanitizer" in stderr:
        how += " after a sanitizer report"
    return CudaRunCrash(f"{what} in {so_path.name}: the {'emulator' if emulated else 'CUDA'} process {how}",
                        stderr, returncode)


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _output_files(model: CudaModel, bindings: Mapping[str, int], folder: str) -> list[tuple]:
    """Per output of ``model`` at ``bindings``: (name, dtype, shape, the
    child's ``{"path", "nbytes"}`` for it in ``folder``)."""
    files = []
    for k, (name, v) in enumerate(model.outputs):
        shape = tuple(evaluate(d, bindings) for d in v.shape)
        files.append((name, v.dtype, shape, {"path": os.path.join(folder, f"out{k}"), "nbytes": _nbytes(shape, v.dtype)}))
    return files


def _input_file(folder: str, k: int, array: np.ndarray) -> str:
    """Input ``k``'s bytes, as the child reads them, in ``folder``."""
    path = os.path.join(folder, f"in{k}")
    Path(path).write_bytes(np.ascontiguousarray(array).tobytes())
    return path


def run_child(so_path: str | os.PathLike, spec: dict, folder: str, *, what: str, timeout: float,
              sanitize: str | None = "auto", emulated: bool = True,
              switches: Mapping[str, str] | None = None) -> dict:
    """Run ``_cuda_child.py`` on ``spec`` (its ``call`` and arguments; files
    in ``folder``) against the library ``so_path``; return its result.
    ``switches``: environment variables the library reads, set for the child.

    Raises CudaRunCrash when the child dies (an emulator check, a signal, a
    sanitizer report), CudaRunTimeout after ``timeout`` seconds, CudaRunError
    when the library returns a non-zero status. ``what`` names the call in
    those messages; ``sanitize="auto"`` reads the library's linked sanitizer.
    """
    so_path = Path(so_path).resolve()
    if sanitize == "auto":
        sanitize = linked_sanitizer(so_path)
    spec_path, result_path = os.path.join(folder, "spec.json"), os.path.join(folder, "result.json")
    with open(spec_path, "w") as f:
        json.dump({**spec, "so": str(so_path), "result": result_path, "timing_module": timing.__file__}, f)
    cmd = [sys.executable, "-I", str(_CHILD), spec_path]
    proc = run_command(cmd, env=_child_env(sanitize, switches, emulated=emulated), timeout=timeout)
    if proc.timed_out:
        raise _timed_out(what, so_path, timeout, proc.stderr)
    if proc.returncode != 0:
        raise _crashed(what, so_path, emulated, proc.returncode, proc.stderr)
    with open(result_path) as f:
        result = json.load(f)
    if result["rc"] != 0:
        rc = result["rc"]
        raise CudaRunError(f"{result['where']} in {so_path.name} returned {rc} "
                           f"({result['error'] or _CUDA_ERRORS.get(rc, 'cudaError_t')})", proc.stderr, rc)
    return result


def run_emulated(so_path: str | os.PathLike, entry: str, args: Sequence[np.ndarray | int], *,
                 timeout: float = DEFAULT_TIMEOUT, sanitize: str | None = "auto") -> list[np.ndarray]:
    """Call ``entry(buffers, ints)`` of an emulated library in a child process;
    return every array argument's final contents, in order. See the module
    docstring for the calling convention, ``run_child`` for the errors."""
    arrays: list[np.ndarray] = []
    ints: list[int] = []
    for i, a in enumerate(args):
        if isinstance(a, (bool, np.bool_)):
            raise TypeError(f"argument {i}: pass flags as ints 0/1, not bool")
        if isinstance(a, (int, np.integer)):
            ints.append(int(a))
        elif isinstance(a, np.ndarray):
            if a.dtype.hasobject:
                raise TypeError(f"argument {i}: object arrays cannot be passed to CUDA")
            arrays.append(np.ascontiguousarray(a))
        else:
            raise TypeError(f"argument {i}: expected a numpy array or an int, got {type(a).__name__} "
                            "(pass float scalars as 1-element arrays)")
    with tempfile.TemporaryDirectory(prefix="blockc-cuda-run-") as tmp:
        buffers = []
        for i, a in enumerate(arrays):
            path = os.path.join(tmp, f"buf{i}.bin")
            a.tofile(path)
            buffers.append({"path": path, "nbytes": int(a.nbytes)})
        run_child(so_path, {"call": "entry", "entry": entry, "buffers": buffers, "ints": ints}, tmp, what=entry,
                  timeout=timeout, sanitize=sanitize)
        return [np.fromfile(b["path"], dtype=a.dtype).reshape(a.shape) for a, b in zip(arrays, buffers)]


# ---- generated models ----------------------------------------------------------------
def _libcuda():
    """The CUDA driver's library, loaded, or None where there is none."""
    import ctypes
    for lib in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(lib)
        except OSError:
            continue
    return None


def cuda_available() -> tuple[bool, str]:
    """Whether a CUDA GPU and driver can be used here, and why not."""
    import ctypes
    cuda = _libcuda()
    if cuda is None:
        return False, "no CUDA driver (libcuda) on this machine"
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return False, "the CUDA driver is installed but sees no GPU"
    return True, f"{count.value} GPU(s)"


def driver_version() -> tuple[int, int] | None:
    """The newest CUDA release the installed driver runs (``cuDriverGetVersion``:
    e.g. (13, 0)), or None without a driver. A build of CUDA X.Y runs on a
    driver of X.0 or later (CUDA's minor-version compatibility)."""
    import ctypes
    cuda = _libcuda()
    version = ctypes.c_int(0)
    if cuda is None or cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value // 1000, version.value % 1000 // 10


def _entry(model: CudaModel, tag: str, flags: tuple, compiler: str) -> Path:
    """The cache entry's folder: the model's name, the build's tag and a key of
    everything that goes into the build (``build.source_hash``)."""
    key = cuda_build.source_hash(model, tag, *flags, compiler=toolchain.compiler_version(compiler))
    return Path(cuda_build.cache_dir()) / f"{model.graph.name[:32].replace('/', '_')}-{tag}-{key}"


def emulated_library(model: CudaModel, *, sanitize: str | None = None) -> Path:
    """The emulated build of ``model``, compiled with g++ unless cached (see
    ``files.cached_file``: concurrent first builds make it once, a damaged
    entry is rebuilt)."""
    gxx = toolchain.find_gxx()
    if gxx is None:
        raise toolchain.ToolchainError("g++ not found on PATH: the CUDA emulator needs a host C++ compiler")
    if model.gemm.kind != "tiled":
        raise BlockcError(f"the emulator cannot run --gemm {model.gemm.kind} (it has no cuBLAS): generate with "
                          "gemm='tiled' to emulate")
    tag = f"emu-{sanitize or 'fibers'}"
    out = _entry(model, tag, (), gxx)

    def make(tmp: Path) -> None:
        cuda_build.write_build(model, str(out), weights=False)   # each run uploads its own
        toolchain.compile_emulated([str(out / "model.cu")], tmp, sanitize=sanitize,
                                   extra_flags=["-DBLOCKC_EMULATE", f"-I{out}"])
    return cached_file(out / f"libblockc_model_{tag}.so", make)


def gpu_library(model: CudaModel, *, archs=cuda_build.ARCHS) -> Path:
    """The GPU build of ``model``, compiled with nvcc unless cached (as
    ``emulated_library``), with one CUDA's nvcc and headers
    (``toolchain.find_toolkit``), linked with its GEMM library (``build.library_flags``)."""
    toolkit = toolchain.find_toolkit()
    toolchain.check_archs(toolkit.nvcc, archs)
    key = cuda_build.nvcc_command(toolkit, archs, gemm=model.gemm)   # where cuBLASLt is: part of the key
    out = _entry(model, "gpu", tuple(key), toolkit.nvcc)

    def make(tmp: Path) -> None:
        cuda_build.write_build(model, str(out), archs=archs, weights=False)   # each run uploads its own
        cmd = cuda_build.nvcc_command(toolkit, archs, gemm=model.gemm, out=str(tmp), origin=str(out))
        done = run_command(cmd, cwd=out, timeout=toolchain.BUILD_TIMEOUT)
        if done.timed_out:
            raise toolchain.ToolchainError(f"nvcc took longer than {toolchain.BUILD_TIMEOUT:.0f} s to build the model",
                                           cmd, done.stderr + done.stdout)
        if done.returncode != 0:
            raise toolchain.ToolchainError("nvcc failed to build the model", cmd, done.stderr + done.stdout)
    return cached_file(out / "libblockc_model_gpu.so", make)


def write_weights(model: CudaModel, directory: str) -> str:
    """The weights of *this* model in ``directory`` (a cached library may have
    been built for a model with other weights); its path."""
    path = os.path.join(directory, "weights.bin")
    Path(path).write_bytes(cuda_build.weights_blob(model.params))
    return path


class CudaSession:
    """A generated model loaded once, in one child process, for a step run
    again and again with state carried from each run to the next (a KV
    cache): ``carry`` maps each carried output to the input it feeds, of the
    same type, and the two share one device buffer, so the state is written
    in place and never leaves the device between runs (``_cuda_child``'s
    ``session``). ``state`` holds the carried inputs' first values.
    ``run(feeds)`` takes the other inputs and returns the other outputs;
    ``read(name)`` copies a carried input's buffer to the host, and
    ``address(name)`` says where it lives on the device. A crash or a hang
    of the child is a ``CudaRunCrash`` / ``CudaRunTimeout``, as for
    ``run_model``; ``close()`` ends it."""

    def __init__(self, model: CudaModel, so_path: str | os.PathLike, carry: Mapping[str, str],
                 state: Mapping[str, np.ndarray], *, emulated: bool, weights: str, timeout: float = 300.0,
                 sanitize: str | None = "auto"):
        self.model, self.emulated, self.timeout = model, emulated, timeout
        self._so = Path(so_path).resolve()
        self._in_names = [name for name, _ in model.inputs]
        self._outputs = [name for name, _ in model.outputs]
        self._carry = {self._outputs.index(out): _in_place_input(model, out, inp, self._in_names)
                       for out, inp in carry.items()}
        self._dir = tempfile.TemporaryDirectory(prefix="blockc-cuda-session-")
        folder = self._dir.name
        state_files, self._shapes = {}, {}
        for k in self._carry.values():
            name = self._in_names[k]
            self._shapes[name] = np.shape(state[name])
            path = os.path.join(folder, f"state{k}")
            Path(path).write_bytes(np.ascontiguousarray(state[name], model.inputs[k][1].dtype.numpy).tobytes())
            state_files[str(k)] = path
        spec = {"call": "session", "so": str(self._so), "weights": weights, "result": os.path.join(folder, "result"),
                "timing_module": timing.__file__, "carry": {str(o): i for o, i in self._carry.items()},
                "state": state_files, "reserve": [0] * len(model.symbols)}
        spec_path = os.path.join(folder, "spec.json")
        Path(spec_path).write_text(json.dumps(spec))
        if sanitize == "auto":
            sanitize = linked_sanitizer(self._so)
        self._stderr = open(os.path.join(folder, "stderr"), "w+")
        self._proc = subprocess.Popen([sys.executable, "-I", str(_CHILD), spec_path], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                      env=_child_env(sanitize, emulated=emulated))
        self.counters: dict = {}
        self._addresses = {self._in_names[int(k)]: v for k, v in self._reply("loading the model")["addresses"].items()}

    def run(self, feeds: Mapping[str, np.ndarray], bindings: Mapping[str, int]) -> dict[str, np.ndarray]:
        """The outputs that are not carried, for ``feeds`` (the inputs that are
        not carried, checked already: ``bindings`` are the sizes they bind)."""
        folder = self._dir.name
        inputs = []
        for k, name in enumerate(self._in_names):
            if k in self._carry.values():
                inputs.append(None)
                continue
            inputs.append(_input_file(folder, k, feeds[name]))
        files = _output_files(self.model, bindings, folder)
        reply = self._command({"op": "run", "dims": [bindings[sym] for sym in self.model.symbols],
                               "inputs": inputs, "outputs": [f for *_, f in files]}, "a run")
        self.counters = reply.get("counters", {})
        return {name: np.fromfile(f["path"], dtype=dtype.numpy).reshape(shape)
                for k, (name, dtype, shape, f) in enumerate(files) if k not in self._carry}

    def read(self, name: str) -> np.ndarray:
        """The carried input ``name`` as the next run will read it, copied to the host."""
        v, shape = dict(self.model.inputs)[name], self._shapes[name]
        path = os.path.join(self._dir.name, "read")
        self._command({"op": "read", "input": self._in_names.index(name), "path": path,
                       "nbytes": _nbytes(shape, v.dtype)},
                      f"reading {name!r}")
        return np.fromfile(path, dtype=v.dtype.numpy).reshape(shape)

    def address(self, name: str) -> int:
        """The device address of the carried input ``name``'s buffer (fixed for the session)."""
        return int(self._addresses[name])

    def _command(self, command: dict, what: str) -> dict:
        if self._proc.poll() is not None:
            raise CudaRunError(f"{what}: the session's child process has ended", self._read_stderr())
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()
        return self._reply(what)

    def _reply(self, what: str) -> dict:
        import selectors
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while True:
                if not sel.select(timeout=self.timeout):
                    self._proc.kill()
                    self._proc.wait()
                    raise _timed_out(what, self._so, self.timeout, self._read_stderr())
                line = self._proc.stdout.readline()
                if not line:   # end of output: the child died
                    raise _crashed(what, self._so, self.emulated, self._proc.wait(), self._read_stderr())
                if line.startswith("blockc-session "):
                    break
        reply = json.loads(line[len("blockc-session "):])
        if not reply["ok"]:
            raise CudaRunError(f"{reply['where']} in {self._so.name} returned {reply['rc']} ({reply['error']})",
                               self._read_stderr(), reply["rc"])
        return reply

    def _read_stderr(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()

    def close(self) -> None:
        proc, self._proc = getattr(self, "_proc", None), None
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                    proc.stdin.flush()
                    proc.wait(timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait()
            for f in (proc.stdin, proc.stdout):
                f.close()
        if getattr(self, "_stderr", None) is not None:
            self._stderr.close()
            self._stderr = None
        if getattr(self, "_dir", None) is not None:
            self._dir.cleanup()
            self._dir = None


def in_place_problem(model: CudaModel, output: str, input_name: str) -> str | None:
    """Why ``output`` cannot be written into ``input_name``'s device buffer
    (not an input; another type than the output), or None where it can."""
    inputs = dict(model.inputs)
    if input_name not in inputs:
        return f"in_place: {output!r} -> {input_name!r}, which is not an input of the model"
    out_t, in_t = dict(model.outputs)[output].type, inputs[input_name].type
    if out_t != in_t:
        return (f"in_place: output {output!r} is {out_t}, input {input_name!r} is {in_t}: "
                f"an output can share only a buffer of its own type")
    return None


def _in_place_input(model: CudaModel, output: str, input_name: str, in_names: list) -> int:
    """The position of the input ``output`` is written into, once their types agree."""
    problem = in_place_problem(model, output, input_name)
    if problem:
        raise BlockcError(problem)
    return in_names.index(input_name)


@dataclass
class ModelRun:
    """What ``run_model`` gives back."""

    outputs: dict                                 # output name -> array
    times: list = field(default_factory=list)     # seconds per timed run (``time=``), else empty
    counters: dict = field(default_factory=dict)  # emulated: what the emulator counted during the runs
                                                  # (device_allocations, kernel_launches, graph_captures, ...)


def run_model(model: CudaModel, so_path: str | os.PathLike, feeds: Mapping[str, np.ndarray], *,
              emulated: bool, timeout: float = 300.0, time: dict | None = None, sanitize: str | None = "auto",
              weights: str | None = None, bindings: Mapping[str, int] | None = None,
              reserve: Mapping[str, int] | None = None, runs: int = 1, graphs: bool | None = None,
              check_launches: bool | None = None, tensor_cores: bool | None = None,
              in_place: Mapping[str, str] | None = None) -> ModelRun:
    """Run ``model``'s library ``so_path`` (``emulated_library`` or
    ``gpu_library``) on ``feeds`` in a child process.

    ``time``: ``{"warmup", "min_repeats", "min_time_s"}`` to time the runs
    (``timing.measure`` on CUDA events recorded before and after each run),
    their seconds per run in ``times``; else the feeds run ``runs`` times.
    ``reserve``: the sizes ``blockc_reserve`` reserves the arena for (None:
    those ``feeds`` bind). ``graphs``, ``check_launches``, ``tensor_cores``:
    the library's switches ``BLOCKC_CUDA_GRAPHS``, ``BLOCKC_CUDA_CHECK_LAUNCHES``
    and ``BLOCKC_CUDA_TENSOR_CORES`` (``blockc_model.h``); None leaves them as
    this process's environment has them. ``sanitize``: the library's sanitizer (see ``run_child``).
    ``weights``: the model's weights file (``write_weights``), written once by
    a caller that runs many times; None writes it for this run.
    ``bindings``: the sizes ``feeds`` bind, from a caller that has checked
    them against the graph already (``Compiled.check``); None checks them here.
    ``in_place``: output name -> input name, each output written into that
    input's device buffer (``present.0.key`` -> ``past.0.key``: a KV cache
    updated in place, as a C API user passes it); of the same type.
    """
    if bindings is None:
        bindings = bind_inputs(model.graph, feeds)
    switches = {name: str(int(on)) for name, on in (("BLOCKC_CUDA_GRAPHS", graphs),
                                                     ("BLOCKC_CUDA_CHECK_LAUNCHES", check_launches),
                                                     ("BLOCKC_CUDA_TENSOR_CORES", tensor_cores))
                if on is not None}
    with tempfile.TemporaryDirectory(prefix="blockc-cuda-run-") as io:
        files = _output_files(model, bindings, io)
        if weights is None:
            weights = write_weights(model, io)
        spec = {"call": "model", "weights": weights, "dims": [bindings[s] for s in model.symbols],
                "reserve": [reserve[s] for s in model.symbols] if reserve is not None else None,
                "runs": runs, "inputs": [], "outputs": [], "time": time}
        for k, (name, _) in enumerate(model.inputs):
            spec["inputs"].append({"path": _input_file(io, k, feeds[name])})
        in_names = [name for name, _ in model.inputs]
        for name, _, _, f in files:
            spec["outputs"].append(dict(f))
            if in_place and name in in_place:
                spec["outputs"][-1]["alias"] = _in_place_input(model, name, in_place[name], in_names)
        result = run_child(so_path, spec, io, what=f"the model {model.graph.name!r}", timeout=timeout,
                           sanitize=sanitize, emulated=emulated, switches=switches)
        outputs = {name: np.fromfile(f["path"], dtype=dtype.numpy).reshape(shape) for name, dtype, shape, f in files}
        return ModelRun(outputs, result.get("times", []), result.get("counters", {}))
