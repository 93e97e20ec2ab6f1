"""A rank reads its slices of a .safetensors file through the slice API:
the same blocks as slicing the whole arrays, padded where the vocabulary
was; and it refuses to start without torchrun's variables."""
from __future__ import annotations

import numpy as np
import pytest

from blockc.errors import BlockcError
from blockc.frontends import build_model, init_weights, trace
from blockc.frontends.weights import save_weights
from blockc.passes.shard import shard
from blockc.parallel.rank_model import read_rank_weights
from blockc.parallel.worker import rank_env


def test_a_rank_reads_its_slices_of_a_safetensors_file(tmp_path):
    model = build_model("llama-tiny", {"layers": "1", "vocab": "255"})
    weights = dict(init_weights(model, seed=0))
    save_weights(tmp_path / "w.safetensors", weights)
    sharded = shard(trace(model), 2, pad_vocab=True)
    for rank in (0, 1):
        got = read_rank_weights(str(tmp_path / "w.safetensors"), sharded, rank)
        want = sharded.rank_weights(weights, rank)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["lm_head.weight"].shape == (64, 128) and not got["lm_head.weight"][:, -1].any()


def test_a_rank_needs_torchruns_variables(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(BlockcError, match="needs the environment variables RANK, WORLD_SIZE, MASTER_ADDR, "
                                          "MASTER_PORT"):
        rank_env()
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(BlockcError, match="RANK=2 is not a rank of WORLD_SIZE=2"):
        rank_env()


def test_weights_a_rank_cannot_read_in_slices_are_refused(tmp_path):
    from blockc.errors import WeightsError
    from blockc.parallel.launch import run_tp
    sharded = shard(trace(build_model("llama-tiny", {"layers": "1"})), 2)
    with pytest.raises(WeightsError, match="reads its slices of a .safetensors file"):
        run_tp("llama-tiny", 2, {}, overrides={"layers": "1"}, weights=str(tmp_path / "w.npz"))
    with pytest.raises(WeightsError, match="no such weights file"):
        read_rank_weights(str(tmp_path / "none.safetensors"), sharded, 0)
    save_weights(tmp_path / "few.safetensors", {"tok.weight": np.zeros((256, 64), np.float32)})
    with pytest.raises(WeightsError, match="has no tensor blocks.0"):
        read_rank_weights(str(tmp_path / "few.safetensors"), sharded, 0)


def test_cuda_ranks_would_meet_on_nccl_and_cpu_ranks_on_gloo():
    """The rule alone: no NCCL or GPU here, so the NCCL path is chosen by it
    but never run (docs/PARALLEL.md says so); the ranks run on the CPU."""
    from blockc.parallel.worker import RANK_DEVICE, group_backend
    assert [group_backend(d) for d in ("cuda", "cuda:0", "cuda:7", "cpu")] == ["nccl", "nccl", "nccl", "gloo"]
    assert group_backend(RANK_DEVICE) == "gloo"
