"""RoPE fused in llama-tiny and qwen3-tiny, in both pairings and with partial
rotation: the fused graph matches the unoptimized graph's float64 reference
on the reference backend and on ONNX Runtime (CPU) in every encoding, and
the exported model holds the fused op in the encoding asked for."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import blockc
from blockc.codegen.fused_encodings import FUNCTION_DOMAIN
from blockc.codegen.onnx_export import export_onnx_decided
from blockc.passes.manager import optimize
from blockc.runtime.backend import make_backend

MS = "com.microsoft"
# (model, settings): rotate-half over the whole head, interleaved over part of it, on heads of 16 and 32
CASES = [("llama-tiny", {}), ("llama-tiny", {"rope_form": "interleaved", "rotary_dim": "8"}),
         ("qwen3-tiny", {"rotary_dim": "16"}), ("qwen3-tiny", {"rope_form": "interleaved"})]
ROTARY_OP = {"function": None, "contrib": (MS, "RotaryEmbedding"), "onnx23": ("", "RotaryEmbedding")}


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join([c[0]] + [f"{k}={v}" for k, v in c[1].items()]))
def case(request):
    name, sets = request.param
    model = blockc.build_model(name, dict(sets, layers="1"))
    graph = blockc.trace(model)
    weights = dict(blockc.init_weights(model, seed=3))
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 2, "seq": 7}, rng) for s in model.inputs()}
    feeds["position_ids"] = rng.integers(0, 128, feeds["position_ids"].shape)   # positions of a long context
    wide = {k: w.astype(np.float64) for k, w in weights.items()}
    want = blockc.run_reference(graph, wide, {k: v.astype(np.float64) if v.dtype.kind == "f" else v
                                              for k, v in feeds.items()})
    fused = optimize(graph).graph
    return sets, fused, weights, feeds, want


def rotaries(graph) -> list:
    return [n for n in graph.nodes if n.op == "rotary"]


def test_every_rotation_fuses(case):
    sets, fused, *_ = case
    nodes = rotaries(fused)
    assert len(nodes) == 2   # the queries and the keys of the one layer
    assert {n.attrs["interleaved"] for n in nodes} == {sets.get("rope_form") == "interleaved"}
    rd = int(sets.get("rotary_dim", 0)) or nodes[0].inputs[0].shape[-1]
    assert all(n.inputs[1].shape == (128, rd) for n in nodes)
    # nothing of the rotation is left outside: no negation, and only the token embedding's gather
    ops = fused.op_counts()
    assert "neg" not in ops and ops["gather"] == 1


def test_the_reference_runs_the_fused_graph(case):
    _, fused, weights, feeds, want = case
    got = make_backend("reference").run(fused, weights, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("form", ["function", "contrib", "onnx23"])
def test_onnx_runtime_runs_each_encoding(case, form):
    _, fused, weights, feeds, want = case
    model, decisions = export_onnx_decided(fused, weights, fused_as=form)
    onnx.checker.check_model(model, full_check=True)
    rotary = [d for d in decisions if d["op"] == "rotary"]
    assert [d["form"] for d in rotary] == [form, form], rotary
    found = Counter((n.domain, n.op_type) for n in model.graph.node)
    if ROTARY_OP[form]:
        assert found[ROTARY_OP[form]] == 2
    else:
        names = {f.name for f in model.functions}
        assert sum(n for (domain, op), n in found.items() if domain == FUNCTION_DOMAIN and op in names
                   and op.startswith("Rotary")) == 2
    got = make_backend("ort-cpu", fused_as=form).run(fused, weights, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=2e-5, err_msg=f"{form} {k}")


def test_auto_says_why_it_picked_an_encoding(case):
    _, fused, weights, _, _ = case
    decisions = export_onnx_decided(fused, weights, fused_as="auto").decisions
    for d in decisions:
        if d["op"] == "rotary":
            assert d["kind"] == "rotary" and d["reason"].startswith("auto: ")
