"""What a tensor-parallel rank runs: its graph (the model traced, split by
``shard``, fused if asked), its slice of each weight, and the session that
lowers the graph for the case's backend. The worker (``worker.py``) runs
cases with these, and ``rank_timing.py`` times them.
"""
from __future__ import annotations

import functools
import os

from ..errors import WeightsError


def rank_graph_and_weights(job: dict, rank: int, world: int):
    """This rank's graph (sharded, then fused if asked) and its weights.
    The cases of one model share what they can (``_traced``, ``_fused``,
    ``_rank_weights``): compare --tp runs each model as several cases
    (backends by forms), which would otherwise trace and split it per case,
    and rank 0 twice (the one-rank graph beside its part)."""
    key = model_key(job["model"], job.get("overrides"), job.get("pad_vocab"))
    graph = _fused(key, world, rank) if job.get("fused") else _traced(key, world)[1].graphs[rank]
    return graph, dict(_rank_weights(key, world, rank, job.get("weights"), job.get("seed", 0)))


def model_key(model: str, overrides, pad_vocab) -> tuple:
    """What makes a model's graph (built, traced and split): the one key of
    the rank memo below, and of ``launch._check_shards``' one check per
    model. A job field that changes the graph belongs here."""
    return model, tuple(sorted((overrides or {}).items())), bool(pad_vocab)


# A rank process runs one job, so what it memoises here is its cases' models, each built and traced once (the
# graphs are not changed by what uses them: shard and optimize make new ones, a session lowers one as it is).
@functools.lru_cache(maxsize=None)
def _built(key: tuple):
    """The model and its trace."""
    from ..frontends import build_model, trace
    model_name, overrides, _ = key
    model = build_model(model_name, dict(overrides))
    return model, trace(model)


@functools.lru_cache(maxsize=None)
def _traced(key: tuple, world: int):
    from ..passes.shard import shard
    model, traced = _built(key)
    return model, shard(traced, world, pad_vocab=key[2])


def sharded_model(key: tuple, world: int):
    """The model ``key`` names, traced and split over ``world`` ranks, made
    once a process (``launch._check_shards`` refuses what does not divide
    with it, before any rank starts)."""
    return _traced(key, world)[1]


@functools.lru_cache(maxsize=None)
def _fused(key: tuple, world: int, rank: int):
    from ..passes.manager import optimize
    return optimize(_traced(key, world)[1].graphs[rank], check=False).graph


@functools.lru_cache(maxsize=2)   # rank 0's two (its part and the one-rank graph's), case after case
def _rank_weights(key: tuple, world: int, rank: int, path: str | None, seed: int) -> dict:
    """This rank's slice of each weight, read from ``path`` or made from
    ``seed``: made once for the cases that share them (the made weights
    are what a case costs most, more than its trace)."""
    from ..frontends import init_weights
    model, sharded = _traced(key, world)
    if path:
        return read_rank_weights(path, sharded, rank)
    return sharded.rank_weights(init_weights(model, seed=seed), rank)


def check_weights_file(path: str) -> None:
    """A rank reads its slices through safetensors' slice API: other formats
    would be read whole on every rank."""
    if not str(path).endswith(".safetensors"):
        raise WeightsError(f"{path}: a tensor-parallel rank reads its slices of a .safetensors file; "
                           f"convert the weights to .safetensors")
    if not os.path.isfile(path):
        raise WeightsError(f"{path}: no such weights file")


def read_rank_weights(path: str, sharded, rank: int) -> dict:
    """Rank ``rank``'s slice of each weight in a ``.safetensors`` file, read
    through its slice API (memory-mapped), never the whole tensor."""
    from safetensors import safe_open
    check_weights_file(path)
    out = {}
    with safe_open(path, framework="numpy") as f:
        missing = sorted(set(sharded.layouts) - set(f.keys()))
        if missing:
            raise WeightsError(f"{path} has no tensor {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        for name in sharded.layouts:
            part = f.get_slice(name)
            out[name] = sharded.block(name, part.get_shape(), rank, part.__getitem__)
    return out


def rank_session(case: dict, graph, weights):
    """``graph`` lowered for the case's backend (``launch.Case`` checked it is one a rank runs)."""
    from ..runtime.backend import make_backend
    return make_backend(case["backend"]).session(graph, weights)   # its registration says what the name means
