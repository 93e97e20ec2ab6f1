"""recompose_silu: golden IR text for ``x * sigmoid(x)`` in both operand
orders (the ONNX spelling of SiLU below opset 24); numbers equal; what must
be left alone."""
from blockc import parse_graph
from blockc.passes.manager import label_origins
from blockc.passes.recompose_silu import recompose_silu
from pass_testing import check_golden, fused, ir, run_pass


def test_golden_both_orders():
    # a: mul(x, sigmoid(x)), as torch.onnx exports Hugging Face's silu; b: mul(sigmoid(y), y)
    r = check_golden(recompose_silu, """
        graph g(%x: f64[batch,seq,8], %y: f64[batch,seq,8]) {
          %0:f64[batch,seq,8] = sigmoid %x
          %1:f64[batch,seq,8] = mul %x, %0
          %2:f64[batch,seq,8] = sigmoid %y
          %3:f64[batch,seq,8] = mul %2, %y
          return a=%1, b=%3
        }
    """, """
        graph g(%x: f64[batch,seq,8], %y: f64[batch,seq,8]) {
          %0:f64[batch,seq,8] = silu %x
          %1:f64[batch,seq,8] = silu %y
          return a=%0, b=%1
        }
    """)
    assert [(s.kind, s.ops, s.result) for s in fused(r.sites)] == [("silu", ["sigmoid", "mul"], "silu")] * 2


def _sites(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(recompose_silu, g)
    return g, r, [s for s in r.sites if s.anchor_op == "mul"]


def test_a_gate_of_another_tensor_is_not_silu():
    # SwiGLU's product, silu(g) * up, is not itself a SiLU; nor is x * sigmoid(y).
    g, r, sites = _sites("""
        graph g(%x: f64[3,4], %y: f64[3,4]) {
          %0:f64[3,4] = sigmoid %y
          %1:f64[3,4] = mul %x, %0
          return a=%1
        }
    """)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = sites
    assert site.reason == "x must be the same value in both places"


def test_a_sigmoid_used_elsewhere_stays():
    g, r, (site,) = _sites("""
        graph g(%x: f64[3,4]) {
          %0:f64[3,4] = sigmoid %x
          %1:f64[3,4] = mul %x, %0
          return a=%1, gate=%0
        }
    """)
    assert not r.changed
    assert site.reason == "the sigmoid result (%0) inside the pattern is used elsewhere"
