"""Shape and dtype rules reject bad operands with messages that name the problem."""
import numpy as np
import pytest

from blockc.errors import BlockcError, ShapeError
from blockc.ir.dims import Sym
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType

seq, batch = Sym.var("seq"), Sym.var("batch")


def graph_with(*types):
    g = Graph()
    return g, [g.add_input(f"x{i}", TensorType(DType.parse(d), s)) for i, (d, s) in enumerate(types)]


@pytest.mark.parametrize("op, types, attrs, message", [
    ("matmul", [("f32", (batch, seq, 64)), ("f32", (32, 64))], {}, "inner dimensions differ"),
    ("matmul", [("f32", (64,)), ("f32", (64, 2))], {}, "rank >= 2"),
    ("add", [("f32", (seq, 4)), ("f32", (batch, 4))], {}, "do not broadcast"),
    ("add", [("f32", (4,)), ("f16", (4,))], {}, "different dtypes"),
    ("exp", [("i64", (4,))], {}, "floating-point"),
    ("reshape", [("f32", (batch, seq, 6))], {"shape": [0, 0, 4, -1]}, "cannot reshape"),
    ("reshape", [("f32", (2, 6))], {"shape": [5, 2]}, "different sizes"),
    ("transpose", [("f32", (2, 3))], {"perm": [0, 0]}, "not a permutation"),
    ("softmax", [("f32", (2, 3))], {"axis": 2}, "out of range"),
    ("layernorm", [("f32", (2, 8)), ("f32", (4,)), ("f32", (8,))], {}, "scale/bias"),
    ("where", [("f32", (2,)), ("f32", (2,)), ("f32", (2,))], {}, "must be bool"),
    ("split", [("f32", (2, 8))], {"axis": 1, "sizes": [3, 3]}, "do not add up"),
    ("gather", [("f32", (10, 4)), ("f32", (2,))], {}, "indices must be"),
    ("cast", [("f32", (2,))], {"to": "float8"}, "unknown dtype"),
    ("gelu", [("f32", (2,))], {"approximate": "fast"}, "approximate must be"),
    ("attention", [("f32", (1, 2, 3, 4))] * 3 + [("f32", (1, 1, 3, 3))], {"mask": "additive", "guarded": True},
     "guarded takes a boolean mask or none"),
])
def test_bad_operands(op, types, attrs, message):
    g, xs = graph_with(*types)
    with pytest.raises(ShapeError, match=message):
        g.add_node(op, xs, attrs)


def test_wrong_arity_and_attribute_kind():
    g, (x,) = graph_with(("f32", (2,)))
    with pytest.raises(ShapeError, match="takes 2 inputs"):
        g.add_node("add", [x])
    with pytest.raises(BlockcError, match="not a int"):
        g.add_node("softmax", [x], {"axis": 1.5})
    with pytest.raises(BlockcError, match="needs attribute 'perm'"):
        g.add_node("transpose", [x])


def test_symbolic_reshape_infers_products():
    g, (x,) = graph_with(("f32", (batch, seq, 64)))
    flat = g.op("reshape", x, shape=[-1, 64])
    assert flat.shape == (batch * seq, 64)
    back = g.op("reshape", flat, shape=[batch, -1, 8, 8])
    assert back.shape == (batch, seq, 8, 8)


def test_gather_out_of_range_is_a_blockc_error():
    from blockc.runtime.reference import run_reference
    g, (ids,) = graph_with(("i64", (4,)))
    table = g.add_param("table", TensorType(DType.float32, (10, 2)))
    g.set_outputs([("y", g.op("gather", table, ids))])
    with pytest.raises(BlockcError, match="out of range"):
        run_reference(g, {"table": np.zeros((10, 2), np.float32)}, {"x0": np.array([0, 1, 2, 10])})
