"""Run an emulated CUDA library (built by ``toolchain.compile_emulated``) safely.

The library is loaded with ctypes in a child Python process with a timeout, so
a crash, an abort from the emulator's checks or a hang cannot take the caller
down; each becomes an ``EmulationError`` that carries the child's stderr, where
the emulator names the kernel, block, thread and warp lane.

Calling convention. The library exports a C entry point::

    extern "C" int entry(void** buffers, const long long* ints);

``run_emulated(so, "entry", args)`` takes ``args`` as a sequence of numpy arrays
and Python ints, in any order. The arrays, in order, become ``buffers[0..]``:
each is copied into its own 256-byte-aligned allocation (``cudaMalloc``'s
alignment; "device" memory is host memory under emulation), so the entry may
pass them straight to ``BLOCKC_LAUNCH`` or ``cudaMemcpy`` them. The ints, in
order, become ``ints[0..]``. The entry returns 0 on success, or a
``cudaError_t`` (``return cudaGetLastError();`` is the usual last line), which
raises ``EmulationError``. The result is the final contents of every array
argument, in order, as new arrays of the same dtype and shape (inputs are never
modified), so outputs are read back from the buffers the caller passed in.

Libraries built with a sanitizer are found out from their linked runtime
(``sanitize="auto"``) and run with it preloaded; a report makes the run fail.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from blockc.codegen.cuda import toolchain
from blockc.errors import BlockcError

DEFAULT_TIMEOUT = 60.0


class EmulationError(BlockcError):
    """An emulated run failed; ``stderr`` holds everything the child printed."""

    def __init__(self, message: str, stderr: str = "", returncode: int | None = None):
        self.stderr, self.returncode = stderr, returncode
        super().__init__(message + _excerpt(stderr))


class EmulationCrash(EmulationError):
    """The child died: a failed emulator check (abort), a signal, or a sanitizer report."""


class EmulationTimeout(EmulationError):
    """The child ran past its timeout and was killed."""


# The child needs no numpy and no blockc: stdlib ctypes only, so it starts fast.
_CHILD = r"""
import ctypes, json, sys
spec = json.load(open(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
lib = ctypes.CDLL(spec["so"])
try:
    fn = getattr(lib, spec["entry"])
except AttributeError:
    sys.exit("blockc-emu runner: %s exports no function %s" % (spec["so"], spec["entry"]))
fn.restype = ctypes.c_int
fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong)]
ptrs = []
for b in spec["buffers"]:
    p = ctypes.c_void_p()
    if libc.posix_memalign(ctypes.byref(p), 256, max(b["nbytes"], 1)) != 0:
        sys.exit("blockc-emu runner: out of memory")
    with open(b["path"], "rb") as f:
        data = f.read()
    ctypes.memmove(p, data, len(data))
    ptrs.append(p.value)
buffers = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
ints = (ctypes.c_longlong * max(len(spec["ints"]), 1))(*spec["ints"])
rc = fn(buffers, ints)
sys.stderr.flush()
for b, p in zip(spec["buffers"], ptrs):
    with open(b["path"], "wb") as f:
        f.write(ctypes.string_at(p, b["nbytes"]))
with open(spec["result"], "w") as f:
    json.dump({"rc": rc}, f)
"""

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


def _child_env(sanitize: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if sanitize is None:
        return env
    env["LD_PRELOAD"] = toolchain.sanitizer_runtime(sanitize)
    if sanitize == "address":
        env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:verify_asan_link_order=0:" + env.get("ASAN_OPTIONS", "")
    else:
        env["TSAN_OPTIONS"] = "halt_on_error=1:report_signal_unsafe=0:" + env.get("TSAN_OPTIONS", "")
    return env


def run_emulated(so_path: str | os.PathLike, entry: str, args: Sequence[np.ndarray | int], *,
                 timeout: float = DEFAULT_TIMEOUT, sanitize: str | None = "auto") -> list[np.ndarray]:
    """Call ``entry(buffers, ints)`` in a child process; return every array argument's
    final contents, in order. See the module docstring for the calling convention.

    Raises EmulationCrash when the child dies (an emulator check, a signal, a sanitizer
    report), EmulationTimeout after ``timeout`` seconds, EmulationError when the entry
    returns non-zero. ``sanitize="auto"`` reads the library's linked sanitizer.
    """
    so_path = Path(so_path).resolve()
    if sanitize == "auto":
        sanitize = linked_sanitizer(so_path)
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
    with tempfile.TemporaryDirectory(prefix="blockc-emu-run-") as tmp:
        buffers = []
        for i, a in enumerate(arrays):
            path = os.path.join(tmp, f"buf{i}.bin")
            a.tofile(path)
            buffers.append({"path": path, "nbytes": int(a.nbytes)})
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump({"so": str(so_path), "entry": entry, "buffers": buffers, "ints": ints,
                       "result": result_path}, f)
        cmd = [sys.executable, "-I", "-c", _CHILD, spec_path]
        try:
            proc = subprocess.run(cmd, env=_child_env(sanitize), capture_output=True, text=True,
                                  timeout=timeout, errors="replace")
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise EmulationTimeout(f"{entry} in {so_path.name} did not finish within {timeout:g} s "
                                   "(an endless loop in a kernel?)", err) from None
        if proc.returncode != 0:
            if proc.returncode < 0:
                how = f"killed by {signal.Signals(-proc.returncode).name}"
            else:
                how = f"exited with status {proc.returncode}"
            if "Sanitizer" in proc.stderr:
                how += " after a sanitizer report"
            raise EmulationCrash(f"{entry} in {so_path.name}: the emulator process {how}",
                                 proc.stderr, proc.returncode)
        with open(result_path) as f:
            rc = json.load(f)["rc"]
        if rc != 0:
            raise EmulationError(f"{entry} in {so_path.name} returned {rc} ({_CUDA_ERRORS.get(rc, 'cudaError_t')})",
                                 proc.stderr, rc)
        return [np.fromfile(b["path"], dtype=a.dtype).reshape(a.shape) for a, b in zip(arrays, buffers)]
