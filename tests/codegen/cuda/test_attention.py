"""The one attention kernel (kernels/attention.py, templates/attention.cu.j2):
emulated numbers against the float64 reference (causal with the bottom-right
offset, padding and additive masks, grouped-query attention, fully masked
rows, sequence lengths off the tile size, qkv_attention read from the packed
projection), the GPT-2 block's launches, and the tensor-core variant proven
by nvcc: sm_80/sm_90 with no spills, and mma.sync, ldmatrix and cp.async in
its PTX. The emulator runs the SIMT variant here (its default); the
tensor-core variant runs emulated in test_attention_mma.py, and has not run
on a GPU here."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import blockc
from blockc.cli import main
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.kernel import CudaCodegenError
from blockc.codegen.cuda.lower import generate
from blockc.runtime.backend import make_backend

NVCC = toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")
needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")

ATTRS = 'scale=0.125, mask="{mask}", causal={causal}, fill={fill}'
LOWEST = "-3.4028234663852886e+38"

# One graph, so one emulated build: every case below is a node of it. Lengths
# 19, 21 and 17 are off the SIMT kernel's 16-row and 32-key tiles.
F32 = """graph g(%q: f32[2,3,19,64], %k: f32[2,3,19,64], %v: f32[2,3,19,64], %keep: bool[2,1,1,19], %bias: f32[2,1,19,19], %qs: f32[2,3,5,64], %kl: f32[2,3,21,64], %vl: f32[2,3,21,64], %qg: f32[2,2,2,17,64], %kg: f32[2,2,1,17,64], %vg: f32[2,2,1,17,64], %x: f32[2,19,32]) {{
  param @w: f32[32,384]
  param @b: f32[384]
  %0:f32[2,3,19,64] = attention %q, %k, %v {causal}
  %1:f32[2,3,19,64] = attention %q, %k, %v, %keep {padding}
  %2:f32[2,3,19,64] = attention %q, %k, %v, %bias {additive}
  %3:f32[2,3,5,64] = attention %qs, %kl, %vl {causal}
  %4:f32[2,3,21,64] = attention %kl, %qs, %qs {causal}
  %5:f32[2,2,2,17,64] = attention %qg, %kg, %vg {causal}
  %6:f32[2,19,128] = qkv_attention %x, @w, @b, %keep {{heads=2, sizes=[128,128,128], {padding_causal}}}
  %7:f32[2,3,19,64] = attention %q, %k, %v, %keep {padding_inf}
  return causal=%0, padded=%1, additive=%2, short_q=%3, long_q=%4, gqa=%5, qkv=%6, padded_inf=%7
}}
""".format(causal="{" + ATTRS.format(mask="none", causal="true", fill=LOWEST) + "}",
           padding="{" + ATTRS.format(mask="bool", causal="false", fill="-60000.0") + "}",
           additive="{" + ATTRS.format(mask="additive", causal="true", fill=LOWEST) + "}",
           padding_causal=ATTRS.format(mask="bool", causal="true", fill=LOWEST),
           padding_inf="{" + ATTRS.format(mask="bool", causal="false", fill="-inf") + "}")


def rel_err(out, ref):
    """The largest error against the largest reference value (float32 scores of size ~50 lose ~1e-6)."""
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def _feeds(rng):
    f = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in [
        ("q", (2, 3, 19, 64)), ("k", (2, 3, 19, 64)), ("v", (2, 3, 19, 64)), ("bias", (2, 1, 19, 19)),
        ("qs", (2, 3, 5, 64)), ("kl", (2, 3, 21, 64)), ("vl", (2, 3, 21, 64)), ("qg", (2, 2, 2, 17, 64)),
        ("kg", (2, 2, 1, 17, 64)), ("vg", (2, 2, 1, 17, 64)), ("x", (2, 19, 32))]}
    for name in ("q", "k", "qs", "kl", "qg", "kg"):
        f[name] *= 3   # peaked softmax rows: the running max moves from tile to tile
    keep = rng.random((2, 1, 1, 19)) > 0.3
    keep[0, ..., 0] = True
    keep[1] = False   # batch 1: every row fully masked
    f["keep"] = keep
    return f


@pytest.fixture(scope="module")
def float32_run():
    g = blockc.parse_graph(F32)
    rng = np.random.default_rng(7)
    feeds = _feeds(rng)
    weights = {"w": (rng.standard_normal((32, 384)) / 4).astype(np.float32),
               "b": rng.standard_normal(384).astype(np.float32)}
    out = make_backend("cuda-emu").run(g, weights, feeds)
    with np.errstate(invalid="ignore"):
        ref = blockc.run_reference(g, weights, feeds)
    return g, feeds, out, ref


@needs_gxx
@pytest.mark.parametrize("output", ["causal", "padded", "additive", "short_q", "long_q", "gqa", "qkv"])
def test_float32_attention_matches_the_reference(float32_run, output):
    _, _, out, ref = float32_run
    assert out[output].shape == ref[output].shape
    assert rel_err(out[output], ref[output]) <= 1e-5


@needs_gxx
def test_fully_masked_rows_average_the_values(float32_run):
    _, feeds, out, ref = float32_run
    # Batch 1 masks every key (fill -60000): the reference averages v, and so does the kernel.
    mean = feeds["v"][1].mean(axis=-2, keepdims=True)
    np.testing.assert_allclose(ref["padded"][1], np.broadcast_to(mean, ref["padded"][1].shape), rtol=1e-5, atol=1e-6)
    # Queries before the first key (q longer than k, causal from the bottom right) see nothing.
    assert np.allclose(ref["long_q"][:, :, :16], feeds["qs"].mean(axis=-2, keepdims=True), atol=1e-6)


@needs_gxx
def test_fill_minus_infinity_is_never_nan(float32_run):
    """With fill -inf a fully masked row is 0/0: the reference says NaN. The
    kernel gives the limit of a finite fill, the mean of the values (what
    the reference computes for any finite fill); the other rows match."""
    _, feeds, out, ref = float32_run
    y = out["padded_inf"]
    assert not np.isnan(y).any()
    assert np.isnan(ref["padded_inf"][1]).all()
    assert rel_err(y[0], ref["padded_inf"][0]) <= 1e-5
    assert rel_err(y[1], ref["padded"][1]) <= 1e-5


HALF = """graph g(%q: f16[1,2,19,128], %k: f16[1,2,19,128], %v: f16[1,2,19,128], %keep: bool[1,1,1,19], %qb: bf16[2,2,19,64], %kb: bf16[2,2,19,64], %vb: bf16[2,2,19,64]) {
  %0:f16[1,2,19,128] = attention %q, %k, %v, %keep {scale=0.125, mask="bool", causal=true, fill=-65504.0, guarded=false}
  %1:bf16[2,2,19,64] = attention %qb, %kb, %vb {scale=0.125, mask="none", causal=true, fill=-1e+30, guarded=false}
  return h=%0, b=%1
}
"""


@needs_gxx
def test_half_precision_attention_rounds_once():
    """float16 head size 128 and bfloat16 head size 64 (the shapes the
    tensor-core variant takes on a GPU; the emulator runs the SIMT one):
    float32 math on the stored values, one rounding at the end."""
    g = blockc.parse_graph(HALF)
    rng = np.random.default_rng(3)
    feeds = {n: (rng.standard_normal((1, 2, 19, 128)) * (2 if n != "v" else 1)).astype(np.float16) for n in "qkv"}
    for n in "qkv":
        feeds[n + "b"] = (rng.standard_normal((2, 2, 19, 64)) * (2 if n != "v" else 1)).astype(np.float32)
    keep = rng.random((1, 1, 1, 19)) > 0.3
    keep[..., 0] = True
    feeds["keep"] = keep
    for n in "qkv":
        feeds[n + "b"] = feeds[n + "b"].astype(ml_dtypes.bfloat16)
    out = make_backend("cuda-emu").run(g, {}, feeds)
    ref = blockc.run_reference(g, {}, feeds)
    for name, dtype in (("h", np.float16), ("b", ml_dtypes.bfloat16)):
        spacing = np.abs(np.spacing(np.abs(ref[name]).astype(np.float16))).astype(np.float64)
        if dtype is not np.float16:   # bfloat16 keeps 8 bits: 2^-7 relative spacing
            spacing = np.maximum(np.abs(ref[name]), 2.0 ** -126) * 2.0 ** -7
        err = np.abs(out[name].astype(np.float64) - ref[name]) / spacing
        assert err.max() <= 1.0, (name, err.max())


def test_gpt2_block_runs_attention_as_one_kernel(tmp_path):
    """Before: QKV GEMM, bias, 3 splits, 4 transposes, QKᵀ, masked softmax, PV,
    a transpose back (20 launches). Now one attention kernel reads the packed
    projection and writes [batch, seq, 768] for the output GEMM."""
    code = main(["cuda", "gpt2-block", "-o", str(tmp_path / "b"), "--no-compile"])
    assert code == 0
    meta = json.loads((tmp_path / "b" / "model.json").read_text())
    kernels = [launch["kernel"] for launch in meta["launches"]]
    assert len(kernels) <= 10, kernels
    assert sum(k.startswith("attention") for k in kernels) == 1, kernels
    assert not any(k.startswith(("split", "transpose", "masked_softmax", "concat")) for k in kernels), kernels


def test_an_unsupported_head_size_is_refused_by_name():
    g = blockc.parse_graph("""graph g(%q: f32[1,1,4,320], %k: f32[1,1,4,320], %v: f32[1,1,4,320]) {
  %0:f32[1,1,4,320] = attention %q, %k, %v {scale=0.125, mask="none", causal=true, fill=-1e9, guarded=false}
  return y=%0
}
""")
    with pytest.raises(CudaCodegenError, match=r"attention: head size 320"):
        generate(g, {})


# The tensor-core shapes in one file, so one nvcc run: float16 and bfloat16 at
# head sizes 64 and 128, causal alone and with each mask kind where registers
# are tightest, and guarded (its per-row flag) at 128 (each result negated, so
# the arena has a buffer).
SHAPES = [("f16", 64, "additive"), ("f16", 128, "bool"), ("bf16", 64, "none"), ("bf16", 128, "additive"),
          ("f16", 128, "bool_guarded")]
MASKS = {"none": "", "bool": ", %keep", "additive": ", %{t}bias", "bool_guarded": ", %keep"}
VARIANTS = "graph g(" + ", ".join(list(dict.fromkeys(f"%{t}{d}: {t}[2,4,33,{d}]" for t, d, m in SHAPES))
                                  + ["%keep: bool[2,1,1,33]", "%f16bias: f16[2,1,33,33]", "%bf16bias: bf16[2,1,33,33]"]) \
    + ") {\n" + "".join(
    f'  %{2 * i}:{t}[2,4,33,{d}] = attention %{t}{d}, %{t}{d}, %{t}{d}{MASKS[m].format(t=t)} '
    f'{{scale=0.125, mask="{m.split("_")[0]}", causal=true, fill=-1e+30, guarded={str(m.endswith("guarded")).lower()}}}'
    f'\n  %{2 * i + 1}:{t}[2,4,33,{d}] = neg %{2 * i}\n'
    for i, (t, d, m) in enumerate(SHAPES)) \
    + "  return " + ", ".join(f"y{i}=%{2 * i + 1}" for i in range(len(SHAPES))) + "\n}\n"


@needs_nvcc
def test_tensor_core_attention_compiles_without_spills(tmp_path):
    """Both variants of each shape for sm_80 and sm_90, warnings as errors, and ptxas's report: no spills."""
    from blockc.codegen.cuda.build import write_build
    write_build(generate(blockc.parse_graph(VARIANTS), {}), str(tmp_path))
    result = toolchain.compile_nvcc(str(tmp_path / "model.cu"), ["sm_80", "sm_90"], werror=True,
                                    extra_flags=[f"-I{tmp_path}"])
    found = {(k.short_name, k.arch): k for k in result.kernels if k.short_name.startswith("attention")}
    want = {(f"attention_causal{'' if m == 'none' else '_' + m}_{t}_{d}_{v}", a)
            for t, d, m in SHAPES for v in ("simt", "mma") for a in ("sm_80", "sm_90")}
    assert set(found) == want
    assert all(k.spill_store_bytes == 0 and k.spill_load_bytes == 0 for k in found.values()), \
        {n: (k.spill_store_bytes, k.spill_load_bytes) for n, k in found.items()}


@needs_nvcc
def test_tensor_core_attention_ptx_has_mma_ldmatrix_and_cp_async(tmp_path, kernel_ptx):
    from blockc.compare.kernels import isolate_nodes
    model = blockc.build_model("gpt2-block", {"d_model": "128", "heads": "2", "dtype": "float16"})
    fused = blockc.to_form(blockc.trace(model), "fused")
    attention = [n for n in fused.nodes if n.op == "qkv_attention"]
    assert len(attention) == 1
    # the block's attention node alone: the block's attention kernels, without nvcc compiling its GEMMs and norms
    cm = generate(isolate_nodes(attention, "gpt2_block_attention"), {})
    for arch in ("sm_80", "sm_90"):
        bodies = kernel_ptx(cm, tmp_path, arch)
        mma = [b for name, b in bodies.items() if "attention" in name and "_mmaP" in name]
        simt = [b for name, b in bodies.items() if "attention" in name and "_simtP" in name]
        assert len(mma) == 1 and len(simt) == 1, list(bodies)
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in mma[0]
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in mma[0]
        assert "cp.async.cg.shared.global" in mma[0]
        assert "mma.sync" not in simt[0]
        # the scores stay on chip: the kernel's only global stores are its output rows
        assert "st.global" in mma[0] and "st.local" not in mma[0]
