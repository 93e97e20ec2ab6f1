"""The printed IR parses back to an identical graph; parse errors point at line and column."""
import numpy as np
import pytest

from blockc import build_model, parse_graph, trace, verify
from blockc.errors import ParseError
from blockc.passes.forms import to_form
from blockc.frontends.catalog import BUILTINS
from blockc.ir.graph import Graph

SMALL = """\
graph g(%x: f32[batch,seq,8], %"odd name": bool[seq,past+seq]) {
  param @w: f32[8,8]
  param @"blocks.0.weird key": f32[8]
  %0:f32[batch,seq,8] = matmul %x, @w
  %1:f32[batch,seq,8] = add %0, @"blocks.0.weird key"
  %2:f32[] = constant {value=dense<f32[]: [-inf]>}
  %3:f32[batch,seq,4], %4:f32[batch,seq,4] = split %1 {axis=-1, sizes=[4,4]}
  %5:f32[batch,seq,2,2] = reshape %3 {shape=[0,0,2,-1]}
  %6:f32[batch,seq,8] = gelu %1 {approximate="tanh"}
  %7:f32[batch,seq,8] = slice %6 {axis=1, start=0, end=seq}
  return y=%5, "odd out"=%4, z=%7
}
"""


def structure(g: Graph):
    """Everything a graph is, independent of object identity."""
    index = {}
    for i, v in enumerate(g.inputs):
        index[id(v)] = ("in", i)
    for name, v in g.params.items():
        index[id(v)] = ("param", name)
    nodes = []
    for i, n in enumerate(g.nodes):
        attrs = {k: (v.tobytes(), str(v.dtype), v.shape) if isinstance(v, np.ndarray) else v
                 for k, v in n.attrs.items()}
        nodes.append((n.op, [index[id(v)] for v in n.inputs], attrs, [o.type for o in n.outputs]))
        for j, o in enumerate(n.outputs):
            index[id(o)] = ("node", i, j)
    return ([(v.name, v.type) for v in g.inputs], [(k, v.type) for k, v in g.params.items()], nodes,
            [(name, index[id(v)]) for name, v in g.outputs])


def test_small_graph_round_trips_exactly():
    g = parse_graph(SMALL)
    verify(g)
    assert str(g) == SMALL
    assert structure(parse_graph(str(g))) == structure(g)


@pytest.mark.parametrize("name", sorted(BUILTINS))
@pytest.mark.parametrize("form", ["standard", "decomposed"])
def test_every_builtin_round_trips(name, form):
    g = to_form(trace(build_model(name)), form)
    text = str(g)
    again = parse_graph(text)
    verify(again)
    assert str(again) == text
    assert structure(again) == structure(g)


def test_float_constants_round_trip_bit_exactly():
    g = Graph("c")
    values = np.array([0.1, 1 / 3, 1e-30, -2.5e38, np.nan, np.inf], np.float32)
    v = g.op("constant", value=values)
    h = g.op("constant", value=np.array([0.1, 65504.0], np.float16))
    g.set_outputs([("v", v), ("h", h)])
    again = parse_graph(str(g))
    got = again.output("v").producer.attrs["value"]
    assert got.dtype == np.float32 and got.tobytes() == values.tobytes()
    assert again.output("h").producer.attrs["value"].tobytes() == np.array([0.1, 65504.0], np.float16).tobytes()


@pytest.mark.parametrize("text, line, col, message", [
    ("graph g(%x: f32[4]) {\n  %0:f32[4] = exp %y\n  return y=%0\n}\n", 2, 19, "undefined value %y"),
    ("graph g(%x: f32[4]) {\n  %0:f32[5] = exp %x\n  return y=%0\n}\n", 2, 15, "declared f32[5]"),
    ("graph g(%x: f32[4]) {\n  %0:f32[4] = frobnicate %x\n  return y=%0\n}\n", 2, 15, "unknown op"),
    ("graph g(%x: q32[4]) {\n", 1, 13, "unknown dtype"),
    ("graph g(%x: f32[4]) {\n  %0:f32[4] = exp %x {axis=}\n}\n", 2, 28, "attribute value"),
    ("graph g(%x: f32[4]) {\n  %0:f32[4] = exp %x $\n}\n", 2, 22, "unexpected character"),
    ("graph g(%x: f32[4]) {\n  %0:f32[4] = exp %x\n  return y=%0\n", 3, 1, "missing closing"),
    ("graph g(%x: f32[4]) {\n  %0:f32[4] = exp %x\n  %0:f32[4] = exp %x\n}\n", 3, 3, "defined twice"),
    ("graph g(%x: f32[4]) {\n  %0:f32[4] = exp %x {bogus=1}\n}\n", 2, 15, "no attribute 'bogus'"),
])
def test_parse_errors_name_line_and_column(text, line, col, message):
    with pytest.raises(ParseError) as info:
        parse_graph(text)
    err = info.value
    assert (err.line, err.column) == (line, col), str(err)
    assert message in str(err)


def test_to_networkx_matches_graph():
    g = parse_graph(SMALL)
    G = g.to_networkx()
    assert sum(1 for _, d in G.nodes(data=True) if d["op"] not in ("input", "param", "output")) == len(g.nodes)
    import networkx as nx
    assert nx.is_directed_acyclic_graph(G)
    assert G.in_degree("n0") == 2
