"""The JSON files beside a model, read by one reader with one rule for what
is wrong with them: the error names the file and, for a field, the field.

They are a Hugging Face directory's ``config.json``, ``tokenizer_config.json``
and ``generation_config.json`` (``ModelError``), its
``model.safetensors.index.json`` (``WeightsError``), and ONNX Runtime
GenAI's ``genai_config.json`` beside a decoder file (``OnnxFileError``)::

    config = read_json("d/genai_config.json", "GenAI settings", OnnxFileError)
    layers = json_field(config, "model.decoder.num_hidden_layers", int,
                        file="d/genai_config.json", error=OnnxFileError)
    # d/genai_config.json: model.decoder.num_hidden_layers is a str ('2'), not an int
"""
from __future__ import annotations

import json
import os

from ..errors import BlockcError, ModelError

_REQUIRED = object()


def read_json(file: str | os.PathLike, what: str, error: type[BlockcError] = ModelError) -> dict:
    """The JSON object in ``file`` as a dict, or ``error`` naming the file and
    what is wrong (``what`` says what the object holds: "settings")."""
    try:
        with open(file, encoding="utf-8") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise error(f"{file} is not valid JSON: {e}") from None
    except OSError as e:
        raise error(f"cannot read {file}: {e.strerror or e}") from None
    if not isinstance(value, dict):
        raise error(f"{file} holds a JSON {type(value).__name__}, not an object of {what}")
    return value


def json_field(value: dict, dotted: str, kind: type | tuple[type, ...], *, file: str | os.PathLike,
               error: type[BlockcError] = ModelError, default=_REQUIRED):
    """The field at ``dotted`` ("model.decoder.inputs") of ``value`` (read
    from ``file``), which must be a ``kind``; ``default`` where it is absent,
    if given; else ``error`` naming the file and the field. A bool is not
    taken for an int (JSON's ``true`` is no count)."""
    node, path = value, []
    for key in dotted.split("."):
        if not isinstance(node, dict):
            raise error(f"{file}: {'.'.join(path)} is {_kind_of(node)}, not an object (reading {dotted})")
        path.append(key)
        if key not in node:
            if default is not _REQUIRED:
                return default
            raise error(f"{file} has no field {dotted}")
        node = node[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(node, kinds) or (isinstance(node, bool) and bool not in kinds):
        wanted = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
        raise error(f"{file}: {dotted} is {_kind_of(node)}, not {wanted}")
    return node


_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false"}


def _kind_of(node) -> str:
    """``node`` as the error shows it: its JSON kind and, for a scalar, its value."""
    kind = {dict: "an object", list: "a list", type(None): "null"}.get(type(node))
    return kind or f"{_KIND_NAMES.get(type(node), type(node).__name__)} ({node!r})"
