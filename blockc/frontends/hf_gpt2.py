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

from ..errors import ModelError, WeightsError
from ..ir.dtypes import DType
from .models import DecoderConfig, DecoderLM
from .weights import check_weights

# HF activation_function -> blockc activation. gelu_new, gelu_fast and
# gelu_pytorch_tanh are all 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "gelu": "gelu", "relu": "relu"}

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


def _get(cfg: Any, key: str, default=None):
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def gpt2_config_from_hf(hf_config: Any, *, probs: bool = False, dtype: str = "float32") -> DecoderConfig:
    """The ``DecoderConfig`` of a Hugging Face GPT-2 config.

    ``hf_config`` is a ``transformers.GPT2Config`` or its ``config.json`` as a
    dict. ``probs=False`` (the default) makes the model return only
    ``logits``, as ``GPT2LMHeadModel`` does. Settings blockc's decoder cannot
    express (no attention scaling, per-layer scaling, cross-attention, an
    untied head, another activation) raise ``ModelError``.
    """
    model_type = _get(hf_config, "model_type", "gpt2")
    if model_type != "gpt2":
        raise ModelError(f"not a GPT-2 config: model_type is {model_type!r}")
    act = _get(hf_config, "activation_function", "gelu_new")
    problems = []
    if act not in _ACTIVATIONS:
        problems.append(f"activation_function={act!r} (supported: {', '.join(_ACTIVATIONS)})")
    if not _get(hf_config, "scale_attn_weights", True):
        problems.append("scale_attn_weights=False (blockc always scales scores by 1/sqrt(d_k))")
    if _get(hf_config, "scale_attn_by_inverse_layer_idx", False):
        problems.append("scale_attn_by_inverse_layer_idx=True")
    if _get(hf_config, "add_cross_attention", False):
        problems.append("add_cross_attention=True")
    if not _get(hf_config, "tie_word_embeddings", True):
        problems.append("tie_word_embeddings=False (DecoderLM's head is the token table)")
    if problems:
        raise ModelError("GPT-2 config not supported by blockc's DecoderLM: " + "; ".join(problems))
    cfg = DecoderConfig(
        vocab=int(_get(hf_config, "vocab_size", 50257)),
        max_positions=int(_get(hf_config, "n_positions", 1024)),
        d_model=int(_get(hf_config, "n_embd", 768)),
        layers=int(_get(hf_config, "n_layer", 12)),
        heads=int(_get(hf_config, "n_head", 12)),
        d_ff=int(_get(hf_config, "n_inner", None) or 0),
        norm_first=True,
        activation=_ACTIVATIONS[act],
        norm="layernorm",
        positions="learned",
        eps=float(_get(hf_config, "layer_norm_epsilon", 1e-5)),
        probs=probs,
        dtype=dtype,
    )
    cfg.check()
    return cfg


def _to_numpy(t: Any) -> np.ndarray:
    """A torch tensor (any device, any dtype, bfloat16 too) or array as numpy."""
    if hasattr(t, "detach") and hasattr(t, "cpu"):
        t = t.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":  # torch cannot hand bfloat16 to numpy
            return t.float().numpy().astype(DType.bfloat16.numpy)
        return t.numpy()
    return np.asarray(t)


def _hf_names(layers: int) -> dict[str, tuple[str, ...]]:
    """Every HF tensor name a GPT-2 of ``layers`` layers has -> its DSL names."""
    names = {_PREFIX + k: v for k, v in _TOP_LEVEL.items()}
    for i in range(layers):
        for k, v in _PER_BLOCK.items():
            names[f"{_PREFIX}h.{i}.{k}"] = tuple(f"blocks.{i}.{n}" for n in v)
    return names


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
    if not isinstance(model, DecoderLM):
        raise ModelError(f"GPT-2 weights load into a DecoderLM, not a {type(model).__name__}")
    cfg = model.cfg
    if not (cfg.norm_first and cfg.norm == "layernorm" and cfg.positions == "learned"):
        raise ModelError("GPT-2 weights need a pre-norm DecoderLM with layernorm and learned positions "
                         "(build it with gpt2_config_from_hf)")
    expected = dict(model.named_parameters())
    dtype = model.dtype
    hf_names = _hf_names(cfg.layers)
    ignored = {f"{_PREFIX}h.{i}.{k}" for i in range(cfg.layers) for k in _IGNORED_PER_BLOCK}
    problems: list[str] = []
    found: dict[str, Any] = {}
    lm_head = None
    for key, value in state_dict.items():
        name = key if key.startswith(_PREFIX) or key == _LM_HEAD else _PREFIX + key
        if name == _LM_HEAD:
            lm_head = value
        elif name in hf_names:
            found[name] = value
        elif name in ignored:
            continue
        else:
            problems.append(f"unexpected: {key}")
    out: dict[str, np.ndarray] = {}
    for hf_name, dsl_names in hf_names.items():
        if hf_name not in found:
            problems.append(f"missing: {hf_name}")
            continue
        array = _to_numpy(found[hf_name])
        widths = [expected[n].shape[-1] for n in dsl_names]
        want = expected[dsl_names[0]].shape[:-1] + (sum(widths),)
        if tuple(array.shape) != want:
            problems.append(f"shape: {hf_name} is {list(array.shape)}, expected {list(want)}")
            continue
        parts = np.split(array, np.cumsum(widths)[:-1], axis=-1) if len(dsl_names) > 1 else [array]
        for n, part in zip(dsl_names, parts):
            out[n] = np.ascontiguousarray(part).astype(dtype.numpy)
    wte = _PREFIX + "wte.weight"
    if lm_head is not None and wte in found:
        head, table = _to_numpy(lm_head), _to_numpy(found[wte])
        if head.shape != table.shape or not np.array_equal(head, table):
            problems.append(f"untied: {_LM_HEAD} differs from {wte}; DecoderLM's head is the token table")
    if problems:
        err = WeightsError(f"GPT-2 state dict does not fit {model.name!r} ({len(problems)} problem"
                           f"{'s' if len(problems) != 1 else ''}):\n  " + "\n  ".join(problems))
        err.problems = problems
        raise err
    return dict(check_weights(model, out))
