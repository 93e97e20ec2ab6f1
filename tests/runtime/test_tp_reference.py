"""``run_ranks_reference``: each collective runs by its declaration's
``peers`` rule, whatever its name. A collective declared here (and removed
after) runs with no edit to the reference, its ranks given different
values; one declared without the rule is refused by name before any rank
runs. (Sharded models against the unsplit graph: tests/passes/test_shard.py.)"""
from __future__ import annotations

import numpy as np
import pytest
from registry_testing import declared_collective

from blockc.errors import BlockcError
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.passes.shard import Sharded
from blockc.runtime.tp_reference import run_ranks_reference

X = np.arange(12.0).reshape(4, 3)


@pytest.fixture
def new_collective():
    with declared_collective("test_scatter") as op:
        yield op


def ranks(world: int = 2) -> Sharded:
    """Each rank: its block of the ranks' sum (``test_scatter``), and the blocks gathered back."""
    graphs = []
    for _ in range(world):
        g = Graph("scatter_gather")
        part = g.op("test_scatter", g.add_input("x", TensorType(DType.float32, X.shape)), world=world)
        g.set_outputs([("part", part), ("whole", g.op("all_gather", part, axis=0, world=world))])
        graphs.append(g)
    return Sharded(graphs, layouts={}, tp=world)


def test_a_declared_collective_runs_by_its_peers_rule(new_collective):
    new_collective.peers(lambda inputs, attrs: [[block] for block in
                                                np.split(sum(xs[0] for xs in inputs), attrs["world"])])
    got = run_ranks_reference(ranks(2), {}, {"x": X.astype(np.float32)})
    for rank, outputs in enumerate(got):
        np.testing.assert_array_equal(outputs["part"], 2 * X[2 * rank:2 * rank + 2])
        np.testing.assert_array_equal(outputs["whole"], 2 * X)


def test_a_collective_without_a_peers_rule_is_refused_by_name(new_collective):
    with pytest.raises(BlockcError, match="the tensor-parallel reference has no meaning for collective op "
                                          "'test_scatter' over the ranks' values"):
        run_ranks_reference(ranks(2), {}, {"x": X.astype(np.float32)})
