"""A ``--set KEY=VALUE`` text as the value its setting takes: one reading for
the built-in models (``catalog``) and a Hugging Face directory's (``hf_dir``)."""
from __future__ import annotations

from ..errors import BlockcError


def convert_setting(model: str, key: str, kind, text: str):
    """``text`` as ``kind`` (a type, or its name as a dataclass field's annotation
    says it), or a ``BlockcError`` naming the model and the setting."""
    kind = {"int": int, "float": float, "bool": bool, "str": str}.get(kind, kind)
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return kind(text)
    except ValueError:
        raise BlockcError(f"{model}: --set {key}={text!r} is not a valid {kind.__name__}") from None
