"""The generated host code (host.cu.j2, the C API of blockc_model.h): the
arena reserved once and never allocated in a run, a CUDA graph captured per
set of dims and replayed, a failed launch named by its kernel, and CUDA-event
timing. Proven on the emulator, which counts allocations, launches and graph
operations (``blockc_emu_counters``), and by nvcc compiling the same source."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import build as cuda_build
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.lower import generate
from blockc.ir.dims import Sym
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType

needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
NVCC = toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")
GOOD = np.array([3, 0, 9], np.int64)


def lookup() -> tuple[Graph, dict]:
    """ids i64[n] -> softmax(exp(table[ids])): three launches, two arena
    buffers, and ids the gather checks (c_api_user.c is written for it)."""
    g = Graph("lookup")
    ids = g.add_input("ids", TensorType(DType.int64, (Sym.var("n"),)))
    table = g.add_param("table", TensorType(DType.float32, (10, 8)))
    g.set_outputs([("y", g.op("softmax", g.op("exp", g.op("gather", table, ids))))])
    return g, {"table": np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32)}


def expected(weights: dict, ids) -> np.ndarray:
    return blockc.run_reference(lookup()[0], weights, {"ids": np.asarray(ids, np.int64)})["y"]


@pytest.fixture(scope="module")
def built():
    if toolchain.find_gxx() is None:
        pytest.skip("no g++: the CUDA emulator needs one")
    from blockc.runtime.cuda_runner import emulated_library
    g, weights = lookup()
    model = generate(g, weights)
    return model, emulated_library(model), weights


def run(built, feeds=None, **kw):
    from blockc.runtime.cuda_runner import run_model
    model, so, _ = built
    return run_model(model, so, feeds or {"ids": GOOD}, emulated=True, **kw)


# ---- the arena ---------------------------------------------------------------------------------
@needs_gxx
@pytest.mark.parametrize("graphs", [True, False])
def test_the_arena_is_reserved_once_and_runs_allocate_nothing(built, graphs):
    # reserved for more than is run: any dims up to the reservation, each
    result = run(built, reserve={"n": 64}, runs=3, graphs=graphs)
    assert result.counters["device_allocations"] == 0
    assert result.counters["kernel_launches"] == 3 * 3
    np.testing.assert_allclose(result.outputs["y"], expected(built[2], GOOD), rtol=1e-6)


@needs_gxx
def test_a_run_over_the_reservation_is_refused_with_its_own_code(built):
    from blockc.runtime.cuda_runner import CudaRunError
    with pytest.raises(CudaRunError, match=r"blockc_run in .* returned 2 \(dimension 'n' is 3, over the 2 "
                                           r"blockc_reserve reserved \(reserve more: blockc_run does not allocate\)\)"):
        run(built, reserve={"n": 2})


@needs_gxx
def test_a_reservation_over_the_models_limits_is_refused():
    from blockc.runtime.cuda_runner import CudaRunError, emulated_library, run_model
    model = blockc.build_model("tiny", {"layers": "1"})
    graph, weights = blockc.to_form(blockc.trace(model), "fused"), dict(blockc.init_weights(model))
    cm = generate(graph, weights)
    with pytest.raises(CudaRunError, match=r"blockc_reserve in .* returned 1 \(dimension 'seq' is 200, over the "
                                           r"model's maximum of 128\)"):
        run_model(cm, emulated_library(cm), {"input_ids": np.zeros((1, 4), np.int64)}, emulated=True,
                  reserve={"batch": 1, "seq": 200})


# ---- CUDA graphs ---------------------------------------------------------------------------------
@needs_gxx
def test_the_first_run_captures_a_graph_and_later_runs_replay_it(built):
    graphs = run(built, runs=3, graphs=True)
    assert {k: graphs.counters[k] for k in ("graph_captures", "graph_instantiations", "graph_launches")} == \
        {"graph_captures": 1, "graph_instantiations": 1, "graph_launches": 3}
    direct = run(built, runs=3, graphs=False)
    assert direct.counters["graph_launches"] == direct.counters["graph_captures"] == 0
    assert graphs.counters["kernel_launches"] == direct.counters["kernel_launches"] == 3 * 3
    np.testing.assert_array_equal(graphs.outputs["y"], direct.outputs["y"])   # the same launches, bit for bit
    np.testing.assert_allclose(graphs.outputs["y"], expected(built[2], GOOD), rtol=1e-6)


@needs_gxx
@pytest.mark.parametrize("graphs", [True, False])
def test_the_id_check_works_with_and_without_graphs(built, graphs):
    from blockc.runtime.cuda_runner import CudaRunError
    with pytest.raises(CudaRunError, match=r"returned 1 \(input 'ids': ids out of range \[0, 10\) \(the first, at "
                                           r"position 1, is 12; it indexes 'table', which has 10 rows\)\)"):
        # bindings given: Python's own check of the feeds (the same rule) is passed over
        run(built, {"ids": np.array([3, 12, 9], np.int64)}, bindings={"n": 3}, graphs=graphs)


@pytest.fixture(scope="module")
def c_api_user(built, tmp_path_factory):
    """c_api_user.c, built as strict C99 against blockc_model.h and the emulated library."""
    folder = tmp_path_factory.mktemp("c_api_user")
    model, so, weights = built
    Path(folder, "weights.bin").write_bytes(cuda_build.weights_blob(model.params))
    exe = folder / "c_api_user"
    subprocess.run(["gcc", "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror",
                    f"-I{Path(cuda_build.API_HEADER).parent}", str(Path(__file__).with_name("c_api_user.c")),
                    str(so), f"-Wl,-rpath,{Path(so).parent}", "-o", str(exe)], check=True)

    def run_it(**env) -> dict:
        import os
        proc = subprocess.run([str(exe), str(folder / "weights.bin")], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    return run_it


@needs_gxx
@pytest.mark.parametrize("graphs", ["1", "0"])
def test_a_c_program_reserves_runs_and_is_refused_as_the_header_says(c_api_user, built, graphs):
    out = c_api_user(BLOCKC_CUDA_GRAPHS=graphs)
    assert out["symbol"] == "n" and out["no_symbol"]
    # not reserved; reserved; runs; other output; back; an id past the table; good again; other dims; over
    assert out["rc"] == [2, 0, 0, 0, 0, 1, 0, 0, 2]
    assert out["unreserved_error"] == "no arena reserved: call blockc_reserve(model, max_dims) once before blockc_run"
    assert out["bad_id_error"].startswith("input 'ids': ids out of range [0, 10) (the first, at position 1, is 12;")
    assert out["over_error"].startswith("dimension 'n' is 5, over the 4 blockc_reserve reserved")
    weights = built[2]
    want = expected(weights, [3, 0, 9]).reshape(-1)
    np.testing.assert_allclose(out["y_a"], want, rtol=1e-6)
    np.testing.assert_allclose(out["y_b"], want, rtol=1e-6)
    np.testing.assert_allclose(out["y_two"], expected(weights, [3, 0]).reshape(-1), rtol=1e-6)
    done = {k: out["counters_after"][k] - out["counters_before"][k] for k in out["counters_after"]}
    assert done["device_allocations"] == 0 and done["kernel_launches"] == 7 * 3
    if graphs == "1":
        # captured at n=3; replayed; other output: captured, updated; back to `a`: captured, updated; bad ids,
        # then good: replayed twice; n=2: captured into a new graph; n=5: refused before any launch
        assert {k: done[k] for k in ("graph_captures", "graph_instantiations", "graph_updates", "graph_launches")} \
            == {"graph_captures": 4, "graph_instantiations": 2, "graph_updates": 2, "graph_launches": 7}
    else:
        assert done["graph_captures"] == done["graph_launches"] == 0


@needs_gxx
@pytest.mark.parametrize("switch", ["BLOCKC_CUDA_GRAPHS", "BLOCKC_CUDA_TENSOR_CORES"])
def test_a_bad_switch_value_is_refused_by_blockc_create(c_api_user, switch):
    out = c_api_user(**{switch: "yes"})
    assert not out["created"] and out["create_error"] == f"{switch} is 'yes': set it to 0 or 1"


# ---- a failed launch names its kernel --------------------------------------------------------------
def _broken(model):
    """``model`` with its softmax launched with 2048 threads a block (CUDA's limit is 1024)."""
    start = model.source.index("static void softmax_f32_8_launch(")
    end = model.source.index("\n}\n", start)
    launcher = model.source[start:end]
    assert launcher.count("dim3(128), 0, stream") == 1
    model.source = model.source[:start] + launcher.replace("dim3(128), 0, stream", "dim3(2048), 0, stream") \
        + model.source[end:]
    return model


@needs_gxx
@pytest.mark.parametrize("switches", [{"graphs": True}, {"graphs": False}, {"check_launches": True}])
def test_a_failed_launch_is_named_by_its_kernel_and_ir_nodes(switches):
    from blockc.runtime.cuda_runner import CudaRunError, emulated_library, run_model
    g, weights = lookup()
    model = _broken(generate(g, weights))
    with pytest.raises(CudaRunError) as err:
        run_model(model, emulated_library(model), {"ids": GOOD}, emulated=True, **switches)
    assert re.search(r"blockc_run in .* returned 1 \(launch 3 of 3, kernel softmax_f32_8 \(IR nodes %2: softmax\): "
                     r"invalid configuration argument\)", str(err.value)), str(err.value)


# ---- timing ----------------------------------------------------------------------------------------
@needs_gxx
def test_runs_are_timed_by_cuda_events_in_the_child(built):
    timed = run(built, time={"warmup": 1, "min_repeats": 4, "min_time_s": 0.0})
    assert len(timed.times) == 4 and all(0 < t < 0.05 for t in timed.times)   # a process start takes longer
    assert timed.counters["graph_launches"] == 5                             # warm-up and timed runs: replays
    np.testing.assert_allclose(timed.outputs["y"], expected(built[2], GOOD), rtol=1e-6)


def test_gpu_backends_say_they_time_on_cuda_events():
    from blockc.runtime.backend import make_backend
    for name in ("cuda", "cuda-emu"):
        backend = make_backend(name)
        assert backend.clock.startswith("CUDA events") and backend.times_itself


# ---- the same host code, compiled by nvcc ----------------------------------------------------------
@needs_nvcc
@pytest.mark.parametrize("case", ["lookup", "fixed dims", "cublas"])
def test_the_host_code_compiles_for_sm80_and_sm90_with_warnings_as_errors(case, tmp_path):
    if case == "lookup":
        model = generate(*lookup())
    elif case == "fixed dims":   # no symbol: blockc_create reserves the arena itself
        model = generate(blockc.parse_graph("graph g(%x: f32[4,8]) {\n  %0:f32[4,8] = exp %x\n"
                                            "  %1:f32[4,8] = softmax %0 {axis=-1}\n  return y=%1\n}\n"), {})
        assert "kNumSymbols = 0" in model.source and "blockc_reserve_checked(m, NULL)" in model.source
    else:
        try:
            toolchain.find_cublas()
        except toolchain.ToolchainError as e:
            pytest.skip(str(e))
        g, weights = blockc.parse_graph("graph g(%x: f32[n,8], %w: f32[8,8]) {\n  %0:f32[n,8] = matmul %x, %w\n"
                                        "  %1:f32[n,8] = exp %0\n  return y=%1\n}\n"), {}
        model = generate(g, weights, gemm="cublas")
    cuda_build.write_build(model, str(tmp_path))
    result = toolchain.compile_nvcc(str(tmp_path / "model.cu"), ["sm_80", "sm_90"], werror=True,
                                    extra_flags=[f"-I{tmp_path}"] + cuda_build.library_flags(model.gemm, link=False))
    assert {k.arch for k in result.kernels} == {"sm_80", "sm_90"}
    source = (tmp_path / "model.cu").read_text()
    assert "cudaStreamBeginCapture" in source and "cudaGraphExecUpdate" in source
