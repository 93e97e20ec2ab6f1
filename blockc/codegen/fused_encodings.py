"""How the exporter writes the fused ops: their ONNX encodings, and the choice.

(An *encoding* is how one fused op is written in ONNX; a *graph form*,
``passes/forms.py``, is which ops a whole graph holds: standard, decomposed
or fused.) ``export_onnx(..., fused_as=ENCODING)`` writes every fused node
(``fused_ops()``) in one of these encodings:

* ``function`` -- an ONNX local function per op kind and attribute set
  (domain ``blockc.fused``, e.g. ``AddLayerNorm_with_sum``), whose body is
  the op's ``decompose`` rule lowered with the ordinary per-op lowerings:
  portable to any ONNX runtime (a node whose attributes hold a symbol of the
  graph, as ``cache_attention``'s start does, has the same ops written
  inline: a function's attributes are constants);
* ``contrib``  -- ONNX Runtime's ``com.microsoft`` op where one exists
  (SkipLayerNormalization, SkipSimplifiedLayerNormalization, an
  activation's own (``Activation.contrib``: BiasGelu, FastGelu),
  MultiHeadAttention, GroupQueryAttention, RotaryEmbedding);
* ``onnx23``   -- opset-23 ``Attention``, ``RMSNormalization`` and
  ``RotaryEmbedding`` where they fit;
* ``auto``     -- per execution provider and fused-op kind, the encoding measured
  fastest: ``fused_encodings_table.json`` beside this file, which
  ``bench/fused_encodings.py`` regenerates; where that one declines a node,
  the next fastest of those measured faster than ``function`` (the entry's
  ``then``). A provider not in the table gets ``function``.

A runtime-op encoding may decline a node it cannot express exactly (a
lowering registered with ``OpDef.onnx_encoding`` raises ``NotApplicable``,
see ``blockc/ops/fused_onnx.py``); that node is then written as a function
(or, under ``auto``, in the entry's next form).
Every node's encoding and the reason for it are recorded as a decision (its
keys keep the name ``form``: they are part of the fusion report's schema)::

    {"nodes": ["%12", "%13"], "node": 4, "op": "add_layernorm", "kind": "add_layernorm",
     "requested": "contrib", "form": "contrib", "reason": "requested"}

(``nodes``: the original nodes the fused op stands for, as in the fusion
report's sites, so ``build_report(onnx_encodings=decisions)`` can show them.)

This module holds what is generic over ops; the per-op runtime lowerings are
declared on the ops, so adding a fused op touches ``blockc/ops`` only.
"""
from __future__ import annotations

import functools
import json
import os

import onnx
from onnx import helper

from ..errors import BlockcError, ShapeError
from ..ir.builder import Builder
from ..ir.dims import Sym, substitute
from ..ir.graph import Graph, Node
from ..ir.printer import format_attrs
from ..ir.types import TensorType
from ..ops import registry
from ..ops.registry import NotApplicable, fused_ops
from .onnx_emitter import FunctionEmitter, OnnxEmitter, lower_composites, lower_nodes, name_outputs

ENCODINGS = ("function", "contrib", "onnx23", "auto")
PROVIDERS = ("cpu", "cuda")
FUNCTION_DOMAIN = "blockc.fused"
ENCODING_MIN_OPSET = {"onnx23": 23}
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_encodings_table.json")

# Table entries are per op, and per variant where the runtime ops differ:
# matmul_bias_act's by activation (its contrib op, or none: ops/activations.py);
# grouped attention (rank 5, ops.fused.group_heads) apart from attention, as
# GroupQueryAttention and Attention with fewer K/V heads, whose cost is their own.
_TABLE_VARIANT = {"matmul_bias_act": lambda node: node.attrs["activation"],
                  "attention": lambda node: "grouped" if node.inputs[0].type.rank == 5 else None}

# Function names; other ops get their name in CamelCase.
_FUNCTION_NAMES = {"masked_softmax": "MaskedSoftmax", "attention": "Attention", "add_layernorm": "AddLayerNorm",
                   "add_rmsnorm": "AddRMSNorm", "matmul_bias_act": "MatMulBiasAct"}


# ---- the measured table ---------------------------------------------------------
def table_key(node: Node) -> str:
    """The table's name for ``node``'s kind: ``add_layernorm``, ``matmul_bias_act/gelu``, ``attention/grouped``."""
    variant = _TABLE_VARIANT[node.op](node) if node.op in _TABLE_VARIANT else None
    return f"{node.op}/{variant}" if variant else node.op


@functools.lru_cache(maxsize=4)
def load_table(path: str = TABLE_PATH) -> dict:
    """The measured table (``{}`` when there is none)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise BlockcError(f"cannot read the fused-op encodings table {path}: {err}") from err


def auto_encodings(table: dict, provider: str, node: Node) -> tuple[list[str], str]:
    """The forms ``auto`` tries for ``node`` on ``provider``, in order (the
    function form after them), and why."""
    measured = table.get("providers", {}).get(provider)
    if not measured:
        return ["function"], (f"auto: {provider} was not measured (bench/fused_encodings.py); "
                              "the portable function form")
    entry = measured["kinds"].get(table_key(node)) or measured["kinds"].get(node.op)
    if not entry:
        return ["function"], f"auto: {table_key(node)} was not measured on {provider}; the portable function form"
    # An entry measured on its own (bench/fused_encodings.py --kinds) names its own machine.
    machine, version = (entry.get(k, measured[k]) for k in ("machine", "onnxruntime"))
    return [entry["form"], *entry.get("then", [])], (f"auto: {entry['form']} for {table_key(node)} on {provider} "
                                                     f"({machine}, onnxruntime {version}): {entry['why']}")


def pick_opset(graph: Graph, fused_as: str, provider: str, default: int, table: dict | None = None) -> int:
    """The opset a form needs: 23 for ``onnx23`` and for an ``auto`` that may
    pick it for some node of ``graph``; else ``default``."""
    if fused_as == "auto":
        table = load_table() if table is None else table
        forms = {f for n in graph.nodes if n.op in fused_ops() for f in auto_encodings(table, provider, n)[0]}
    else:
        forms = {fused_as}
    return max([default] + [ENCODING_MIN_OPSET.get(f, 0) for f in forms])


def check_encoding(fused_as: str, provider: str, opset: int | None) -> None:
    """A clear error for an unknown form or provider, or an opset (None:
    to be picked) too old for the form."""
    if fused_as not in ENCODINGS:
        raise BlockcError(f"unknown fused-op encoding {fused_as!r}; encodings: {', '.join(ENCODINGS)}")
    if provider not in PROVIDERS:
        raise BlockcError(f"unknown execution provider {provider!r} for the fused-op encodings; use "
                          f"{' or '.join(PROVIDERS)}")
    need = ENCODING_MIN_OPSET.get(fused_as, 0)
    if opset is not None and opset < need:
        raise BlockcError(f"fused ops as {fused_as} need opset {need} or later (Attention and RMSNormalization "
                          f"arrived in opset 23); got opset {opset}: drop the opset to pick it automatically")


# ---- lowering fused nodes ------------------------------------------------------------
class FusedLowering:
    """Lowers the fused nodes of one export in the form ``fused_as`` asks for,
    falling back to functions; ``decisions`` records what each node became."""

    def __init__(self, fused_as: str, provider: str, opset: int, table: dict | None = None):
        self.fused_as, self.provider = fused_as, provider
        self.table = load_table() if table is None and fused_as == "auto" else (table or {})
        self.functions = FunctionLibrary(opset)
        self.decisions: list[dict] = []

    def __call__(self, e: OnnxEmitter, node: Node, ins: list[str], index: int) -> list[str]:
        if node.op not in fused_ops():
            raise BlockcError(f"ONNX export: op {node.op} (node {index}) has no ONNX lowering")
        if self.fused_as == "auto":
            candidates, reason = auto_encodings(self.table, self.provider, node)
        else:
            candidates, reason = [self.fused_as], "requested"
        requested, form, outs, declined = candidates[0], "function", None, []
        for candidate in candidates:
            if candidate == "function":
                break
            lower = registry.get(node.op).onnx_encodings.get(candidate)
            emitted = (len(e.nodes), len(e.initializers))
            try:
                if lower is None:
                    raise NotApplicable(f"{node.op} has no {candidate} lowering")
                outs, form = lower(e, node, ins), candidate
                break
            except NotApplicable as why:
                if (len(e.nodes), len(e.initializers)) != emitted:
                    raise AssertionError(f"the {candidate} lowering of {node.op} emitted nodes, then declined")
                declined.append(f"{candidate} declined: {why}")
        if declined:
            written = "a function" if form == "function" else f"{form}, measured next fastest"
            reason = f"{'; '.join(declined)}; written as {written}"
            if self.fused_as == "auto":
                reason = f"{reason} (auto picked {requested} for {table_key(node)} on {self.provider})"
        if outs is None and registry.attr_symbols(node.attrs):
            # A function's attributes are constants: one that holds a symbol of the graph (cache_attention's
            # start=past) is written as its decomposition in place, the same ops a function would hold.
            outs = _inline(e, node, ins)
            reason = f"{reason}; inline, not a function: its attributes hold symbols"
        elif outs is None:
            try:
                outs = self.functions.call(e, node, ins)
            except ShapeError as why:
                # The body keeps the node's dims (renamed): it types wherever the op's decomposition is right.
                raise ShapeError(f"ONNX export: the decomposition of {node.op} (node {index}) does not type "
                                 f"as a function body: {why}") from why
        self.decisions.append({"nodes": list(node.origin), "node": index, "op": node.op, "kind": table_key(node),
                               "requested": requested, "form": form, "reason": reason})
        return outs


class FunctionLibrary:
    """One ONNX function per fused-op kind, attribute set and input type
    pattern, made on first use; ``protos`` go into ``ModelProto.functions``."""

    def __init__(self, opset: int):
        self.opset = opset
        self.protos: list[onnx.FunctionProto] = []
        self._by_key: dict[tuple, str] = {}   # (op, attrs, input types) -> function name
        self._by_body: dict[tuple, str] = {}  # (op, attrs, body nodes) -> function name
        self._names: set[str] = set()

    def call(self, e: OnnxEmitter, node: Node, ins: list[str]) -> list[str]:
        """A call of ``node``'s function, emitted into ``e``; its output names."""
        types = _plain_types(node)
        attrs = tuple((k, repr(v)) for k, v in sorted(node.attrs.items()))
        key = (node.op, attrs, tuple(map(str, types)))
        if key not in self._by_key:
            proto = self._build(node, types)
            # Input types that give the same body share one function.
            body = (node.op, attrs, tuple(n.SerializeToString(deterministic=True) for n in proto.node))
            if body not in self._by_body:
                proto.name = self._name(node)
                self.protos.append(proto)
                self._by_body[body] = proto.name
            self._by_key[key] = self._by_body[body]
        n = len(node.outputs)
        outs = e.emit(self._by_key[key], ins, n=n, domain=FUNCTION_DOMAIN)
        return [outs] if n == 1 else outs

    def _name(self, node: Node) -> str:
        """``AddLayerNorm_with_sum``: the op, then its mode attributes (true
        flags, string values other than none); numbers go in the doc string.
        A second attribute set of the same name gets ``_2``."""
        base = _FUNCTION_NAMES.get(node.op) or "".join(p.title() for p in node.op.split("_"))
        parts = [base]
        for k, v in node.attrs.items():
            if v is True:
                parts.append(k)
            elif isinstance(v, str) and v != "none":
                parts.append(v)
        name, n = "_".join(parts), 1
        while name in self._names:
            n += 1
            name = f"{'_'.join(parts)}_{n}"
        self._names.add(name)
        return name

    def _build(self, node: Node, types: list[TensorType]) -> onnx.FunctionProto:
        """The function (not yet named) whose body is ``node``'s
        decomposition, over inputs of ``types`` (``_plain_types``: the
        node's dims, symbols renamed); every dim the body needs is read off
        the function's own inputs."""
        opdef = registry.get(node.op)
        inputs = _formal_inputs(opdef, len(node.inputs))
        outputs = ["Y"] if len(node.outputs) == 1 else [f"Y{i}" for i in range(len(node.outputs))]
        body = Graph(node.op)
        values = [body.add_input(n, t) for n, t in zip(inputs, types)]
        results = opdef.decompose_fn(Builder(body), node, values)
        body.set_outputs(list(zip(outputs, results)))
        body = lower_composites(body)
        e = FunctionEmitter(body, self.opset, inputs + outputs)
        names = {id(v): v.name for v in body.inputs}
        lower_nodes(e, body, names)
        nodes = name_outputs(e, [(out, names[id(v)]) for out, v in body.outputs])
        doc = f"blockc {node.op} {format_attrs(node.attrs)}: its decomposition ({opdef.doc})"
        return helper.make_function(
            FUNCTION_DOMAIN, node.op, inputs, outputs, nodes,
            opset_imports=[helper.make_opsetid("", self.opset)]
            + [helper.make_opsetid(d, v) for d, v in sorted(e.domains.items())],
            doc_string=doc)


def _inline(e: OnnxEmitter, node: Node, ins: list[str]) -> list[str]:
    """``node``'s decomposition, lowered straight into ``e``: its dims read
    from the graph's inputs, as any other node's are."""
    opdef = registry.get(node.op)
    body = Graph(node.op)
    values = [body.add_input(f"x{i}", v.type) for i, v in enumerate(node.inputs)]
    body.set_outputs([(f"y{i}", r) for i, r in enumerate(opdef.decompose_fn(Builder(body), node, values))])
    body = lower_composites(body)
    names = {id(v): name for v, name in zip(body.inputs, ins)}
    lower_nodes(e, body, names)
    return [names[id(v)] for _, v in body.outputs]


def _plain_types(node: Node) -> list[TensorType]:
    """The input types of ``node`` with each symbol renamed ``d0``, ``d1``,
    ... in order of first use, and expressions of them kept: ``past+seq`` is
    ``d2+d1`` when past is d2 and seq d1, so that the body's shapes agree
    where the graph's do (a concat of past and new keys is as long as the
    mask), and one function serves graphs that name their dims apart."""
    if registry.attr_symbols(node.attrs):
        raise BlockcError(f"ONNX export: {node.op} has symbolic attributes; it cannot become a function")
    plain: dict[str, Sym] = {}
    for v in node.inputs:
        for d in v.shape:
            for s in sorted(d.symbols) if isinstance(d, Sym) else ():
                plain.setdefault(s, Sym.var(f"d{len(plain)}"))
    return [TensorType(v.dtype, tuple(substitute(d, plain) for d in v.shape)) for v in node.inputs]


def _formal_inputs(opdef, n: int) -> list[str]:
    fixed = [x for x in opdef.inputs if not x.startswith("*")]
    if n == len(fixed):
        return fixed
    rest = opdef.inputs[-1].lstrip("*")
    extra = n - len(fixed)
    return fixed + ([rest] if extra == 1 else [f"{rest}{i}" for i in range(extra)])
