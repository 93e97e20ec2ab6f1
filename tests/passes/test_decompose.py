"""decompose: golden IR text, and numbers equal to the composite ops in float64."""
import numpy as np
import pytest

from blockc import build_model, init_weights, parse_graph, run_reference, trace, verify
from blockc.frontends.catalog import BUILTINS
from blockc.passes.decompose import decompose

BEFORE = """\
graph g(%x: f32[batch,seq,4]) {
  param @g: f32[4]
  param @b: f32[4]
  %0:f32[batch,seq,4] = layernorm %x, @g, @b {eps=1e-05}
  %1:f32[batch,seq,4] = softmax %0 {axis=-1}
  return y=%1
}
"""

AFTER = """\
graph g(%x: f32[batch,seq,4]) {
  param @g: f32[4]
  param @b: f32[4]
  %0:f32[batch,seq,1] = reduce_mean %x {axes=[-1], keepdims=true}
  %1:f32[batch,seq,4] = sub %x, %0
  %2:f32[batch,seq,4] = mul %1, %1
  %3:f32[batch,seq,1] = reduce_mean %2 {axes=[-1], keepdims=true}
  %4:f32[] = constant {value=dense<f32[]: [9.999999747378752e-06]>}
  %5:f32[batch,seq,1] = add %3, %4
  %6:f32[batch,seq,1] = sqrt %5
  %7:f32[batch,seq,4] = div %1, %6
  %8:f32[batch,seq,4] = mul %7, @g
  %9:f32[batch,seq,4] = add %8, @b
  %10:f32[batch,seq,1] = reduce_max %9 {axes=[-1], keepdims=true}
  %11:f32[batch,seq,4] = sub %9, %10
  %12:f32[batch,seq,4] = exp %11
  %13:f32[batch,seq,1] = reduce_sum %12 {axes=[-1], keepdims=true}
  %14:f32[batch,seq,4] = div %12, %13
  return y=%14
}
"""


def test_golden():
    result = decompose(parse_graph(BEFORE))
    assert result.changed
    verify(result.graph)
    assert str(result.graph) == AFTER
    assert not decompose(result.graph).changed


OPS = {
    "layernorm": "%0:f32[3,7] = layernorm %x, @g, @b {eps=0.001}",
    "rmsnorm": "%0:f32[3,7] = rmsnorm %x, @g {eps=0.001}",
    "softmax": "%0:f32[3,7] = softmax %x {axis=0}",
    "gelu": '%0:f32[3,7] = gelu %x {approximate="none"}',
    "gelu_tanh": '%0:f32[3,7] = gelu %x {approximate="tanh"}',
    "cumsum": "%0:f32[3,7] = cumsum %x {axis=1}",
    "cumsum_exclusive": "%0:f32[3,7] = cumsum %x {axis=0, exclusive=true}",
    "cumsum_reverse": "%0:f32[3,7] = cumsum %x {axis=-1, reverse=true}",
    "cumsum_both": "%0:f32[3,7] = cumsum %x {axis=1, exclusive=true, reverse=true}",
}


@pytest.mark.parametrize("name", OPS)
def test_each_decomposition_matches_its_op(name):
    # float64 graphs: the decomposition's constants (eps, sqrt(2/pi), ...) are then exact too.
    text = ("graph g(%x: f64[3,7]) {\n  param @g: f64[7]\n  param @b: f64[7]\n  "
            + OPS[name].replace("f32", "f64") + "\n  return y=%0\n}\n")
    g = parse_graph(text)
    d = decompose(g).graph
    verify(d)
    assert name.split("_")[0] not in d.op_counts()
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((3, 7)) * 3}
    weights = {"g": rng.standard_normal(7), "b": rng.standard_normal(7)}
    want = run_reference(g, weights, feeds)["y"]
    got = run_reference(d, weights, feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-6)])
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_forms_agree(name, dtype, tol):
    """In float64 models the forms agree exactly; in float32 ones they differ
    only by the rounding of the decompositions' constants to float32."""
    model = build_model(name, {"layers": "2", "d_model": "32", "heads": "4", "dtype": dtype}
                        | ({"vocab": "50"} if "vocab" in BUILTINS[name].config.__dataclass_fields__ else {}))
    g = trace(model)
    d = decompose(g).graph
    verify(d)
    assert "layernorm" not in d.op_counts() and "softmax" not in d.op_counts()
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 2, "seq": 5}, rng) for s in model.inputs()}
    w = dict(init_weights(model, seed=3))
    a, b = run_reference(g, w, feeds), run_reference(d, w, feeds)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=tol, atol=tol)
