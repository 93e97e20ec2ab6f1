"""A rank's backend registration, carried in the job.

The ranks are fresh ``python -m blockc.parallel.worker`` processes: they
know only the backends blockc registers at import. A PyTorch backend the
launching process registered at run time (``runtime.backend.register``)
travels in ``job.json`` as its class's ``module:qualname`` and its fixed
options, and the worker registers it again before it makes the backend::

    {"name": "torch-variant", "cls": "my_backends:FastTorch", "fixed": {"compile": true},
     "path": ["/home/me/exp"]}

``path`` is the folder that makes the class's module importable (the parent
of its top package): the launching process may have found it on a path the
ranks do not share (a script's own folder, a notebook's ``sys.path``), so
the rank puts it on its ``sys.path`` before it imports the class.

A class of blockc's own (its PyTorch backend under another name and
options) is found among the classes the rank registered at import, never
imported by a string.

What a fresh interpreter could not rebuild (a class defined in
``__main__`` or inside a function, fixed options JSON cannot hold) is
refused by name before any rank starts.
"""
from __future__ import annotations

import json
import pkgutil
import sys
from pathlib import Path

from ..errors import LaunchError


def carried_registration(name: str) -> dict:
    """The registration of the backend ``name`` as a job carries it; a
    ``LaunchError`` naming it where a rank could not register it again."""
    from ..runtime.backend import registration
    entry = registration(name)
    where = f"{entry.cls.__module__}:{entry.cls.__qualname__}"
    if _importable(entry.cls) is not entry.cls:
        raise LaunchError(f"backend {name!r} is the class {where}, which a rank (a fresh Python process) cannot "
                          f"import by that name: define it at the top level of an importable module")
    fixed = dict(entry.fixed)
    try:
        same = json.loads(json.dumps(fixed)) == fixed
    except (TypeError, ValueError):
        same = False
    if not same:
        raise LaunchError(f"backend {name!r} fixes the options {fixed!r}, which cannot travel to the ranks in "
                          f"job.json: fix only numbers, strings, booleans, lists and dicts of them")
    return {"name": name, "cls": where, "fixed": fixed, "path": _import_root(entry.cls)}


def register_carried(carried: dict) -> None:
    """Register again, in a rank, what ``carried_registration`` wrote."""
    from ..runtime.backend import register
    for folder in reversed(carried.get("path", [])):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        cls = _resolve(carried["cls"])
    except (ImportError, AttributeError, ValueError) as e:
        raise LaunchError(f"backend {carried['name']!r}: this rank cannot import its class {carried['cls']} "
                          f"({e})") from None
    register(carried["name"], cls, **carried["fixed"])


def _import_root(cls: type) -> list[str]:
    """The folder a fresh interpreter must have on its path to import ``cls``'s
    module (the parent of its top package), as a list: empty where the module
    has no file (a namespace package's, a built-in one)."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return []
    folder = Path(file).absolute().parent   # not resolved: a symlinked file is imported where it is linked
    depth = cls.__module__.count(".") + (Path(file).stem == "__init__")   # a package's own file is one deeper
    return [str(folder.parents[depth - 1] if depth else folder)]


def _importable(cls: type):
    """``cls`` as a fresh interpreter finds it by its module and qualified name, or None."""
    if cls.__module__ == "__main__" or "<" in cls.__qualname__:   # a script's own, or a function's local
        return None
    try:
        return _resolve(f"{cls.__module__}:{cls.__qualname__}")
    except (ImportError, AttributeError, ValueError):
        return None


def _resolve(where: str):
    """The class named ``module:qualname``: one of blockc's from the rank's own
    registrations (blockc's modules are imported by name, never by a string:
    tests/test_layering.py), the user's by its module."""
    from ..runtime.backend import registrations
    module = where.split(":", 1)[0]
    if module == "blockc" or module.startswith("blockc."):
        for entry in registrations():
            if f"{entry.cls.__module__}:{entry.cls.__qualname__}" == where:
                return entry.cls
        raise ImportError(f"{where} is not a backend class blockc registers")
    return pkgutil.resolve_name(where)
