"""The ONNX emitter's constants (``codegen/onnx_emitter.py``): identical
values share one, in a graph as an initializer and in a function body as a
``Constant`` node, by the one rule both use."""
from __future__ import annotations

import numpy as np

from blockc.codegen.onnx_emitter import FunctionEmitter, OnnxEmitter
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
