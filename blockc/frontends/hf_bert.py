"""Hugging Face BERT and RoBERTa checkpoints on blockc's ``Encoder`` (the built-in ``bert-base``).

``bert_config_from_hf`` turns a ``transformers.BertConfig`` (or its
``config.json`` as a dict) into an ``EncoderConfig``; ``load_hf_bert_state_dict``
maps a ``BertModel`` ``state_dict`` -- or a task model's (``BertForMaskedLM``,
``BertForSequenceClassification``...), whose ``BertModel`` sits under ``bert.``
-- onto the DSL model. Neither imports torch or transformers.

What the mapping relies on:

* **Post-norm blocks.** ``attention.output.LayerNorm`` normalises
  ``x + attention(x)`` and ``output.LayerNorm`` ``o + ffn(o)``: the
  ``TransformerBlock``'s ``ln1`` and ``ln2`` with ``norm_first=False``.
* **nn.Linear is [out, in].** Every projection (query, key, value, the
  attention's ``output.dense``, ``intermediate.dense``, ``output.dense``, the
  pooler) is transposed into blockc's ``[in, out]``.
* **Embeddings.** Word, position (rows ``0..seq-1``: HF's default
  ``position_ids``) and token-type tables, summed and normalised, as the
  ``Encoder`` does; the ``position_ids``/``token_type_ids`` buffers of older
  checkpoints are not weights and are ignored.
* **Padding mask.** HF adds the float minimum to padded keys' scores; blockc
  selects the lowest float for them. The two agree wherever a row has one
  token to attend to.
* **Pooler.** ``BertModel``'s pooler, ``tanh(dense(h[:, 0]))``, is the
  ``Encoder``'s ``pooler`` setting (``pooler_output``). A model built without
  it computes no ``pooler_output`` and ignores the pooler's tensors, which
  every ``BertModel`` checkpoint carries.

A task model's head (every key outside ``bert.``: ``cls.``, ``classifier.``,
``qa_outputs.``) is no part of ``BertModel`` and is left out.

RoBERTa is BERT's layout under ``roberta.`` with one difference: its
positions count from row ``pad_token_id + 1`` of the table (row
``pad_token_id`` is the padding's own), the ``Encoder``'s ``position_offset``.
A pad id inside a row, which RoBERTa gives the padding position, is not
modelled: the ids are not read for positions.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import ModelError
from .hf_common import HF_ACTIVATIONS, Layout, Source, hf_model_type, hf_setting, map_state_dict
from .models import Encoder, EncoderConfig

# model_type -> (title, where a task model keeps its base model)
FAMILIES = {"bert": ("BERT", "bert."), "roberta": ("RoBERTa", "roberta.")}

# DSL name -> (BertModel name, is an nn.Linear weight); per layer, then for the whole model.
_LINEARS = {"attn.w_q": "attention.self.query", "attn.w_k": "attention.self.key",
            "attn.w_v": "attention.self.value", "attn.w_o": "attention.output.dense",
            "ffn.fc1": "intermediate.dense", "ffn.fc2": "output.dense"}
_NORMS = {"ln1": "attention.output.LayerNorm", "ln2": "output.LayerNorm"}
_PER_BLOCK = {
    **{f"{dsl}.{kind}": (f"{hf}.{kind}", kind == "weight") for dsl, hf in _LINEARS.items()
       for kind in ("weight", "bias")},
    **{f"{dsl}.{kind}": (f"{hf}.{kind}", False) for dsl, hf in _NORMS.items() for kind in ("weight", "bias")},
}
_TOP_LEVEL = {
    "tok.weight": ("embeddings.word_embeddings.weight", False),
    "pos.weight": ("embeddings.position_embeddings.weight", False),
    "segment.weight": ("embeddings.token_type_embeddings.weight", False),
    "ln_emb.weight": ("embeddings.LayerNorm.weight", False),
    "ln_emb.bias": ("embeddings.LayerNorm.bias", False),
    "pooler.weight": ("pooler.dense.weight", True),
    "pooler.bias": ("pooler.dense.bias", False),
}
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def bert_config_from_hf(hf_config: Any, *, pooler: bool = True, dtype: str = "float32") -> EncoderConfig:
    """The ``EncoderConfig`` of a Hugging Face BERT or RoBERTa config (a
    ``transformers.BertConfig``/``RobertaConfig`` or its ``config.json`` as a
    dict). RoBERTa's positions start after its padding row: row
    ``pad_token_id + 1`` is the first token's (``position_offset``), as
    ``RobertaEmbeddings`` counts them for every token that is not a pad.

    ``pooler=True`` (the default, as ``BertModel``'s ``add_pooling_layer``)
    adds ``pooler_output``. Settings blockc's encoder cannot express (an
    activation it lacks, relative position embeddings, a decoder or
    cross-attention) are listed in one ``ModelError``.
    """
    model_type = hf_model_type(hf_config, "BERT", FAMILIES)
    get = lambda key, default=None: hf_setting(hf_config, key, default)  # noqa: E731
    problems = []
    act = get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        problems.append(f"hidden_act={act!r} (supported: {', '.join(HF_ACTIVATIONS)})")
    # transformers 4.x still has relative_key/relative_key_query position embeddings; 5 dropped them
    positions = get("position_embedding_type", "absolute")
    if positions not in (None, "absolute"):
        problems.append(f"position_embedding_type={positions!r} (supported: 'absolute')")
    if get("is_decoder", False):
        problems.append("is_decoder=True (blockc's encoder attends both ways)")
    if get("add_cross_attention", False):
        problems.append("add_cross_attention=True")
    if problems:
        raise ModelError(f"{FAMILIES[model_type][0]} config not supported by blockc's Encoder: " + "; ".join(problems))
    offset = int(get("pad_token_id", 1)) + 1 if model_type == "roberta" else 0
    cfg = EncoderConfig(
        vocab=int(get("vocab_size", 30522)),
        max_positions=int(get("max_position_embeddings", 512)),
        type_vocab=int(get("type_vocab_size", 2)),
        d_model=int(get("hidden_size", 768)),
        layers=int(get("num_hidden_layers", 12)),
        heads=int(get("num_attention_heads", 12)),
        d_ff=int(get("intermediate_size", 3072)),
        activation=HF_ACTIVATIONS[act],
        norm="layernorm",
        eps=float(get("layer_norm_eps", 1e-12)),
        pooler=pooler,
        position_offset=offset,
        dtype=dtype,
    )
    cfg.check()
    return cfg


def _sources(model: Encoder) -> dict[str, Source]:
    """The ``BertModel`` tensor of each of ``model``'s parameters."""
    sources = {}
    for name, _ in model.named_parameters():
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            hf, linear = _PER_BLOCK[rest]
            hf = f"encoder.layer.{i}.{hf}"
        else:
            hf, linear = _TOP_LEVEL[name]
        sources[hf] = Source((name,), transpose=linear)
    return sources


def bert_layout(model: Encoder, model_type: str = "bert") -> Layout:
    """Where each of ``model``'s weights is in a ``BertModel`` (``RobertaModel``)
    checkpoint, or a task model's, whose base model sits under ``bert.`` (``roberta.``)."""
    if not isinstance(model, Encoder):
        raise ModelError(f"BERT weights load into an Encoder, not a {type(model).__name__}")
    if model.cfg.norm != "layernorm":
        raise ModelError("BERT weights need an Encoder with norm=layernorm (build it with bert_config_from_hf)")
    ignored = set(_BUFFERS)
    if not model.cfg.pooler:
        ignored |= {"pooler.dense.weight", "pooler.dense.bias"}
    family, base = FAMILIES[model_type]
    return Layout(family, _sources(model), base=base, ignored=frozenset(ignored))


def load_hf_bert_state_dict(state_dict: Mapping[str, Any], model: Encoder) -> dict[str, np.ndarray]:
    """Weights for ``model`` (an ``Encoder`` built from ``bert_config_from_hf``,
    or the built-in ``bert-base`` at the checkpoint's sizes) from a Hugging
    Face ``BertModel`` ``state_dict``, or a task model's (its ``bert.`` part).

    Values may be torch tensors or numpy arrays; they are cast to the model's
    dtype, and ``nn.Linear`` weights transposed (see the module docstring).
    Missing, unexpected and misshapen tensors are all reported in one
    ``WeightsError``, named as ``BertModel`` names them.
    """
    return map_state_dict(state_dict, model, bert_layout(model))
