"""A sharded model exports one ONNX file per rank, each checker-clean with
its collectives as com.microsoft AllReduce/AllGather and only its slice of
the weights."""
from __future__ import annotations

import onnx

from blockc import optimize
from blockc.codegen.onnx_ranks import NEEDS_COLLECTIVES, save_rank_onnx
from blockc.frontends import build_model, init_weights, trace
from blockc.passes.shard import shard


def test_one_checker_clean_file_per_rank(tmp_path):
    model = build_model("llama-tiny", {"layers": "1"})
    sharded = shard(trace(model), 2)
    sharded.graphs = [optimize(g).graph for g in sharded.graphs]
    paths = save_rank_onnx(sharded, init_weights(model, seed=0), tmp_path / "m.onnx", fused_as="contrib")
    assert [p.rsplit("/", 1)[1] for p in paths] == ["m.rank0.onnx", "m.rank1.onnx"]
    for path in paths:
        proto = onnx.load(path)
        onnx.checker.check_model(proto, full_check=True)
        ops = [(n.domain, n.op_type) for n in proto.graph.node]
        assert ops.count(("com.microsoft", "AllReduce")) == 3 and ("com.microsoft", "AllGather") in ops
        sizes = {i.name: list(i.dims) for i in proto.graph.initializer}
        assert sizes["blocks.0.attn.w_o.weight"] == [32, 64]
    assert "NCCL or MPI" in NEEDS_COLLECTIVES
