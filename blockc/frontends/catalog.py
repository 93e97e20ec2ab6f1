"""The built-in models, ``--set`` overrides, and loading a user's model file.

A MODEL argument is a built-in name (``gpt2``), ``path/to/file.py:name``,
``path/to/model.onnx`` (imported by ``frontends/onnx``) or a Hugging Face
checkpoint directory (``frontends/hf_dir``),
where ``name`` is a ``Model`` instance, a ``Model`` subclass, or a function
returning a ``Model``; overrides are passed to the latter two as keyword
arguments.
"""
from __future__ import annotations

import dataclasses
import os
import runpy
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import BlockcError, ModelError
from .models import BlockConfig, BlockModel, DecoderConfig, DecoderLM, Encoder, EncoderConfig
from .module import Model
from .settings import convert_setting, parse_pairs


@dataclass(frozen=True)
class Builtin:
    name: str
    config: type
    defaults: dict
    build: Callable
    about: str


# Llama's choices at a size that runs in milliseconds (d_ff about 8/3 d, as Llama's SwiGLU keeps the
# parameter count of a 4d MLP).
LLAMA_TINY = dict(vocab=256, max_positions=128, d_model=64, layers=2, heads=4, kv_heads=2, d_ff=176,
                  norm="rmsnorm", eps=1e-6, activation="silu", gated_ffn=True, positions="rope",
                  qkv_bias=False, out_bias=False, ffn_bias=False, tie_embeddings=False)

BUILTINS = {b.name: b for b in [
    Builtin("tiny", DecoderConfig, dict(vocab=256, max_positions=128, d_model=64, layers=2, heads=4),
            DecoderLM, "a small GPT-style decoder (2 layers, d=64, 4 heads, vocab 256) for quick runs"),
    Builtin("gpt2", DecoderConfig, {}, DecoderLM,
            "GPT-2 small: pre-norm, tanh-GELU, 12 layers, d=768, 12 heads, vocab 50257, 1024 positions, tied head"),
    Builtin("gpt2-block", BlockConfig, {}, BlockModel,
            "one GPT-2 block (pre-norm, causal, tanh-GELU, d=768, 12 heads) on x: f32[batch,seq,768]"),
    Builtin("bert-base", EncoderConfig, {}, Encoder,
            "BERT-base encoder: post-norm, GELU, 12 layers, d=768, 12 heads, padding mask; pooler=true adds "
            "Hugging Face BertModel's pooler_output"),
    Builtin("llama-tiny", DecoderConfig, LLAMA_TINY, DecoderLM,
            "a small Llama-style decoder: RMSNorm, rotary positions (rotate-half) from position_ids, "
            "grouped-query attention (4 heads, 2 K/V heads), SwiGLU, no biases, untied head; "
            "2 layers, d=64, vocab 256"),
    Builtin("qwen3-tiny", DecoderConfig, dict(LLAMA_TINY, head_dim=32, qk_norm="head"), DecoderLM,
            "llama-tiny with Qwen3's query/key RMSNorm per head and heads of 32 (wider than d/heads)"),
]}

DEFAULT_MODEL = "gpt2-block"


def config_fields(cls) -> dict[str, Any]:
    return {f.name: f.type for f in dataclasses.fields(cls)}


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``["layers=2", "d_model=64"]`` -> ``{"layers": "2", "d_model": "64"}``."""
    return parse_pairs(items, "--set", "KEY=VALUE", "layers=2")


def build_model(spec: str, overrides: dict[str, str] | None = None) -> Model:
    """The model named by ``spec`` with ``--set`` overrides applied."""
    overrides = dict(overrides or {})
    if spec in BUILTINS:
        b = BUILTINS[spec]
        fields = config_fields(b.config)
        unknown = [k for k in overrides if k not in fields]
        if unknown:
            raise BlockcError(f"{spec} has no setting {', '.join(repr(k) for k in unknown)}; "
                              f"settings: {', '.join(fields)}")
        values = dict(b.defaults)
        values.update({k: convert_setting(spec, k, fields[k], v) for k, v in overrides.items()})
        try:
            return b.build(b.config(**values), name=spec)
        except ModelError as e:
            raise ModelError(f"{spec}: {e}") from None
    if ":" in spec and spec.rsplit(":", 1)[0].endswith(".py"):
        return _load_user_model(spec, overrides)
    from .hf_dir import is_hf_dir, load_hf_dir
    if is_hf_dir(spec):
        return load_hf_dir(spec, overrides)
    if spec.lower().endswith(".onnx"):
        if overrides:
            raise BlockcError(f"{spec} is an ONNX file: its sizes are fixed, and --set does not apply")
        from .onnx import OnnxModel
        return OnnxModel(spec)
    raise BlockcError(f"unknown model {spec!r}; built-in models: {', '.join(BUILTINS)} "
                      f"(or give path/to/file.py:name, path/to/model.onnx or a Hugging Face checkpoint directory)")


def _load_user_model(spec: str, overrides: dict[str, str]) -> Model:
    path, name = spec.rsplit(":", 1)
    if not os.path.isfile(path):
        raise BlockcError(f"model file {path!r} not found")
    try:
        namespace = runpy.run_path(path)
    except BlockcError:
        raise
    except SystemExit as e:  # would end blockc silently, with the model file's status
        raise ModelError(f"{_where(e, path)}: the model file called sys.exit({e.code!r}) while loading; "
                         f"a model file must not end the program") from None
    except Exception as e:
        raise ModelError(f"{_where(e, path)}: error while loading the model file: "
                         f"{type(e).__name__}: {e}") from None
    if name not in namespace:
        found = [k for k, v in namespace.items() if isinstance(v, Model) or
                 (isinstance(v, type) and issubclass(v, Model) and v is not Model)]
        raise BlockcError(f"{path} defines no {name!r}" + (f"; models there: {', '.join(found)}" if found else ""))
    obj = namespace[name]
    if isinstance(obj, Model):
        if overrides:
            raise BlockcError(f"{spec} is a model instance; --set needs a Model class or a function")
        return obj
    if callable(obj):
        try:
            model = obj(**{k: _guess(v) for k, v in overrides.items()})
        except BlockcError:
            raise
        except TypeError as e:
            raise BlockcError(f"{spec}: cannot build with settings {overrides}: {e}") from None
        except SystemExit as e:
            raise ModelError(f"{_where(e, path)}: {name} called sys.exit({e.code!r}); a model must not end "
                             f"the program") from None
        except Exception as e:
            raise ModelError(f"{_where(e, path)}: {type(e).__name__}: {e}") from None
        if isinstance(model, Model):
            return model
    raise BlockcError(f"{spec} is not a blockc Model, a Model subclass or a function returning one")


def _guess(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _where(e: Exception, path: str) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if os.path.abspath(f.filename) == os.path.abspath(path)]
    return f"{path}:{frames[-1].lineno}" if frames else path
