"""blockc: a compiler for transformer models.

Declare a model in the DSL (or pick a built-in), trace it into a typed
dataflow IR, run it on the float64 reference interpreter, export ONNX and run
it on ONNX Runtime.

The names below are imported when first used (PEP 562 ``__getattr__``):
``import blockc`` (every ``blockc`` command starts with it) does not import
ONNX, the model catalog or the passes a warm ``generate`` or ``run`` never
uses; ``from blockc import optimize`` works as before.
"""
from __future__ import annotations

from . import ops as _ops  # noqa: F401  (registers every op)
from .errors import BlockcError  # noqa: F401
from .version import __version__  # noqa: F401

_FRONTEND = ("Model", "Module", "ModuleList", "Parameter", "build_model", "init_weights", "symbol", "trace")
__all__ = ["BlockcError", "__version__", "FORMS", "to_form", "load_onnx", *_FRONTEND, "Graph", "parse_graph",
           "print_graph", "verify", "optimize", "shard", "run_reference"]


def _defining_module(name: str):
    """The module that defines the facade's ``name``, imported now (by
    name, so that the layering test sees each import); None: no such name."""
    if name in ("FORMS", "to_form"):
        from .passes import forms as module
    elif name == "load_onnx":
        from .frontends import onnx as module
    elif name in _FRONTEND:
        from . import frontends as module
    elif name == "Graph":
        from .ir import graph as module
    elif name == "parse_graph":
        from .ir import parser as module
    elif name == "print_graph":
        from .ir import printer as module
    elif name == "verify":
        from .ir import verify as module
    elif name == "optimize":
        from .passes import manager as module
    elif name == "shard":
        from .passes import shard as module
    elif name == "run_reference":
        from .runtime import reference as module
    else:
        return None
    return module


_SUBPACKAGES = ("frontends", "passes", "runtime", "ir")


def _every_name() -> None:
    """Every facade name resolved, as ``import blockc`` did before they were
    lazy: the subpackages those imports made attributes (``blockc.passes``,
    ``blockc.frontends.onnx``, ``blockc.runtime.reference``) are there again."""
    for name in __all__:
        if name not in globals():
            __getattr__(name)


def __getattr__(name: str):
    if name in _SUBPACKAGES:   # asked of the package before any facade name imported it
        _every_name()
        if name in globals():
            return globals()[name]
    module = _defining_module(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value   # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
