"""Hugging Face BERT (randomly initialised, built offline from its config)
loaded into blockc's Encoder with the pooler on: the sequence and pooled
outputs must match transformers' own forward with padding and token types,
and the DSL graph must match the same model exported by torch.onnx and
imported by blockc -- the DSL and import paths checked against each other."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_testing import randomise  # noqa: E402

from blockc import build_model, optimize, run_reference, trace  # noqa: E402
from blockc.errors import ModelError, WeightsError  # noqa: E402
from blockc.frontends import (Encoder, bert_config_from_hf, init_weights, load_hf_bert_state_dict,  # noqa: E402
                              materialize)
from blockc.runtime.backend import make_backend  # noqa: E402

VOCAB, TYPES = 100, 3
OUTPUTS = ("last_hidden_state", "pooler_output")


def hf_config(**kw):
    # eps and type vocabulary off BERT's defaults, so a config not read shows
    settings = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=48, type_vocab_size=TYPES, layer_norm_eps=1e-6)
    settings.update(kw)
    config = transformers.BertConfig(**settings)
    config._attn_implementation = "eager"
    return config


def inputs(seed=1, batch=2, seq=9):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[1, 6:] = 0   # row 1 padded after six tokens
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64),
            "token_type_ids": rng.integers(0, TYPES, (batch, seq)).astype(np.int64),
            "attention_mask": mask}


def hf_outputs(hf, feeds) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = hf(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    return {k: getattr(out, k).numpy() for k in OUTPUTS}


@pytest.fixture(scope="module")
def loaded():
    torch.manual_seed(0)
    hf = randomise(transformers.BertModel(hf_config()), torch)
    model = Encoder(bert_config_from_hf(hf.config))
    weights = load_hf_bert_state_dict(hf.state_dict(), model)
    feeds = inputs()
    expected = hf_outputs(hf, feeds)
    assert np.abs(expected["last_hidden_state"]).max() > 1.0   # not all ~0: 1e-4 is a real bound
    return hf, model, weights, feeds, expected


def _max_errors(got, expected):
    return {k: float(np.abs(got[k] - expected[k]).max()) for k in OUTPUTS}


def test_config_is_mapped(loaded):
    cfg = loaded[1].cfg
    assert (cfg.vocab, cfg.max_positions, cfg.type_vocab, cfg.d_model, cfg.layers, cfg.heads, cfg.d_ff) == (
        VOCAB, 48, TYPES, 32, 2, 4, 64)
    assert (cfg.activation, cfg.eps, cfg.pooler) == ("gelu", 1e-6, True)


@pytest.mark.parametrize("backend, form", [("reference", "standard"), ("ort-cpu", "fused")])
def test_outputs_match_transformers(loaded, backend, form):
    _, model, weights, feeds, expected = loaded
    graph = trace(model)
    if form == "fused":
        graph = optimize(graph).graph
        assert {"qkv_attention", "add_layernorm"} <= set(graph.op_counts())
        weights = {k: w for k, w in weights.items() if k in graph.params}
    if backend == "reference":
        got = run_reference(graph, weights, feeds, float64=False)
    else:
        got = make_backend(backend).run(graph, weights, feeds)
    errors = _max_errors(got, expected)
    assert max(errors.values()) <= 1e-4, errors


def test_dsl_matches_the_hf_onnx_import(loaded, tmp_path):
    """The same BertModel by both doors: its weights loaded into the DSL, and
    its torch.onnx export imported; the two graphs agree, and fuse alike."""
    hf, model, weights, feeds, expected = loaded
    names = list(feeds)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = hf

        def forward(self, *args):
            return self.m(**dict(zip(names, args)), return_dict=False)[:2]

    path = tmp_path / "bert.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapped().eval(), tuple(torch.zeros(2, 5, dtype=torch.long) for _ in names), str(path),
                          input_names=names, output_names=list(OUTPUTS), opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
    imported = build_model(str(path))
    ours = run_reference(trace(model), weights, feeds, float64=False)
    theirs = run_reference(trace(imported), materialize(init_weights(imported)), feeds, float64=False)
    errors = _max_errors(ours, theirs)
    assert max(errors.values()) <= 1e-4, errors
    assert max(_max_errors(theirs, expected).values()) <= 1e-4
    fused = ("qkv_attention", "add_layernorm", "matmul_bias_act")
    counts = [optimize(trace(m)).graph.op_counts() for m in (model, imported)]
    assert [{k: c.get(k) for k in fused} for c in counts] == [{"qkv_attention": 2, "add_layernorm": 5,
                                                               "matmul_bias_act": 2}] * 2


def test_a_task_models_state_dict_and_numpy_values(loaded):
    # BertForSequenceClassification keeps BertModel under "bert." beside its head: the head is left out
    hf, model, weights, *_ = loaded
    task = {f"bert.{k}": v.numpy() for k, v in hf.state_dict().items()}
    task.update({"classifier.weight": np.zeros((2, 32), np.float32), "classifier.bias": np.zeros(2, np.float32),
                 "bert.embeddings.position_ids": np.arange(48)[None]})   # an older checkpoint's buffer
    got = load_hf_bert_state_dict(task, model)
    assert got.keys() == weights.keys()
    for k in weights:
        np.testing.assert_array_equal(got[k], weights[k])
    np.testing.assert_array_equal(got["blocks.1.attn.w_k.weight"],
                                  hf.state_dict()["encoder.layer.1.attention.self.key.weight"].numpy().T)


def test_the_built_in_bert_base_takes_the_weights(loaded):
    """The pooler is a setting of the built-in bert-base; off, the graph has no
    pooler_output and the checkpoint's pooler tensors are not needed."""
    hf, _, _, feeds, expected = loaded
    sizes = dict(vocab=VOCAB, max_positions=48, type_vocab=TYPES, d_model=32, layers=2, heads=4, d_ff=64, eps=1e-6)
    with_pooler = build_model("bert-base", {**{k: str(v) for k, v in sizes.items()}, "pooler": "true"})
    got = run_reference(trace(with_pooler), load_hf_bert_state_dict(hf.state_dict(), with_pooler), feeds,
                        float64=False)
    assert max(_max_errors(got, expected).values()) <= 1e-4
    without = build_model("bert-base", {k: str(v) for k, v in sizes.items()})
    assert [name for name, _ in trace(without).outputs] == ["last_hidden_state"]
    assert not any(k.startswith("pooler") for k in load_hf_bert_state_dict(hf.state_dict(), without))


def test_bad_state_dict_lists_every_problem(loaded):
    hf, model, *_ = loaded
    sd = dict(hf.state_dict())
    del sd["encoder.layer.1.output.LayerNorm.bias"]
    del sd["pooler.dense.weight"]
    sd["encoder.layer.0.intermediate.dense.weight"] = sd["encoder.layer.0.intermediate.dense.weight"].T
    sd["encoder.layer.4.output.dense.bias"] = torch.zeros(32)   # a layer the model lacks
    with pytest.raises(WeightsError) as info:
        load_hf_bert_state_dict(sd, model)
    problems = ["unexpected: encoder.layer.4.output.dense.bias",
                "shape: encoder.layer.0.intermediate.dense.weight is [32, 64], expected [64, 32]",
                "missing: encoder.layer.1.output.LayerNorm.bias", "missing: pooler.dense.weight"]
    assert str(info.value) == "BERT state dict does not fit 'encoder' (4 problems):\n  " + "\n  ".join(problems)


def test_configs_blockc_cannot_express_are_listed_at_once():
    with pytest.raises(ModelError) as info:
        bert_config_from_hf(dict(model_type="bert", hidden_act="quick_gelu", is_decoder=True,
                                 position_embedding_type="relative_key"))
    assert str(info.value) == (
        "BERT config not supported by blockc's Encoder: hidden_act='quick_gelu' (supported: relu, gelu, "
        "gelu_new, gelu_pytorch_tanh, gelu_fast, silu, swish); position_embedding_type='relative_key' (supported: "
        "'absolute'); is_decoder=True (blockc's encoder attends both ways)")
    with pytest.raises(ModelError, match="not a BERT config: model_type is 'gpt2'"):
        bert_config_from_hf(transformers.GPT2Config())
    with pytest.raises(ModelError, match="BERT weights load into an Encoder, not a DecoderLM"):
        load_hf_bert_state_dict({}, build_model("tiny"))
