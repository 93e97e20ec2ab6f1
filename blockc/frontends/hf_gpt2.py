"""Hugging Face GPT-2 checkpoints on blockc's ``DecoderLM``.

``gpt2_config_from_hf`` turns a ``transformers.GPT2Config`` (or its
``config.json`` as a dict) into a ``DecoderConfig``;
``load_hf_gpt2_state_dict`` renames and splits a ``GPT2LMHeadModel`` (or
``GPT2Model``) ``state_dict`` into weights for the DSL model. Neither imports
torch or transformers: tensors are converted by duck typing.

Two things about HF GPT-2 that the mapping relies on:

* **Activation.** GPT-2's ``activation_function`` is ``"gelu_new"``, the tanh
  approximation of GELU, which is blockc's ``gelu_tanh`` (not the erf
  ``gelu``; the two differ by up to ~1e-3, enough to fail a parity check).
* **Conv1D, not nn.Linear.** HF GPT-2's projections (``c_attn``, ``c_proj``,
  ``c_fc``) are ``transformers.pytorch_utils.Conv1D``, which computes
  ``x @ weight + bias`` with ``weight`` stored ``[in, out]``. That is exactly
  blockc's ``Linear`` convention, so the weights are copied **without a
  transpose**. (A torch ``nn.Linear`` stores ``[out, in]`` and computes
  ``x @ weight.T``: its weights need ``.T`` to become blockc weights.)
  ``c_attn`` fuses the three input projections: ``[d, 3d]`` whose column
  blocks are q, k and v, so it is split along the last axis into ``w_q``,
  ``w_k`` and ``w_v`` (and its bias ``[3d]`` likewise).

GPT-2 ties the unembedding to the token table (``lm_head.weight`` is
``transformer.wte.weight``), as ``DecoderLM`` does; an ``lm_head.weight``
present in the state dict must equal ``wte``. The causal-mask buffers
``attn.bias`` and ``attn.masked_bias`` of older checkpoints are ignored.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import ModelError
from .hf_common import HF_ACTIVATIONS, Layout, Source, hf_model_type, hf_setting, map_state_dict
from .models import DecoderConfig, DecoderLM

# HF name (relative to "transformer.") -> the DSL names it becomes; several
# names mean the HF tensor is split along its last axis in that order.
_TOP_LEVEL = {
    "wte.weight": ("tok.weight",),
    "wpe.weight": ("pos.weight",),
    "ln_f.weight": ("ln_f.weight",),
    "ln_f.bias": ("ln_f.bias",),
}
_PER_BLOCK = {
    "ln_1.weight": ("ln1.weight",),
    "ln_1.bias": ("ln1.bias",),
    "attn.c_attn.weight": ("attn.w_q.weight", "attn.w_k.weight", "attn.w_v.weight"),
    "attn.c_attn.bias": ("attn.w_q.bias", "attn.w_k.bias", "attn.w_v.bias"),
    "attn.c_proj.weight": ("attn.w_o.weight",),
    "attn.c_proj.bias": ("attn.w_o.bias",),
    "ln_2.weight": ("ln2.weight",),
    "ln_2.bias": ("ln2.bias",),
    "mlp.c_fc.weight": ("ffn.fc1.weight",),
    "mlp.c_fc.bias": ("ffn.fc1.bias",),
    "mlp.c_proj.weight": ("ffn.fc2.weight",),
    "mlp.c_proj.bias": ("ffn.fc2.bias",),
}
_IGNORED_PER_BLOCK = ("attn.bias", "attn.masked_bias")  # causal-mask buffers, not weights
_PREFIX = "transformer."
_LM_HEAD = "lm_head.weight"


def gpt2_config_from_hf(hf_config: Any, *, probs: bool = False, dtype: str = "float32") -> DecoderConfig:
    """The ``DecoderConfig`` of a Hugging Face GPT-2 config.

    ``hf_config`` is a ``transformers.GPT2Config`` or its ``config.json`` as a
    dict. ``probs=False`` (the default) makes the model return only
    ``logits``, as ``GPT2LMHeadModel`` does. Settings blockc's decoder cannot
    express (no attention scaling, per-layer scaling, cross-attention, an
    untied head, another activation) raise ``ModelError``.
    """
    hf_model_type(hf_config, "GPT-2", ("gpt2",))
    act = hf_setting(hf_config, "activation_function", "gelu_new")
    problems = []
    if act not in HF_ACTIVATIONS:
        problems.append(f"activation_function={act!r} (supported: {', '.join(HF_ACTIVATIONS)})")
    if not hf_setting(hf_config, "scale_attn_weights", True):
        problems.append("scale_attn_weights=False (blockc always scales scores by 1/sqrt(d_k))")
    if hf_setting(hf_config, "scale_attn_by_inverse_layer_idx", False):
        problems.append("scale_attn_by_inverse_layer_idx=True")
    if hf_setting(hf_config, "add_cross_attention", False):
        problems.append("add_cross_attention=True")
    if not hf_setting(hf_config, "tie_word_embeddings", True):
        problems.append("tie_word_embeddings=False (DecoderLM's head is the token table)")
    if problems:
        raise ModelError("GPT-2 config not supported by blockc's DecoderLM: " + "; ".join(problems))
    cfg = DecoderConfig(
        vocab=int(hf_setting(hf_config, "vocab_size", 50257)),
        max_positions=int(hf_setting(hf_config, "n_positions", 1024)),
        d_model=int(hf_setting(hf_config, "n_embd", 768)),
        layers=int(hf_setting(hf_config, "n_layer", 12)),
        heads=int(hf_setting(hf_config, "n_head", 12)),
        d_ff=int(hf_setting(hf_config, "n_inner", None) or 0),
        norm_first=True,
        activation=HF_ACTIVATIONS[act],
        norm="layernorm",
        positions="learned",
        eps=float(hf_setting(hf_config, "layer_norm_epsilon", 1e-5)),
        probs=probs,
        dtype=dtype,
    )
    cfg.check()
    return cfg


def _sources(layers: int) -> dict[str, Source]:
    """Every HF tensor a GPT-2 of ``layers`` layers has -> what it becomes
    (Conv1D weights are ``[in, out]`` already: nothing is transposed)."""
    names = {_PREFIX + k: Source(v) for k, v in _TOP_LEVEL.items()}
    for i in range(layers):
        for k, v in _PER_BLOCK.items():
            names[f"{_PREFIX}h.{i}.{k}"] = Source(tuple(f"blocks.{i}.{n}" for n in v))
    return names


def gpt2_layout(model: DecoderLM) -> Layout:
    """Where each of ``model``'s weights is in a ``GPT2LMHeadModel`` or
    ``GPT2Model`` checkpoint (refused unless the model is GPT-2-shaped)."""
    if not isinstance(model, DecoderLM):
        raise ModelError(f"GPT-2 weights load into a DecoderLM, not a {type(model).__name__}")
    cfg = model.cfg
    if not (cfg.norm_first and cfg.norm == "layernorm" and cfg.positions == "learned" and cfg.tie_embeddings
            and not cfg.gated_ffn and cfg.qkv_bias and cfg.out_bias and cfg.ffn_bias
            and cfg.kv_heads in (0, cfg.heads) and not cfg.head_dim and cfg.qk_norm == "none"):
        raise ModelError("GPT-2 weights need a GPT-2-shaped DecoderLM: pre-norm, layernorm, learned positions, "
                         "biases, a tied head (build it with gpt2_config_from_hf)")
    ignored = frozenset(f"{_PREFIX}h.{i}.{k}" for i in range(cfg.layers) for k in _IGNORED_PER_BLOCK)
    return Layout("GPT-2", _sources(cfg.layers), prefix=_PREFIX, ignored=ignored,
                  tied=(_LM_HEAD, _PREFIX + "wte.weight"))


def load_hf_gpt2_state_dict(state_dict: Mapping[str, Any], model: DecoderLM) -> dict[str, np.ndarray]:
    """Weights for ``model`` (a GPT-2-shaped ``DecoderLM``) from a Hugging Face
    ``GPT2LMHeadModel`` or ``GPT2Model`` ``state_dict``.

    Values may be torch tensors or numpy arrays; they are cast to the model's
    dtype. Names may carry the ``transformer.`` prefix (``GPT2LMHeadModel``)
    or not (``GPT2Model``). Unknown names, missing names, wrong shapes and an
    ``lm_head.weight`` that differs from ``wte`` are all reported in one
    ``WeightsError``. See the module docstring for the mapping (Conv1D weights
    are ``[in, out]``, like blockc's: no transpose; ``c_attn`` splits into q, k, v).
    """
    return map_state_dict(state_dict, model, gpt2_layout(model))
