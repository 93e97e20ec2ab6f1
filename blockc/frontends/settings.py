"""``KEY=VALUE`` flags read once: ``parse_pairs`` splits them (``--set``,
``--dim``), and ``convert_setting`` reads a ``--set`` text as the value its
setting takes, one reading for the built-in models (``catalog``) and a
Hugging Face directory's (``hf_dir``)."""
from __future__ import annotations

from ..errors import BlockcError


def parse_pairs(items: list[str] | None, flag: str, form: str, example: str,
                valid=lambda value: True) -> dict[str, str]:
    """``["layers=2", "d_model=64"]`` -> ``{"layers": "2", "d_model": "64"}``:
    each item a ``form`` (``KEY=VALUE``) with both sides given and ``valid(value)``,
    else one error naming the flag, the item and an ``example``."""
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip() or not valid(value.strip()):
            raise BlockcError(f"malformed {flag} {item!r}: expected {form}, e.g. {flag} {example}")
        out[key.strip()] = value.strip()
    return out


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
