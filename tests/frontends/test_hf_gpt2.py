"""A Hugging Face GPT-2 (randomly initialised, nothing downloaded) loaded into
blockc's DecoderLM: logits must match transformers'."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_testing import randomise  # noqa: E402

from blockc import run_reference, trace  # noqa: E402
from blockc.errors import ModelError, WeightsError  # noqa: E402
from blockc.frontends import DecoderLM  # noqa: E402
from blockc.frontends.hf_gpt2 import gpt2_config_from_hf, load_hf_gpt2_state_dict  # noqa: E402

VOCAB, POSITIONS = 100, 32


def hf_config(**kw):
    settings = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=POSITIONS,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    settings.update(kw)
    config = transformers.GPT2Config(**settings)
    config._attn_implementation = "eager"
    return config


def hf_model(seed=0, **kw):
    """A GPT2LMHeadModel with every parameter random (``hf_testing.randomise``)."""
    torch.manual_seed(seed)
    return randomise(transformers.GPT2LMHeadModel(hf_config(**kw)), torch)


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


def random_ids(seed=1, batch=2, seq=16):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, seq)).astype(np.int64)


@pytest.mark.parametrize("float64", [False, True], ids=["float32", "float64"])
def test_logits_match_transformers(float64):
    hf = hf_model()
    cfg = gpt2_config_from_hf(hf.config)
    assert (cfg.activation, cfg.norm_first, cfg.layers, cfg.d_model, cfg.heads) == ("gelu_tanh", True, 2, 64, 4)
    model = DecoderLM(cfg)
    weights = load_hf_gpt2_state_dict(hf.state_dict(), model)
    ids = random_ids()
    expected = hf_logits(hf, ids)
    assert np.abs(expected).max() > 1.0  # the logits are not all ~0, so 1e-4 is a real bound
    got = run_reference(trace(model), weights, {"input_ids": ids}, float64=float64)["logits"]
    err = np.abs(got - expected).max()
    assert err <= 1e-4, f"max abs error {err:.3g}"


def test_float64_model_matches_float64_transformers_tightly():
    hf = hf_model(seed=2).double()
    model = DecoderLM(gpt2_config_from_hf(hf.config, dtype="float64"))
    weights = load_hf_gpt2_state_dict(hf.state_dict(), model)
    assert all(w.dtype == np.float64 for w in weights.values())
    ids = random_ids(3, seq=POSITIONS)  # every position
    got = run_reference(trace(model), weights, {"input_ids": ids})["logits"]
    assert np.abs(got - hf_logits(hf, ids)).max() <= 1e-9


def test_numpy_state_dict_without_prefix_or_head():
    # GPT2Model-style names (no "transformer."), numpy values, no lm_head entry.
    hf = hf_model(seed=4)
    sd = {k.removeprefix("transformer."): v.numpy() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    model = DecoderLM(gpt2_config_from_hf(hf.config))
    weights = load_hf_gpt2_state_dict(sd, model)
    ids = random_ids(5)
    got = run_reference(trace(model), weights, {"input_ids": ids}, float64=False)["logits"]
    assert np.abs(got - hf_logits(hf, ids)).max() <= 1e-4


def test_c_attn_is_split_into_q_k_v_columns():
    hf = hf_model()
    sd = hf.state_dict()
    weights = load_hf_gpt2_state_dict(sd, DecoderLM(gpt2_config_from_hf(hf.config)))
    c_attn = sd["transformer.h.1.attn.c_attn.weight"].numpy()
    for i, name in enumerate(("w_q", "w_k", "w_v")):
        np.testing.assert_array_equal(weights[f"blocks.1.attn.{name}.weight"], c_attn[:, i * 64:(i + 1) * 64])
    np.testing.assert_array_equal(weights["blocks.1.ffn.fc1.weight"], sd["transformer.h.1.mlp.c_fc.weight"].numpy())


@pytest.mark.parametrize("prefix", ["transformer.", ""], ids=["GPT2LMHeadModel", "GPT2Model"])
def test_mask_buffers_are_ignored(prefix):
    # Older checkpoints carry each block's causal-mask buffers attn.bias and
    # attn.masked_bias. Ignored means: not reported as unexpected, not loaded
    # as a weight, and the weights are exactly those of the same state dict
    # without them.
    hf = hf_model()
    model = DecoderLM(gpt2_config_from_hf(hf.config))
    buffers = (".attn.bias", ".attn.masked_bias")  # recent transformers leave them out of state_dict()
    sd = {(k if prefix else k.removeprefix("transformer.")): v
          for k, v in hf.state_dict().items() if not k.endswith(buffers)}
    without = load_hf_gpt2_state_dict(sd, model)
    for i in range(2):
        sd[f"{prefix}h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, POSITIONS, POSITIONS, dtype=torch.bool))
        sd[f"{prefix}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    with_buffers = load_hf_gpt2_state_dict(sd, model)
    assert with_buffers.keys() == without.keys() == dict(model.named_parameters()).keys()
    for name, value in without.items():
        np.testing.assert_array_equal(with_buffers[name], value, err_msg=name)


def test_bad_state_dict_lists_every_problem():
    hf = hf_model()
    sd = dict(hf.state_dict())
    del sd["transformer.h.1.ln_2.bias"]
    sd["transformer.h.0.mlp.c_fc.weight"] = sd["transformer.h.0.mlp.c_fc.weight"].T  # [4d, d]: wrong
    sd["transformer.h.7.attn.c_attn.weight"] = torch.zeros(64, 192)  # a layer the model lacks
    sd["transformer.extra.weight"] = torch.zeros(3)
    with pytest.raises(WeightsError) as info:
        load_hf_gpt2_state_dict(sd, DecoderLM(gpt2_config_from_hf(hf.config)))
    message = str(info.value)
    assert "missing: transformer.h.1.ln_2.bias" in message
    assert "shape: transformer.h.0.mlp.c_fc.weight is [256, 64], expected [64, 256]" in message
    assert "unexpected: transformer.h.7.attn.c_attn.weight" in message
    assert "unexpected: transformer.extra.weight" in message
    assert len(info.value.problems) == 4


def test_untied_head_is_rejected():
    hf = hf_model()
    sd = dict(hf.state_dict())
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
    with pytest.raises(WeightsError, match="lm_head.weight differs"):
        load_hf_gpt2_state_dict(sd, DecoderLM(gpt2_config_from_hf(hf.config)))


def test_wrong_layer_count_is_reported():
    hf = hf_model()
    model = DecoderLM(gpt2_config_from_hf(hf_config(n_layer=3)))
    with pytest.raises(WeightsError) as info:
        load_hf_gpt2_state_dict(hf.state_dict(), model)
    assert len(info.value.problems) == 12  # every tensor of h.2
    assert all(p.startswith("missing: transformer.h.2.") for p in info.value.problems)


def test_config_conversion():
    cfg = gpt2_config_from_hf({"model_type": "gpt2", "n_embd": 96, "n_layer": 3, "n_head": 3, "n_inner": 200,
                               "vocab_size": 50, "n_positions": 16, "layer_norm_epsilon": 1e-6,
                               "activation_function": "gelu"})
    assert (cfg.d_model, cfg.layers, cfg.heads, cfg.d_ff, cfg.vocab, cfg.max_positions) == (96, 3, 3, 200, 50, 16)
    assert cfg.eps == 1e-6 and cfg.activation == "gelu" and cfg.probs is False
    with pytest.raises(ModelError, match="scale_attn_by_inverse_layer_idx.*add_cross_attention"):
        gpt2_config_from_hf(hf_config(scale_attn_by_inverse_layer_idx=True, add_cross_attention=True))
    # every Hugging Face name an activation declares (ops/activations.py), and no other
    assert gpt2_config_from_hf(hf_config(activation_function="swish")).activation == "silu"
    with pytest.raises(ModelError, match="activation_function='quick_gelu'"):
        gpt2_config_from_hf(hf_config(activation_function="quick_gelu"))
    # another family's config is refused as the BERT and Llama loaders refuse one, naming what it takes
    with pytest.raises(ModelError) as info:
        gpt2_config_from_hf({"model_type": "llama"})
    assert str(info.value) == "not a GPT-2 config: model_type is 'llama' (supported: gpt2)"
