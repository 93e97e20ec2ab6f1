"""The tensor-core attention kernel run emulated: the emulator implements
cp.async, ldmatrix (.x4 and .trans) and mma.sync m16n8k16 warp-collectively
with the PTX ISA's fragment layouts (blockc_cuda.h), so with
BLOCKC_CUDA_TENSOR_CORES=1 the very kernel a GPU runs -- not the SIMT one --
is checked against the float64 reference: float16 and bfloat16, head sizes
64 and 128, every mask kind, causal from the bottom right, grouped-query
attention, fully masked rows, lengths off the 64-row and 64/32-key tiles;
race-checked (the emulator's default) and under AddressSanitizer."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.lower import generate

pytestmark = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")

# (dtype, head size, mask, causal, q rows, k rows); 70 keys: two 64-key tiles
# at head size 64, three 32-key ones at 128; 33 and 80 rows: one and two 64-row
# query tiles, the second cut short.
CASES = [("f16", 64, "none", True, 33, 70), ("f16", 128, "bool", True, 80, 70),
         ("bf16", 64, "additive", True, 33, 70), ("bf16", 128, "none", False, 33, 70),
         ("f16", 64, "bool", False, 80, 33)]
SPEC = {"f16": (np.float16, 10, "-65504.0"), "bf16": (ml_dtypes.bfloat16, 7, "-1e+30")}


def case_graph(cases=CASES, batch=2, gqa=True):
    lines, inputs, outputs = [], [], []
    for i, (t, d, mask, causal, nq, nk) in enumerate(cases):
        inputs += [f"%q{i}: {t}[{batch},2,{nq},{d}]", f"%k{i}: {t}[{batch},2,{nk},{d}]",
                   f"%v{i}: {t}[{batch},2,{nk},{d}]"]
        extra = ""
        if mask == "bool":
            inputs.append(f"%m{i}: bool[{batch},1,1,{nk}]")
            extra = f", %m{i}"
        elif mask == "additive":
            inputs.append(f"%m{i}: {t}[{batch},1,{nq},{nk}]")
            extra = f", %m{i}"
        lines.append(f"  %{i}:{t}[{batch},2,{nq},{d}] = attention %q{i}, %k{i}, %v{i}{extra} {{scale={d ** -0.5!r}, "
                     f"mask=\"{mask}\", causal={'true' if causal else 'false'}, fill={SPEC[t][2]}}}")
        outputs.append(f"y{i}=%{i}")
    if gqa:   # grouped-query attention: 4 query heads over 2 K/V heads, read through a stride of 0
        inputs += ["%qg: f16[1,2,2,40,64]", "%kg: f16[1,2,1,70,64]", "%vg: f16[1,2,1,70,64]"]
        lines.append('  %g:f16[1,2,2,40,64] = attention %qg, %kg, %vg {scale=0.125, mask="none", causal=true, '
                     'fill=-65504.0}')
        outputs.append("gqa=%g")
    return blockc.parse_graph(f"graph mma({', '.join(inputs)}) {{\n" + "\n".join(lines)
                              + f"\n  return {', '.join(outputs)}\n}}\n")


def case_feeds(graph, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        shape = tuple(v.shape)
        if v.dtype.name == "bool":
            keep = rng.random(shape) > 0.3
            keep[0, ..., 0] = True
            keep[1:] = False   # batch 1: every key masked
            feeds[v.name] = keep
        else:
            x = rng.standard_normal(shape) * (1 if v.name[0] in "vm" else 2)
            feeds[v.name] = x.astype(np.float32).astype(v.dtype.numpy)
    return feeds


@pytest.fixture(scope="module")
def runs():
    from blockc.runtime.cuda_runner import emulated_library, run_model
    g = case_graph()
    cm = generate(g, {})
    so = emulated_library(cm)
    feeds = case_feeds(g)
    mma = run_model(cm, so, feeds, emulated=True, tensor_cores=True).outputs
    simt = run_model(cm, so, feeds, emulated=True, tensor_cores=False).outputs
    return g, cm, feeds, mma, simt, blockc.run_reference(g, {}, feeds)


def test_every_case_has_a_tensor_core_kernel(runs):
    _, cm, _, _, _, _ = runs
    assert all(any(k.endswith("_mma") for k in step.kernels) for step in cm.steps)


@pytest.mark.parametrize("name", [f"y{i}" for i in range(len(CASES))] + ["gqa"])
def test_the_tensor_core_kernel_matches_the_reference(runs, name):
    """Within two units in the last place of the stored type beside float32's
    own error: the probabilities enter P.V rounded to the storage type, as on
    a GPU, where the SIMT kernel keeps them in float32."""
    _, _, _, mma, simt, ref = runs
    bits = 7 if mma[name].dtype == ml_dtypes.bfloat16 else 10
    r = ref[name].astype(np.float64)
    unit = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(r), 2.0 ** -14))) - bits)
    err = np.abs(mma[name].astype(np.float64) - r)
    assert (err <= 2 * unit + 1e-3 * np.abs(r).max()).all(), (name, (err / unit).max())
    # and it is the tensor-core kernel that ran: P rounded to the storage type gives other last bits
    assert not np.array_equal(mma[name], simt[name])


def test_fully_masked_rows_average_the_values_on_tensor_cores(runs):
    _, _, feeds, mma, _, _ = runs
    for i, (t, d, mask, causal, nq, nk) in enumerate(CASES):
        if mask == "bool":
            mean = feeds[f"v{i}"][1].astype(np.float64).mean(axis=-2, keepdims=True)
            np.testing.assert_allclose(mma[f"y{i}"][1].astype(np.float64), np.broadcast_to(mean, (2, nq, d)),
                                       rtol=2e-3, atol=2e-3)


def test_the_tensor_core_kernel_is_clean_under_address_sanitizer():
    """One case, off both tiles (ASan runs a thread per CUDA thread: ~100x slower shuffles)."""
    from blockc.runtime.cuda_runner import emulated_library, run_model
    g = case_graph([("f16", 64, "bool", True, 33, 70)], batch=1, gqa=False)
    cm = generate(g, {})
    try:
        so = emulated_library(cm, sanitize="address")
    except toolchain.ToolchainError as e:
        if "sanitizer" in str(e).lower() and "runtime" in str(e).lower():
            pytest.skip(str(e))
        raise
    feeds = case_feeds(g, seed=1)
    out = run_model(cm, so, feeds, emulated=True, tensor_cores=True, timeout=600).outputs
    ref = blockc.run_reference(g, {}, feeds)
    assert np.abs(out["y0"].astype(np.float64) - ref["y0"]).max() < 1e-2
