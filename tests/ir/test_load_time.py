"""Which nodes are computed once at load (ir/load_time.py): fixed-size results
of parameters and constants, never a value that depends on a run-time dim."""
from blockc.ir.load_time import load_time_nodes
from blockc.ir.parser import parse_graph

TEXT = """graph g(%x: f32[seq]) {
  param @p: f32[8]
  %0:f32[4] = slice @p {axis=0, start=0, end=4}
  %1:f32[4] = neg %0
  %2:f32[1] = slice @p {axis=0, start=seq-1, end=seq}
  %3:i64[] = dim_value {value=seq}
  %4:f32[seq] = add %x, %2
  return a=%1, b=%3, c=%4
}
"""


def test_a_value_a_symbolic_attribute_decides_is_computed_at_run_time():
    g = parse_graph(TEXT)
    static = load_time_nodes(g)
    # the fixed slice and what it feeds are load-time; the slice at seq-1 and seq as data are
    # fixed-size but known only once seq is, and %4 reads an input
    assert [n.op for n in g.nodes if id(n) in static] == ["slice", "neg"]
    assert [n.attrs.get("start") for n in g.nodes if id(n) in static] == [0, None]
