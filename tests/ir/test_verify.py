import pytest

from blockc import parse_graph, verify
from blockc.errors import VerifyError
from blockc.ir.types import TensorType
from blockc.ir.dtypes import DType

TEXT = """\
graph g(%x: f32[batch,8]) {
  param @w: f32[8,8]
  %0:f32[batch,8] = matmul %x, @w
  %1:f32[batch,8] = exp %0
  %2:f32[batch,8] = add %1, %0
  return y=%2
}
"""


def fresh():
    g = parse_graph(TEXT)
    verify(g)
    return g


def test_use_before_definition():
    g = fresh()
    g.nodes[0], g.nodes[1] = g.nodes[1], g.nodes[0]
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(g)


def test_wrong_result_type():
    g = fresh()
    g.nodes[1].outputs[0].type = TensorType(DType.float16, g.nodes[1].outputs[0].type.shape)
    with pytest.raises(VerifyError, match="differ from the op's rule"):
        verify(g)


def test_stale_use_list():
    g = fresh()
    g.nodes[2].inputs[1] = g.inputs[0]  # bypasses the graph API
    with pytest.raises(VerifyError, match="use-list"):
        verify(g)


def test_output_not_in_graph():
    g = fresh()
    other = fresh()
    g.outputs.append(("z", other.nodes[0].output))
    with pytest.raises(VerifyError, match="not defined"):
        verify(g)


def test_duplicate_output_name():
    g = fresh()
    g.outputs.append(("y", g.nodes[0].output))
    with pytest.raises(VerifyError, match="named twice"):
        verify(g)


def test_bad_attribute_caught():
    g = fresh()
    g.nodes[1].attrs["axis"] = 3
    with pytest.raises(VerifyError, match="no attribute 'axis'"):
        verify(g)


def test_graph_api_keeps_graph_valid():
    g = fresh()
    exp = g.nodes[1]
    g.replace_all_uses(exp.output, g.nodes[0].output)
    g.remove_node(exp)
    verify(g)
    assert [n.op for n in g.nodes] == ["matmul", "add"]
