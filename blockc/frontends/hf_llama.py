"""Hugging Face Llama-family checkpoints (Llama, Mistral, Qwen2, Qwen3) on
blockc's ``DecoderLM``.

``llama_config_from_hf`` turns a ``LlamaConfig``, ``MistralConfig``,
``Qwen2Config`` or ``Qwen3Config`` (or its ``config.json`` as a dict) into a
``DecoderConfig``; ``load_hf_llama_state_dict`` maps a ``*ForCausalLM`` (or
bare ``*Model``) ``state_dict`` onto the DSL model. The four families differ
only in what the DSL model's settings already say -- Qwen2's q/k/v biases,
Qwen3's per-head query/key RMSNorm (``q_norm``/``k_norm``), a tied or untied
head -- so one table, read off the model's own parameters, serves them all.

What the mapping relies on:

* **nn.Linear is [out, in].** Every projection is a torch ``nn.Linear``,
  which stores ``[out, in]`` and computes ``x @ weight.T``: each weight is
  transposed into blockc's ``[in, out]`` (biases and norm weights are copied).
* **Rotate-half RoPE.** Hugging Face's checkpoints pair dimension ``i`` with
  ``i + head_dim/2`` (its converter permutes Meta's interleaved ``W_q``/``W_k``
  rows into that layout), which is ``rope_form="rotate_half"``. The cos/sin
  tables are not in the checkpoint (``inv_freq`` is a buffer): blockc makes
  them from ``rope_theta``. Only the default RoPE is mapped; scaled variants
  (``llama3``, ``yarn``, ``dynamic``, ...) are refused by name.
* **RMSNorm.** ``LlamaRMSNorm`` is ``weight * x / sqrt(mean(x²) + eps)``
  (eps inside the root, weight starting at 1), blockc's ``rmsnorm``.
* **SwiGLU.** ``down_proj(silu(gate_proj(x)) * up_proj(x))`` is the gated
  feed-forward with ``activation="silu"``: ``gate``, ``up``, ``down``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import ModelError
from .hf_common import Layout, Source, hf_model_type, hf_setting, map_state_dict
from .models import DecoderConfig, DecoderLM

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
_PREFIX = "model."
_LM_HEAD = "lm_head.weight"

# DSL name -> (HF name, is an nn.Linear weight); per block, then for the whole model.
_PER_BLOCK = {
    "ln1.weight": ("input_layernorm.weight", False),
    "ln2.weight": ("post_attention_layernorm.weight", False),
    **{f"attn.w_{p}.{kind}": (f"self_attn.{p}_proj.{kind}", kind == "weight")
       for p in "qkvo" for kind in ("weight", "bias")},
    "attn.q_norm.weight": ("self_attn.q_norm.weight", False),
    "attn.k_norm.weight": ("self_attn.k_norm.weight", False),
    **{f"ffn.{p}.{kind}": (f"mlp.{p}_proj.{kind}", kind == "weight")
       for p in ("gate", "up", "down") for kind in ("weight", "bias")},
}
_TOP_LEVEL = {
    "tok.weight": ("model.embed_tokens.weight", False),
    "ln_f.weight": ("model.norm.weight", False),
    "lm_head.weight": (_LM_HEAD, True),
}
_MADE = ("rope.cos", "rope.sin")  # made from rope_theta, not read


def llama_config_from_hf(hf_config: Any, *, probs: bool = False, dtype: str = "float32") -> DecoderConfig:
    """The ``DecoderConfig`` of a Hugging Face Llama, Mistral, Qwen2 or Qwen3
    config (a ``transformers`` config or its ``config.json`` as a dict).

    ``probs=False`` (the default) makes the model return only ``logits``, as
    ``*ForCausalLM`` does. Settings blockc's decoder cannot express (another
    activation, scaled RoPE, partial rotation, sliding-window attention) are
    listed in one ``ModelError``.
    """
    model_type = hf_model_type(hf_config, "Llama-family", FAMILIES)
    get = lambda key, default=None: hf_setting(hf_config, key, default)  # noqa: E731
    problems = []
    act = get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act={act!r} (supported: 'silu', the SwiGLU feed-forward)")
    # transformers 5 keeps RoPE's settings in rope_parameters; 4.x in rope_theta and rope_scaling
    rope = get("rope_parameters") or get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in (None, "default"):
        problems.append(f"rope_type={rope_type!r} (supported: the default RoPE)")
    theta = rope.get("rope_theta", get("rope_theta", 10000.0))
    if rope.get("partial_rotary_factor", get("partial_rotary_factor", 1.0)) != 1.0:
        problems.append("partial_rotary_factor (Llama-family attention turns the whole head)")
    window = get("sliding_window")
    max_positions = int(get("max_position_embeddings", 2048))
    if (model_type == "mistral" or get("use_sliding_window", False)) and window is not None \
            and window < max_positions:
        problems.append(f"sliding_window={window} (blockc's attention sees every earlier position)")
    attention_bias = bool(get("attention_bias", False))
    if model_type == "qwen2":
        qkv_bias, out_bias, ffn_bias = True, False, False
    else:
        qkv_bias = out_bias = attention_bias
        ffn_bias = bool(get("mlp_bias", False))
    if problems:
        raise ModelError(f"{model_type} config not supported by blockc's DecoderLM: " + "; ".join(problems))
    d_model, heads = int(get("hidden_size", 4096)), int(get("num_attention_heads", 32))
    head_dim = int(get("head_dim", None) or d_model // heads)
    cfg = DecoderConfig(
        vocab=int(get("vocab_size", 32000)),
        max_positions=max_positions,
        d_model=d_model,
        layers=int(get("num_hidden_layers", 32)),
        heads=heads,
        kv_heads=int(get("num_key_value_heads", None) or heads),
        head_dim=0 if head_dim * heads == d_model else head_dim,
        d_ff=int(get("intermediate_size", 11008)),
        norm_first=True,
        activation="silu",
        gated_ffn=True,
        norm="rmsnorm",
        positions="rope",
        rope_form="rotate_half",
        rope_theta=float(theta),
        qk_norm="head" if model_type == "qwen3" else "none",
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        ffn_bias=ffn_bias,
        tie_embeddings=bool(get("tie_word_embeddings", False)),
        eps=float(get("rms_norm_eps", 1e-6)),
        probs=probs,
        dtype=dtype,
    )
    cfg.check()
    return cfg


def _sources(model: DecoderLM) -> dict[str, Source]:
    """The checkpoint tensor of each of ``model``'s parameters."""
    sources, unknown = {}, []
    for name, _ in model.named_parameters():
        if name in _MADE:
            continue
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            hf, linear = _PER_BLOCK.get(rest, (None, False))
            hf = hf and f"{_PREFIX}layers.{i}.{hf}"
        else:
            hf, linear = _TOP_LEVEL.get(name, (None, False))
        if hf is None:
            unknown.append(name)
        else:
            sources[hf] = Source((name,), transpose=linear)
    if unknown:
        raise ModelError(f"Llama-family checkpoints have no tensor for {', '.join(unknown)}")
    return sources


def llama_layout(model: DecoderLM) -> Layout:
    """Where each of ``model``'s weights is in a Llama-family checkpoint
    (refused unless the model is Llama-shaped)."""
    if not isinstance(model, DecoderLM):
        raise ModelError(f"Llama-family weights load into a DecoderLM, not a {type(model).__name__}")
    cfg = model.cfg
    if not (cfg.norm_first and cfg.norm == "rmsnorm" and cfg.positions == "rope" and cfg.gated_ffn
            and cfg.rope_form == "rotate_half" and not cfg.rotary_dim):
        raise ModelError("Llama-family weights need a pre-norm DecoderLM with rmsnorm, rotate-half rotary "
                         "positions over whole heads and a gated feed-forward (build it with llama_config_from_hf)")
    # a bare *Model's state dict has no head: the tied check then has nothing to compare
    ignored = frozenset({f"{_PREFIX}rotary_emb.inv_freq"} | {
        f"{_PREFIX}layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(cfg.layers)})  # older checkpoints
    tied = (_LM_HEAD, _PREFIX + "embed_tokens.weight") if cfg.tie_embeddings else None
    return Layout("Llama-family", _sources(model), prefix=_PREFIX, ignored=ignored, tied=tied)


def load_hf_llama_state_dict(state_dict: Mapping[str, Any], model: DecoderLM) -> dict[str, np.ndarray]:
    """Weights for ``model`` (a ``DecoderLM`` built from ``llama_config_from_hf``)
    from a Hugging Face ``LlamaForCausalLM``, ``MistralForCausalLM``,
    ``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM`` ``state_dict`` (or the bare
    ``*Model``'s, without the ``model.`` prefix).

    Values may be torch tensors or numpy arrays; they are cast to the model's
    dtype, and ``nn.Linear`` weights transposed (see the module docstring).
    Missing, unexpected and misshapen tensors, and a tied ``lm_head.weight``
    that differs from the token table, are all reported in one ``WeightsError``.
    """
    return map_state_dict(state_dict, model, llama_layout(model))
