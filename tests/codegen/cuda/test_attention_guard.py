"""A guarded attention's CUDA kernels zero a query row exactly when it has
no key to attend, read from the mask and the causal test
(``ops/masking.allowed_keys``), not from the scores: with a finite fill a
row whose allowed keys all score below the fill still has keys, and gives
what the float64 reference gives (about the mean of the forbidden keys'
values), while a row whose keys are all forbidden gives zeros. Checked on
the SIMT kernel (causal, with key tiles skipped), the decode split and its
combine (the row's allowed keys in its last run only), the tensor-core kernel
(emulated), and a guarded attention with no mask, which guards nothing.
One small graph, one emulated build. nvcc compiles the guarded kernels with
warnings as errors and no spills in test_attention.py (tensor cores) and
test_attention_decode.py (split and combine)."""
from __future__ import annotations

import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.lower import generate

FILL = "-10000.0"   # finite, as older BERT exports write it
GUARD = f'scale=0.25, fill={FILL}, guarded=true'
# plain: 40 rows, 40 keys at head size 16 (32-key tiles), causal: the first
# query tile loads one key tile and skips keys 32..39. decode: one row
# against 128 keys (4 tiles: split into runs). mma: float16 head size 64.
# open: no mask, not causal: no key is forbidden, so nothing is zeroed.
GRAPH = f"""graph guard(%q: f32[1,2,40,16], %k: f32[1,2,40,16], %v: f32[1,2,40,16], %keep: bool[1,2,40,40], %qd: f32[1,2,1,16], %kd: f32[1,2,128,16], %vd: f32[1,2,128,16], %keepd: bool[1,2,1,128], %qh: f16[1,2,40,64], %kh: f16[1,2,40,64], %vh: f16[1,2,40,64], %keeph: bool[1,2,40,40]) {{
  %0:f32[1,2,40,16] = attention %q, %k, %v, %keep {{mask="bool", causal=true, {GUARD}}}
  %1:f32[1,2,1,16] = attention %qd, %kd, %vd, %keepd {{mask="bool", causal=false, {GUARD}}}
  %2:f16[1,2,40,64] = attention %qh, %kh, %vh, %keeph {{mask="bool", causal=true, {GUARD}}}
  %3:f32[1,2,40,16] = attention %q, %k, %v {{mask="none", causal=false, {GUARD}}}
  return plain=%0, decode=%1, mma=%2, open=%3
}}
"""
BIG = 300.0   # q . k = -BIG^2 on every key of head 0's row 0: scaled, far below the fill


def _attention_feeds(rng, names, batch, rows, keys, d, dtype):
    """Random q, k, v and mask (``names``), with head 0's row 0 scoring
    -BIG^2/4 on every key and allowed keys 0, 3, 6, ... only (over every key
    tile), or with one row (a decode step), the last 8 only (in the last
    split run, the others having none), and head 1's row 3 (row 0 where
    there is one row) allowed no key."""
    q, k, v, keep = names
    f = {q: rng.standard_normal(batch + (rows, d)), k: rng.standard_normal(batch + (keys, d)),
         v: rng.standard_normal(batch + (keys, d))}
    f[q][0, 0, :, 0] = 0.0      # only row 0 reads component 0, where every key of head 0 holds -BIG
    f[q][0, 0, 0] = 0.0
    f[q][0, 0, 0, 0] = BIG
    f[k][0, 0, :, 0] = -BIG
    mask = rng.random(batch + (rows, keys)) > 0.3
    mask[..., 0] = True
    mask[0, 0, 0] = np.arange(keys) % 3 == 0 if rows > 1 else np.arange(keys) >= keys - 8
    mask[0, 1, min(3, rows - 1)] = False
    f = {n: x.astype(dtype) for n, x in f.items()}
    f[keep] = mask
    return f


def guard_feeds(seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {**_attention_feeds(rng, ("q", "k", "v", "keep"), (1, 2), 40, 40, 16, np.float32),
            **_attention_feeds(rng, ("qd", "kd", "vd", "keepd"), (1, 2), 1, 128, 16, np.float32),
            **_attention_feeds(rng, ("qh", "kh", "vh", "keeph"), (1, 2), 40, 40, 64, np.float16)}


@pytest.fixture(scope="module")
def guard_runs():
    """The graph's library, run with tensor cores (the float16 attention on
    its mma kernel) and without, and the float64 reference."""
    if toolchain.find_gxx() is None:
        pytest.skip("no g++: the CUDA emulator needs one")
    from blockc.runtime.cuda_runner import emulated_library, run_model
    g = blockc.parse_graph(GRAPH)
    cm = generate(g, {})
    so = emulated_library(cm)
    f = guard_feeds()
    runs = {tc: run_model(cm, so, f, emulated=True, tensor_cores=tc) for tc in (True, False)}
    return cm, f, runs, blockc.run_reference(g, {}, f)


def forbidden_mean(v, keep, causal_keys=None):
    """Head 0's row 0: every key scores -BIG^2/4, far below the fill that
    replaces the forbidden keys' scores, so the row is their values' mean."""
    forbidden = ~keep[0, 0, 0]
    if causal_keys is not None:
        forbidden[causal_keys:] = True
    return v[0, 0][forbidden].astype(np.float64).mean(axis=0)


CASES = [("plain", True, "v", "keep", 1), ("decode", True, "vd", "keepd", None), ("mma", True, "vh", "keeph", 1), ("mma", False, "vh", "keeph", 1)]


@pytest.mark.parametrize("name, tensor_cores, v, keep, causal_keys", CASES)
def test_a_row_whose_allowed_keys_score_below_the_fill_is_not_zeroed(guard_runs, name, tensor_cores, v, keep,
                                                                     causal_keys):
    _, f, runs, ref = guard_runs
    out = runs[tensor_cores].outputs[name].astype(np.float64)
    want = forbidden_mean(f[v], f[keep], causal_keys)
    np.testing.assert_allclose(ref[name][0, 0, 0], want, rtol=1e-3, atol=1e-3)
    tol = 1e-5 if out.dtype == np.float32 else 2e-3
    np.testing.assert_allclose(out[0, 0, 0], ref[name][0, 0, 0], rtol=tol, atol=tol)
    # every other row as the reference has it too, head 1's row without a key zero
    np.testing.assert_allclose(out, ref[name], rtol=tol, atol=tol)


@pytest.mark.parametrize("name, tensor_cores", [("plain", True), ("decode", True), ("mma", True), ("mma", False)])
def test_a_row_with_no_allowed_key_is_zero(guard_runs, name, tensor_cores):
    _, f, runs, ref = guard_runs
    out = runs[tensor_cores].outputs[name]
    row = min(3, out.shape[-2] - 1)
    assert not ref[name][0, 1, row].any()
    assert not out[0, 1, row].any()
    assert out[0, 1].any(axis=-1).sum() == out.shape[-2] - 1   # the others are not


def test_a_guarded_attention_with_no_mask_guards_nothing(guard_runs):
    """No key is forbidden, so no row is zeroed: head 0's row 0, whose keys
    all score far below the fill, is the mean of every value."""
    _, f, runs, ref = guard_runs
    out = runs[True].outputs["open"]
    np.testing.assert_allclose(ref["open"][0, 0, 0], f["v"][0, 0].astype(np.float64).mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(out, ref["open"], rtol=1e-5, atol=1e-5)


def test_the_paths_ran(guard_runs):
    """The decode attention split over its keys (split and combine), and the
    float16 one ran on its tensor-core kernel (P rounded to float16 gives other last bits)."""
    cm, _, runs, _ = guard_runs
    assert any(s.name.endswith("_decode") and s.name + "_split" in s.kernels for s in cm.steps)
    assert runs[True].counters["kernel_launches"] == 5   # decode: split + combine
    assert not np.array_equal(runs[True].outputs["mma"], runs[False].outputs["mma"])

