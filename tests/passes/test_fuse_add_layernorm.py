"""fuse_add_layernorm: golden IR text for post-norm (with_sum=false) and
pre-norm (with_sum=true), either add operand order, a broadcast residual,
RMSNorm; sites that must not fuse say why."""
import pytest

from blockc import parse_graph
from blockc.passes.fuse_add_layernorm import fuse_add_layernorm
from blockc.passes.manager import label_origins
from pass_testing import check_golden, ir, nodes_of, run_pass

POST_NORM = """
    graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {{
      param @g: f64[4]
      param @b: f64[4]
      %0:f64[2,3,4] = add {a}, {b}
      %1:f64[2,3,4] = layernorm %0, @g, @b {{eps=1e-05}}
      return y=%1
    }}
"""


@pytest.mark.parametrize("a, b", [("%x", "%r"), ("%r", "%x")])
def test_golden_post_norm_either_operand_order(a, b):
    r = check_golden(fuse_add_layernorm, POST_NORM.format(a=a, b=b), f"""
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {{
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[2,3,4] = add_layernorm {a}, {b}, @g, @b {{eps=1e-05, with_sum=false}}
          return y=%0
        }}
    """)
    (site,) = r.sites
    assert site.fused and site.kind == "add_layernorm" and site.ops == ["add", "layernorm"]


def test_golden_pre_norm_returns_the_sum_for_its_later_user():
    # The sum is the next residual: the fused op returns it as output 1, and
    # the later add reads that output.
    r = check_golden(fuse_add_layernorm, """
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {
          param @g: f64[4]
          param @b: f64[4]
          param @w: f64[4,4]
          %0:f64[2,3,4] = add %x, %r
          %1:f64[2,3,4] = layernorm %0, @g, @b {eps=1e-05}
          %2:f64[2,3,4] = matmul %1, @w
          %3:f64[2,3,4] = add %0, %2
          return y=%3
        }
    """, """
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {
          param @g: f64[4]
          param @b: f64[4]
          param @w: f64[4,4]
          %0:f64[2,3,4], %1:f64[2,3,4] = add_layernorm %x, %r, @g, @b {eps=1e-05, with_sum=true}
          %2:f64[2,3,4] = matmul %0, @w
          %3:f64[2,3,4] = add %1, %2
          return y=%3
        }
    """)
    (node,) = nodes_of(r.graph, "add_layernorm")
    (later,) = [n for n in r.graph.nodes if n.op == "add"]
    assert later.inputs[0] is node.outputs[1]


def test_golden_sum_returned_and_read_before_the_norm():
    # The sum is a graph output and is read by a node placed before the norm:
    # with_sum=true, and the graph is re-sorted so that node follows the fused op.
    check_golden(fuse_add_layernorm, """
        graph g(%x: f64[2,3,4], %pos: f64[3,4]) {
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[2,3,4] = add %pos, %x
          %1:f64[2,3,4] = tanh %0
          %2:f64[2,3,4] = layernorm %0, @g, @b {eps=1e-05}
          return y=%2, t=%1, h=%0
        }
    """, """
        graph g(%x: f64[2,3,4], %pos: f64[3,4]) {
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[2,3,4], %1:f64[2,3,4] = add_layernorm %x, %pos, @g, @b {eps=1e-05, with_sum=true}
          %2:f64[2,3,4] = tanh %1
          return y=%0, t=%2, h=%1
        }
    """)


@pytest.mark.parametrize("a, b", [("%x", "%pos"), ("%pos", "%x")])
def test_golden_broadcast_residual_becomes_the_residual(a, b):
    # A [seq,d] table added to [batch,seq,d]: the full-shape operand is the input.
    check_golden(fuse_add_layernorm, f"""
        graph g(%x: f64[batch,seq,4], %pos: f64[seq,4]) {{
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[batch,seq,4] = add {a}, {b}
          %1:f64[batch,seq,4] = layernorm %0, @g, @b {{eps=1e-12}}
          return y=%1
        }}
    """, """
        graph g(%x: f64[batch,seq,4], %pos: f64[seq,4]) {
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[batch,seq,4] = add_layernorm %x, %pos, @g, @b {eps=1e-12, with_sum=false}
          return y=%0
        }
    """)


def test_golden_rmsnorm_pre_and_post_norm():
    r = check_golden(fuse_add_layernorm, """
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {
          param @g1: f64[4]
          param @g2: f64[4]
          %0:f64[2,3,4] = add %r, %x
          %1:f64[2,3,4] = rmsnorm %0, @g1 {eps=1e-06}
          %2:f64[2,3,4] = add %1, %0
          %3:f64[2,3,4] = rmsnorm %2, @g2 {eps=0.001}
          return y=%3
        }
    """, """
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {
          param @g1: f64[4]
          param @g2: f64[4]
          %0:f64[2,3,4], %1:f64[2,3,4] = add_rmsnorm %r, %x, @g1 {eps=1e-06, with_sum=true}
          %2:f64[2,3,4] = add_rmsnorm %0, %1, @g2 {eps=0.001, with_sum=false}
          return y=%2
        }
    """)
    assert [(s.kind, s.fused) for s in r.sites] == [("add_rmsnorm", True), ("add_rmsnorm", True)]


def _rejected(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(fuse_add_layernorm, g)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = r.sites
    assert not site.fused
    return site.reason


def test_both_operands_broadcast_does_not_fuse():
    assert _rejected("""
        graph g(%x: f64[1,3,4], %r: f64[2,1,4]) {
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[2,3,4] = add %x, %r
          %1:f64[2,3,4] = layernorm %0, @g, @b {eps=1e-05}
          return y=%1
        }
    """) == "neither operand of the add has the sum's shape (both are broadcast)"


def test_a_norm_of_something_else_is_not_a_site_match():
    assert _rejected("""
        graph g(%x: f64[2,3,4]) {
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[2,3,4] = tanh %x
          %1:f64[2,3,4] = layernorm %0, @g, @b {eps=1e-05}
          return y=%1
        }
    """) == "expected add, found a tanh result"


def test_a_scale_computed_from_the_sum_does_not_fuse():
    # gamma = mean of the sum over batch and seq: the fused op would have to
    # read a value computed from its own second output.
    assert _rejected("""
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {
          param @b: f64[4]
          %0:f64[2,3,4] = add %x, %r
          %1:f64[4] = reduce_mean %0 {axes=[0,1], keepdims=false}
          %2:f64[2,3,4] = layernorm %0, %1, @b {eps=1e-05}
          return y=%2
        }
    """) == "gamma is computed from a result inside the pattern that the fused op would return (a cycle)"
