"""Fused kernels cut out of a graph run alone at the comparison's dims."""
import numpy as np

import blockc
from blockc.compare.kernels import first_fused_nodes, isolate, sample_feeds
from blockc.passes.manager import optimize
from blockc.runtime.backend import make_backend


def test_a_decode_steps_attention_runs_alone():
    """Its cache step (append_attention) appends 'seq' keys to 'past' and its
    queries are 'seq': the kernel alone gets inputs binding both, so a
    backend's checks can tell every dim."""
    step = blockc.build_model("llama-tiny", {"layers": "1"}).for_cache("decode")
    fused = optimize(blockc.trace(step)).graph
    node = next(n for _, n in first_fused_nodes([fused]) if n.op == "append_attention")
    alone = isolate(node, "attention_alone")
    dims = {"batch": 1, "seq": 2, "past": 3}
    feeds = sample_feeds(alone, dims, np.random.default_rng(0))
    with make_backend("reference").compile(alone, {}) as compiled:
        out = compiled.run(feeds)
    assert out["out0"].shape[-2] == 2 and out["out1"].shape[2] == 5 and np.isfinite(out["out0"]).all()
