"""Generated CUDA, run emulated on the CPU, against the float64 reference:
whole built-in models in the fused and standard forms, and single ops (the
row kernels, at every tier, are test_rows.py's)."""
import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import toolchain
from blockc.runtime.backend import make_backend

pytestmark = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")


def run_emulated(graph, weights, feeds):
    return make_backend("cuda-emu").run(graph, weights, feeds)


def rel_err(out, ref):
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def model_case(name, sets, dims, form):
    model = blockc.build_model(name, sets)
    weights = dict(blockc.init_weights(model, seed=1))
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample(dims, rng) for s in model.inputs()}
    standard = blockc.trace(model)
    out = run_emulated(blockc.to_form(standard, form), weights, feeds)
    return model, standard, weights, feeds, out


SMALL = {"layers": "2", "d_model": "64", "heads": "4"}


@pytest.mark.parametrize("name, sets, dims, form", [
    ("tiny", {}, {"batch": 2, "seq": 7}, "fused"),
    ("tiny", {}, {"batch": 2, "seq": 7}, "standard"),
    ("gpt2", dict(SMALL, vocab="50"), {"batch": 2, "seq": 9}, "fused"),
    ("gpt2", {"layers": "1", "d_model": "100", "heads": "4", "vocab": "50"}, {"batch": 2, "seq": 7}, "fused"),
    ("gpt2", {"layers": "1", "d_model": "100", "heads": "4", "vocab": "50"}, {"batch": 2, "seq": 7}, "standard"),
    ("bert-base", dict(SMALL, vocab="50"), {"batch": 2, "seq": 9}, "fused"),
    ("bert-base", dict(SMALL, vocab="50"), {"batch": 2, "seq": 9}, "standard"),
    ("gpt2-block", {"d_model": "64", "heads": "4"}, {"batch": 2, "seq": 9}, "fused"),
])
def test_float32_models_match_the_reference(name, sets, dims, form):
    _, standard, weights, feeds, out = model_case(name, sets, dims, form)
    ref = blockc.run_reference(standard, weights, feeds)
    for k in ref:
        assert out[k].shape == ref[k].shape
        assert rel_err(out[k], ref[k]) <= 1e-5, k


@pytest.mark.parametrize("name, sets, dtype, form", [
    ("tiny", {}, "float16", "fused"),
    ("tiny", {}, "float16", "standard"),
    ("tiny", {}, "bfloat16", "fused"),
    ("gpt2", dict(SMALL, vocab="50"), "float16", "fused"),
    ("gpt2", dict(SMALL, vocab="50"), "float16", "standard"),
    ("bert-base", dict(SMALL, vocab="50"), "float16", "fused"),
    ("bert-base", dict(SMALL, vocab="50"), "float16", "standard"),
])
def test_half_precision_model_rounds_like_half_precision(name, sets, dtype, form):
    """End to end through two layers a 16-bit model cannot be a few ulp from
    float64 (each op rounds); the honest bound is that the kernels are no
    worse than the same graph computed op by op in that dtype with float32
    math (the reference interpreter's native mode), with 25% slack for the
    different rounding points of fused kernels."""
    model, standard, weights, feeds, out = model_case(name, dict(sets, dtype=dtype), {"batch": 2, "seq": 7}, form)
    ref = blockc.run_reference(standard, weights, feeds)
    native = blockc.run_reference(standard, weights, feeds, float64=False)
    for k in ref:
        assert out[k].dtype == native[k].dtype
        assert rel_err(out[k], ref[k]) <= 1.25 * rel_err(native[k], ref[k]) + 1e-3, k


def single_op(text, feeds, weights=None):
    g = blockc.parse_graph(text)
    weights = weights or {}
    return g, run_emulated(g, weights, feeds), blockc.run_reference(g, weights, feeds)


def test_gemm_bias_activation_and_broadcast_batch():
    text = """graph g(%a: f32[2,3,5,7], %b: f32[1,3,7,4], %x: f32[6,7]) {
  param @w: f32[7,9]
  param @bias: f32[9]
  %0:f32[2,3,5,4] = matmul %a, %b
  %1:f32[6,9] = matmul_bias_act %x, @w, @bias {activation="gelu"}
  return p=%0, q=%1
}
"""
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((2, 3, 5, 7)).astype(np.float32),
             "b": rng.standard_normal((1, 3, 7, 4)).astype(np.float32),
             "x": rng.standard_normal((6, 7)).astype(np.float32)}
    weights = {"w": rng.standard_normal((7, 9)).astype(np.float32), "bias": rng.standard_normal(9).astype(np.float32)}
    _, out, ref = single_op(text, feeds, weights)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-5)


def test_cached_build_runs_with_the_callers_weights():
    """Builds are cached by source; weights are not part of the source. The
    model is test_float32_models_match_the_reference's tiny, fused: its build,
    where that test made it first in the cache."""
    model = blockc.build_model("tiny")
    graph = blockc.to_form(blockc.trace(model), "fused")
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 1, "seq": 5}, rng) for s in model.inputs()}
    for seed in (11, 12):
        weights = dict(blockc.init_weights(model, seed=seed))
        out = run_emulated(graph, weights, feeds)
        ref = blockc.run_reference(blockc.trace(model), weights, feeds)
        assert rel_err(out["logits"], ref["logits"]) <= 1e-5
