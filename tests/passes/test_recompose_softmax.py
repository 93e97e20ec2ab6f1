"""recompose_softmax: golden IR text for the decomposed form and each variant;
numbers equal; reasons when a site does not fit."""
import pytest

from blockc import parse_graph
from blockc.passes.decompose import decompose
from blockc.passes.manager import label_origins
from blockc.passes.recompose_softmax import recompose_softmax
from pass_testing import assert_same_numbers, check_golden, fused, ir, run_pass

SOFTMAX = """
    graph g(%x: f64[2,3,5]) {
      %0:f64[2,3,5] = softmax %x {axis=-1}
      return y=%0
    }
"""


def test_golden_decomposed_form():
    decomposed = decompose(parse_graph(ir(SOFTMAX))).graph
    assert str(decomposed) == ir("""
        graph g(%x: f64[2,3,5]) {
          %0:f64[2,3,1] = reduce_max %x {axes=[-1], keepdims=true}
          %1:f64[2,3,5] = sub %x, %0
          %2:f64[2,3,5] = exp %1
          %3:f64[2,3,1] = reduce_sum %2 {axes=[-1], keepdims=true}
          %4:f64[2,3,5] = div %2, %3
          return y=%4
        }
    """)
    r = check_golden(recompose_softmax, str(decomposed), SOFTMAX)
    (site,) = fused(r.sites)
    assert site.kind == "softmax" and site.ops == ["reduce_max", "sub", "exp", "reduce_sum", "div"]


def test_golden_variants():
    # a: no max subtraction; b: e * 1/sum with the reciprocal first, over a
    # middle axis (given back as a negative axis); c: e * 1/sum the other way
    # round, over axis 0 of a rank-2 tensor.
    check_golden(recompose_softmax, """
        graph g(%x: f64[2,3,5], %y: f64[2,3,5], %z: f64[4,5]) {
          %0:f64[2,3,5] = exp %x
          %1:f64[2,3,1] = reduce_sum %0 {axes=[2], keepdims=true}
          %2:f64[2,3,5] = div %0, %1
          %3:f64[2,1,5] = reduce_max %y {axes=[1], keepdims=true}
          %4:f64[2,3,5] = sub %y, %3
          %5:f64[2,3,5] = exp %4
          %6:f64[2,1,5] = reduce_sum %5 {axes=[1], keepdims=true}
          %7:f64[2,1,5] = reciprocal %6
          %8:f64[2,3,5] = mul %7, %5
          %9:f64[4,5] = exp %z
          %10:f64[1,5] = reduce_sum %9 {axes=[0], keepdims=true}
          %11:f64[1,5] = reciprocal %10
          %12:f64[4,5] = mul %9, %11
          return a=%2, b=%8, c=%12
        }
    """, """
        graph g(%x: f64[2,3,5], %y: f64[2,3,5], %z: f64[4,5]) {
          %0:f64[2,3,5] = softmax %x {axis=-1}
          %1:f64[2,3,5] = softmax %y {axis=-2}
          %2:f64[4,5] = softmax %z {axis=-2}
          return a=%0, b=%1, c=%2
        }
    """)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_decompose_then_recompose_is_the_identity(axis):
    text = ir(f"""
        graph g(%x: f64[2,3,5]) {{
          %0:f64[2,3,5] = softmax %x {{axis={axis}}}
          return y=%0
        }}
    """)
    g = parse_graph(text)
    r = run_pass(recompose_softmax, decompose(g).graph)
    (node,) = r.graph.nodes
    assert node.op == "softmax" and node.attrs["axis"] % 3 == axis % 3
    assert_same_numbers(g, r.graph)


def test_max_over_another_axis_still_gives_a_softmax_of_the_difference():
    # exp(z - m) / sum(exp(z - m)) is a softmax of (z - m) whatever m is:
    # the max that does not fit stays, and the softmax reads the difference.
    check_golden(recompose_softmax, """
        graph g(%z: f64[2,3,5]) {
          %0:f64[1,3,5] = reduce_max %z {axes=[0], keepdims=true}
          %1:f64[2,3,5] = sub %z, %0
          %2:f64[2,3,5] = exp %1
          %3:f64[2,3,1] = reduce_sum %2 {axes=[2], keepdims=true}
          %4:f64[2,3,5] = div %2, %3
          return y=%4
        }
    """, """
        graph g(%z: f64[2,3,5]) {
          %0:f64[1,3,5] = reduce_max %z {axes=[0], keepdims=true}
          %1:f64[2,3,5] = sub %z, %0
          %2:f64[2,3,5] = softmax %1 {axis=-1}
          return y=%2
        }
    """)


def test_rejections_say_why():
    text = ir("""
        graph g(%x: f64[2,3,5], %y: f64[3,5]) {
          %0:f64[2,3,5] = exp %x
          %1:f64[2,1,1] = reduce_sum %0 {axes=[1,2], keepdims=true}
          %2:f64[2,3,5] = div %0, %1
          %3:f64[3,5] = exp %y
          %4:f64[3,1] = reduce_sum %3 {axes=[-1], keepdims=true}
          %5:f64[3,5] = div %3, %4
          %6:f64[3,5] = tanh %3
          return a=%2, b=%5, c=%6
        }
    """)
    g = label_origins(parse_graph(text))
    r = run_pass(recompose_softmax, g)
    assert not r.changed and str(r.graph) == text
    reasons = {s.anchor: s.reason for s in r.sites}
    assert reasons["%2"] == "the sum is not over one axis with keepdims"
    assert reasons["%5"] == "the exp result (%3) is used elsewhere and the fused op does not return it"
