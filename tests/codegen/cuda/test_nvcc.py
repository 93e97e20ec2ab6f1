"""The same .cu files the emulator runs compile with nvcc for sm_80 and sm_90 with every
warning an error, and ptxas's resource report is parsed for each kernel."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from blockc.codegen.cuda import toolchain

KERNEL_SOURCES = sorted((Path(__file__).parent / "kernels").glob("*.cu"))

NVCC = toolchain.find_nvcc()
pytestmark = pytest.mark.skipif(NVCC.path is None, reason=f"nvcc tests skipped: {NVCC.reason}")
ARCHS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("nvcc")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda src: toolchain.compile_nvcc(src, ARCHS, werror=True, out=out / f"{src.stem}.o"),
                           KERNEL_SOURCES)
        return dict(zip((s.name for s in KERNEL_SOURCES), results))


@pytest.mark.parametrize("source", KERNEL_SOURCES, ids=lambda s: s.name)
def test_kernel_file_compiles_and_reports_resources(compiled, source):
    result = compiled[source.name]
    assert result.object_path.exists()
    kernels = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", source.read_text())
    assert kernels
    for name in kernels:
        for arch in ARCHS:
            k = result.kernel(name, arch)
            assert k.registers > 0, k
            assert isinstance(k.spill_store_bytes, int) and isinstance(k.spill_load_bytes, int)
            assert k.spill_store_bytes >= 0 and k.spill_load_bytes >= 0


def test_static_shared_memory_is_reported(compiled):
    # row_sum holds 8 warp sums; shared_race 128 floats.
    assert compiled["block_reduce.cu"].kernel("row_sum", "sm_90").shared_bytes == 32
    assert compiled["faults.cu"].kernel("shared_race", "sm_80").shared_bytes == 512


def test_warnings_are_errors(tmp_path):
    src = tmp_path / "warns.cu"
    src.write_text("__global__ void k(float* x) { int unused; x[0] = 1.0f; }\n")
    with pytest.raises(toolchain.ToolchainError, match=r"(?s)nvcc failed to compile warns\.cu.*unused"):
        toolchain.compile_nvcc(src, ("sm_80",), werror=True)


def test_a_model_with_no_intermediate_buffer_compiles(tmp_path):
    """Every value a weight, an input or an output: the host code plans an
    empty arena, and nothing it writes for the arena is left unused (nvcc's
    warnings are errors)."""
    import blockc
    from blockc.codegen.cuda import build as cuda_build
    from blockc.codegen.cuda.lower import generate
    graph = blockc.parse_graph("graph one(%x: f32[r,n]) {\n  %0:f32[r,n] = softmax %x {axis=-1}\n  return y=%0\n}\n")
    cm = generate(graph, {})
    cuda_build.write_build(cm, str(tmp_path))
    assert "blockc_align" not in (tmp_path / "model.cu").read_text()
    result = toolchain.compile_nvcc(str(tmp_path / "model.cu"), ["sm_80"], werror=True, extra_flags=[f"-I{tmp_path}"])
    assert result.kernels
