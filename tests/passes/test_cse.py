"""cse: golden IR text; equal nodes and equal constants merge, different ones do not."""
from blockc import parse_graph
from blockc.passes.cse import cse
from pass_testing import check_golden, ir, run_pass


def test_golden():
    # Merges: the two causal masks, the two -1.0 f32 constants, then (because
    # their inputs are now the same) the two wheres on %a, then the two adds,
    # and the two splits. Kept apart: softmax over different axes, an f64
    # constant with the same value, a where on a different input.
    check_golden(cse, """
        graph g(%a: f32[seq,seq], %b: f32[seq,seq], %c: f32[4,6]) {
          %0:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %1:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %2:f32[] = constant {value=dense<f32[]: [-1.0]>}
          %3:f32[] = constant {value=dense<f32[]: [-1.0]>}
          %4:f32[seq,seq] = where %0, %a, %2
          %5:f32[seq,seq] = where %1, %a, %3
          %6:f32[seq,seq] = where %1, %b, %3
          %7:f32[seq,seq] = add %4, %5
          %8:f32[seq,seq] = add %5, %4
          %9:f32[seq,seq] = softmax %7 {axis=-1}
          %10:f32[seq,seq] = softmax %7 {axis=0}
          %11:f64[] = constant {value=dense<f64[]: [-1.0]>}
          %12:f32[4,2], %13:f32[4,4] = split %c {axis=1, sizes=[2,4]}
          %14:f32[4,2], %15:f32[4,4] = split %c {axis=1, sizes=[2,4]}
          %16:f32[4,4] = tanh %13
          %17:f32[4,4] = tanh %15
          %18:f32[4,4] = sub %16, %17
          return y=%6, p=%8, q=%9, r=%10, c=%11, d=%18
        }
    """, """
        graph g(%a: f32[seq,seq], %b: f32[seq,seq], %c: f32[4,6]) {
          %0:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %1:f32[] = constant {value=dense<f32[]: [-1.0]>}
          %2:f32[seq,seq] = where %0, %a, %1
          %3:f32[seq,seq] = where %0, %b, %1
          %4:f32[seq,seq] = add %2, %2
          %5:f32[seq,seq] = softmax %4 {axis=-1}
          %6:f32[seq,seq] = softmax %4 {axis=0}
          %7:f64[] = constant {value=dense<f64[]: [-1.0]>}
          %8:f32[4,2], %9:f32[4,4] = split %c {axis=1, sizes=[2,4]}
          %10:f32[4,4] = tanh %9
          %11:f32[4,4] = sub %10, %10
          return y=%3, p=%4, q=%5, r=%6, c=%7, d=%11
        }
    """)


def test_docstring_example():
    check_golden(cse, """
        graph g(%a: f64[seq,seq], %b: f64[seq,seq], %c: f64[]) {
          %0:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %1:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %2:f64[seq,seq] = where %0, %a, %c
          %3:f64[seq,seq] = where %1, %b, %c
          return y=%2, z=%3
        }
    """, """
        graph g(%a: f64[seq,seq], %b: f64[seq,seq], %c: f64[]) {
          %0:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %1:f64[seq,seq] = where %0, %a, %c
          %2:f64[seq,seq] = where %0, %b, %c
          return y=%1, z=%2
        }
    """)


def test_constants_differing_in_value_shape_or_sign_stay_apart():
    text = ir("""
        graph g(%x: f32[2]) {
          %0:f32[] = constant {value=dense<f32[]: [0.0]>}
          %1:f32[] = constant {value=dense<f32[]: [-0.0]>}
          %2:f32[1] = constant {value=dense<f32[1]: [0.0]>}
          %3:f32[] = constant {value=dense<f32[]: [1.0]>}
          %4:f32[2] = add %x, %0
          %5:f32[2] = add %x, %1
          %6:f32[2] = add %x, %2
          %7:f32[2] = add %x, %3
          return a=%4, b=%5, c=%6, d=%7
        }
    """)
    r = run_pass(cse, text)
    assert not r.changed
    assert str(r.graph) == text


def test_merging_a_graph_output_keeps_both_output_names():
    check_golden(cse, """
        graph g(%x: f64[3]) {
          %0:f64[3] = exp %x
          %1:f64[3] = exp %x
          return a=%0, b=%1
        }
    """, """
        graph g(%x: f64[3]) {
          %0:f64[3] = exp %x
          return a=%0, b=%0
        }
    """)


def test_origins_of_merged_nodes_are_kept():
    from blockc.passes.manager import label_origins
    g = label_origins(parse_graph(ir("""
        graph g(%x: f64[3]) {
          %0:f64[3] = exp %x
          %1:f64[3] = exp %x
          %2:f64[3] = add %0, %1
          return y=%2
        }
    """)))
    r = run_pass(cse, g)
    assert [n.origin for n in r.graph.nodes] == [("%0", "%1"), ("%2",)]
