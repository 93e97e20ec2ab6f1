"""`blockc cuda`: nvcc compile proof for sm_80/sm_90 with ptxas's report,
128-bit loads in the fused kernels' PTX, sanitizer runs, and bad input."""
import json
import os
import subprocess

import numpy as np
import pytest

import blockc
from blockc.cli import main
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.kernel import CudaCodegenError
from blockc.codegen.cuda.lower import generate

NVCC = toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")


def cuda_cli(tmp_path, *argv):
    out = tmp_path / "build"
    code = main(["cuda", *argv, "-o", str(out)])
    return code, out


@needs_nvcc
@pytest.mark.parametrize("name", ["gpt2", "bert-base"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_models_compile_without_warnings_or_fused_spills(name, dtype, tmp_path, capsys):
    # the default GEMM (cuBLASLt) where cuBLAS is installed; test_gemm.py builds and links it
    try:
        toolchain.find_cublas()
        gemm = "cublas"
    except toolchain.ToolchainError:
        gemm = "tiled"
    code, out = cuda_cli(tmp_path, name, "--set", "layers=2", "--dtype", dtype, "--gemm", gemm)
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["compiled"] is True and summary["archs"] == ["sm_80", "sm_90"] and summary["gemm"] == gemm
    kernels = summary["kernels"]
    assert {k["arch"] for k in kernels} == {"sm_80", "sm_90"}
    assert all(k["registers"] > 0 for k in kernels)
    fused = [k for k in kernels if k["fused"]]
    assert any(k["kernel"].startswith("attention") for k in fused)
    assert any(k["kernel"].startswith("add_layernorm") for k in fused)
    assert all(k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0 for k in fused), \
        [k["function"] for k in fused if k["spill_store_bytes"] or k["spill_load_bytes"]]
    assert "spills in fused kernels: 0 bytes" in printed
    plan = summary["memory_plan"]
    assert plan["arena_bytes"] < plan["naive_bytes"]
    for f in ("model.cu", "blockc_cuda.h", "blockc_model.h", "weights.bin", "model.json", "build.sh"):
        assert (out / f).exists()


@needs_nvcc
def test_fused_kernels_use_128_bit_loads(tmp_path, kernel_ptx):
    model = blockc.build_model("gpt2", {"layers": "1", "d_model": "64", "heads": "4", "vocab": "50"})
    # Without fuse_attention the block keeps its masked softmax (the attention kernel replaces it otherwise).
    graph = blockc.to_form(blockc.trace(model), "fused", disable=["fuse_attention"])
    bodies = kernel_ptx(generate(graph, blockc.init_weights(model)), tmp_path)
    for prefix in ("masked_softmax_causal_f32", "add_layernorm_f32"):
        # every register and shared-memory kernel (each row's body is read and written in 128-bit vectors)
        vec = [body for name, body in bodies.items() if prefix in name and ("_warp" in name or "_smem" in name)]
        assert vec, f"no register or shared-memory kernel of {prefix}"
        assert all(("ld.global.v4" in b or "ld.global.nc.v4" in b) for b in vec), prefix
        assert all(("st.global.v4" in b or "st.global.wb.v4" in b) for b in vec), prefix


def small_fused(name="tiny"):
    model = blockc.build_model(name, {"layers": "1"} if name == "tiny" else {"layers": "1", "d_model": "32",
                                                                               "heads": "2", "vocab": "30"})
    return model, blockc.to_form(blockc.trace(model), "fused")


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++")
@pytest.mark.parametrize("sanitize", ["address", "thread"])
def test_sanitizers_find_nothing_in_the_fused_kernels(sanitize):
    from blockc.runtime.cuda_runner import emulated_library, run_model
    model, graph = small_fused("bert-base")
    weights = dict(blockc.init_weights(model))
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 1, "seq": 5}, rng) for s in model.inputs()}
    cm = generate(graph, weights)
    try:
        out = run_model(cm, emulated_library(cm, sanitize=sanitize), feeds, emulated=True, timeout=600).outputs
    except toolchain.ToolchainError as e:
        if "sanitizer" in str(e).lower() and "runtime" in str(e).lower():
            pytest.skip(str(e))
        raise
    ref = blockc.run_reference(blockc.trace(model), weights, feeds)
    np.testing.assert_allclose(out["last_hidden_state"], ref["last_hidden_state"], rtol=1e-4, atol=1e-5)


# ---- bad input -------------------------------------------------------------------------------
def test_unsupported_reduction_is_named_before_anything_is_written(tmp_path, capsys):
    # ReduceSum over axes 0 and 2: not one run of adjacent axes (kernels/reduce.py)
    import onnx
    from onnx import TensorProto, helper
    axes = helper.make_node("Constant", [], ["axes"], value=onnx.numpy_helper.from_array(np.array([0, 2]), "axes"))
    graph = helper.make_graph([axes, helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    path = tmp_path / "sum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    code, out = cuda_cli(tmp_path, str(path), "--no-compile")
    err = capsys.readouterr().err
    assert code == 2
    assert "(reduce_sum): axes [0, 2] of a [2, 3, 4] tensor are not adjacent" in err, err
    assert not out.exists()


def test_float64_is_refused(tmp_path, capsys):
    code, out = cuda_cli(tmp_path, "tiny", "--set", "dtype=float64", "--no-compile")
    assert code == 2 and "float64" in capsys.readouterr().err
    assert not out.exists()


def test_softmax_over_another_axis_is_refused():
    g = blockc.parse_graph("graph g(%x: f32[4,8]) {\n  %0:f32[4,8] = softmax %x {axis=0}\n  return y=%0\n}\n")
    with pytest.raises(CudaCodegenError, match="softmax over axis 0"):
        generate(g, {})


HOSTILE = ['in"put*/\nx', "int", "*/ system(\"rm -rf /\"); /*", "a\\b", "__global__", "#define x"]


def test_hostile_names_never_reach_the_source_raw(tmp_path):
    from blockc.ir.dims import Sym
    from blockc.ir.dtypes import DType
    from blockc.ir.graph import Graph
    from blockc.ir.types import TensorType
    g = Graph('model"*/\nname')
    n = Sym.var("n")
    x = g.add_input(HOSTILE[0], TensorType(DType.float32, (n, 8)))
    gamma = g.add_param(HOSTILE[1], TensorType(DType.float32, (8,)))
    beta = g.add_param(HOSTILE[2], TensorType(DType.float32, (8,)))
    y = g.op("layernorm", g.op("exp", x), gamma, beta)
    g.set_outputs([(HOSTILE[3], y), (HOSTILE[4], g.op("tanh", y))])
    weights = {HOSTILE[1]: np.ones(8, np.float32), HOSTILE[2]: np.zeros(8, np.float32)}
    cm = generate(g, weights)
    # Keyword-like names ("int", "__global__") occur in any CUDA file; the
    # test is that no label is emitted as code: the ones that could break out
    # of a comment or a string never occur at all.
    for name in [h for h in HOSTILE if not h.replace("_", "").isalnum()] + ['model"*/\nname']:
        assert name not in cm.source
    assert "*/ system" not in cm.source and 'in"put' not in cm.source
    if toolchain.find_gxx() is not None:
        from blockc.runtime.cuda_runner import emulated_library, run_model
        feeds = {HOSTILE[0]: np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)}
        out = run_model(cm, emulated_library(cm), feeds, emulated=True).outputs
        ref = blockc.run_reference(g, weights, feeds)
        for k in ref:
            np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-6)


def test_elementwise_chains_are_shown_in_the_summary(tmp_path, capsys):
    code, out = cuda_cli(tmp_path, "bert-base", "--set", "layers=1", "--form", "standard", "--no-compile")
    printed = capsys.readouterr().out
    assert code == 0
    chains = json.loads((out / "model.json").read_text())["elementwise_chains"]
    # BERT's mask, scaled then selected: one kernel for mul+where, its IR nodes named (the
    # FFN's bias add and GELU are its GEMM's epilogue: test_gemm.py)
    mask = [c for c in chains if c["ops"] == ["mul", "where"]]
    assert mask and all(len(c["nodes"]) == 2 and all(n.startswith("%") for n in c["nodes"]) for c in mask)
    launches = [launch["ops"] for launch in json.loads((out / "model.json").read_text())["launches"]]
    assert ["matmul", "add", "gelu"] in launches and ["add", "gelu"] not in launches
    fused = sum(len(c["ops"]) for c in chains)
    assert f"elementwise fusion: {fused} IR ops in {len(chains)} launches" in printed


def test_kernels_from_a_decomposed_op_name_the_node_it_came_from():
    # qkv_attention has no kernel of its own: it is legalized into the projection and one attention
    # kernel, which still carry its origin
    g = blockc.optimize(blockc.trace(blockc.build_model("gpt2-block", {"d_model": "64", "heads": "2"}))).graph
    qkv = next(n for n in g.nodes if n.op == "qkv_attention")
    weights = {name: np.zeros(v.type.concrete_shape({}), np.float32) for name, v in g.params.items()}
    model = generate(g, weights)
    from_qkv = [s for s in model.steps if set(s.nodes) & set(qkv.origin)]
    assert {"attention", "matmul"} <= {op for s in from_qkv for op in s.ops}
    assert not any(label.startswith("#") for s in model.steps for label in s.nodes)
