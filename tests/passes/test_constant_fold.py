"""constant_fold: golden IR text; what folds, in which dtype, and what must not fold.

The constants a fold reads are left in place when they become unused: removing
dead nodes is ``dce``'s job (the pipeline ends with it).
"""
import numpy as np

from blockc import parse_graph
from blockc.passes.constant_fold import MAX_ELEMENTS, constant_fold
from blockc.passes.dce import dce
from pass_testing import check_golden, ir, run_pass


def test_docstring_example():
    r = check_golden(constant_fold, """
        graph g(%s: f32[batch,seq,seq]) {
          %0:f32[] = constant {value=dense<f32[]: [64.0]>}
          %1:f32[] = sqrt %0
          %2:f32[batch,seq,seq] = div %s, %1
          return y=%2
        }
    """, """
        graph g(%s: f32[batch,seq,seq]) {
          %0:f32[] = constant {value=dense<f32[]: [64.0]>}
          %1:f32[] = constant {value=dense<f32[]: [8.0]>}
          %2:f32[batch,seq,seq] = div %s, %1
          return y=%2
        }
    """)
    # and after dce, the docstring's "after" exactly
    assert str(dce(r.graph).graph) == ir("""
        graph g(%s: f32[batch,seq,seq]) {
          %0:f32[] = constant {value=dense<f32[]: [8.0]>}
          %1:f32[batch,seq,seq] = div %s, %0
          return y=%1
        }
    """)


def test_golden_chains_multi_output_and_narrow_dtypes():
    # A chain folds all the way (split -> mul -> add with the folded sqrt);
    # float16 computes in float32 and rounds once: 1/3 -> 0.333251953125;
    # causal_mask has no inputs but a symbolic size: it stays.
    check_golden(constant_fold, """
        graph g(%s: f32[batch,seq,seq]) {
          %0:f32[] = constant {value=dense<f32[]: [64.0]>}
          %1:f32[] = sqrt %0
          %2:f32[batch,seq,seq] = div %s, %1
          %3:f32[4] = constant {value=dense<f32[4]: [1.0, 2.0, 3.0, 4.0]>}
          %4:f32[2], %5:f32[2] = split %3 {axis=0, sizes=[2,2]}
          %6:f32[2] = mul %4, %5
          %7:f32[2] = add %6, %1
          %8:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %9:f16[] = constant {value=dense<f16[]: [3.0]>}
          %10:f16[] = reciprocal %9
          return y=%2, z=%7, m=%8, h=%10, k=%3
        }
    """, """
        graph g(%s: f32[batch,seq,seq]) {
          %0:f32[] = constant {value=dense<f32[]: [64.0]>}
          %1:f32[] = constant {value=dense<f32[]: [8.0]>}
          %2:f32[batch,seq,seq] = div %s, %1
          %3:f32[4] = constant {value=dense<f32[4]: [1.0, 2.0, 3.0, 4.0]>}
          %4:f32[2] = constant {value=dense<f32[2]: [1.0, 2.0]>}
          %5:f32[2] = constant {value=dense<f32[2]: [3.0, 4.0]>}
          %6:f32[2] = constant {value=dense<f32[2]: [3.0, 8.0]>}
          %7:f32[2] = constant {value=dense<f32[2]: [11.0, 16.0]>}
          %8:bool[seq,seq] = causal_mask {rows=seq, cols=seq}
          %9:f16[] = constant {value=dense<f16[]: [3.0]>}
          %10:f16[] = constant {value=dense<f16[]: [0.333251953125]>}
          return y=%2, z=%7, m=%8, h=%10, k=%3
        }
    """, rtol=1e-3)  # the reference computes 1/3 in float64; the folded constant is float16


def test_folds_in_the_graph_dtype_not_float64():
    # 0.1 + 0.2 in float32 is 0.30000001192092896, in float64 0.30000000000000004.
    r = run_pass(constant_fold, """
        graph g() {
          %0:f32[] = constant {value=dense<f32[]: [0.1]>}
          %1:f32[] = constant {value=dense<f32[]: [0.2]>}
          %2:f32[] = add %0, %1
          return y=%2
        }
    """)
    (value,) = [n.attrs["value"] for n in r.graph.nodes if n.outputs[0] is r.graph.output("y")]
    assert value.dtype == np.float32 and value == np.float32(0.1) + np.float32(0.2)


def test_what_does_not_fold():
    # An input among the operands; a symbolic result shape; a result over
    # MAX_ELEMENTS (built with the API: its operands print at length).
    g = parse_graph(ir("""
        graph g(%x: f32[2]) {
          %0:f32[2] = constant {value=dense<f32[2]: [1.0, 2.0]>}
          %1:f32[2] = add %0, %x
          %2:f32[8] = constant {value=dense<f32[8]: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]>}
          %3:f32[seq] = slice %2 {axis=0, start=0, end=seq}
          return y=%1, z=%3
        }
    """))
    side = int(np.sqrt(MAX_ELEMENTS)) + 1
    col = g.op("constant", value=np.zeros((side, 1), np.float32))
    row = g.op("constant", value=np.zeros((1, side), np.float32))
    g.set_outputs(g.outputs + [("big", g.op("add", col, row))])
    before = str(g)
    r = run_pass(constant_fold, g)
    assert not r.changed
    assert str(r.graph) == before
