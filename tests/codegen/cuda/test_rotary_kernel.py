"""The rotary kernel (codegen/cuda/kernels/rotary.py): one launch per
rotary op, both pairings (halves and interleaved pairs), the whole head and
part of it, positions per row ([batch, seq]) and shared ([seq]), run
emulated against the float64 reference at two sizes of one build, in
float32, float16 and bfloat16; positions the model computes, outside the
tables, fail the run as the reference does; and every variant compiled by
nvcc for sm_80 and sm_90, warnings as errors, without spills."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import build as cuda_build
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.lower import generate, kernel_steps
from blockc.errors import BlockcError
from blockc.runtime.backend import make_backend

needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
NVCC = toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")
NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
ROWS = 64   # positions in the tables


def rotary_graph(t: str) -> str:
    """Heads of 16 turned whole (16) and in part (8), in halves and in pairs,
    at positions per row and shared by the batch; and at positions the
    graph computes (seq - 1 - s: every position below seq)."""
    inputs, body, outputs = _rotary_parts(t)
    return f"graph rotary_{t}({inputs}) {{\n{body}  return {outputs}\n}}\n"


def _rotary_parts(t: str, p: str = "") -> tuple[str, str, str]:
    """rotary_graph's inputs, params and nodes, and outputs, every name prefixed with ``p``."""
    tables = "".join(f"  param @{p}{w}{rd}: {t}[{ROWS},{rd}]\n" for rd in (16, 8) for w in ("cos", "sin"))
    x, pos, shared = f"%{p}x", f"%{p}pos", f"%{p}shared"
    inputs = f"{x}: {t}[b,3,s,16], {pos}: i64[b,s], {shared}: i64[s]"
    body = tables + f"""  %{p}0:{t}[b,3,s,16] = rotary {x}, @{p}cos16, @{p}sin16, {pos} {{interleaved=false}}
  %{p}1:{t}[b,3,s,16] = rotary {x}, @{p}cos16, @{p}sin16, {pos} {{interleaved=true}}
  %{p}2:{t}[b,3,s,16] = rotary {x}, @{p}cos8, @{p}sin8, {shared} {{interleaved=false}}
  %{p}3:{t}[b,3,s,16] = rotary {x}, @{p}cos8, @{p}sin8, {shared} {{interleaved=true}}
  %{p}4:i64[s] = arange {{n=s}}
  %{p}5:i64[s] = sub {shared}, %{p}4
  %{p}6:{t}[b,3,s,16] = rotary {x}, @{p}cos16, @{p}sin16, %{p}5 {{interleaved=false}}
"""
    outputs = (f"{p}half=%{p}0, {p}pairs=%{p}1, {p}half_part=%{p}2, {p}pairs_part=%{p}3, "
               f"{p}computed=%{p}6")
    return inputs, body, outputs


def weights_for(t: str, p: str = "") -> dict:
    rng = np.random.default_rng(1)
    return {f"{p}{w}{rd}": rng.standard_normal((ROWS, rd)).astype(NUMPY[t]) for rd in (16, 8) for w in ("cos", "sin")}


def feeds_for(t: str, b: int, s: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((b, 3, s, 16)).astype(NUMPY[t]),
            "pos": rng.integers(0, ROWS, (b, s)).astype(np.int64),
            "shared": np.full(s, s - 1, np.int64)}   # with the arange: positions s-1 down to 0


def test_a_rotary_is_one_launch():
    model = blockc.build_model("llama-tiny")
    graph = blockc.to_form(blockc.trace(model.for_cache("decode", cache_len=32)), "fused")
    _, steps = kernel_steps(graph, dict(blockc.init_weights(model)))
    ops = [[n.op for n in step] for step in steps]
    # q and k in each of 2 layers, each one launch: no gather, split, neg or concat of the tables' rows
    assert ops.count(["rotary"]) == 4 and ["neg"] not in ops
    assert len(steps) == 40


@needs_gxx
@pytest.mark.parametrize("t", NUMPY)
def test_rotary_matches_the_reference(t):
    graph = blockc.parse_graph(rotary_graph(t))
    weights = weights_for(t)
    eps = float(ml_dtypes.finfo(NUMPY[t]).eps)
    with make_backend("cuda-emu").compile(graph, weights) as compiled:
        for b, s in ((2, 5), (3, 40)):
            feeds = feeds_for(t, b, s, seed=s)
            got = compiled.run(feeds)
            want = blockc.run_reference(graph, weights, feeds, float64=True)
            for name, ref in want.items():
                assert got[name].dtype == NUMPY[t]
                # one rounding of a two-term sum of products computed in float32
                np.testing.assert_allclose(got[name].astype(np.float64), ref, rtol=0,
                                           atol=2 * eps * float(np.abs(ref).max()), err_msg=f"{name} b={b} s={s}")


@needs_gxx
def test_computed_positions_outside_the_tables_fail_the_run():
    """%6 turns at positions the graph computes (shared - s), which no check
    of the feeds sees: within the op's meaning, [-64, 64) (negative ones
    count from the end, as a gather's), they run as on the reference;
    outside it, blockc_run refuses the run, naming the op and the first."""
    graph = blockc.parse_graph(rotary_graph("f32"))
    weights = weights_for("f32")
    with make_backend("cuda-emu").compile(graph, weights) as compiled:
        with pytest.raises(BlockcError, match=r"input 'shared'.* out of range \[0, 64\)"):   # an input: checked first
            compiled.run({**feeds_for("f32", 1, 4, seed=0), "shared": np.array([1, 1, 70, 1], np.int64)})
        near = {**feeds_for("f32", 1, 4, seed=0), "shared": np.zeros(4, np.int64)}   # computed 0, -1, -2, -3
        got, want = compiled.run(near), blockc.run_reference(graph, weights, near)
        np.testing.assert_allclose(got["computed"], want["computed"], rtol=1e-6, atol=1e-6)
        far = {**feeds_for("f32", 1, 70, seed=0), "shared": np.zeros(70, np.int64)}   # computed 0 down to -69
        with pytest.raises(BlockcError, match="out of range"):
            blockc.run_reference(graph, weights, far)
        with pytest.raises(BlockcError, match=r"blockc_run in .* returned 1 \(rotary %6: computed indices out of "
                                              r"range \[-64, 64\) \(the first, at position 65, is -65\)\)"):
            compiled.run(far)


@needs_nvcc
def test_every_variant_compiles_for_sm80_and_sm90_without_spills(tmp_path):
    # every dtype's graph in one model: one nvcc run (most of a run is the host code's, whatever the kernels)
    parts = [_rotary_parts(t, f"{t}_") for t in NUMPY]
    graph = blockc.parse_graph(f"graph rotary_all({', '.join(i for i, _, _ in parts)}) {{\n"
                               + "".join(b for _, b, _ in parts) + f"  return {', '.join(o for _, _, o in parts)}\n}}\n")
    cm = generate(graph, {k: v for t in NUMPY for k, v in weights_for(t, f"{t}_").items()})
    assert {s.name.rsplit("_", 1)[1] for s in cm.steps if s.ops == ["rotary"]} == set(NUMPY)
    cuda_build.write_build(cm, str(tmp_path))
    result = toolchain.compile_nvcc(str(tmp_path / "model.cu"), ["sm_80", "sm_90"], werror=True,
                                    extra_flags=[f"-I{tmp_path}"])
    rotary = [k for k in result.kernels if k.short_name.startswith("rotary_")]
    assert {k.arch for k in rotary} == {"sm_80", "sm_90"} and len(rotary) == 2 * len(
        {c.name for c in cm.steps if c.ops == ["rotary"]})
    assert all(k.spill_store_bytes == 0 and k.spill_load_bytes == 0 for k in rotary)
