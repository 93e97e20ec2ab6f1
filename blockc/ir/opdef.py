"""The one op registry: the ``OpDef`` class and the table of every declared op.

Each op is declared once (in ``blockc/ops/``), with everything blockc knows
about it, attached to its ``OpDef`` by decorators or keywords:

* ``attrs``     -- attribute names, kinds and defaults;
* ``infer``     -- the shape/dtype rule, over symbolic dims;
* ``numpy``     -- its meaning, run by the reference interpreter (and by
  constant folding and load-time evaluation, through ``ops.evaluate``);
* ``decompose`` -- (composite and fused ops) the same math in more primitive
  ops: what ``legalize`` uses on a target that cannot lower the op itself;
* ``onnx``      -- how it lowers to standard ONNX nodes;
* ``onnx_form`` -- (fused ops) other ONNX encodings by name (``contrib``,
  ``onnx23``): lowerings to single runtime ops that may decline a node by
  raising ``NotApplicable`` with the reason;
* ``torch``     -- the PyTorch call a PyTorch user would write for it;
* ``cuda``      -- the name of the CUDA kernel family that computes it (``elementwise`` with
  its C expression ``cuda_expr``; the families are declared in ``codegen/cuda/kernels/``, which
  ``ir`` does not know), or nothing: the CUDA backend then legalizes it by decomposition;
* ``flops``     -- floating-point operations per output element (or a rule);
* ``traffic``   -- bytes an ideal kernel reads and writes, where that is not
  each input once and each output once (a causal softmax reads only the
  scores its rows see): the traffic model's rule (``report/traffic.py``);
* ``indexes``   -- which inputs hold ids that pick entries of another input
  (a ``gather``'s indices, a ``rotary``'s positions): ``ops/limits.py``
  range-checks a graph input used so, on every backend;
* ``bounds``    -- which symbolic ends must fit a fixed axis of an input (a
  ``slice`` up to ``seq`` of a 1024-row table, a cache written up to
  ``total`` of a 1001-position buffer): ``ops/limits.py`` refuses a dim past
  them, on every backend, before any run;
* ``fused``     -- whether the fusion passes make it: reports draw it, ONNX
  export writes it in a fused-op encoding, ``blockc compare`` times it alone;
* ``moves_data`` -- whether its result is its inputs' elements moved or
  copied (``transpose``, ``concat``, ``slice``, ...) or each converted alone
  by the one IEEE rounding (``cast``): any runtime gives the same bits, so
  ``runtime/folded_params.py`` may compute it over parameters itself, where
  arithmetic (a scale folded into a weight, ``1 + w``) is left to the
  runtime that would round it its own way;
* ``collective`` -- whether it exchanges values between the ranks of a
  tensor-parallel group (of ``world`` ranks, an attribute every collective
  has): ``compare --tp`` times these alone, through their ``torch`` rule,
  and the communication report counts their bytes (``collective_ops``);
* ``peers``     -- (collectives) the meaning over the ranks' values, which
  ``numpy`` cannot give since it sees one rank alone: ``fn(inputs of each
  rank, attrs) -> outputs of each rank``, what the tensor-parallel reference
  (``runtime/tp_reference.py``) runs.

Every list of ops elsewhere (fused ops, a target's supported set, the FLOP
table, report colours) is derived from this table, never typed again.

The table lives in ``ir`` because a graph needs it to type a node it makes;
``ir`` itself declares no op. Importing ``blockc.ops`` fills it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import BlockcError, ShapeError
from .dims import Sym, is_dim
from .types import TensorType

# Attribute kinds. Lists of dims double as lists of ints (ints are dims).
INT, FLOAT, STR, BOOL, DIM, DIMS, TENSOR = "int", "float", "str", "bool", "dim", "dims", "tensor"

REQUIRED = object()


class NotApplicable(Exception):
    """Raised by an ``onnx_form`` lowering that cannot express a node, before
    it emits anything; the message is the reason, shown in the fusion report."""


@dataclass
class OpDef:
    name: str
    inputs: tuple            # names of inputs; a trailing "*name" takes zero or more values
    outputs: int | Callable[[Mapping[str, Any], int], int] = 1
    attrs: dict = field(default_factory=dict)   # name -> (kind, default or REQUIRED)
    doc: str = ""
    infer_fn: Callable | None = None
    numpy_fn: Callable | None = None
    onnx_fn: Callable | None = None
    decompose_fn: Callable | None = None
    onnx_encodings: dict = field(default_factory=dict)  # form name -> lowering (may raise NotApplicable)
    torch_fn: Callable | None = None       # fn(b, node, xs): see blockc/runtime/torch_runner.py
    peers_fn: Callable | None = None       # a collective's fn([inputs of rank r for r], attrs) -> [outputs of rank r]
    cuda: str | None = None                # a CUDA kernel family's name; None: legalized by decomposition
    # elementwise: "({0} + {1})" ({k} the k-th input, {index} the element's linear index, {attr} a
    # dim attribute's run-time value), or fn(attrs, args, out_dtype)
    cuda_expr: str | Callable | None = None
    flops: int | Callable = 1              # per element of the first output, or fn(node, bindings)
    traffic: Callable | None = None        # fn(node, bindings) -> (bytes read, bytes written); None: each once
    fused: bool = False                    # made by the fusion passes
    collective: bool = False               # exchanges values between the ranks (attribute ``world``)
    moves_data: bool = False               # its result is its inputs' elements moved or converted: the same bits anywhere
    colour: str | None = None              # a fused op's colour in report pictures (else a spare one)
    indexes: Callable | None = None        # fn(node) -> [(ids value, table value, axis)] (ops/limits.py)
    bounds: Callable | None = None         # fn(node) -> [(end dim, value, axis)]: end <= value's axis (ops/limits.py)

    # -- decorators used by the op modules --------------------------------
    def infer(self, fn):
        self.infer_fn = fn
        return fn

    def numpy(self, fn):
        self.numpy_fn = fn
        return fn

    def onnx(self, fn):
        self.onnx_fn = fn
        return fn

    def decompose(self, fn):
        self.decompose_fn = fn
        return fn

    def torch(self, fn):
        self.torch_fn = fn
        return fn

    def peers(self, fn):
        self.peers_fn = fn
        return fn

    def onnx_encoding(self, form: str):
        """Register the lowering of this op in the ONNX form ``form``: called
        as ``fn(e, node, input_names)`` like ``onnx``, it may raise
        ``NotApplicable(reason)`` (before emitting anything) instead."""
        def register(fn):
            if form in self.onnx_encodings:
                raise AssertionError(f"{self.name}: onnx form {form} declared twice")
            self.onnx_encodings[form] = fn
            return fn
        return register

    # -- checks -------------------------------------------------------------
    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].startswith("*")

    def num_outputs(self, attrs: Mapping[str, Any], num_inputs: int) -> int:
        return self.outputs(attrs, num_inputs) if callable(self.outputs) else self.outputs

    def check_arity(self, n: int) -> None:
        if self.variadic:
            least = len(self.inputs) - 1
            if n < least:
                raise ShapeError(f"{self.name} takes at least {least} inputs, got {n}")
        elif n != len(self.inputs):
            raise ShapeError(f"{self.name} takes {len(self.inputs)} inputs, got {n}")

    def result_types(self, types: Sequence, attrs: Mapping[str, Any]) -> tuple[dict, list]:
        """``(attrs, output types)`` of a node of this op on inputs of
        ``types``: attributes defaulted and checked, the inputs counted, the
        shape rule applied. What making, verifying and folding a node share."""
        attrs = self.normalize_attrs(attrs)
        self.check_arity(len(types))
        out = self.infer_fn(list(types), attrs)
        return attrs, [out] if isinstance(out, TensorType) else list(out)

    def normalize_attrs(self, attrs: Mapping[str, Any]) -> dict:
        """Defaults filled in, kinds checked; unknown names rejected."""
        out = {}
        for key in attrs:
            if key not in self.attrs:
                known = ", ".join(self.attrs) or "none"
                raise BlockcError(f"{self.name} has no attribute {key!r} (attributes: {known})")
        for key, (kind, default) in self.attrs.items():
            if key in attrs:
                out[key] = _coerce(self.name, key, kind, attrs[key])
            elif default is REQUIRED:
                raise BlockcError(f"{self.name} needs attribute {key!r}")
            elif default is not None:
                out[key] = default
        return out


def _coerce(op: str, key: str, kind: str, v):
    def bad() -> BlockcError:   # made only when raised: repr of a tensor attribute formats the whole array
        return BlockcError(f"{op}: attribute {key}={v!r} is not a {kind}")
    if kind == INT:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise bad()
        return int(v)
    if kind == FLOAT:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise bad()
        return float(v)
    if kind == STR:
        if not isinstance(v, str):
            raise bad()
        return v
    if kind == BOOL:
        if not isinstance(v, (bool, np.bool_)):
            raise bad()
        return bool(v)
    if kind == DIM:
        if isinstance(v, np.integer):
            v = int(v)
        if not is_dim(v):
            raise bad()
        return v
    if kind == DIMS:
        if not isinstance(v, (list, tuple)):
            raise bad()
        items = [int(x) if isinstance(x, np.integer) else x for x in v]
        if not all(is_dim(x) for x in items):
            raise bad()
        return tuple(items)
    if kind == TENSOR:
        if not isinstance(v, np.ndarray):
            raise bad()
        return v
    raise AssertionError(kind)


OPS: dict[str, OpDef] = {}


def define(name: str, inputs, *, outputs=1, attrs=None, doc: str = "", cuda: str | None = None,
           cuda_expr: str | Callable | None = None, flops: int | Callable = 1, fused: bool = False,
           colour: str | None = None, indexes: Callable | None = None, bounds: Callable | None = None,
           traffic: Callable | None = None, collective: bool = False, moves_data: bool = False) -> OpDef:
    """Declare an op; returns the ``OpDef`` whose decorators attach its rules."""
    if name in OPS:
        raise AssertionError(f"op {name} declared twice")
    if collective and "world" not in (attrs or {}):
        raise AssertionError(f"op {name}: a collective says the size of its group, in an attribute 'world'")
    if (cuda == "elementwise") != (cuda_expr is not None):
        raise AssertionError(f"op {name}: an elementwise CUDA op, and only one, gives its C expression")
    op = OpDef(name, tuple(inputs), outputs, dict(attrs or {}), doc, cuda=cuda, cuda_expr=cuda_expr,
               flops=flops, fused=fused, colour=colour, indexes=indexes, bounds=bounds, traffic=traffic,
               collective=collective, moves_data=moves_data)
    OPS[name] = op
    return op


def fused_ops() -> tuple[str, ...]:
    """The fused ops' names, in declaration order."""
    return tuple(name for name, op in OPS.items() if op.fused)


def collective_ops() -> tuple[str, ...]:
    """The collectives' names, in declaration order."""
    return tuple(name for name, op in OPS.items() if op.collective)


def get(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise BlockcError(f"unknown op {name!r}") from None


def attr_symbols(attrs: Mapping[str, Any]) -> set:
    """Symbols used by symbolic-dim attributes (e.g. ``slice end=seq``)."""
    out = set()
    for v in attrs.values():
        items = v if isinstance(v, tuple) else (v,)
        for x in items:
            if isinstance(x, Sym):
                out |= x.symbols
    return out
