"""blockc: a compiler for transformer models.

Declare a model in the DSL (or pick a built-in), trace it into a typed
dataflow IR, run it on the float64 reference interpreter, export ONNX and run
it on ONNX Runtime.
"""
from . import ops as _ops  # noqa: F401  (registers every op)
from .errors import BlockcError  # noqa: F401
from .passes.forms import FORMS, to_form  # noqa: F401
from .frontends.onnx import load_onnx  # noqa: F401
from .frontends import (Model, Module, ModuleList, Parameter, build_model, init_weights,  # noqa: F401
                        symbol, trace)
from .ir.graph import Graph  # noqa: F401
from .ir.parser import parse_graph  # noqa: F401
from .ir.printer import print_graph  # noqa: F401
from .ir.verify import verify  # noqa: F401
from .passes.manager import optimize  # noqa: F401
from .passes.shard import shard  # noqa: F401
from .runtime.reference import run_reference  # noqa: F401
from .version import __version__  # noqa: F401
