"""A sharded model as ONNX: one file per rank (``m.onnx`` -> ``m.rank0.onnx``,
``m.rank1.onnx``, ...), each rank's graph with its own slice of the weights
and its collectives as ONNX Runtime's ``com.microsoft`` ``AllReduce`` and
``AllGather`` (``ops/collectives.py``)."""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from .onnx_export import save_onnx

# What a user is told with the files: the standard onnxruntime wheel has no collectives.
NEEDS_COLLECTIVES = ("the rank files use com.microsoft AllReduce/AllGather, which only an ONNX Runtime built "
                     "with NCCL or MPI (--use_nccl / --use_mpi) runs; the standard onnxruntime wheel does not")


def rank_paths(path: str | os.PathLike, tp: int) -> list[str]:
    """``m.onnx`` -> ``[m.rank0.onnx, ...]``."""
    stem, ext = os.path.splitext(os.fspath(path))
    return [f"{stem}.rank{r}{ext or '.onnx'}" for r in range(tp)]


def save_rank_onnx(sharded, weights: Mapping[str, np.ndarray] | None, path: str | os.PathLike,
                   **kw) -> list[str]:
    """Write each rank's graph of ``sharded`` (``passes/shard.Sharded``) with
    its slice of ``weights`` (None: weightless); the paths written. ``kw`` goes
    to ``save_onnx``."""
    paths = rank_paths(path, sharded.tp)
    for rank, (graph, target) in enumerate(zip(sharded.graphs, paths)):
        mine = None if weights is None else sharded.rank_weights(weights, rank)
        save_onnx(graph, mine, target, **kw)
    return paths
