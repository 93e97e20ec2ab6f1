"""Hugging Face Llama and Qwen checkpoints (randomly initialised, built
offline from their configs) loaded into blockc's DecoderLM: grouped-query
attention and RoPE on, the logits must match transformers' own forward on
the reference interpreter and on ONNX Runtime, before and after blockc's
fusions."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_testing import randomise  # noqa: E402

from blockc import optimize, run_reference, trace  # noqa: E402
from blockc.errors import ModelError, WeightsError  # noqa: E402
from blockc.frontends import DecoderLM  # noqa: E402
from blockc.frontends.hf_gpt2 import load_hf_gpt2_state_dict  # noqa: E402
from blockc.frontends.hf_llama import llama_config_from_hf, load_hf_llama_state_dict  # noqa: E402
from blockc.runtime.backend import make_backend  # noqa: E402

VOCAB, POSITIONS = 96, 48
FAMILIES = {
    # GQA: 4 query heads over 2 K/V heads; rope_theta off its default so a wrong base shows
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, rope_theta=500.0)),
    # QK-norm per head, heads of 24 (not hidden/heads = 16), multi-query
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=1, head_dim=24)),
    # q/k/v biases without an output bias, a tied head
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
}


def hf_config(family="llama", **kw):
    config_cls, _, extra = FAMILIES[family]
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=POSITIONS, rms_norm_eps=1e-5, **extra)
    settings.update(kw)
    config = getattr(transformers, config_cls)(**settings)
    config._attn_implementation = "eager"
    return config


def hf_model(family="llama", seed=0, **kw):
    """A *ForCausalLM with every parameter random (``hf_testing.randomise``)."""
    torch.manual_seed(seed)
    return randomise(getattr(transformers, FAMILIES[family][1])(hf_config(family, **kw)), torch)


def inputs(seed=1, batch=2, seq=12):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
    # row 0 from position 0; row 1 continues a sequence from position 30, as a decode step would
    positions = np.stack([np.arange(seq), 30 + np.arange(seq)])[:batch].astype(np.int64)
    return {"input_ids": ids, "position_ids": positions}


def hf_logits(model, feeds) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(feeds["input_ids"]),
                     position_ids=torch.from_numpy(feeds["position_ids"])).logits.numpy()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def loaded(request):
    hf = hf_model(request.param)
    model = DecoderLM(llama_config_from_hf(hf.config))
    weights = load_hf_llama_state_dict(hf.state_dict(), model)
    feeds = inputs()
    expected = hf_logits(hf, feeds)
    assert np.abs(expected).max() > 1.0  # the logits are not all ~0, so 1e-4 is a real bound
    return request.param, model, weights, feeds, expected


def test_config_is_mapped(loaded):
    family, model, *_ = loaded
    cfg = model.cfg
    assert (cfg.positions, cfg.norm, cfg.activation, cfg.gated_ffn, cfg.layers, cfg.d_model, cfg.heads) == (
        "rope", "rmsnorm", "silu", True, 2, 64, 4)
    assert cfg.kv_heads == FAMILIES[family][2]["num_key_value_heads"] < cfg.heads   # GQA (or MQA) on
    assert cfg.qk_norm == ("head" if family == "qwen3" else "none")
    assert (cfg.qkv_bias, cfg.out_bias, cfg.tie_embeddings) == ((True, False, True) if family == "qwen2"
                                                                else (False, False, False))
    assert cfg.rope_theta == (500.0 if family == "llama" else 10000.0) and cfg.eps == 1e-5


@pytest.mark.parametrize("form", ["standard", "fused"])
@pytest.mark.parametrize("backend", ["reference-float64", "reference", "ort-cpu"])
def test_logits_match_transformers(loaded, backend, form):
    _, model, weights, feeds, expected = loaded
    graph = trace(model)
    if form == "fused":
        graph = optimize(graph).graph
        assert "attention" in graph.op_counts() and "add_rmsnorm" in graph.op_counts()
        weights = {k: w for k, w in weights.items() if k in graph.params}
    if backend.startswith("reference"):
        got = run_reference(graph, weights, feeds, float64=backend.endswith("float64"))["logits"]
    else:
        got = make_backend(backend).run(graph, weights, feeds)["logits"]
    err = np.abs(got - expected).max()
    assert err <= 1e-4, f"max abs error {err:.3g}"


def test_the_rope_tables_are_made_not_read():
    hf = hf_model()
    sd = hf.state_dict()
    assert not any("inv_freq" in k or "rotary" in k for k in sd)   # a buffer, not in the checkpoint
    model = DecoderLM(llama_config_from_hf(hf.config))
    weights = load_hf_llama_state_dict(sd, model)
    angles = np.arange(POSITIONS)[:, None] * 500.0 ** (-np.arange(0, 16, 2) / 16)
    np.testing.assert_allclose(weights["rope.cos"], np.cos(np.concatenate([angles, angles], 1)), atol=1e-7)
    # older checkpoints stored inv_freq per layer: ignored, not unexpected
    sd = dict(sd, **{f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(8) for i in range(2)})
    assert load_hf_llama_state_dict(sd, model).keys() == weights.keys()


def test_nn_linear_weights_are_transposed():
    hf = hf_model()
    sd = hf.state_dict()
    weights = load_hf_llama_state_dict(sd, DecoderLM(llama_config_from_hf(hf.config)))
    for dsl, name in [("attn.w_k", "self_attn.k_proj"), ("ffn.gate", "mlp.gate_proj"), ("ffn.down", "mlp.down_proj")]:
        np.testing.assert_array_equal(weights[f"blocks.1.{dsl}.weight"], sd[f"model.layers.1.{name}.weight"].numpy().T)
    assert weights["blocks.1.attn.w_k.weight"].shape == (64, 32)   # [in, out], 2 K/V heads of 16
    np.testing.assert_array_equal(weights["lm_head.weight"], sd["lm_head.weight"].numpy().T)


def test_bare_model_without_prefix_and_numpy_values():
    # a tied Qwen2's *Model state dict: no "model." prefix, no head; numpy arrays
    hf = hf_model("qwen2", seed=3)
    sd = {k.removeprefix("model."): v.numpy() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    model = DecoderLM(llama_config_from_hf(hf.config))
    feeds = inputs(4)
    got = run_reference(trace(model), load_hf_llama_state_dict(sd, model), feeds, float64=False)["logits"]
    assert np.abs(got - hf_logits(hf, feeds)).max() <= 1e-4


def test_bad_state_dict_lists_every_problem():
    hf = hf_model("qwen3")
    sd = dict(hf.state_dict())
    del sd["model.layers.1.self_attn.q_norm.weight"]
    sd["model.layers.0.self_attn.k_proj.weight"] = sd["model.layers.0.self_attn.k_proj.weight"].T  # [64, 24]: wrong
    sd["model.layers.5.mlp.up_proj.weight"] = torch.zeros(112, 64)   # a layer the model lacks
    sd["model.extra.weight"] = torch.zeros(3)
    with pytest.raises(WeightsError) as info:
        load_hf_llama_state_dict(sd, DecoderLM(llama_config_from_hf(hf.config)))
    problems = ["unexpected: model.layers.5.mlp.up_proj.weight", "unexpected: model.extra.weight",
                "shape: model.layers.0.self_attn.k_proj.weight is [64, 24], expected [24, 64]",
                "missing: model.layers.1.self_attn.q_norm.weight"]
    assert str(info.value) == "Llama-family state dict does not fit 'decoder' (4 problems):\n  " + \
        "\n  ".join(problems)


def test_a_llama_checkpoint_lacks_qwen3s_norms():
    # the tensors the DSL model needs come from its own settings: a Llama checkpoint on a Qwen3-shaped model
    llama = hf_model()
    cfg = llama_config_from_hf(llama.config)
    cfg.qk_norm = "head"
    with pytest.raises(WeightsError) as info:
        load_hf_llama_state_dict(llama.state_dict(), DecoderLM(cfg))
    assert sorted(info.value.problems) == sorted(f"missing: model.layers.{i}.self_attn.{n}_norm.weight"
                                                 for i in range(2) for n in "qk")


def test_a_tied_head_that_differs_is_reported():
    hf = hf_model("qwen2")
    sd = dict(hf.state_dict())
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
    with pytest.raises(WeightsError, match="untied: lm_head.weight differs from model.embed_tokens.weight"):
        load_hf_llama_state_dict(sd, DecoderLM(llama_config_from_hf(hf.config)))


def test_configs_blockc_cannot_express_are_listed_at_once():
    config = hf_config(hidden_act="gelu", rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 16})
    with pytest.raises(ModelError) as info:
        llama_config_from_hf(config)
    message = str(info.value)
    assert message.startswith("llama config not supported by blockc's DecoderLM: ")
    assert "hidden_act='gelu'" in message and "rope_type='llama3'" in message
    qwen2 = hf_config("qwen2", use_sliding_window=True, sliding_window=8)
    with pytest.raises(ModelError, match="sliding_window=8"):
        llama_config_from_hf(qwen2)
    with pytest.raises(ModelError, match="not a Llama-family config: model_type is 'gpt2'"):
        llama_config_from_hf(transformers.GPT2Config())


def test_loaders_refuse_each_others_models():
    hf = hf_model()
    llama = DecoderLM(llama_config_from_hf(hf.config))
    with pytest.raises(ModelError, match="GPT-2 weights need a GPT-2-shaped DecoderLM"):
        load_hf_gpt2_state_dict(hf.state_dict(), llama)
    from blockc import build_model
    with pytest.raises(ModelError, match="Llama-family weights need a pre-norm DecoderLM with rmsnorm"):
        load_hf_llama_state_dict(hf.state_dict(), build_model("tiny"))
