"""GEMMs: cuBLASLt by default on a GPU build, the bias/activation/residual in
the GEMM's epilogue (no separate bias kernel), TF32 only when asked for, the
tiled kernel's numbers on the emulator, and builds that link cuBLASLt from
the toolkit or NVIDIA's wheel (checked with ldd)."""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

import blockc
from blockc.cli import main
from blockc.codegen.cuda import build as cuda_build
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.kernel import CudaCodegenError
from blockc.codegen.cuda.lower import generate
from blockc.errors import BlockcError

NVCC = toolchain.find_nvcc()


def _cublas():
    try:
        return toolchain.find_cublas()
    except toolchain.ToolchainError:
        return None


def gpt2_block(d_model=768, heads=12, dtype=None):
    settings = {"d_model": str(d_model), "heads": str(heads)} | ({"dtype": dtype} if dtype else {})
    model = blockc.build_model("gpt2-block", settings)
    return model, blockc.optimize(blockc.trace(model)).graph


# ---- what a GPT-2 block launches -------------------------------------------------------------

# Before: 20 launches per block, three of them bias adds after GEMMs (QKV,
# attention output, and the FFN output's bias+residual chain), and the
# attention's split, transposes, batched score GEMMs and softmax. Now 7:
# layernorm, 4 GEMMs with their epilogues, one attention kernel, add+layernorm.
GPT2_BLOCK_GEMMS = [["matmul", "add"], ["matmul", "add"], ["matmul_bias_act"], ["matmul", "add", "add"]]


@pytest.mark.parametrize("gemm", ["cublas", "tiled"])
def test_gpt2_block_has_no_bias_kernel_after_a_gemm(gemm):
    model, graph = gpt2_block()
    cm = generate(graph, blockc.init_weights(model), gemm=gemm)
    gemms = [s.ops for s in cm.steps if s.ops[0] in ("matmul", "matmul_bias_act")]
    assert gemms == GPT2_BLOCK_GEMMS
    assert not any(s.ops[0] == "add" for s in cm.steps)   # no bias add, no residual add: all in epilogues
    assert len(cm.steps) == 7
    if gemm == "cublas":
        assert all(s.name.startswith("cublaslt_gemm") for s in cm.steps if s.ops[0].startswith("matmul"))
        # GPT-2's tanh-GELU is cuBLASLt's own GELU epilogue: the FFN's first GEMM launches no kernel of ours
        fc1 = next(s for s in cm.steps if s.ops == ["matmul_bias_act"])
        assert "CUBLASLT_EPILOGUE_GELU_BIAS" in fc1.source and fc1.kernels == []
        assert cm.source.count("cublasLtMatmul(") == 1   # one helper; the sites call it
    else:
        assert "cublas" not in cm.source.lower()


def test_erf_gelu_keeps_the_bias_epilogue_and_one_pass():
    # cuBLASLt's GELU is the tanh form: BERT's erf-GELU is applied by a pass over the output
    model = blockc.build_model("bert-base", {"layers": "1", "d_model": "64", "heads": "2", "vocab": "30"})
    cm = generate(blockc.to_form(blockc.trace(model), "fused"), blockc.init_weights(model), gemm="cublas")
    fc1 = [s for s in cm.steps if s.ops == ["matmul_bias_act"]]
    assert fc1 and all("CUBLASLT_EPILOGUE_BIAS" in s.source and "blockc_gelu_erf" in s.source for s in fc1)
    assert all(s.kernels == [f"{s.name}_after"] for s in fc1)
    assert "CUBLASLT_EPILOGUE_GELU" not in cm.source


def test_fp16_gemms_run_on_tensor_cores_with_fp32_accumulation():
    model, graph = gpt2_block(d_model=64, heads=2, dtype="float16")
    cm = generate(graph, blockc.init_weights(model), gemm="cublas")
    specs = re.findall(r"static const blockc_gemm_spec spec = \{ \"\w+\", (\w+), sizeof\(\w+\), (\w+), ", cm.source)
    assert specs and set(specs) == {("CUDA_R_16F", "CUBLAS_COMPUTE_32F")}


# ---- TF32 ------------------------------------------------------------------------------------

def test_tf32_only_changes_the_compute_type():
    model, graph = gpt2_block(d_model=64, heads=2)
    weights = blockc.init_weights(model)
    plain, tf32 = generate(graph, weights, gemm="cublas"), generate(graph, weights, gemm="cublas", tf32=True)
    assert "CUBLAS_COMPUTE_32F_FAST_TF32" not in plain.source
    sites = [s for s in tf32.steps if "cublaslt" in s.name]
    assert len(re.findall(r"CUBLAS_COMPUTE_32F_FAST_TF32, CUBLASLT_EPILOGUE", tf32.source)) == len(sites) == 4
    undone = tf32.source.replace("CUBLAS_COMPUTE_32F_FAST_TF32", "CUBLAS_COMPUTE_32F").replace("_tf32", "")
    assert undone == plain.source
    # float16 already runs on tensor cores: TF32 changes nothing there
    model16, graph16 = gpt2_block(d_model=64, heads=2, dtype="float16")
    w16 = blockc.init_weights(model16)
    assert generate(graph16, w16, gemm="cublas", tf32=True).source == generate(graph16, w16, gemm="cublas").source


def test_tf32_needs_cublas():
    model, graph = gpt2_block(d_model=64, heads=2)
    weights = blockc.init_weights(model)
    with pytest.raises(CudaCodegenError, match="tf32 needs --gemm cublas"):
        generate(graph, weights, gemm="tiled", tf32=True)
    with pytest.raises(CudaCodegenError, match="unknown gemm 'cutlass'"):
        generate(graph, weights, gemm="cutlass")


def test_tf32_and_gemm_are_refused_where_they_change_nothing(capsys):
    assert main(["run", "tiny", "--tf32"]) == 2
    assert "backend 'ort' does not take the option 'tf32' (cuda takes it)" in capsys.readouterr().err
    assert main(["run", "tiny", "--backend", "cuda-emu", "--tf32"]) == 2
    assert "backend 'cuda-emu' does not take the option 'tf32' (cuda takes it)" in capsys.readouterr().err
    assert main(["check", "tiny", "--backend", "cuda-emu", "--gemm", "cublas"]) == 2
    assert "cuBLAS cannot be emulated" in capsys.readouterr().err


def test_check_with_tf32_says_it_needs_a_gpu(capsys):
    from blockc.runtime.cuda_runner import cuda_available
    if cuda_available()[0]:
        pytest.skip("a GPU is here: tests/runtime's GPU tests run TF32 for real")
    assert main(["check", "tiny", "--backend", "cuda", "--tf32"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


# ---- per-model state, checked errors ---------------------------------------------------------

def test_cublas_state_is_per_model_and_every_call_is_checked():
    model, graph = gpt2_block(d_model=64, heads=2)
    src = generate(graph, blockc.init_weights(model), gemm="cublas").source
    assert "blockc_gemm_state gemm;" in src.split("struct blockc_model {")[1].split("};")[0]
    assert not re.search(r"static\s+cublasLtHandle_t", src)            # no process-global handle
    assert "static thread_local char blockc_error_text" in src          # the last error is per thread...
    assert "memcpy(m->error, blockc_error_text" in src                  # ...and a run's failure per model
    assert "blockc_model_error" in src
    calls = re.findall(r"^.*\bcublasLt(?!\w*Destroy)\w+\(.*$", src, re.M)
    unchecked = [c for c in calls if "BLOCKC_LT_CHECK" not in c and "status =" not in c
                 and not c.strip().startswith(("//", "#", "const char*"))
                 and "cublasLtGetStatusString" not in c and "cublasLtMatmulPreferenceAttributes_t" not in c]
    assert not unchecked, unchecked
    # a failure names the GEMM it happened in
    assert 'blockc_set_error("GEMM %s: %s failed: %s", (name)' in src


# ---- the tiled kernel's epilogue, emulated -----------------------------------------------------

GRAPH = """graph g(%x: f32[batch,5,24], %r: f32[batch,5,16]) {
  param @w: f32[24,16]
  param @b: f32[16]
  %0:f32[batch,5,16] = matmul %x, @w
  %1:f32[batch,5,16] = add @b, %0
  %2:f32[batch,5,16] = add %r, %1
  return y=%2
}
"""


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++")
@pytest.mark.parametrize("keep_sum", [False, True])
def test_bias_and_residual_in_the_tiled_epilogue_match_the_reference(keep_sum):
    from blockc.runtime.cuda_runner import emulated_library, run_model
    text = GRAPH.replace("return y=%2", "return y=%2, s=%1") if keep_sum else GRAPH
    g = blockc.parse_graph(text)
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((24, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    cm = generate(g, weights)
    # a value that is a graph output is written, so its add stays outside the GEMM
    assert [s.ops for s in cm.steps] == ([["matmul", "add"], ["add"]] if keep_sum else [["matmul", "add", "add"]])
    feeds = {"x": rng.standard_normal((3, 5, 24)).astype(np.float32),
             "r": rng.standard_normal((3, 5, 16)).astype(np.float32)}
    out = run_model(cm, emulated_library(cm), feeds, emulated=True).outputs
    ref = blockc.run_reference(g, weights, feeds, float64=True)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++")
@pytest.mark.parametrize("act", ["relu %1", "gelu %1 {approximate=\"none\"}", "gelu %1 {approximate=\"tanh\"}",
                                 "silu %1"])
def test_an_activation_after_the_bias_is_the_epilogue(act):
    from blockc.runtime.cuda_runner import emulated_library, run_model
    g = blockc.parse_graph(GRAPH.replace("add %r, %1", act).replace(", %r: f32[batch,5,16]", ""))
    rng = np.random.default_rng(1)
    weights = {"w": rng.standard_normal((24, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    cm = generate(g, weights)
    assert [s.ops for s in cm.steps] == [["matmul", "add", act.split()[0]]]
    cublas = generate(g, weights, gemm="cublas").source
    # cuBLASLt's GELU is the tanh form: erf-GELU (and SiLU, which it lacks) keeps the bias epilogue and a
    # pass of its own
    lt = "GELU_BIAS" if "tanh" in act else ("RELU_BIAS" if "relu" in act else "BIAS")
    assert f"CUBLASLT_EPILOGUE_{lt} }};" in cublas
    assert ("_after" in cublas) == (lt == "BIAS")
    feeds = {"x": rng.standard_normal((2, 5, 24)).astype(np.float32)}
    out = run_model(cm, emulated_library(cm), feeds, emulated=True).outputs
    ref = blockc.run_reference(g, weights, feeds, float64=True)
    np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-5, atol=1e-5)


def test_the_emulator_refuses_a_cublas_build():
    from blockc.runtime.cuda_runner import emulated_library
    model, graph = gpt2_block(d_model=64, heads=2)
    with pytest.raises(BlockcError, match="cannot run --gemm cublas"):
        emulated_library(generate(graph, blockc.init_weights(model), gemm="cublas"))


# ---- compiled and linked: toolkit or wheel, checked with ldd ----------------------------------

def _toolkit_from(found, root):
    """A CUDA-toolkit layout (include/, lib64/ with the unversioned link) holding ``found``'s cuBLASLt."""
    (root / "include").mkdir(parents=True)
    (root / "lib64").mkdir()
    for name in os.listdir(found.include):
        (root / "include" / name).symlink_to(os.path.join(found.include, name))
    so = f"libcublasLt.so.{found.major}"
    (root / "lib64" / so).symlink_to(os.path.join(found.lib, so))
    (root / "lib64" / "libcublasLt.so").symlink_to(so)
    return root


@pytest.mark.skipif(NVCC.path is None, reason=NVCC.reason)
@pytest.mark.parametrize("where", ["wheel", "toolkit"])
def test_cublas_build_compiles_links_and_resolves(where, tmp_path, monkeypatch):
    found = _cublas()
    if found is None:
        pytest.skip("no cuBLASLt: pip install 'blockc[cuda]' (nvidia-cublas)")
    nvcc = toolchain.find_toolkit()
    if where == "toolkit":
        # the toolkit layout, made from what is installed, found before any wheel
        toolkit = _toolkit_from(found, tmp_path / "cuda")
        monkeypatch.setattr(toolchain, "STANDARD_CUDA", toolkit)
        monkeypatch.setattr(toolchain, "_toolkit_of", lambda nvcc: toolkit)
        assert toolchain.find_cublas().lib == os.path.realpath(toolkit / "lib64")
    model, graph = gpt2_block(d_model=64, heads=2, dtype="float16")
    cm = generate(graph, blockc.init_weights(model), gemm="cublas")
    out = tmp_path / "build"
    cuda_build.write_build(cm, str(out))
    cmd = cuda_build.nvcc_command(nvcc, ("sm_80", "sm_90"), gemm=cm.gemm, origin=str(out))   # warnings are errors
    proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # RUNPATH: cuBLASLt's folder from $ORIGIN first (a moved cache and environment), then absolute
    dynamic = subprocess.run(["readelf", "-d", str(out / "libblockc_model.so")], capture_output=True, text=True).stdout
    runpath = re.search(r"RUNPATH.*\[(.*)\]", dynamic).group(1).split(":")
    lib = toolchain.find_cublas().lib
    assert runpath[0].startswith("$ORIGIN/") and os.path.normpath(runpath[0].replace("$ORIGIN", str(out))) == lib
    assert runpath[1:] == [lib]
    ldd = subprocess.run(["ldd", str(out / "libblockc_model.so")], capture_output=True, text=True).stdout
    line = next(l for l in ldd.splitlines() if "libcublasLt.so" in l)
    assert "not found" not in line and f"libcublasLt.so.{found.major} => " in line
    if where == "toolkit":
        assert "/cuda/lib64/libcublasLt" in line     # the rpath points at the toolkit's folder
    assert "libcublas.so" not in ldd.replace("libcublasLt.so", "")   # only cuBLASLt is needed
    # build.sh carries the same command
    assert f"-l:libcublasLt.so.{found.major}" in (out / "build.sh").read_text()


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++")
def test_a_failed_run_is_kept_by_its_model_not_the_process(tmp_path):
    import sys
    from blockc.runtime.cuda_runner import emulated_library, write_weights
    # test_host's reservation test builds this model: one build in the suite's cache for both
    model = blockc.build_model("tiny", {"layers": "1"})
    cm = generate(blockc.to_form(blockc.trace(model), "fused"), blockc.init_weights(model))
    weights = write_weights(cm, str(tmp_path))
    dims = [10 ** 6 if s == "seq" else 1 for s in cm.symbols]   # seq past the position table
    script = f"""
import ctypes
lib = ctypes.CDLL({str(emulated_library(cm))!r})
vp = ctypes.c_void_p
lib.blockc_create.restype, lib.blockc_create.argtypes = vp, [ctypes.c_char_p]
lib.blockc_model_error.restype, lib.blockc_model_error.argtypes = ctypes.c_char_p, [vp]
lib.blockc_run.argtypes = [vp, vp, vp, ctypes.POINTER(ctypes.c_longlong), vp]
lib.blockc_destroy.argtypes = [vp]
a, b = lib.blockc_create({weights.encode()!r}), lib.blockc_create({weights.encode()!r})
dims = (ctypes.c_longlong * {len(dims)})(*{dims!r})
print(lib.blockc_run(a, None, None, dims, None))
print(lib.blockc_model_error(a).decode())
print(repr(lib.blockc_model_error(b).decode()))
lib.blockc_destroy(a), lib.blockc_destroy(b)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rc, error_a, error_b = proc.stdout.splitlines()
    assert rc == "1" and "over the model's maximum" in error_a and error_b == "''"


# ---- without cuBLASLt: the tiled GEMM, said in one line ------------------------------------

def _no_cublas(*_args, **_kwargs):
    raise toolchain.ToolchainError("no cuBLASLt (cublasLt.h with libcublasLt.so.N): ...")


def test_without_cublas_a_gpu_build_falls_back_to_the_tiled_gemm_with_a_notice(monkeypatch, tmp_path):
    import json

    from blockc.cli import main
    monkeypatch.setattr(toolchain, "find_cublas", _no_cublas)
    with pytest.warns(UserWarning, match=r"^no cuBLASLt on this machine: GEMMs use the tiled kernel "
                                         r"\(pip install 'blockc\[cuda\]' for cuBLASLt\)$") as notices:
        assert main(["cuda", "tiny", "--set", "layers=1", "--no-compile", "-o", str(tmp_path / "b")]) == 0
    assert len([w for w in notices if w.category is UserWarning]) == 1    # one line, once
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["gemm"] == "tiled"
    assert cuda_build.gpu_gemm("cublas") == "cublas"       # asked for by name: no fallback


def test_the_gpu_backend_falls_back_too(monkeypatch):
    from blockc.runtime.backend import make_backend
    monkeypatch.setattr(toolchain, "find_cublas", _no_cublas)
    with pytest.warns(UserWarning, match="no cuBLASLt"):
        assert make_backend("cuda").gemm == "tiled"
    assert make_backend("cuda", gemm="cublas").gemm == "cublas"


# ---- batch x heads past the grid's 65,535 along y and z ------------------------------------

BATCHED = """graph g(%q: f32[batch,3,1,2], %k: f32[batch,3,2,1]) {
  %0:f32[batch,3,1,1] = matmul %q, %k
  return y=%0
}
"""


# The launch geometry alone (blockc_cuda.h's blockc_grid_yz and the kernel's loop), at the real
# size: one thread a block, so the emulator runs 100,000 blocks in seconds, against its GPU limit.
SPREAD = r"""#include "blockc_cuda.h"
__global__ void cover(long long count, int* hits) {
  for (long long t = blockc_yz_first(); t < count; t += blockc_yz_step()) atomicAdd(&hits[t], 1);
}
extern "C" int run_cover(void** buffers, const long long* ints) {
  const long long count = ints[0], most = ints[1];
  const dim3 grid = most > 0 ? blockc_grid_yz(1, count, most) : blockc_grid_yz(1, count);
  long long* seen = (long long*)buffers[1];
  seen[0] = grid.x, seen[1] = grid.y, seen[2] = grid.z, seen[3] = blockc_max_grid_yz();
  BLOCKC_LAUNCH(cover, grid, dim3(1), 0, 0, count, (int*)buffers[0]);
  return (int)cudaGetLastError();
}
"""


@pytest.fixture(scope="module")
def spread_lib(tmp_path_factory):
    from blockc.codegen.cuda.templates import TEMPLATE_DIR
    if toolchain.find_gxx() is None:
        pytest.skip("no g++")
    src = tmp_path_factory.mktemp("spread") / "spread.cu"
    src.write_text(SPREAD)
    # a model's emulated build's flags (racecheck on): the session's cached emulator runtime is theirs
    return toolchain.compile_emulated([src], src.with_suffix(".so"),
                                      extra_flags=["-DBLOCKC_EMULATE", f"-I{TEMPLATE_DIR}"])


@pytest.mark.parametrize("count, most", [(100_000, 0), (21, 4), (16, 4), (1, 4), (65_535 * 2 + 1, 0)])
def test_batch_x_heads_past_65535_is_spread_over_y_and_z_each_piece_once(spread_lib, count, most):
    from blockc.runtime.cuda_runner import run_emulated
    hits, seen = run_emulated(spread_lib, "run_cover", [np.zeros(count, np.int32), np.zeros(4, np.int64),
                                                         count, most], timeout=120)
    x, y, z, device = seen
    assert device == 65_535                                   # a GPU's limit, which the emulator enforces
    assert x == 1 and 1 <= y <= (most or device) and 1 <= z <= (most or device)
    np.testing.assert_array_equal(hits, np.ones(count, np.int32))   # every (tile, batch) exactly once


def test_a_batch_of_gemms_past_the_grids_y_and_z_limit_is_split_over_both(monkeypatch, spread_lib):
    # The emulator's limit, lowered from a GPU's 65,535 to 4 (the device reports it too), lets
    # 7 x 3 = 21 batches of one row tile each cross it with a few blocks: one grid axis
    # would need 21 > 4, and even y x z = 16 < 21 leaves the kernel a rest to loop over.
    from blockc.runtime.cuda_runner import emulated_library, run_emulated
    monkeypatch.setenv("BLOCKC_EMU_MAX_GRID_YZ", "4")
    _, (_, y, z, device) = run_emulated(spread_lib, "run_cover", [np.zeros(21, np.int32), np.zeros(4, np.int64), 21, 0])
    assert (device, y, z) == (4, 4, 4)    # the lowered limit holds, so the GEMM below must split to pass it
    _batched_gemm_matches_the_reference(7, emulated_library, emulated=True)


# The generated GEMM's own launcher at batch x heads = 100,000, its launch recorded instead of run
# (the kernel is what the test above runs): every grid dim within the device's limits.
LAUNCHER = r"""#include "blockc_cuda.h"
static dim3 recorded;
#undef BLOCKC_LAUNCH
#define BLOCKC_LAUNCH(kernel, grid, block, shmem, stream, ...) (recorded = dim3(grid))
#include "model.cu"
extern "C" int run_launcher(void** buffers, const long long* ints) {
  NAME_batch batch = {{1, 1, 1, ints[0]}, {0, 0, 0, 2}, {0, 0, 0, 2}};
  NAME_launch(nullptr, nullptr, nullptr, 1, 1, 2, batch, 0);
  int limits[3] = {0, 0, 0};
  cudaDeviceGetAttribute(&limits[0], cudaDevAttrMaxGridDimX, 0);
  cudaDeviceGetAttribute(&limits[1], cudaDevAttrMaxGridDimY, 0);
  cudaDeviceGetAttribute(&limits[2], cudaDevAttrMaxGridDimZ, 0);
  long long* seen = (long long*)buffers[0];
  seen[0] = recorded.x, seen[1] = recorded.y, seen[2] = recorded.z;
  const long long every_gpu[3] = {0x7fffffffLL, 65535, 65535};  // where the device does not say
  for (int i = 0; i < 3; ++i) seen[3 + i] = limits[i] > 0 ? limits[i] : every_gpu[i];
  return 0;
}
"""


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++")
def test_the_gemm_launcher_keeps_every_grid_dim_within_the_devices_limits_at_100000_batches(tmp_path):
    from blockc.codegen.cuda.templates import TEMPLATE_DIR
    from blockc.runtime.cuda_runner import run_emulated
    cm = generate(blockc.parse_graph(BATCHED), {}, gemm="tiled")
    name, = re.findall(r"static void (\w+)_launch\(", cm.source)
    (tmp_path / "model.cu").write_text(cm.source)
    (tmp_path / "launcher.cu").write_text(LAUNCHER.replace("NAME_", name + "_"))
    lib = toolchain.compile_emulated([tmp_path / "launcher.cu"], tmp_path / "launcher.so",
                                     extra_flags=["-DBLOCKC_EMULATE", f"-I{tmp_path}", f"-I{TEMPLATE_DIR}"])
    grid_and_limits, = run_emulated(lib, "run_launcher", [np.zeros(6, np.int64), 100_000 * 3])
    grid, limits = grid_and_limits[:3], grid_and_limits[3:]
    assert (grid >= 1).all() and (grid <= limits).all(), f"grid {grid} past the limits {limits}"
    assert grid[1] * grid[2] >= 300_000    # one block a (row tile, batch): no block loops at this size


def _batched_gemm_matches_the_reference(batch: int, library, *, emulated: bool) -> None:
    from blockc.runtime.cuda_runner import run_model
    g = blockc.parse_graph(BATCHED)
    cm = generate(g, {}, gemm="tiled")
    rng = np.random.default_rng(3)
    feeds = {"q": rng.standard_normal((batch, 3, 1, 2)).astype(np.float32),
             "k": rng.standard_normal((batch, 3, 2, 1)).astype(np.float32)}
    out = run_model(cm, library(cm), feeds, emulated=emulated).outputs
    np.testing.assert_allclose(out["y"], blockc.run_reference(g, {}, feeds, float64=True)["y"], rtol=1e-5, atol=1e-6)


def test_a_batch_of_gemms_past_65535_runs_on_a_gpu():
    # the real limit: 100,000 batches in one tiled GEMM launch (emulated, it takes minutes)
    from blockc.runtime.cuda_runner import cuda_available, gpu_library
    ok, why = cuda_available()
    if not ok:
        pytest.skip(why)
    _batched_gemm_matches_the_reference(100_000, gpu_library, emulated=False)


def test_cublas_asks_its_heuristic_in_an_eager_run_before_any_capture():
    # the first run at new dims launches eagerly (the plans are made there), the next captures;
    # a tiled build has no heuristic to ask and captures at once (its compile: the nvcc test above)
    model, graph = gpt2_block(d_model=64, heads=2, dtype="float16")
    weights = blockc.init_weights(model)
    lt = generate(graph, weights, gemm="cublas").source
    run_graph = lt[lt.index("static int blockc_run_graph("):]
    eager = run_graph.index("return blockc_launch(m, inputs, outputs, dims, stream, 0);")
    assert "m->eager_ran = 1;" in run_graph[:eager] and eager < run_graph.index("blockc_capture(m, g,")
    assert "eager_ran" not in generate(graph, weights, gemm="tiled").source
