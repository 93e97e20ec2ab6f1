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

import importlib

from . import ops as _ops  # noqa: F401  (registers every op)
from .errors import BlockcError  # noqa: F401
from .version import __version__  # noqa: F401

# name -> the module that defines it
_LAZY = {
    "FORMS": ".passes.forms", "to_form": ".passes.forms",
    "load_onnx": ".frontends.onnx",
    **{name: ".frontends" for name in ("Model", "Module", "ModuleList", "Parameter", "build_model",
                                       "init_weights", "symbol", "trace")},
    "Graph": ".ir.graph",
    "parse_graph": ".ir.parser",
    "print_graph": ".ir.printer",
    "verify": ".ir.verify",
    "optimize": ".passes.manager",
    "shard": ".passes.shard",
    "run_reference": ".runtime.reference",
}

__all__ = ["BlockcError", "__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value   # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
