"""The preallocated, in-place KV cache: the same logits and tokens as the
concat cache and as recomputation, on every backend and form; the cache
buffer stays where it is between ONNX Runtime steps; a request longer than
the buffer is refused."""
import numpy as np
import pytest
from test_loop import PROMPTS, recompute_greedy, weights_of

from blockc import parse_graph, run_reference, trace, verify
from blockc.errors import BlockcError, ModelError
from blockc.frontends import build_model
from blockc.generate import generate, greedy
from blockc.generate.loop import cache_names, into_cache
from blockc.passes.forms import to_form
from blockc.runtime.backend import make_backend


def logits_and_tokens(model, weights, max_new, **kw):
    steps = []

    def pick(logits, history):
        steps.append(logits.copy())
        return greedy(logits, history)

    tokens = generate(model, weights, PROMPTS, max_new, pick=pick, **kw).tokens
    return np.stack(steps), tokens


@pytest.mark.parametrize("form", ["standard", "fused"])
@pytest.mark.parametrize("backend", ["reference", "ort-cpu"])
@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_inplace_equals_concat_and_recomputation(name, backend, form):
    model = build_model(name)
    weights = weights_of(model)
    logits, tokens = logits_and_tokens(model, weights, 8, backend=backend, form=form)
    concat_logits, concat_tokens = logits_and_tokens(model, weights, 8, backend=backend, form=form, cache="concat")
    assert tokens == concat_tokens == [recompute_greedy(model, weights, p, 8, backend) for p in PROMPTS]
    assert np.abs(logits - concat_logits).max() <= 1e-5


def test_a_longer_buffer_changes_nothing():
    model = build_model("llama-tiny")
    weights = weights_of(model)
    assert generate(model, weights, PROMPTS, 6, cache_len=100).tokens == generate(model, weights, PROMPTS, 6).tokens


def test_the_decode_graph_with_a_buffer_verifies_and_round_trips():
    g = trace(build_model("llama-tiny").for_cache("decode", cache_len=40))
    verify(g)
    assert str(parse_graph(str(g))) == str(g)
    assert str(g.output("present.1.key").type) == "f32[batch,2,40,16]"
    assert any(n.op == "cache_write" for n in g.nodes)


# fused as function: cache_attention's start=past is a symbol no ONNX function attribute holds, so its
# decomposition is written inline (codegen/fused_encodings.py)
@pytest.mark.parametrize("form,fused_as", [("standard", "auto"), ("fused", "auto"), ("fused", "function")])
def test_ort_keeps_the_cache_in_one_buffer(form, fused_as):
    model = build_model("llama-tiny")
    weights = weights_of(model)
    graph = to_form(trace(model.for_cache("decode", cache_len=16)), form)
    names = cache_names(model.cfg.layers)
    rng = np.random.default_rng(0)
    past = {p: rng.standard_normal((1, 2, 5, 16)).astype(np.float32) for p, _ in names}
    feeds = {"input_ids": np.array([[3]]), "attention_mask": np.ones((1, 6), np.int64),
             "position_ids": np.array([[5]])}
    oracle = run_reference(graph, weights, {**feeds, **{p: into_cache(a, 16) for p, a in past.items()}})
    with make_backend("ort-cpu", fused_as=fused_as).compile(graph, weights) as compiled:
        with compiled.cached({present: p for p, present in names}, {p: into_cache(a, 16) for p, a in past.items()}) \
                as step:
            where = {p: step.address(p) for p, _ in names}
            out = step.run(feeds)
            assert np.abs(out["logits"] - oracle["logits"]).max() <= 1e-5
            for p, present in names:   # the buffer holds the new rows, in the same place
                assert step.address(p) == where[p]
                np.testing.assert_allclose(step.value(p), oracle[present], atol=1e-5)
            for k in range(6, 9):      # more steps: still in place
                step.run({"input_ids": np.array([[k]]), "attention_mask": np.ones((1, k + 1), np.int64),
                          "position_ids": np.array([[k]])})
                assert all(step.address(p) == where[p] for p, _ in names)


def test_the_concat_cache_moves_on_the_host():
    """The base ``CachedStep`` (the reference's) hands a new array back every step: what the in-place cache avoids."""
    model = build_model("tiny", {"layers": "1"})
    graph = trace(model.for_cache("decode"))
    state = {p: np.zeros((1, 4, 2, 16), np.float32) for p, _ in cache_names(1)}
    with make_backend("reference").compile(graph, weights_of(model)) as compiled:
        with compiled.cached({present: p for p, present in cache_names(1)}, state) as step:
            before = step.address("past.0.key")
            step.run({"input_ids": np.array([[1]]), "attention_mask": np.ones((1, 3), np.int64),
                      "position_ids": np.array([[2]])})
            assert step.address("past.0.key") != before and step.value("past.0.key").shape == (1, 4, 3, 16)


def test_a_request_beyond_the_buffer_is_refused():
    model = build_model("tiny")
    with pytest.raises(BlockcError, match=r"a prompt of 6 tokens and 8 new ones need a cache of 13 positions, "
                                          r"over the preallocated cache_len=12"):
        generate(model, weights_of(model), PROMPTS, 8, cache_len=12)
    with pytest.raises(BlockcError, match="cache must be one of inplace, concat"):
        generate(model, weights_of(model), PROMPTS, 2, cache="ring")


def test_cache_len_belongs_to_a_decode_step():
    with pytest.raises(ModelError, match="cache_len must be a positive integer, for a decode step"):
        build_model("tiny").for_cache("prefill", cache_len=8)


@pytest.mark.parametrize("name", ["tiny", "llama-tiny", "qwen3-tiny"])
def test_fused_inplace_decode_is_group_query_attention_and_matches_float64(name):
    from blockc import optimize
    from blockc.codegen.onnx_export import export_onnx
    model = build_model(name)
    weights = weights_of(model)
    graph = trace(model.for_cache("decode", cache_len=12))
    fused = optimize(graph, check=True).graph
    assert any(n.op == "cache_attention" for n in fused.nodes)
    assert "GroupQueryAttention" in {n.op_type for n in export_onnx(fused, weights).graph.node}
    rng = np.random.default_rng(1)
    kv = model.cfg.kv_heads or model.cfg.heads
    feeds = {"input_ids": np.array([[3], [9]]), "attention_mask": np.array([[1] * 8, [0, 0] + [1] * 6]),
             "position_ids": np.array([[7], [5]])}
    for p, _ in cache_names(model.cfg.layers):   # 7 rows cached, the rest of the buffer zero, as the loop makes it
        feeds[p] = into_cache(rng.standard_normal((2, kv, 7, model.cfg.head_size)).astype(np.float32), 12)
    oracle = run_reference(graph, weights, feeds, float64=True)
    got = make_backend("ort-cpu").run(fused, weights, feeds)
    for key, value in oracle.items():
        assert np.abs(got[key] - value).max() < 1e-4, key


def test_the_default_cache_is_bucketed_so_nearby_requests_share_one_build():
    from blockc.generate.loop import cache_length
    model = build_model("llama-tiny")
    prompt = [[1, 2, 3]]
    five, six = (cache_length(model, prompt, n, "inplace", None) for n in (5, 6))
    assert five == six == 64                       # one decode graph, so one build, for both
    assert cache_length(model, prompt, 70, "inplace", None) == 128 >= 3 + 70 - 1
    top = model.cfg.max_positions
    assert cache_length(model, [[1] * (top - 1)], 1, "inplace", None) == top   # never past the model's positions
