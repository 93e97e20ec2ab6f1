"""The running-sum kernel (codegen/cuda/kernels/scan.py): ``cumsum`` is one
launch, in every direction ONNX's CumSum has (inclusive, exclusive, from the
end), along the first, a middle and the last axis, over floats and integers,
run emulated against the float64 reference at two sizes of one build."""
from __future__ import annotations

import numpy as np
import pytest

from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.lower import generate
from blockc.ir.parser import parse_graph
from blockc.runtime.reference import run_reference

pytestmark = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")

GRAPH = """graph running_sums(%x: f32[b,s,5], %ids: i64[b,s], %small: i32[b,s]) {
  %0:f32[b,s,5] = cumsum %x {axis=1}
  %1:f32[b,s,5] = cumsum %x {axis=-1, exclusive=true}
  %2:f32[b,s,5] = cumsum %x {axis=0, reverse=true}
  %3:i64[b,s] = cumsum %ids {axis=-1, exclusive=true, reverse=true}
  %4:i32[b,s] = cumsum %small {axis=1}
  return seq=%0, last=%1, batch_back=%2, ids_before=%3, small=%4
}
"""


def test_a_cumsum_is_one_launch_and_no_reduction():
    cm = generate(parse_graph(GRAPH), {})
    assert [s.ops for s in cm.steps] == [["cumsum"]] * 5
    assert sorted(cm.kernels) == ["cumsum_excl_f32_5", "cumsum_excl_rev_i64_n", "cumsum_f32_5", "cumsum_i32_n",
                                  "cumsum_rev_f32_5"]


def test_running_sums_match_the_reference(emulator):
    graph = parse_graph(GRAPH)
    with emulator.compile(graph, {}) as compiled:
        for b, s in ((2, 7), (3, 1)):
            rng = np.random.default_rng(s)
            feeds = {"x": rng.standard_normal((b, s, 5)).astype(np.float32),
                     "ids": rng.integers(-9, 9, (b, s)).astype(np.int64),
                     "small": rng.integers(0, 2, (b, s)).astype(np.int32)}
            ours, theirs = compiled.run(feeds), run_reference(graph, {}, feeds, float64=True)
            assert (ours["ids_before"].dtype, ours["small"].dtype) == (np.int64, np.int32)
            for k, v in theirs.items():
                np.testing.assert_allclose(ours[k], v, rtol=1e-5, atol=1e-5, err_msg=k)
