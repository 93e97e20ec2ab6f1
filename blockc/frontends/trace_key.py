"""What a model's trace depends on, said without tracing it.

``trace(model)`` of a built-in model class is a function of the class, the
model's name, its modules as they stand (each one's class, own settings and
parameters' names, shapes and dtypes: what its config made, or what a caller
set since, such as another dtype) and the step it traces (``DecoderLM.for_cache``: prefill or decode, the cache
length, padded or not), given the code (``version.code_version()``). So that
description, not the traced graph, can name a compile-cache entry
(``passes/forms.form_of``), and a warm start need not trace at all.

A Hugging Face directory's model is a ``DecoderLM`` or ``Encoder`` whose
config is made from its ``config.json`` and the checkpoint's dtype (the
safetensors headers, checked against the model when it is built): its key is
that config, and never a weight byte, so weights changed in place are still
bound at load. An ONNX file's model (``OnnxModel``) is keyed by the file's graph without
the values of its parameters (their names, shapes and dtypes kept; the
small constants it reads as part of the graph kept whole, a node's tensor
kept as external data included), its functions and
opsets, its name and the inputs as this model takes them (the dims a step
binds). A user's own class (or a subclass of a built-in one, whose
``forward`` may differ) has no such description: ``None``, and its callers
trace and key on the printed graph instead.
"""
from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..files import cache_key
from ..ir.dtypes import DType
from .models import BlockModel, DecoderLM, Encoder
from .module import Model

if TYPE_CHECKING:
    from .onnx.model import OnnxModel

_KEYED = (DecoderLM, Encoder, BlockModel)   # built-in classes whose trace their config determines
_STEP = ("cache", "cache_len", "padded")     # DecoderLM's step settings (absent on the others)


def trace_key(model: Model) -> str | None:
    """Everything ``trace(model)`` depends on besides blockc's code, as text;
    ``None`` where only tracing can tell (see the module docstring)."""
    if type(model) not in _KEYED:
        # the ONNX frontend for an ONNX model alone (who made one imported it): a built-in's run never loads it
        from .onnx.model import OnnxModel
        return _file_key(model) if type(model) is OnnxModel else None
    step = {name: getattr(model, name) for name in _STEP if hasattr(model, name)}
    tree = _module_tree(model)
    if tree is None:
        return None
    return json.dumps({"class": type(model).__name__, "name": model.name, "config": dataclasses.asdict(model.cfg),
                       "step": step, "modules": tree}, sort_keys=True)


# Values a built-in module's own settings take; anything else (a user's object) has no stable text.
_PLAIN = (str, int, float, bool, type(None), DType)


def _module_tree(model: Model) -> list | None:
    """Every module of ``model`` as built now: its path, its class, its own
    settings and its parameters' names, shapes and dtypes (never their
    values). A model changed after it was built (a module replaced, a dtype
    or a setting set) so keys otherwise than the one its config makes, and a
    module of a user's class, or a setting no text names, gives ``None``."""
    tree = []
    for path, module in [("", model), *model.named_modules()]:
        cls = type(module)
        if not cls.__module__.startswith("blockc."):
            return None
        settings = {}
        for name, value in vars(module).items():
            if name in ("_params", "_modules"):
                continue
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)
                if not all(isinstance(v, _PLAIN) for v in value.values()):
                    return None
            elif not isinstance(value, _PLAIN):
                return None
            settings[name] = value if not isinstance(value, DType) else value.name
        params = [(name, list(p.shape), p.dtype.name if p.dtype else None, bool(p.fixed))
                  for name, p in module._params.items()]
        tree.append([path, f"{cls.__module__}.{cls.__qualname__}", settings, params])
    return tree


def _constants(model: OnnxModel) -> list[tuple[str, np.ndarray]]:
    """The values the graph reads as part of itself, by name: the file's
    small initializers, and the tensors of node attributes (a ``Constant``'s
    value) kept as external data, whose node holds only where they lie."""
    held = [(name, model.constants[name]) for name in sorted(model.constants)]
    for index, node in enumerate(model.nodes):
        for name, a in sorted(node.attrs.items()):
            if a.type == a.TENSOR and a.t.data_location == onnx.TensorProto.EXTERNAL:
                held.append((f"node {index} {node.name} {name}", model.attr_tensor(node, name)))
    return held


def _file_key(model: OnnxModel) -> str:
    """An ONNX file's model, its parameters' values left out (see the module docstring)."""
    proto = model.file.model
    graph = onnx.GraphProto()
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(proto.graph, field))
    for t in proto.graph.initializer:   # names, shapes, dtypes: a parameter's values are bound at load
        graph.initializer.add(name=t.name, dims=t.dims, data_type=t.data_type)
    constants = [part for name, value in _constants(model)
                 for part in (name, str(value.dtype), value.tobytes())]
    digest = cache_key(graph.SerializeToString(deterministic=True), *constants,
                       *(f.SerializeToString(deterministic=True) for f in proto.functions))
    opsets = sorted((o.domain, o.version) for o in proto.opset_import)
    return json.dumps({"class": "OnnxModel", "name": model.name, "graph": digest, "opsets": opsets,
                       "inputs": [repr(spec) for spec in model.inputs()]}, sort_keys=True)
