"""The reduction kernels (codegen/cuda/kernels/reduce.py): ``reduce_sum``,
``reduce_max`` and ``reduce_mean`` are one launch each, over the last axis
(a warp a row, or a block a row when the row is longer than 1024), a middle
axis and two adjacent axes (strided), keepdims on and off, over float32,
float16 and the integers, run emulated against the float64 reference at a
small size and one larger than a block; compiled by nvcc for sm_80/sm_90
with warnings as errors and no spills; axes that are not adjacent refused."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.kernel import CudaCodegenError
from blockc.codegen.cuda.lower import generate
from blockc.ir.parser import parse_graph
from blockc.runtime.reference import run_reference

GRAPH = """graph reductions(%x: f32[b,s,n], %h: f16[b,s,n], %w: bf16[b,s,n], %i: i32[b,s,n], %l: i64[b,s,n]) {
  %0:f32[b,s] = reduce_sum %x {axes=[-1], keepdims=false}
  %1:f32[b,s,1] = reduce_max %x {axes=[2], keepdims=true}
  %2:f16[b,s,1] = reduce_mean %h {axes=[-1], keepdims=true}
  %3:f32[b,1,n] = reduce_sum %x {axes=[1], keepdims=true}
  %4:f16[b,n] = reduce_max %h {axes=[1], keepdims=false}
  %5:bf16[b,n] = reduce_mean %w {axes=[-2], keepdims=false}
  %6:i32[b,n] = reduce_sum %i {axes=[1], keepdims=false}
  %7:i64[b,s,1] = reduce_max %l {axes=[-1], keepdims=true}
  %8:f32[b] = reduce_max %x {axes=[1,2], keepdims=false}
  %9:f32[1,1,n] = reduce_sum %x {axes=[0,1], keepdims=true}
  return sum_last=%0, max_last=%1, mean_last=%2, sum_mid=%3, max_mid=%4, mean_mid=%5, isum_mid=%6, imax_last=%7, max_two=%8, sum_two=%9
}
"""
needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
NVCC = toolchain.find_nvcc()


def test_each_reduction_is_one_launch():
    cm = generate(parse_graph(GRAPH), {})
    assert [s.ops for s in cm.steps] == [[op] for op in ["reduce_sum", "reduce_max", "reduce_mean", "reduce_sum",
                                                          "reduce_max", "reduce_mean", "reduce_sum", "reduce_max",
                                                          "reduce_max", "reduce_sum"]]
    assert {"reduce_sum_last_f32_n", "reduce_max_last_i64_n", "reduce_mean_strided_bf16_n",
            "reduce_sum_strided_i32_n"} <= set(cm.kernels)


@needs_gxx
def test_reductions_match_the_reference(emulator):
    graph = parse_graph(GRAPH)
    with emulator.compile(graph, {}) as compiled:
        # the second: rows of 1100 (a block a row) and runs of 9 along s (past the 8 a block's rows take)
        for b, s, n in ((2, 3, 5), (1, 9, 1100)):
            rng = np.random.default_rng(n)
            x = rng.standard_normal((b, s, n))
            x[-1, -1, -1] = np.nan   # a NaN is every reduction's result, a max's too
            feeds = {"x": x.astype(np.float32), "h": x.astype(np.float16), "w": x.astype(ml_dtypes.bfloat16),
                     "i": rng.integers(-9, 9, (b, s, n)).astype(np.int32),
                     "l": rng.integers(-2 ** 40, 2 ** 40, (b, s, n)).astype(np.int64)}
            ours, theirs = compiled.run(feeds), run_reference(graph, {}, feeds, float64=True)
            for k, v in theirs.items():
                assert ours[k].shape == v.shape, k
                tol = 1e-4 if ours[k].dtype == np.float32 else 1e-2   # float16/bfloat16 stores round
                np.testing.assert_allclose(ours[k].astype(np.float64), v, rtol=tol, atol=10 * tol,
                                           err_msg=k)
            assert (ours["isum_mid"].dtype, ours["imax_last"].dtype) == (np.int32, np.int64)
            np.testing.assert_array_equal(ours["imax_last"], theirs["imax_last"])


def test_axes_that_are_not_adjacent_are_refused():
    g = parse_graph("graph g(%x: f32[2,3,4]) {\n  %0:f32[3] = reduce_sum %x {axes=[0,2], keepdims=false}\n"
                    "  return y=%0\n}\n")
    with pytest.raises(CudaCodegenError, match=r"\(reduce_sum\): axes \[0, 2\] of a \[2, 3, 4\] tensor are not "
                                               r"adjacent; the CUDA backend reduces one run of adjacent axes"):
        generate(g, {})


@pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")
def test_reductions_compile_without_warnings_or_spills(tmp_path):
    from blockc.codegen.cuda.build import write_build
    write_build(generate(parse_graph(GRAPH), {}), str(tmp_path))
    result = toolchain.compile_nvcc(str(tmp_path / "model.cu"), ["sm_80", "sm_90"], werror=True,
                                    extra_flags=[f"-I{tmp_path}"])
    found = {(k.short_name, k.arch): k for k in result.kernels if k.short_name.startswith("reduce")}
    assert {a for _, a in found} == {"sm_80", "sm_90"}
    assert {n.rsplit("_", 1)[-1] for n, _ in found} == {"warp", "block", "strided"}
    assert all(k.spill_store_bytes == 0 and k.spill_load_bytes == 0 for k in found.values()), \
        {n: (k.spill_store_bytes, k.spill_load_bytes) for n, k in found.items()}
