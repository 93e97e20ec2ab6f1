"""The ranks of a sharded graph run in one process, in lockstep, on the
float64 reference interpreter: each collective (an op declared
``collective``) by its meaning given the peers' values, its declaration's
``peers`` rule (``ops/collectives.reduce_peers``, ``gather_peers``), with
no processes and no transport; one declared without that rule is refused
by name before any rank runs. It is the oracle the launched ranks
(``parallel/launch.py``) are checked against, and what a test of a
sharding reads first: every rank's graph walks the same node sequence, so
node ``i`` of each rank is ready when the collective at ``i`` needs it.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import BlockcError
from ..ops import registry
from ..ops.evaluate import Env, evaluate_node
from .bindings import bind_inputs


def run_ranks_reference(sharded, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray],
                        *, float64: bool = True) -> list[dict[str, np.ndarray]]:
    """Each rank's outputs (``passes/shard.Sharded``), computed together
    from whole ``feeds`` (each rank given its block of a split input)."""
    graphs = sharded.graphs
    if len({len(g.nodes) for g in graphs}) != 1:
        raise BlockcError("the ranks' graphs differ in length, so they cannot run in lockstep")
    _check_collectives(graphs[0])
    env = Env(bind_inputs(graphs[0], sharded.rank_feeds(feeds, 0)), float64)
    vals = []
    for rank, g in enumerate(graphs):
        mine, fed = sharded.rank_weights(weights, rank), sharded.rank_feeds(feeds, rank)
        v = {id(x): np.asarray(fed[x.name]).astype(env.numpy_dtype(x.dtype), copy=False) for x in g.inputs}
        v.update({id(x): np.asarray(mine[name]).astype(env.numpy_dtype(x.dtype)) for name, x in g.params.items()})
        vals.append(v)
    for i, nodes in enumerate(zip(*(g.nodes for g in graphs))):
        args = [[vals[r][id(x)] for x in n.inputs] for r, n in enumerate(nodes)]
        op = registry.get(nodes[0].op)
        if op.collective:
            results = op.peers_fn(args, nodes[0].attrs)
        else:
            results = [evaluate_node(n, a, env, where=f"rank {r} node {i}") for r, (n, a) in enumerate(zip(nodes, args))]
        for r, (n, res) in enumerate(zip(nodes, results)):
            for out, x in zip(n.outputs, res):
                vals[r][id(out)] = x
    return [{name: vals[r][id(x)] for name, x in g.outputs} for r, g in enumerate(graphs)]


def _check_collectives(graph) -> None:
    """A collective with no meaning over the ranks' values (no ``peers``
    rule; ``numpy`` sees one rank alone) is refused by name, not evaluated
    rank by rank."""
    for n in graph.nodes:
        op = registry.get(n.op)
        if op.collective and op.peers_fn is None:
            raise BlockcError(f"the tensor-parallel reference has no meaning for collective op {n.op!r} over the "
                              f"ranks' values (its declaration gives no peers rule)"
                              + (f" (from {n.loc})" if n.loc else ""))
