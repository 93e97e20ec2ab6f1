"""The communication model of a tensor-parallel rank, beside the traffic
model (``report/traffic.py``): bytes each rank hands to its collectives in
one forward pass, and each rank's parameter bytes and peak activations.

Megatron's split all-reduces the block's output twice (after attention's
output projection and after the second feed-forward projection), each a
``[b, s, d]`` tensor: ``2·b·s·d`` elements per block per rank in the
forward pass, plus one for the vocabulary-parallel embedding; the
vocabulary-split logits are gathered once. Counted from the ranks' graphs
(the nodes of every op declared ``collective``, ``all_reduce`` and
``all_gather`` among them, and their types), so the rule
is checked, not assumed (``tests/report/test_communication.py``). What the
link then costs is a ring all-reduce's ``2·(N-1)/N`` times the bytes over
each link; the model counts bytes, not time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..ir.graph import Graph
from ..ops._rules import numel
from ..ops.registry import collective_ops
from .footprint import footprint

@dataclass
class CollectiveBytes:
    """One kind of collective in a rank's graph: how many, and the bytes of
    their inputs (what the rank contributes) and outputs (what it receives)."""
    op: str
    count: int
    sent: int
    received: int


def collective_bytes(graph: Graph, bindings: Mapping[str, int]) -> list[CollectiveBytes]:
    """Each collective kind in ``graph`` at the sizes ``bindings``, in the
    registry's order."""
    rows = []
    for op in collective_ops():
        nodes = [n for n in graph.nodes if n.op == op]
        if nodes:
            rows.append(CollectiveBytes(
                op, len(nodes),
                sum(numel(n.inputs[0].shape, bindings) * n.inputs[0].dtype.itemsize for n in nodes),
                sum(numel(n.outputs[0].shape, bindings) * n.outputs[0].dtype.itemsize for n in nodes)))
    return rows


@dataclass
class RankSummary:
    """Rank ``rank``'s parameter bytes, and at given sizes its peak live
    activations (``report/footprint.py``: values split across the ranks are
    1/N of the unsplit model's, values every rank holds whole are not) and
    its collectives."""
    rank: int
    param_bytes: int
    activation_bytes: int
    collectives: list

    def format(self) -> str:
        parts = [f"rank {self.rank}: {self.param_bytes:,} parameter bytes, "
                 f"{self.activation_bytes:,} activation bytes at peak"]
        parts += [f"{c.count} {c.op} of {c.sent:,} bytes in all" for c in self.collectives]
        return "; ".join(parts)


def rank_summaries(sharded, bindings: Mapping[str, int]) -> list[RankSummary]:
    """One row per rank of ``passes/shard.Sharded``."""
    return [RankSummary(r, nbytes, footprint(g, bindings).activations, collective_bytes(g, bindings))
            for r, (g, nbytes) in enumerate(zip(sharded.graphs, sharded.param_bytes()))]
