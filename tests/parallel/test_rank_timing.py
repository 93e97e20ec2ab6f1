"""``rank_timing.time_collectives``: a rank's collectives timed alone run as
the PyTorch backend runs them, by each op's ``torch`` rule in the registry.
A collective op declared here (and removed after) is timed through its own
rule with no edit to the timing, and one with no rule is refused by name.
(On gloo with 2 ranks the timing runs in ``tests/cli/test_tensor_parallel.py``:
``compare --tp 2``.)"""
from __future__ import annotations

import numpy as np
import pytest
from registry_testing import declared_collective

from blockc.errors import BlockcError
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ops import registry
from blockc.parallel.rank_timing import time_collectives

pytest.importorskip("torch")


@pytest.fixture
def new_collective():
    """``test_scatter``, a collective with no rule for PyTorch yet; forgotten after the test."""
    with declared_collective("test_scatter") as op:
        yield op


def graph_of(op: str, world: int) -> Graph:
    g = Graph("collective")
    x = g.add_input("x", TensorType(DType.float16, (2, 3)))
    g.set_outputs([("y", g.op(op, x, world=world))])
    return g


FEEDS = {"x": np.zeros((2, 3), np.float16)}


def test_a_collective_is_timed_through_its_torch_rule(new_collective):
    seen = []
    new_collective.torch(lambda b, node, xs: b.call(lambda x: seen.append((x.shape, x.dtype)) or x, xs[0]))
    timed = time_collectives(graph_of("test_scatter", 2), FEEDS, warmup=1, repeats=3)
    assert timed["collectives"] == 1 and timed["collectives_s"] >= 0
    import torch
    assert seen == [(torch.Size([2, 3]), torch.float16)] * 4   # warmup and repeats, on the input's shape and dtype
    assert time_collectives(graph_of("test_scatter", 1), FEEDS, warmup=1, repeats=3)["collectives"] == 0


def test_a_collective_without_a_torch_rule_is_refused_by_name(new_collective):
    with pytest.raises(BlockcError, match="the PyTorch backend has no lowering for op 'test_scatter'"):
        time_collectives(graph_of("test_scatter", 2), FEEDS, warmup=0, repeats=1)


def test_a_collective_says_its_group_size():
    with pytest.raises(AssertionError, match="a collective says the size of its group, in an attribute 'world'"):
        registry.define("test_groupless", ("x",), collective=True)
    assert "test_groupless" not in registry.OPS
