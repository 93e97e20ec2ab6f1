"""What a tensor-parallel rank runs: its graph (the model traced, split by
``shard``, fused if asked), its slice of each weight, and the session that
lowers the graph for the case's backend. The worker (``worker.py``) runs
cases with these, and ``rank_timing.py`` times them.
"""
from __future__ import annotations

import os

from ..errors import WeightsError


def rank_graph_and_weights(job: dict, rank: int, world: int):
    """This rank's graph (sharded, then fused if asked) and its weights."""
    from ..frontends import build_model, init_weights, trace
    from ..passes.manager import optimize
    from ..passes.shard import shard
    model = build_model(job["model"], job.get("overrides") or {})
    sharded = shard(trace(model), world, pad_vocab=bool(job.get("pad_vocab")))
    graph = sharded.graphs[rank]
    if job.get("fused"):
        graph = optimize(graph, check=False).graph
    if job.get("weights"):
        weights = read_rank_weights(job["weights"], sharded, rank)
    else:
        weights = sharded.rank_weights(init_weights(model, seed=job.get("seed", 0)), rank)
    return graph, weights


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
