"""The pipeline finds every fusion site in the built-in models, whether the
graph starts as traced or decomposed (``blockc.to_form(g, "decomposed")``)."""
from collections import Counter

import numpy as np
import pytest

from blockc import build_model, init_weights, run_reference, to_form, trace, verify
from blockc.passes.manager import optimize


def _fused_counts(result) -> Counter:
    return Counter(s.kind for s in result.sites if s.fused)


@pytest.mark.parametrize("form", ["standard", "decomposed"])
def test_gpt2_four_layers(form):
    g = to_form(trace(build_model("gpt2", {"layers": "4"})), form)
    r = optimize(g)
    verify(r.graph)
    counts = _fused_counts(r)
    # 2 norms per block after a residual add, plus the final norm; the first
    # block's ln1 reads the embeddings sum (wte + wpe) -- also an add.
    assert counts["add_layernorm"] == 9
    assert counts["masked_softmax"] == 4
    assert counts["qkv"] == 4
    assert counts["attention"] == 4
    assert counts["bias_activation"] == 4
    # ... and each attention core, with its packed projection, becomes one qkv_attention
    assert counts["qkv_attention"] == 4
    attention = [n for n in r.graph.nodes if n.op == "qkv_attention"]
    assert [(n.attrs["mask"], n.attrs["causal"], n.attrs["heads"]) for n in attention] == [("none", True, 12)] * 4
    assert "attention" not in r.graph.op_counts() and "split" not in r.graph.op_counts()
    ops = r.graph.op_counts()
    assert ops["add_layernorm"] == 9 and "layernorm" not in ops and "gelu" not in ops
    # the only softmax left is the LM head's output probabilities
    assert ops.get("softmax") == 1


@pytest.mark.parametrize("form", ["standard", "decomposed"])
def test_bert_base_two_layers(form):
    g = to_form(trace(build_model("bert-base", {"layers": "2"})), form)
    r = optimize(g)
    verify(r.graph)
    counts = _fused_counts(r)
    # the embeddings' norm (after tok + pos + segment) and 2 per block
    assert counts["add_layernorm"] == 5
    assert counts["masked_softmax"] == 2
    assert counts["qkv"] == 2
    # The padding mask is boolean: masked_softmax and then attention carry it.
    only_softmax = optimize(g, disable=["fuse_attention"]).graph
    masked = [n for n in only_softmax.nodes if n.op == "masked_softmax"]
    assert [(n.attrs["mask"], n.attrs["causal"]) for n in masked] == [("bool", False)] * 2
    attention = [n for n in r.graph.nodes if n.op == "qkv_attention"]
    assert [(n.attrs["mask"], n.attrs["causal"]) for n in attention] == [("bool", False)] * 2
    assert counts["qkv_attention"] == 2
    assert "layernorm" not in r.graph.op_counts() and "softmax" not in r.graph.op_counts()


@pytest.mark.parametrize("form", ["standard", "decomposed"])
def test_llama_tiny_two_layers(form):
    g = to_form(trace(build_model("llama-tiny")), form)
    r = optimize(g)
    verify(r.graph)
    counts = _fused_counts(r)
    # Q/K/V and SwiGLU's gate/up per layer; the residual adds into ln2, the next ln1 and the final norm;
    # the rotary embedding of the queries and of the keys per layer
    assert (counts["qkv"], counts["add_rmsnorm"], counts["masked_softmax"], counts["attention"]) == (4, 4, 2, 2)
    assert counts["rotary"] == 4 and r.graph.op_counts()["rotary"] == 4
    assert counts["qkv_attention"] == 0   # grouped-query attention: declined, with its reason
    ops = r.graph.op_counts()
    assert ops["attention"] == 2 and "rmsnorm" in ops and ops["silu"] == 2 and ops.get("softmax") == 1


@pytest.mark.parametrize("name", ["tiny", "bert-base", "llama-tiny", "qwen3-tiny"])
def test_fused_builtins_give_the_same_numbers(name):
    overrides = {"layers": "2", "d_model": "32", "heads": "4", "dtype": "float64"}
    if name == "bert-base":
        overrides["vocab"] = "50"
    model = build_model(name, overrides)
    g = trace(model)
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 2, "seq": 5}, rng) for s in model.inputs()}
    weights = dict(init_weights(model, seed=3))
    want = run_reference(g, weights, feeds)
    for form in ("standard", "decomposed"):
        r = optimize(to_form(g, form))
        got = run_reference(r.graph, {k: w for k, w in weights.items() if k in r.graph.params}, feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-11, err_msg=f"{form}: {k}")
