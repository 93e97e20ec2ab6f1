"""The attention kernel's decode path (kernels/attention.py, flash-decoding):
a few query rows against a long key axis are split over the keys, each run
of key tiles kept as partial sums in the arena's scratch, and merged by a
combine kernel. Emulated against the float64 reference at pasts that do and
do not split (the launch count says which path ran), with every mask kind,
grouped-query attention, a few query rows, fully masked rows and runs, and
float16/bfloat16; clean under AddressSanitizer and ThreadSanitizer; and
compiled by nvcc for sm_80/sm_90 with warnings as errors and no spills."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.lower import generate

needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
NVCC = toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")

LOWEST = "-3.4028234663852886e+38"
# One graph, one emulated build. `past` keys; `rows` query rows (1 for a
# token's step, a few for a short continuation). d=64: 32-key tiles, so
# past 100 makes 4 tiles (2 runs) and past 1000 32 tiles (16 runs).
DECODE = f"""graph g(%q: f32[2,3,1,64], %k: f32[2,3,past,64], %v: f32[2,3,past,64], %keep: bool[2,1,1,past], %bias: f32[2,1,rows,past], %qr: f32[2,3,rows,64], %qg: f32[1,2,4,1,64], %kg: f32[1,2,1,past,64], %vg: f32[1,2,1,past,64], %qh: f16[1,2,1,128], %kh: f16[1,2,past,128], %vh: f16[1,2,past,128], %qb: bf16[1,2,1,64], %kb: bf16[1,2,past,64], %vb: bf16[1,2,past,64]) {{
  %0:f32[2,3,1,64] = attention %q, %k, %v, %keep {{scale=0.125, mask="bool", causal=true, fill={LOWEST}, guarded=false}}
  %1:f32[2,3,1,64] = attention %q, %k, %v, %keep {{scale=0.125, mask="bool", causal=false, fill=-inf, guarded=false}}
  %2:f32[2,3,rows,64] = attention %qr, %k, %v, %bias {{scale=0.125, mask="additive", causal=true, fill={LOWEST}, guarded=false}}
  %3:f32[1,2,4,1,64] = attention %qg, %kg, %vg {{scale=0.125, mask="none", causal=true, fill={LOWEST}, guarded=false}}
  %4:f16[1,2,1,128] = attention %qh, %kh, %vh {{scale=0.088, mask="none", causal=true, fill=-65504.0, guarded=false}}
  %5:bf16[1,2,1,64] = attention %qb, %kb, %vb {{scale=0.125, mask="none", causal=false, fill=-1e+30, guarded=false}}
  %6:f32[2,3,1,64] = attention %q, %k, %v, %keep {{scale=0.125, mask="bool", causal=true, fill={LOWEST}, guarded=true}}
  return padded=%0, padded_inf=%1, rows=%2, gqa=%3, half=%4, bf16=%5, guarded=%6
}}
"""
ATTENTIONS = 7


def feeds(past: int, rows: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    f = {}
    for name, shape in [("q", (2, 3, 1, 64)), ("k", (2, 3, past, 64)), ("v", (2, 3, past, 64)),
                        ("bias", (2, 1, rows, past)), ("qr", (2, 3, rows, 64)), ("qg", (1, 2, 4, 1, 64)),
                        ("kg", (1, 2, 1, past, 64)), ("vg", (1, 2, 1, past, 64))]:
        f[name] = rng.standard_normal(shape).astype(np.float32) * (1 if name[0] in "vb" else 3)
    for t, d, dtype in (("h", 128, np.float16), ("b", 64, ml_dtypes.bfloat16)):
        for n in "qkv":
            shape = (1, 2, 1 if n == "q" else past, d)
            f[n + t] = (rng.standard_normal(shape) * (2 if n != "v" else 1)).astype(np.float32).astype(dtype)
    keep = rng.random((2, 1, 1, past)) > 0.3
    keep[0, ..., : past // 2] = False   # batch 0: the first half masked, so whole runs of keys are
    keep[0, ..., -1] = True
    keep[1] = False                      # batch 1: every key masked (the row averages v)
    f["keep"] = keep
    return f


@pytest.fixture(scope="module")
def decode_model():
    if toolchain.find_gxx() is None:
        pytest.skip("no g++: the CUDA emulator needs one")
    from blockc.runtime.cuda_runner import emulated_library
    g = blockc.parse_graph(DECODE)
    cm = generate(g, {})
    return g, cm, emulated_library(cm)


def run(decode_model, f, **kw):
    from blockc.runtime.cuda_runner import run_model
    _, cm, so = decode_model
    return run_model(cm, so, f, emulated=True, **kw)


def reference(g, f):
    with np.errstate(invalid="ignore"):
        return blockc.run_reference(g, {}, f)


def rel_err(out, ref):
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def test_every_decode_attention_has_a_split_path():
    cm = generate(blockc.parse_graph(DECODE), {})
    names = [s.name for s in cm.steps]
    assert len(names) == ATTENTIONS and all(n.endswith("_decode") for n in names), names
    assert all(f"{n}_split" in s.kernels and f"{n}_combine" in s.kernels for n, s in zip(names, cm.steps))
    assert "attention scratch f32[2,3,32,16,66]" in cm.source   # the arena slot, named in the host code


def test_prefill_shapes_have_no_split_path():
    # 33 rows do not fit one query tile, and 40 keys make two tiles: neither step can split
    g = blockc.parse_graph("""graph g(%q: f32[1,2,33,64], %k: f32[1,2,33,64], %qs: f32[1,2,1,64], %ks: f32[1,2,40,64]) {
  %0:f32[1,2,33,64] = attention %q, %k, %k {scale=0.125, mask="none", causal=true, fill=-1e+30, guarded=false}
  %1:f32[1,2,1,64] = attention %qs, %ks, %ks {scale=0.125, mask="none", causal=true, fill=-1e+30, guarded=false}
  return a=%0, b=%1
}
""")
    cm = generate(g, {})
    assert [s.name for s in cm.steps] == ["attention_causal_f32_64", "attention_causal_f32_64"]
    assert "scratch" not in cm.source


@needs_gxx
@pytest.mark.parametrize("past, launches", [(5, 1), (100, 2), (1000, 2)])
def test_decode_matches_the_reference_split_or_not(decode_model, past, launches):
    g = decode_model[0]
    f = feeds(past)
    result = run(decode_model, f)
    # one launch per attention at past 5 (one key tile); split and combine from 4 tiles on
    assert result.counters["kernel_launches"] == ATTENTIONS * launches
    out, ref = result.outputs, reference(g, f)
    for name in ("padded", "rows", "gqa", "guarded"):
        assert rel_err(out[name], ref[name]) <= 1e-5, (name, past)
    # guarded: the same, but batch 1's rows, which see no key, are zero
    assert not out["guarded"][1].any() and rel_err(out["guarded"][0], out["padded"][0]) <= 1e-6
    # batch 1 masks every key: the reference averages v, and so do the split runs
    mean = f["v"][1].mean(axis=-2, keepdims=True)
    np.testing.assert_allclose(out["padded"][1], np.broadcast_to(mean, out["padded"][1].shape), rtol=1e-5, atol=1e-6)
    # fill -inf: runs with no finite score drop out; a row with none anywhere is the mean, never NaN
    y = out["padded_inf"]
    assert not np.isnan(y).any()
    assert rel_err(y[0], ref["padded_inf"][0]) <= 1e-5
    np.testing.assert_allclose(y[1], out["padded"][1], rtol=1e-5, atol=1e-6)
    # float16 / bfloat16: float32 math on the stored values, one rounding at
    # the end (within one unit of the stored value, beside float32's own
    # error where the weighted values cancel to near zero)
    for name, bits in (("half", 10), ("bf16", 7)):
        r = ref[name].astype(np.float64)
        unit = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(r), 2.0 ** -14))) - bits)
        err = np.abs(out[name].astype(np.float64) - r)
        assert (err <= unit + 1e-6 * np.abs(r).max()).all(), (name, (err / unit).max())


@needs_gxx
def test_the_split_path_is_the_same_in_a_cuda_graph(decode_model):
    f = feeds(300, seed=1)
    direct = run(decode_model, f, runs=2, graphs=False)
    replayed = run(decode_model, f, runs=2, graphs=True)
    assert replayed.counters["graph_launches"] == 2
    for name in direct.outputs:
        np.testing.assert_array_equal(replayed.outputs[name], direct.outputs[name])


@needs_gxx
@pytest.mark.parametrize("sanitize", ["address", "thread"])
def test_the_decode_path_is_clean_under_sanitizers(sanitize):
    from blockc.runtime.cuda_runner import emulated_library, run_model
    g = blockc.parse_graph(DECODE)
    cm = generate(g, {})
    try:
        so = emulated_library(cm, sanitize=sanitize)
    except toolchain.ToolchainError as e:
        if "sanitizer" in str(e).lower() and "runtime" in str(e).lower():
            pytest.skip(str(e))
        raise
    f = feeds(130, rows=2)
    result = run_model(cm, so, f, emulated=True, timeout=600)
    assert result.counters["kernel_launches"] == ATTENTIONS * 2
    ref = reference(g, f)
    assert rel_err(result.outputs["rows"], ref["rows"]) <= 1e-5


@needs_nvcc
def test_the_decode_kernels_compile_without_spills(tmp_path):
    from blockc.codegen.cuda.build import write_build
    write_build(generate(blockc.parse_graph(DECODE), {}), str(tmp_path))
    result = toolchain.compile_nvcc(str(tmp_path / "model.cu"), ["sm_80", "sm_90"], werror=True,
                                    extra_flags=[f"-I{tmp_path}"])
    found = {(k.short_name, k.arch): k for k in result.kernels if k.short_name.endswith(("_split", "_combine"))}
    assert len(found) == 2 * 2 * ATTENTIONS   # split and combine of each, for each arch
    assert all(k.spill_store_bytes == 0 and k.spill_load_bytes == 0 for k in found.values()), \
        {n: (k.spill_store_bytes, k.spill_load_bytes) for n, k in found.items()}


@needs_gxx
def test_llama_tiny_decode_steps_split_at_a_long_past():
    """The generation issue's decode graph (grouped-query attention, rotary,
    padded rows): at past 200 each layer's attention is split and combined,
    one launch more per layer than at past 5, and both match float64."""
    from blockc.runtime.cuda_runner import emulated_library, run_model
    model = blockc.build_model("llama-tiny", {"max_positions": "256"})
    step = model.for_cache("decode")
    graph = blockc.to_form(blockc.trace(step), "fused")
    weights = dict(blockc.init_weights(model))
    cm = generate(graph, weights)
    assert sum(s.name.startswith("attention") and s.name.endswith("_decode") for s in cm.steps) == model.cfg.layers
    so = emulated_library(cm)
    launches = {}
    for past in (5, 200):
        rng = np.random.default_rng(past)
        feeds = {spec.name: spec.sample({"batch": 2, "seq": 1, "past": past}, rng) for spec in step.inputs()}
        result = run_model(cm, so, feeds, emulated=True)
        ref = blockc.run_reference(graph, weights, feeds)
        for name, y in result.outputs.items():
            np.testing.assert_allclose(y, ref[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} at past {past}")
        launches[past] = result.counters["kernel_launches"]
    assert launches[200] == launches[5] + model.cfg.layers
