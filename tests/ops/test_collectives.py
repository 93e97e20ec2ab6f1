"""``all_reduce`` and ``all_gather``: shape rule, meaning (a group of one is
the identity, a larger group needs its peers), and the ONNX encoding as ONNX
Runtime's ``com.microsoft`` collectives, checked by the ONNX checker."""
from __future__ import annotations

import numpy as np
import pytest

from blockc import run_reference, verify
from blockc.codegen.onnx_export import export_onnx
from blockc.errors import BlockcError, ShapeError
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.parser import parse_graph
from blockc.ir.types import TensorType
from blockc.ops.collectives import gather_peers, reduce_peers

BATCH = parse_dim("batch")


def collectives(world: int) -> Graph:
    g = Graph("collectives")
    x = g.add_input("x", TensorType(DType.float32, (BATCH, 3, 4)))
    g.set_outputs([("sum", g.op("all_reduce", x, world=world)),
                   ("joined", g.op("all_gather", x, axis=-1, world=world))])
    verify(g)
    return g


def test_shape_rule():
    g = collectives(4)
    assert g.output("sum").shape == (BATCH, 3, 4)
    assert g.output("joined").shape == (BATCH, 3, 16)
    with pytest.raises(ShapeError, match="world=0 is not a group size"):
        collectives(0)


def test_the_printed_form_parses_back():
    text = str(collectives(2))
    assert "all_gather %x {axis=-1, world=2}" in text
    assert str(parse_graph(text)) == text


def test_a_group_of_one_is_the_identity_and_a_larger_one_needs_its_peers():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    out = run_reference(collectives(1), {}, {"x": x})
    np.testing.assert_array_equal(out["sum"], x)
    np.testing.assert_array_equal(out["joined"], x)
    with pytest.raises(BlockcError, match="all_reduce over 2 ranks needs its peers' values"):
        run_reference(collectives(2), {}, {"x": x})


def test_the_meaning_given_the_peers():
    a, b = np.ones((2, 3)), np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(reduce_peers([a, b]), a + b)
    np.testing.assert_array_equal(gather_peers([a, b], 1), np.concatenate([a, b], axis=1))


def test_onnx_encoding_is_microsoft_collectives():
    model = export_onnx(collectives(2), {})   # export_onnx runs the ONNX checker
    nodes = {n.op_type: n for n in model.graph.node}
    assert nodes["AllReduce"].domain == nodes["AllGather"].domain == "com.microsoft"
    attrs = {a.name: a for a in nodes["AllGather"].attribute}
    assert attrs["group_size"].i == 2 and attrs["axis"].i == -1


def test_a_group_of_one_exports_as_identity():
    model = export_onnx(collectives(1), {})
    assert [n.op_type for n in model.graph.node] == ["Identity", "Identity"]
