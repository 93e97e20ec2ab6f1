"""One rank of a tensor-parallel run: ``python -m blockc.parallel.worker JOB``.

It reads who it is from torchrun's environment variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so
``parallel/launch.py`` or ``torchrun --nproc-per-node N -m
blockc.parallel.worker JOB`` start the same ranks. It joins the process
group, makes its own graph with ``shard`` (every rank shards alike, so
no graph is sent), its slice of each weight, lowers the graph with the
PyTorch backend (``runtime/torch_runner.py``: the collectives are
``torch.distributed`` calls) and writes its outputs to
``{out}/rank{R}.npz``. A peer that dies makes its collectives fail, and the
collective timeout bounds one that hangs: the rank then exits with a
``blockc: error:`` line, never waiting for ever.

A collective waits at most ``$BLOCKC_TP_TIMEOUT`` seconds (60 unless set)
for its peers. The process group is gloo on the CPU, NCCL where the ranks
run on CUDA devices (``group_backend``; the PyTorch backend runs on the CPU
today, so every rank is on gloo).

``JOB`` is a JSON file: ``out`` (a folder), ``timeout`` (seconds, the
whole run's), ``time`` (optional: the cases timed in blocks rather than
run, ``parallel/rank_timing.py``: ``{"blocks", "rounds", "warmup",
"repeats", "seed"}``) and ``cases``, each run in turn in the one process
group: ``model`` (a built-in name, a ``.py`` or ``.onnx`` spec),
``overrides``, ``seed`` (the weights made from it) or ``weights`` (a
``.safetensors`` file, each rank reading only its slices), ``feeds`` (an
``.npz``), ``pad_vocab``, ``fused``, ``backend`` (``torch-eager`` or
``torch-compile``, or one registered at run time: ``registration``,
``parallel/rank_backend.py``, registers it here again), ``repeat`` (runs of the forward pass, the last one
kept), ``generate`` (``{"prompts": [[ids]], "max_new": n, "form", "cache",
"cache_len", "choices"}``, ``choices`` a pickle of ``generate``'s ``pick``,
``stop_id`` and ``stopping``: generation instead of one forward pass,
``{out}.generation.json``; rank 0's tokens so far in ``{out}.tokens.json``).
"""
from __future__ import annotations

import datetime
import json
import os
import sys

from ..environment import env_setting, positive_float
from ..errors import BlockcError
from .rank_backend import register_carried
from .rank_model import rank_graph_and_weights, rank_session


def rank_env() -> tuple[int, int]:
    """``(rank, world size)`` from torchrun's variables, checked."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise BlockcError(f"a tensor-parallel rank needs the environment variables {', '.join(missing)} "
                          f"(set by blockc's launcher or torchrun)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 0 <= rank < world:
        raise BlockcError(f"RANK={rank} is not a rank of WORLD_SIZE={world}")
    return rank, world


# Where a rank's graph runs: the PyTorch backend runs on the CPU (``runtime/backends/pytorch.py``).
RANK_DEVICE = "cpu"
TIMEOUT_VARIABLE = "BLOCKC_TP_TIMEOUT"
# How long a rank waits in one collective (or for its peers to join) before it gives up: a peer that
# hangs, or was stopped, ends the run in this time, not in torch.distributed's default of 30 minutes.
# Long enough for ranks that compile at different speeds (torch.compile on shared cores).
DEFAULT_COLLECTIVE_TIMEOUT_S = 60.0


def group_backend(device: str) -> str:
    """The ``torch.distributed`` backend for ranks on ``device``: NCCL for
    CUDA devices, gloo on the CPU (PyTorch's own advice)."""
    return "nccl" if device.startswith("cuda") else "gloo"


def collective_timeout() -> float:
    """Seconds a rank waits for its peers in one collective:
    ``$BLOCKC_TP_TIMEOUT`` where set (by the user, for blockc's launcher or
    torchrun alike), else ``DEFAULT_COLLECTIVE_TIMEOUT_S``."""
    return env_setting(TIMEOUT_VARIABLE, positive_float, DEFAULT_COLLECTIVE_TIMEOUT_S,
                       "a number of seconds (> 0): it bounds how long a rank waits for its peers")


def run_rank(job: dict) -> None:
    import torch.distributed as dist
    rank, world = rank_env()
    for case in job["cases"]:   # a backend the launching process registered at run time
        if case.get("registration"):
            register_carried(case["registration"])
    dist.init_process_group(group_backend(RANK_DEVICE), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=collective_timeout()))
    try:
        if job.get("time"):
            from .rank_timing import time_job
            time_job(job, rank, world)
        else:
            for i, case in enumerate(job["cases"]):
                run_case(case, os.path.join(job["out"], f"case{i}.rank{rank}"), rank, world)
    finally:
        dist.destroy_process_group()


def run_case(case: dict, out: str, rank: int, world: int) -> None:
    """One model on one set of feeds: ``{out}.npz`` holds this rank's outputs;
    ``{out}.ready`` appears once the rank is about to run."""
    if case.get("generate"):
        return generate_case(case, out, rank, world)
    import numpy as np

    from ..runtime.feeds import load_npz, save_npz
    graph, weights = rank_graph_and_weights(case, rank, world)
    session = rank_session(case, graph, weights)
    feeds = load_npz(case["feeds"])
    open(out + ".ready", "w").close()
    for _ in range(max(1, int(case.get("repeat", 1)))):
        outputs = session.run(feeds)
    save_npz(out + ".npz", {k: np.asarray(v) for k, v in outputs.items()})


def generate_case(case: dict, out: str, rank: int, world: int) -> None:
    """Generation on this rank (``generate(..., rank_of=)``): rank 0 picks
    and stops rows with the request's ``choices`` (``launch.write_job``'s
    pickle), the others follow; its ``Generation`` to ``{out}.generation.json``,
    and rank 0's tokens so far to ``{out}.tokens.json`` after each step."""
    import pickle
    import time
    from ..frontends import build_model
    from ..generate.loop import generate
    model = build_model(case["model"], case.get("overrides") or {})
    request = case["generate"]
    with open(request["choices"], "rb") as f:
        choices = pickle.load(f)
    t0 = time.perf_counter()
    weights = case_weights(case, model)
    result = generate(model, weights, request["prompts"], request["max_new"],
                      backend=case["backend"], form=request["form"],
                      cache=request["cache"], cache_len=request["cache_len"], rank_of=(rank, world),
                      pad_vocab=bool(case.get("pad_vocab")), load_s=time.perf_counter() - t0,
                      on_token=_tokens_writer(out + ".tokens.json") if rank == 0 else None, **choices)
    with open(out + ".generation.json", "w") as f:
        json.dump(result.as_json(), f)


def _tokens_writer(path: str):
    """An ``on_token`` that keeps each prompt's new ids so far in ``path``,
    replaced whole each step, so a reader never sees half a file."""
    def write(tokens) -> None:
        with open(path + ".part", "w") as f:
            json.dump(tokens, f)
        os.replace(path + ".part", path)
    return write


def case_weights(case: dict, model):
    """The whole weights of a case that shards them itself (generation):
    its ``.safetensors`` file's, checked against the model, or made from its seed
    (a Hugging Face directory's own, read from its checkpoint)."""
    from ..frontends import init_weights
    if case.get("weights"):
        from ..frontends.weights import check_weights, load_weights
        weights = load_weights(case["weights"])
        check_weights(model, weights)
        return weights
    return init_weights(model, seed=case.get("seed", 0))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) != 1:
            raise BlockcError("usage: python -m blockc.parallel.worker JOB.json")
        with open(argv[0]) as f:
            run_rank(json.load(f))
    except (BlockcError, OSError, ValueError) as err:
        print(f"blockc: error: rank {os.environ.get('RANK', '?')}: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:   # torch.distributed: a peer gone, a timeout
        print(f"blockc: error: rank {os.environ.get('RANK', '?')}: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
