"""fuse_bias_activation: golden IR text for relu, gelu, tanh-gelu and silu with the
bias on either side; sites whose intermediates are used elsewhere are
rejected with a reason and the graph is left as it was."""
import pytest

from blockc import parse_graph
from blockc.passes.fuse_bias_activation import fuse_bias_activation
from blockc.passes.manager import label_origins
from pass_testing import check_golden, ir, run_pass


def test_golden_docstring_example():
    r = check_golden(fuse_bias_activation, """
        graph g(%x: f64[b,s,64]) {
          param @ffn.fc1.weight: f64[64,256]
          param @ffn.fc1.bias: f64[256]
          %0:f64[b,s,256] = matmul %x, @ffn.fc1.weight
          %1:f64[b,s,256] = add %0, @ffn.fc1.bias
          %2:f64[b,s,256] = gelu %1 {approximate="tanh"}
          return y=%2
        }
    """, """
        graph g(%x: f64[b,s,64]) {
          param @ffn.fc1.weight: f64[64,256]
          param @ffn.fc1.bias: f64[256]
          %0:f64[b,s,256] = matmul_bias_act %x, @ffn.fc1.weight, @ffn.fc1.bias {activation="gelu_tanh"}
          return y=%0
        }
    """)
    (site,) = r.sites
    assert site.fused and site.kind == "bias_activation" and site.ops == ["matmul", "add", "gelu"]
    assert site.result == "matmul_bias_act"


@pytest.mark.parametrize("act, attrs, activation", [
    ("relu", "", "relu"),
    ("gelu", ' {approximate="none"}', "gelu"),
    ("gelu", ' {approximate="tanh"}', "gelu_tanh"),
    ("silu", "", "silu"),
])
@pytest.mark.parametrize("add", ["%0, @bias", "@bias, %0"])
def test_golden_each_activation_and_bias_side(act, attrs, activation, add):
    check_golden(fuse_bias_activation, f"""
        graph g(%x: f64[3,4]) {{
          param @w: f64[4,8]
          param @bias: f64[8]
          %0:f64[3,8] = matmul %x, @w
          %1:f64[3,8] = add {add}
          %2:f64[3,8] = {act} %1{attrs}
          return y=%2
        }}
    """, f"""
        graph g(%x: f64[3,4]) {{
          param @w: f64[4,8]
          param @bias: f64[8]
          %0:f64[3,8] = matmul_bias_act %x, @w, @bias {{activation="{activation}"}}
          return y=%0
        }}
    """)


def _rejected(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(fuse_bias_activation, g)
    assert not r.changed
    assert str(r.graph) == str(g)
    return [s.reason for s in r.sites if not s.fused]


def test_a_biased_product_used_by_another_node_is_not_fused():
    # relu and gelu both read matmul + bias: fusing either would drop the
    # other's input.
    reasons = _rejected("""
        graph g(%x: f64[3,4]) {
          param @w: f64[4,8]
          param @bias: f64[8]
          %0:f64[3,8] = matmul %x, @w
          %1:f64[3,8] = add %0, @bias
          %2:f64[3,8] = relu %1
          %3:f64[3,8] = gelu %1 {approximate="none"}
          return a=%2, b=%3
        }
    """)
    assert reasons == ["the add result (%1) inside the pattern is used elsewhere"] * 2


def test_a_product_used_by_another_node_is_not_fused():
    assert _rejected("""
        graph g(%x: f64[3,4]) {
          param @w: f64[4,8]
          param @bias: f64[8]
          %0:f64[3,8] = matmul %x, @w
          %1:f64[3,8] = add %0, @bias
          %2:f64[3,8] = relu %1
          return a=%2, raw=%0
        }
    """) == ["the matmul result (%0) inside the pattern is used elsewhere"]


def test_an_added_tensor_that_is_not_a_bias_is_not_fused():
    assert _rejected("""
        graph g(%x: f64[3,4], %r: f64[3,8]) {
          param @w: f64[4,8]
          %0:f64[3,8] = matmul %x, @w
          %1:f64[3,8] = add %0, %r
          %2:f64[3,8] = relu %1
          return y=%2
        }
    """) == ["the added tensor is f64[3,8], not a bias of the last axis"]


def test_an_activation_without_a_bias_is_not_fused():
    assert _rejected("""
        graph g(%x: f64[3,4]) {
          param @w: f64[4,8]
          %0:f64[3,8] = matmul %x, @w
          %1:f64[3,8] = relu %0
          return y=%1
        }
    """) == ["expected add, found a matmul result"]
