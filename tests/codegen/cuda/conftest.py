"""Emulated builds of the hand-written kernels in kernels/, shared by the tests here.

Each library is built once per session: fibers (the default) and one OS thread per
CUDA thread, both race-checked, and OS threads under AddressSanitizer and under
ThreadSanitizer.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from blockc.codegen.cuda import toolchain

KERNELS = Path(__file__).parent / "kernels"
KERNEL_SOURCES = sorted(KERNELS.glob("*.cu"))


def _build(tmp_path_factory, sanitize: str | None, threads: bool | None = None) -> Path:
    if toolchain.find_gxx() is None:
        pytest.skip("g++ not found: the CUDA emulator needs a host C++ compiler")
    if sanitize is not None:
        try:
            toolchain.sanitizer_runtime(sanitize)
        except toolchain.ToolchainError as e:
            pytest.skip(str(e))
    out = tmp_path_factory.mktemp("emu") / f"kernels_{sanitize or ('threads' if threads else 'fibers')}.so"
    # A model's emulated build's flags (runtime.cuda_runner.emulated_library: -O2, -DBLOCKC_EMULATE, which
    # only blockc_cuda.h reads, not these kernels): its emulator runtime and precompiled header, cached
    # per set of flags, are then built once a session for both, not twice (-O1 here cost 3 sets, ~30 CPU-s)
    return toolchain.compile_emulated(KERNEL_SOURCES, out, sanitize=sanitize, threads=threads,
                                      extra_flags=["-DBLOCKC_EMULATE"])


@pytest.fixture(scope="session")
def fiber_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, None)


@pytest.fixture(scope="session")
def threads_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, None, threads=True)


@pytest.fixture(scope="session")
def asan_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "address")


@pytest.fixture(scope="session")
def tsan_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "thread")


@pytest.fixture
def kernel_ptx():
    """``ptx(cuda_model, folder, arch)``: each kernel's PTX body in the
    model's model.cu, by mangled name (nvcc -ptx)."""
    nvcc = toolchain.find_nvcc()
    if nvcc.path is None:
        pytest.skip(nvcc.reason)

    def ptx(cm, folder, arch="sm_80") -> dict:
        from blockc.codegen.cuda.build import write_build
        write_build(cm, str(folder))
        out = Path(folder) / "model.ptx"
        cmd = [nvcc.path, "-ptx", "-std=c++17", f"-arch={arch}", f"-I{folder}", "-include",
               str(toolchain.EMU_HEADER), str(Path(folder) / "model.cu"), "-o", str(out)]
        subprocess.run(cmd, check=True, capture_output=True)
        return _entries(out)
    return ptx


def _entries(ptx: Path) -> dict:
    """Each kernel's body in a PTX file, by mangled name."""
    return {chunk.split("(", 1)[0]: chunk for chunk in ptx.read_text().split(".entry ")[1:]}


@pytest.fixture(scope="session")
def nvcc_keeping_ptx():
    """``build(cuda_model, folder, archs)``: ``toolchain.compile_nvcc`` of the model's
    model.cu (warnings as errors), and each arch's PTX that nvcc made on the way
    (``-keep``), each kernel's body by mangled name. A test of ptxas's report and
    a test of the PTX share one nvcc run instead of running cicc twice."""
    nvcc = toolchain.find_nvcc()
    if nvcc.path is None:
        pytest.skip(nvcc.reason)

    def build(cm, folder, archs=("sm_80", "sm_90")) -> tuple:
        from blockc.codegen.cuda.build import write_build
        folder, kept = Path(folder), Path(folder) / "kept"
        write_build(cm, str(folder))
        kept.mkdir()
        result = toolchain.compile_nvcc(str(folder / "model.cu"), list(archs), werror=True,
                                        extra_flags=[f"-I{folder}", "-keep", f"--keep-dir={kept}"])
        return result, {arch: _entries(kept / f"model.compute_{arch[3:]}.ptx") for arch in archs}
    return build


@pytest.fixture
def emulator():
    """The cuda-emu backend, or a skip saying why it cannot run here."""
    from blockc.runtime.backend import make_backend
    backend = make_backend("cuda-emu")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    return backend
