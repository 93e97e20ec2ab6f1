"""A rank process memoises its cases' models (``rank_model``): jobs that
differ in what makes the graph or the weights get their own, and equal
ones share one build."""
from __future__ import annotations

import numpy as np
import pytest

from blockc.errors import ShardError
from blockc.frontends import build_model, init_weights
from blockc.frontends.weights import save_weights
from blockc.parallel import rank_model
from blockc.parallel.rank_model import rank_graph_and_weights

SMALL = {"layers": "1", "vocab": "255"}


@pytest.fixture
def memo():
    """The memo empty before and after: the counts below are this test's
    (``_built``'s misses: the models built; ``_traced``'s hits: those shared)."""
    memoised = (rank_model._built, rank_model._traced, rank_model._fused, rank_model._rank_weights)
    for f in memoised:
        f.cache_clear()
    yield rank_model
    for f in memoised:
        f.cache_clear()


def _job(**fields):
    return {"model": "llama-tiny", "overrides": SMALL, "pad_vocab": True, "seed": 0, **fields}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_jobs_share_the_memo_only_where_they_are_equal(memo, tmp_path):
    graph, weights = rank_graph_and_weights(_job(), 0, 2)
    again = rank_graph_and_weights(_job(overrides={"vocab": "255", "layers": "1"}), 0, 2)
    assert again[0] is graph and _same(again[1], weights)
    assert memo._built.cache_info().misses == 1 and memo._traced.cache_info().hits >= 1

    seeded = rank_graph_and_weights(_job(seed=1), 0, 2)   # the same model (a hit), other weights
    assert seeded[0] is graph and not _same(seeded[1], weights) and memo._built.cache_info().misses == 1

    deeper = rank_graph_and_weights(_job(overrides={**SMALL, "layers": "2"}), 0, 2)
    assert memo._built.cache_info().misses == 2 and len(deeper[0].nodes) > len(graph.nodes)
    assert len(deeper[1]) > len(weights)

    with pytest.raises(ShardError, match="vocabulary of 255 rows"):   # unpadded: its own trace, refused
        rank_graph_and_weights(_job(pad_vocab=False), 0, 2)

    model = build_model("llama-tiny", SMALL)
    for seed in (5, 6):   # two files: each read, neither the seed's weights
        save_weights(tmp_path / f"w{seed}.safetensors", dict(init_weights(model, seed=seed)))
    read = [rank_graph_and_weights(_job(weights=str(tmp_path / f"w{s}.safetensors")), 0, 2)[1] for s in (5, 6)]
    assert not _same(read[0], weights) and not _same(read[0], read[1])
    assert _same(read[0], rank_graph_and_weights(_job(seed=5), 0, 2)[1])
