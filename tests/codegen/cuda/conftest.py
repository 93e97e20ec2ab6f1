"""Emulated builds of the hand-written kernels in kernels/, shared by the tests here.

Each library is built once per session: fibers (the default), and one OS thread per
CUDA thread under AddressSanitizer and under ThreadSanitizer.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from blockc.codegen.cuda import toolchain

KERNELS = Path(__file__).parent / "kernels"
KERNEL_SOURCES = sorted(KERNELS.glob("*.cu"))


def _build(tmp_path_factory, sanitize: str | None) -> Path:
    if toolchain.find_gxx() is None:
        pytest.skip("g++ not found: the CUDA emulator needs a host C++ compiler")
    if sanitize is not None:
        try:
            toolchain.sanitizer_runtime(sanitize)
        except toolchain.ToolchainError as e:
            pytest.skip(str(e))
    out = tmp_path_factory.mktemp("emu") / f"kernels_{sanitize or 'fibers'}.so"
    return toolchain.compile_emulated(KERNEL_SOURCES, out, sanitize=sanitize, opt="-O1")


@pytest.fixture(scope="session")
def fiber_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, None)


@pytest.fixture(scope="session")
def asan_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "address")


@pytest.fixture(scope="session")
def tsan_lib(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "thread")
