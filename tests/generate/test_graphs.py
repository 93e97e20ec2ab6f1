"""The prefill and decode graphs of a decoder LM: they verify, print and
parse back, export with their symbolic dims (``past``, ``past+seq``), keep
the plain forward's weight names, run through the optimizer matching the
float64 reference, and every backend refuses feeds outside their limits."""
import numpy as np
import onnx
import pytest

from blockc import init_weights, optimize, parse_graph, run_reference, trace, verify
from blockc.codegen.cuda import toolchain
from blockc.codegen.onnx_export import export_onnx
from blockc.errors import InputsError, ModelError
from blockc.frontends import build_model
from blockc.frontends.models import DecoderLM
from blockc.ops.limits import graph_limits
from blockc.runtime.backend import make_backend

MODELS = ["tiny", "llama-tiny", "qwen3-tiny"]
BACKENDS = ["reference", "ort-cpu",
            pytest.param("cuda-emu", marks=pytest.mark.skipif(toolchain.find_gxx() is None, reason="g++ not found"))]


def decode_feeds(model, batch=2, past=5, seq=1, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, model.cfg.vocab, (batch, seq)),
             "attention_mask": np.ones((batch, past + seq), np.int64),
             "position_ids": np.broadcast_to(past + np.arange(seq), (batch, seq)).astype(np.int64)}
    feeds["attention_mask"][1, :2] = 0   # a left-padded row
    feeds["position_ids"] = feeds["position_ids"] - np.array([[0], [2]])
    for name in (v.name for v in trace(model.for_cache("decode")).inputs if v.name.startswith("past.")):
        feeds[name] = rng.standard_normal((batch, model.cfg.kv_heads or model.cfg.heads, past,
                                           model.cfg.head_size)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("name", MODELS)
def test_graphs_verify_round_trip_and_share_the_weight_names(name, mode):
    model = build_model(name)
    g = trace(model.for_cache(mode))
    verify(g)
    text = str(g)
    assert str(parse_graph(text)) == text
    assert set(g.params) <= set(trace(model).params) | {"pos.weight"}
    assert set(g.params) == set(dict(model.named_parameters()))   # one weights dict serves every graph
    kv = model.cfg.kv_heads or model.cfg.heads   # the cache holds the K/V heads, not repeated ones
    length = "seq" if mode == "prefill" else "past+seq"
    assert str(g.output("present.1.value").type) == f"f32[batch,{kv},{length},{model.cfg.head_size}]"


def test_onnx_shows_the_cache_dims():
    model = build_model("llama-tiny")
    proto = export_onnx(trace(model.for_cache("decode")), dict(init_weights(model)))
    onnx.checker.check_model(proto)

    def shape(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    inputs = {v.name: shape(v) for v in proto.graph.input}
    outputs = {v.name: shape(v) for v in proto.graph.output}
    assert inputs["attention_mask"] == ["batch", "past+seq"]
    assert inputs["past.0.key"] == ["batch", 2, "past", 16]
    assert outputs["present.1.value"] == ["batch", 2, "past+seq", 16]
    assert outputs["logits"] == ["batch", "seq", 256]


@pytest.mark.parametrize("name", MODELS)
def test_fused_decode_graph_matches_the_float64_reference_on_ort(name):
    model = build_model(name)
    graph, weights, feeds = trace(model.for_cache("decode")), dict(init_weights(model)), decode_feeds(model, seq=2)
    fused = optimize(graph, check=True).graph
    assert any(n.op == "append_attention" for n in fused.nodes)   # the cache step fused (concat + attention)
    oracle = run_reference(graph, weights, feeds, float64=True)
    for g in (graph, fused):
        got = make_backend("ort-cpu").run(g, weights, feeds)
        for key, value in oracle.items():
            assert np.abs(got[key] - value).max() < 1e-4, key


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_positions_beyond_the_cache_are_refused_everywhere(name, backend):
    model = build_model(name, {"layers": "1"})
    graph, weights, feeds = trace(model.for_cache("decode")), dict(init_weights(model)), decode_feeds(model)
    feeds["position_ids"] = np.array([[6], [5]], np.int64)   # past+seq is 6: position 6 names no cached token
    with pytest.raises(InputsError, match=r"input 'position_ids': 1 of 2 ids out of range \[0, 6\) \(min 5, max 6; "
                                          r"it indexes the first past\+seq rows of '(pos.weight|rope.cos)', "
                                          r"past\+seq = 6\)"):
        make_backend(backend).run(graph, weights, feeds)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_longer_than_the_position_table_is_refused_everywhere(backend):
    model = build_model("tiny", {"layers": "1"})
    graph = trace(model.for_cache("decode"))
    limits = graph_limits(graph)
    assert [(str(d.dim), d.limit) for d in limits.dims] == [("past+seq", 128)]
    assert limits.ids["input_ids"][0] == 256
    feeds = decode_feeds(model, past=128)
    with pytest.raises(InputsError, match=r"dimension 'past\+seq' is 129, over the model's maximum of 128"):
        make_backend(backend).run(graph, dict(init_weights(model)), feeds)


def test_unknown_cache_mode_is_refused():
    with pytest.raises(ModelError, match="cache must be one of prefill, decode"):
        DecoderLM(build_model("tiny").cfg, cache="both")


def test_unpadded_is_only_for_a_step():
    with pytest.raises(ModelError, match="padded must be True or False, for a prefill or decode step"):
        DecoderLM(build_model("tiny").cfg, padded=False)


@pytest.mark.parametrize("kind", [("prefill", None), ("decode", None), ("decode", 16)])
@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_an_unpadded_step_has_no_key_mask_and_the_same_numbers_without_pads(name, kind):
    """Rows without pads (a mask of ones): the unpadded step gives what the
    padded one does, with no key mask to build: attention is causal alone,
    and ONNX Runtime's GroupQueryAttention gets no attention_bias."""
    mode, cache_len = kind
    model = build_model(name, {"layers": "1"})
    weights = dict(init_weights(model))
    padded, unpadded = (optimize(trace(model.for_cache(mode, cache_len=cache_len, padded=p))).graph
                        for p in (True, False))
    assert unpadded.name.endswith("-unpadded")
    attention = [n for n in unpadded.nodes if n.op in ("attention", "cache_attention", "append_attention")]
    assert attention and all(n.attrs["mask"] == "none" for n in attention)
    assert all(n.attrs["mask"] == "bool" for n in padded.nodes if n.op in ("attention", "cache_attention", "append_attention"))
    rng = np.random.default_rng(0)
    past, seq = (0, 5) if mode == "prefill" else (6, 1)
    feeds = {"input_ids": rng.integers(0, model.cfg.vocab, (2, seq)), "attention_mask": np.ones((2, past + seq), np.int64),
             "position_ids": np.broadcast_to(past + np.arange(seq), (2, seq)).astype(np.int64)}
    for v in padded.inputs:
        if v.name.startswith("past."):
            shape = (2, model.cfg.kv_heads or model.cfg.heads, cache_len or past, model.cfg.head_size)
            feeds[v.name] = rng.standard_normal(shape).astype(np.float32)
            feeds[v.name][:, :, past:] = 0
    for backend in ("reference", "ort-cpu"):
        want = make_backend(backend).run(padded, weights, feeds)
        got = make_backend(backend).run(unpadded, weights, feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{backend} {k}")
    if cache_len:
        gqa = [n for n in export_onnx(unpadded, weights).graph.node if n.op_type == "GroupQueryAttention"]
        assert gqa and all(len(n.input) < 11 or not n.input[10] for n in gqa)
