"""The ONNX emitter (``codegen/onnx_emitter.py``): identical constants share
one, in a graph as an initializer and in a function body as a ``Constant``
node, by the one rule both use; symbolic dims are read off the inputs' axes."""
from __future__ import annotations

import numpy as np

from blockc.codegen.onnx_emitter import FunctionEmitter, OnnxEmitter
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType


def _graph() -> Graph:
    g = Graph("g")
    g.add_input("x", TensorType(DType.float32, (2,)))
    return g


def test_identical_constants_share_one_initializer_in_a_graph():
    e = OnnxEmitter(_graph(), 18, ["x"])
    a, b = e.const(np.float32(2.0)), e.const(np.array(2.0, np.float32))
    other = e.const(np.float64(2.0))   # another dtype: another constant
    assert a == b != other and [t.name for t in e.initializers] == [a, other] and e.nodes == []


def test_identical_constants_share_one_constant_node_in_a_function():
    e = FunctionEmitter(_graph(), 18, ["x"])
    a, b = e.const(np.int64([1, 2])), e.const(np.array([1, 2], np.int64))
    assert a == b and e.initializers == [] and [n.op_type for n in e.nodes] == ["Constant"]
    assert list(e.nodes[0].output) == [a] and e.is_node_output(a)


def test_symbols_are_read_off_axes_that_hold_them_in_expressions():
    """``past`` read as a ``past+seq`` axis less a ``seq`` axis, and
    ``batch*seq`` whole from its own axis (no axis is ``batch`` alone), as
    ONNX Runtime computes them from the inputs' shapes."""
    import onnx
    from onnx import helper

    from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)
    g = Graph("g")
    shapes = {"rows": "batch*seq", "keys": "past+seq", "q": "seq"}
    for name, dim in shapes.items():
        g.add_input(name, TensorType(DType.float32, (parse_dim(dim), 2)))
    e = OnnxEmitter(g, 18, list(shapes))
    out = e.dims((parse_dim("past"), parse_dim("batch*seq"), parse_dim("2*past+seq")))
    inputs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [d, 2]) for n, d in shapes.items()]
    model = helper.make_model(helper.make_graph(e.nodes, "g", inputs, [
        helper.make_tensor_value_info(out, onnx.TensorProto.INT64, [3])], e.initializers),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    feeds = {n: np.zeros((size, 2), np.float32) for n, size in {"rows": 3 * 5, "keys": 7 + 5, "q": 5}.items()}
    (got,) = peer_session(model.SerializeToString()).run(None, feeds)
    assert got.tolist() == [7, 15, 2 * 7 + 5]
