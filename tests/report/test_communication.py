"""The communication model counts what the sharded graphs hold: Megatron's
2·b·s·d all-reduced elements per block per rank (plus the embedding's), and
per-rank parameters of 1/N of the split weights plus the replicated ones,
at GPT-3's shape (96 layers, d=12288) without weights. A collective
declared in a test (and removed after) is counted with no edit to the model."""
from __future__ import annotations

from registry_testing import declared_collective

from blockc.frontends import build_model, trace
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.passes.shard import shard
from blockc.report.communication import RankSummary, collective_bytes, rank_summaries

GPT3 = {"layers": "96", "d_model": "12288", "heads": "96", "vocab": "50304", "max_positions": "2048"}


def test_two_all_reduces_of_b_s_d_per_block():
    layers, b, s, d = 3, 2, 7, 64
    graph = trace(build_model("gpt2", {"layers": str(layers), "vocab": "256", "d_model": str(d), "heads": "4"}))
    for row in rank_summaries(shard(graph, 2), {"batch": b, "seq": s}):
        reduce, gather = row.collectives
        assert (reduce.op, reduce.count) == ("all_reduce", 2 * layers + 1)
        assert reduce.sent == (2 * layers + 1) * b * s * d * 4
        assert (gather.op, gather.count, gather.sent) == ("all_gather", 1, b * s * 128 * 4)
        assert "all_reduce of" in row.format()


def test_gpt3_per_rank_parameters_are_an_eighth():
    graph = trace(build_model("gpt2", GPT3))
    whole = sum(v.type.nbytes({}) for v in graph.params.values())
    sharded = shard(graph, 8)
    replicated = sum(graph.params[n].type.nbytes({}) for n, lay in sharded.layouts.items() if not lay)
    rows = rank_summaries(sharded, {"batch": 1, "seq": 2048})
    assert 174e9 < whole / 4 < 176e9
    for row in rows:
        assert row.param_bytes == (whole - replicated) // 8 + replicated
        assert 21.8e9 < row.param_bytes / 4 < 21.9e9


def test_a_declared_collective_is_counted():
    with declared_collective("test_scatter"):
        g = Graph("scatter")
        x = g.add_input("x", TensorType(DType.float16, (8, 3)))
        g.set_outputs([("y", g.op("test_scatter", g.op("all_reduce", x, world=2), world=2))])
        reduce, scatter = collective_bytes(g, {})
        assert (reduce.op, reduce.count, reduce.sent) == ("all_reduce", 1, 8 * 3 * 2)
        assert (scatter.op, scatter.count, scatter.sent, scatter.received) == ("test_scatter", 1, 8 * 3 * 2, 4 * 3 * 2)
        assert "1 test_scatter of 48 bytes in all" in RankSummary(0, 0, 0, [reduce, scatter]).format()
