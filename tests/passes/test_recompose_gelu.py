"""recompose_gelu: golden IR text for the decomposed erf and tanh forms and
the variants in the pass's docstring; numbers equal; reasons when a site does not fit.

Matched constants are not consumed (another node may read them): ``dce`` drops them.
"""
import pytest

from blockc import parse_graph
from blockc.passes.dce import dce
from blockc.passes.decompose import decompose
from blockc.passes.manager import label_origins
from blockc.passes.recompose_gelu import recompose_gelu
from pass_testing import assert_same_numbers, check_golden, fused, ir, run_pass

GELUS = """
    graph g(%x: f64[3,4], %y: f64[3,4]) {
      %0:f64[3,4] = gelu %x {approximate="none"}
      %1:f64[3,4] = gelu %y {approximate="tanh"}
      return a=%0, b=%1
    }
"""

DECOMPOSED = """
    graph g(%x: f64[3,4], %y: f64[3,4]) {
      %0:f64[] = constant {value=dense<f64[]: [1.0]>}
      %1:f64[] = constant {value=dense<f64[]: [1.4142135623730951]>}
      %2:f64[3,4] = div %x, %1
      %3:f64[3,4] = erf %2
      %4:f64[3,4] = add %0, %3
      %5:f64[] = constant {value=dense<f64[]: [0.5]>}
      %6:f64[3,4] = mul %5, %x
      %7:f64[3,4] = mul %6, %4
      %8:f64[3,4] = mul %y, %y
      %9:f64[3,4] = mul %8, %y
      %10:f64[] = constant {value=dense<f64[]: [0.7978845608028654]>}
      %11:f64[] = constant {value=dense<f64[]: [0.044715]>}
      %12:f64[3,4] = mul %11, %9
      %13:f64[3,4] = add %y, %12
      %14:f64[3,4] = mul %10, %13
      %15:f64[] = constant {value=dense<f64[]: [1.0]>}
      %16:f64[3,4] = tanh %14
      %17:f64[3,4] = add %15, %16
      %18:f64[] = constant {value=dense<f64[]: [0.5]>}
      %19:f64[3,4] = mul %18, %y
      %20:f64[3,4] = mul %19, %17
      return a=%7, b=%20
    }
"""


def test_golden_decomposed_forms():
    assert str(decompose(parse_graph(ir(GELUS))).graph) == ir(DECOMPOSED)
    r = check_golden(recompose_gelu, DECOMPOSED, """
        graph g(%x: f64[3,4], %y: f64[3,4]) {
          %0:f64[] = constant {value=dense<f64[]: [1.0]>}
          %1:f64[] = constant {value=dense<f64[]: [1.4142135623730951]>}
          %2:f64[] = constant {value=dense<f64[]: [0.5]>}
          %3:f64[3,4] = gelu %x {approximate="none"}
          %4:f64[] = constant {value=dense<f64[]: [0.7978845608028654]>}
          %5:f64[] = constant {value=dense<f64[]: [0.044715]>}
          %6:f64[] = constant {value=dense<f64[]: [1.0]>}
          %7:f64[] = constant {value=dense<f64[]: [0.5]>}
          %8:f64[3,4] = gelu %y {approximate="tanh"}
          return a=%3, b=%8
        }
    """)
    assert str(dce(r.graph).graph) == ir(GELUS)
    assert [(s.kind, len(s.nodes)) for s in fused(r.sites)] == [("gelu", 5), ("gelu", 9)]


def test_golden_variants():
    # erf form: x * 0.7071 (constant first), 1 + erf on the right,
    # 0.5 * (x * phi); tanh form: pow(x, 3), cube * c, (x + ...) * k,
    # (x * phi) * 0.5 with phi first.
    check_golden(recompose_gelu, """
        graph g(%x: f64[3,4], %y: f64[3,4]) {
          %0:f64[] = constant {value=dense<f64[]: [0.7071067811865476]>}
          %1:f64[3,4] = mul %0, %x
          %2:f64[3,4] = erf %1
          %3:f64[] = constant {value=dense<f64[]: [1.0]>}
          %4:f64[3,4] = add %2, %3
          %5:f64[3,4] = mul %x, %4
          %6:f64[] = constant {value=dense<f64[]: [0.5]>}
          %7:f64[3,4] = mul %6, %5
          %8:f64[] = constant {value=dense<f64[]: [3.0]>}
          %9:f64[3,4] = pow %y, %8
          %10:f64[] = constant {value=dense<f64[]: [0.044715]>}
          %11:f64[3,4] = mul %9, %10
          %12:f64[3,4] = add %11, %y
          %13:f64[] = constant {value=dense<f64[]: [0.7978845608028654]>}
          %14:f64[3,4] = mul %12, %13
          %15:f64[3,4] = tanh %14
          %16:f64[3,4] = add %3, %15
          %17:f64[3,4] = mul %16, %y
          %18:f64[3,4] = mul %17, %6
          return a=%7, b=%18
        }
    """, """
        graph g(%x: f64[3,4], %y: f64[3,4]) {
          %0:f64[] = constant {value=dense<f64[]: [0.7071067811865476]>}
          %1:f64[] = constant {value=dense<f64[]: [1.0]>}
          %2:f64[] = constant {value=dense<f64[]: [0.5]>}
          %3:f64[3,4] = gelu %x {approximate="none"}
          %4:f64[] = constant {value=dense<f64[]: [3.0]>}
          %5:f64[] = constant {value=dense<f64[]: [0.044715]>}
          %6:f64[] = constant {value=dense<f64[]: [0.7978845608028654]>}
          %7:f64[3,4] = gelu %y {approximate="tanh"}
          return a=%3, b=%7
        }
    """)


def test_half_times_phi_then_x():
    # torch.onnx's dynamo exporter at opset 18: x * (0.5 * (1 + erf(x / 1.4142)))
    check_golden(recompose_gelu, """
        graph g(%x: f64[3,4]) {
          %0:f64[] = constant {value=dense<f64[]: [1.4142135623730951]>}
          %1:f64[3,4] = div %x, %0
          %2:f64[3,4] = erf %1
          %3:f64[] = constant {value=dense<f64[]: [1.0]>}
          %4:f64[3,4] = add %2, %3
          %5:f64[] = constant {value=dense<f64[]: [0.5]>}
          %6:f64[3,4] = mul %5, %4
          %7:f64[3,4] = mul %x, %6
          return a=%7
        }
    """, """
        graph g(%x: f64[3,4]) {
          %0:f64[] = constant {value=dense<f64[]: [1.4142135623730951]>}
          %1:f64[] = constant {value=dense<f64[]: [1.0]>}
          %2:f64[] = constant {value=dense<f64[]: [0.5]>}
          %3:f64[3,4] = gelu %x {approximate="none"}
          return a=%3
        }
    """)


def test_cube_as_x_times_x_squared():
    g = parse_graph(ir(DECOMPOSED).replace("%9:f64[3,4] = mul %8, %y", "%9:f64[3,4] = mul %y, %8"))
    r = run_pass(recompose_gelu, g)
    assert_same_numbers(g, r.graph)
    assert [n.attrs for n in r.graph.nodes if n.op == "gelu"] == [{"approximate": "none"},
                                                                  {"approximate": "tanh"}]


@pytest.mark.parametrize("old, new, reason", [
    ("[0.5]>}\n  %6", "[0.6]>}\n  %6", "constant half=0.6 is not GELU's 0.5"),
    ("[1.4142135623730951]", "[1.5]", "constant sqrt2=1.5 is not GELU's 1.41421"),
    ("[0.044715]", "[0.05]", "constant c=0.05 is not GELU's 0.044715"),
])
def test_wrong_constants_are_rejected_with_the_constant_named(old, new, reason):
    text = ir(DECOMPOSED)
    assert text.count(old) == 1
    g = label_origins(parse_graph(text.replace(old, new)))
    r = run_pass(recompose_gelu, g)
    assert r.graph.op_counts()["gelu"] == 1  # the other one still fuses
    assert reason in {s.reason for s in r.sites if not s.fused}
