"""What a model's trace depends on, said without tracing it.

``trace(model)`` of a built-in model class is a function of the class, the
model's name, its config (every size and setting, the dtype included) and
the step it traces (``DecoderLM.for_cache``: prefill or decode, the cache
length, padded or not), given the code (``version.code_version()``). So that
description, not the traced graph, can name a compile-cache entry
(``passes/forms.form_of``), and a warm start need not trace at all.

A Hugging Face directory's model is a ``DecoderLM`` or ``Encoder`` whose
config is made from its ``config.json`` and the checkpoint's dtype (the
safetensors headers, checked against the model when it is built): its key is
that config, and never a weight byte, so weights changed in place are still
bound at load. A user's own class (or a subclass of a built-in one, whose
``forward`` may differ) has no such description: ``None``, and its callers
trace and key on the printed graph instead.
"""
from __future__ import annotations

import dataclasses
import json

from .models import BlockModel, DecoderLM, Encoder
from .module import Model

_KEYED = (DecoderLM, Encoder, BlockModel)   # built-in classes whose trace their config determines
_STEP = ("cache", "cache_len", "padded")     # DecoderLM's step settings (absent on the others)


def trace_key(model: Model) -> str | None:
    """Everything ``trace(model)`` depends on besides blockc's code, as text;
    ``None`` where only tracing can tell (see the module docstring)."""
    if type(model) not in _KEYED:
        return None
    step = {name: getattr(model, name) for name in _STEP if hasattr(model, name)}
    return json.dumps({"class": type(model).__name__, "name": model.name, "config": dataclasses.asdict(model.cfg),
                       "step": step}, sort_keys=True)
