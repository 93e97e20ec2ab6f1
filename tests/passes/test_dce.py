"""dce: golden IR text; dead nodes and parameters go, live ones (and their order) stay."""
from blockc import parse_graph
from blockc.passes.dce import dce
from pass_testing import check_golden, ir, run_pass


def test_golden_drops_dead_nodes_and_params():
    # exp/mul are dead (and with them @dead); the split lives through one of
    # its two outputs; an output may be a graph input; unused graph inputs stay.
    check_golden(dce, """
        graph g(%x: f32[4], %unused: f32[2]) {
          param @w: f32[4]
          param @dead: f32[4]
          %0:f32[4] = exp %x
          %1:f32[4] = mul %0, @dead
          %2:f32[2], %3:f32[2] = split %x {axis=0, sizes=[2,2]}
          %4:f32[4] = tanh %x
          %5:f32[4] = add %4, @w
          %6:f32[2] = neg %3
          return y=%5, z=%6, x2=%x
        }
    """, """
        graph g(%x: f32[4], %unused: f32[2]) {
          param @w: f32[4]
          %0:f32[2], %1:f32[2] = split %x {axis=0, sizes=[2,2]}
          %2:f32[4] = tanh %x
          %3:f32[4] = add %2, @w
          %4:f32[2] = neg %1
          return y=%3, z=%4, x2=%x
        }
    """)


def test_docstring_example():
    check_golden(dce, """
        graph g(%x: f32[4]) {
          %0:f32[4] = exp %x
          %1:f32[4] = tanh %x
          return y=%1
        }
    """, """
        graph g(%x: f32[4]) {
          %0:f32[4] = tanh %x
          return y=%0
        }
    """)


def test_a_dead_chain_goes_whole():
    check_golden(dce, """
        graph g(%x: f64[3]) {
          %0:f64[3] = exp %x
          %1:f64[3] = tanh %0
          %2:f64[3] = neg %1
          %3:f64[3] = relu %x
          return y=%3
        }
    """, """
        graph g(%x: f64[3]) {
          %0:f64[3] = relu %x
          return y=%0
        }
    """)


def test_unused_param_alone_is_a_change():
    text = ir("""
        graph g(%x: f32[4]) {
          param @w: f32[4]
          return y=%x
        }
    """)
    r = run_pass(dce, text)
    assert r.changed
    assert str(r.graph) == "graph g(%x: f32[4]) {\n  return y=%x\n}\n"


def test_live_graph_is_unchanged():
    text = ir("""
        graph g(%x: f32[4], %y: f32[4]) {
          param @w: f32[4]
          %0:f32[4] = mul %x, @w
          %1:f32[4] = add %0, %y
          return a=%1, b=%0
        }
    """)
    r = run_pass(dce, parse_graph(text))
    assert not r.changed
    assert str(r.graph) == text
