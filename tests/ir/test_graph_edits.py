"""Graph edits: inserting before a node and removing nodes are applied to the
node list when it is next read (one sweep, not a scan per edit); the list a
reader sees is always what immediate edits would have made."""
import pytest

from blockc import parse_graph, verify
from blockc.errors import ShapeError
from blockc.ir.builder import Builder

TEXT = """\
graph g(%x: f32[4]) {
  %0:f32[4] = exp %x
  %1:f32[4] = tanh %0
  %2:f32[4] = neg %1
  return y=%2
}
"""


def ops(g):
    return [n.op for n in g.nodes]


def test_inserts_and_removals_read_back_in_order():
    g = parse_graph(TEXT)
    exp, tanh, neg = g.nodes
    b = Builder(g, before=tanh)
    r = b.op("relu", exp.output)
    s = b.op("sqrt", r)
    g.replace_all_uses(tanh.output, s)
    g.remove_node(tanh)
    assert ops(g) == ["exp", "relu", "sqrt", "neg"]
    assert b.created == [r.producer, s.producer]
    verify(g)


def test_a_node_put_before_a_node_that_was_itself_put_in():
    g = parse_graph(TEXT)
    exp, tanh, neg = g.nodes
    r = Builder(g, before=neg).op("relu", tanh.output)
    Builder(g, before=r.producer).op("sqrt", tanh.output)
    g.add_node("relu", [exp.output])  # appended at the end
    assert ops(g) == ["exp", "tanh", "sqrt", "relu", "neg", "relu"]


def test_a_list_read_earlier_is_still_the_graphs_list():
    g = parse_graph(TEXT)
    nodes = g.nodes
    exp, tanh, neg = nodes
    Builder(g, before=neg).op("relu", tanh.output)
    assert ops(g) == ["exp", "tanh", "relu", "neg"] and g.nodes is nodes


def test_removed_node_can_be_put_back_elsewhere():
    g = parse_graph(TEXT)
    exp, tanh, neg = g.nodes
    g.replace_all_uses(neg.output, tanh.output)
    g.remove_node(neg)
    g.insert(neg)
    assert ops(g) == ["exp", "tanh", "neg"]


def test_inserting_before_a_node_of_another_graph_is_an_error():
    g, other = parse_graph(TEXT), parse_graph(TEXT)
    Builder(g, before=other.nodes[0]).op("relu", g.inputs[0])
    with pytest.raises(ShapeError, match="not in the graph"):
        g.nodes
