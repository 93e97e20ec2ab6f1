"""An ONNX file as a blockc ``Model``: traced like any DSL model, so
weights, limits, passes, exports and ``compare`` see nothing new.

* ``inputs()``: the file's graph inputs; a ``dim_param`` keeps its name
  (made a valid symbol: ``batch``, ``sequence_length``; ``seq len`` becomes
  ``seq_len``), a dim with neither name nor size gets one.
* parameters: the file's float initializers, each a ``Parameter`` whose
  initialiser returns the stored array, so ``init_weights`` gives the
  file's weights and ``--weights`` replaces them. Scalars and integer
  initializers are constants (a softmax scale, a reshape's shape): folded
  at import, where the fusion patterns expect them.
* ``forward``: the nodes in dependency order, each replayed by its entry in
  ``rules.DOMAINS``; a call of one of the file's local functions is its body
  (``functions.py``).
* ``own_proto``: the file's own graph again (what ``blockc compare``'s ONNX
  Runtime peers run), with other weights where ``--weights`` gives them.
"""
from __future__ import annotations

import os
import re

from typing import Mapping

import numpy as np
import onnx

from ...errors import BlockcError, OnnxFileError, WeightsError
from ...ir.dims import Sym
from ...ir.dtypes import DType
from ..module import InputSpec, Model, Parameter, _param_tensor
from ..tensor import Tensor
from .cache_io import step_dims, summed_dim
from .convert import Rule, as_value, is_tensor, tensor
from .functions import DEFAULT_DOMAINS, GraphNode, inline_functions
from .rules import DOMAINS
from .safe_load import ExternalTensor, OnnxFile, element_type_name, label, node_label, read_onnx, tensor_array

_SYMBOL_CHARS = re.compile(r"[^A-Za-z0-9_]")


def symbol_name(text: str, taken: set[str]) -> str:
    """A valid, unused dimension name for ``text`` (a ``dim_param`` is a label)."""
    name = re.sub("_+", "_", _SYMBOL_CHARS.sub("_", text))[:40].strip("_") or "dim"
    if name[0].isdigit():
        name = "d" + name
    base, i = name, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


class OnnxModel(Model):
    """The model of an ONNX file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, dims: Mapping[str, object] | None = None):
        """``dims``: a dim_param of the file -> the dim it is (a size, or an
        expression of the file's other dim_params: ``cache_io.CacheIO.dims``);
        by default, a file that carries a cache takes it as a step's, ``total = past + seq``."""
        super().__init__()
        loaded = read_onnx(path)
        object.__setattr__(self, "file", loaded)
        object.__setattr__(self, "name", os.path.basename(os.fspath(path)))
        g = loaded.model.graph
        self.nodes = inline_functions(loaded)
        _refuse_branches(loaded, self.nodes)
        _refuse_unsupported(loaded, self.nodes)
        self._attr_arrays: dict[int, np.ndarray] = {}
        self.constants: dict[str, np.ndarray] = {}
        counts: dict[DType, int] = {}
        for name, value in loaded.initializers.items():
            dtype = _float_dtype(value)
            if dtype is None or value.size <= 1 or 0 in value.shape:
                self.constants[name] = loaded.array(name)
            else:   # external data is read when the weights are made: --weights and summary read none
                self._params[name] = Parameter(value.shape, init=lambda shape, rng, n=name: loaded.array(n),
                                               dtype=dtype)
                counts[dtype] = counts.get(dtype, 0) + value.size
        self.dtype = max(counts, key=counts.get) if counts else DType.float32
        self.uses = {x for n in self.nodes for x in n.input} | {o.name for o in g.output}
        dims = step_dims(path, g) if dims is None else dims
        self._specs = _input_specs(loaded, self.nodes, dict(dims))

    def inputs(self) -> list[InputSpec]:
        return list(self._specs)

    def used(self, name: str) -> bool:
        return name in self.uses

    def lookup_tables(self) -> set[str]:
        """The parameters whose rows the graph selects -- the table of a
        ``Gather`` along axis 0 (token, segment and Hugging Face's position
        embeddings) or of a ``Slice`` along axis 0 alone (blockc's own learned
        positions): what a module tree would call embeddings."""
        tables = set()
        for node in self.nodes:
            if not node.input or node.input[0] not in self._params:
                continue
            if node.op_type == "Gather":
                axis = node.attrs["axis"].i if "axis" in node.attrs else 0
                if axis in (0, -len(self._params[node.input[0]].shape)):
                    tables.add(node.input[0])
            elif node.op_type == "Slice" and len(node.input) > 3 and node.input[3] in self.constants:
                if np.asarray(self.constants[node.input[3]]).reshape(-1).tolist() == [0]:
                    tables.add(node.input[0])
        return tables

    def attr_tensor(self, node: GraphNode, name: str):
        a = node.attrs.get(name)
        if a is None or a.type != a.TENSOR:
            return None
        if id(a) not in self._attr_arrays:   # once: a function's constant is one attribute for all its calls
            where = f"node {label(node.name or node.op_type)}, attribute {name}"
            folder = os.path.dirname(os.path.abspath(self.file.path))
            self._attr_arrays[id(a)] = tensor_array(self.file, a.t, folder, where)
        return self._attr_arrays[id(a)]

    def own_proto(self, weights: Mapping[str, np.ndarray] | None = None) -> tuple[onnx.ModelProto, int]:
        """The file's own model, self-contained, and how many initializers
        were replaced: each parameter in ``weights`` whose values differ
        from the file's is written in place of its initializer (parameters
        are the file's float initializers, so any checked weights fit), and
        initializers kept as external data are read in from the arrays
        ``safe_load`` checked, so that no runtime follows their locations."""
        model = onnx.ModelProto()
        model.CopyFrom(self.file.model)   # external initializers are references here, not their bytes
        replaced = 0
        for t in model.graph.initializer:
            stored = self.file.initializers[t.name]
            value = stored
            if weights is not None and t.name in self._params and t.name in weights:
                value = np.asarray(weights[t.name])
                if value.shape != stored.shape or value.dtype != stored.dtype:
                    raise WeightsError(f"{self.file.path}: weight {label(t.name)} is {value.dtype}{list(value.shape)}, "
                                       f"its initializer {stored.dtype}{list(stored.shape)}: it cannot replace it")
                if isinstance(stored, ExternalTensor) and stored.missing is None:
                    stored = stored.read()
                if isinstance(stored, np.ndarray) and np.array_equal(value, stored):
                    value = stored
                else:
                    replaced += 1
            elif isinstance(stored, ExternalTensor):
                value = stored = stored.read()
            if value is not stored or t.data_location == onnx.TensorProto.EXTERNAL:
                t.CopyFrom(onnx.numpy_helper.from_array(value, t.name))
        return model, replaced

    def forward(self, *inputs: Tensor):
        values: dict[str, object] = dict(self.constants)
        values.update({s.name: t for s, t in zip(self._specs, inputs)})
        for name, p in self._params.items():
            values[name] = _param_tensor(p)   # not getattr: a weight may be named 'forward'
        for node in self.nodes:
            ins = [values[x] if x else None for x in node.input]
            try:
                outs = rule_for(node).fn(node, ins, self)
            except OnnxFileError:
                raise
            except BlockcError as e:   # Unsupported, a ShapeError of a folded op, a ModelError of a traced one
                raise OnnxFileError(f"{self.file.path}: node {node_label(node)} ({node.op_type}): {e}") from None
            except (TypeError, ValueError, IndexError, KeyError) as e:  # a node whose operands do not fit it
                raise OnnxFileError(f"{self.file.path}: node {node_label(node)} "
                                    f"({node.op_type}) cannot be imported: {type(e).__name__}: {e}") from None
            unmade = [name for name in node.output[len(outs):] if name and self.used(name)]
            if unmade:   # an optional output the rule does not compute, which the graph reads
                raise OnnxFileError(f"{self.file.path}: node {node_label(node)} ({node.op_type}): "
                                    f"its output {label(unmade[0])} is not supported by blockc's ONNX import")
            for name, v in zip(node.output, outs):
                if name:
                    values[name] = as_value(v)
        out = {}
        for o in self.file.model.graph.output:
            v = values[o.name]
            out[o.name] = v if is_tensor(v) else tensor(v)
        return out


def _float_dtype(value: np.ndarray) -> DType | None:
    try:
        dtype = DType.from_numpy(value.dtype)
    except KeyError:
        return None
    return dtype if dtype.is_float else None


def rule_for(n: GraphNode) -> Rule | None:
    """The rule importing node ``n`` at the opset its domain is read at; None where there is none."""
    rule = DOMAINS.get(n.domain, {}).get(n.op_type)
    version = n.opset if n.domain in DEFAULT_DOMAINS else n.opsets.get(n.domain, 1)
    return rule if rule is not None and rule.since <= version <= rule.until else None


def missing_operators(nodes: list[GraphNode]) -> list[str]:
    """Every operator among ``nodes`` that the importer lacks at the opsets
    each is read at, as ``domain::Op (opset N)``, sorted. A call of a
    function the file does not define is one of them."""
    missing = set()
    for n in nodes:
        if rule_for(n) is None:
            domain = n.domain or "ai.onnx"
            missing.add(f"{label(domain)[1:-1]}::{label(n.op_type)[1:-1]} (opset {n.opsets.get(n.domain, '?')})")
    return sorted(missing)


def _refuse_branches(loaded: OnnxFile, nodes: list[GraphNode]) -> None:
    """An ``If`` chooses its subgraph when it runs, and a blockc graph is one
    graph: refused by name, with the files to import instead, before the
    list of missing operators (Optimum's merged decoder is the one users meet)."""
    for n in nodes:
        if n.op_type == "If" and n.domain in DEFAULT_DOMAINS:
            cond = label(n.input[0]) if n.input else "its condition"
            raise OnnxFileError(
                f"{loaded.path}: node {node_label(n)} (If): chooses between two subgraphs by {cond} when it runs, "
                f"which blockc's ONNX import cannot (it traces one graph). Optimum's merged decoder "
                f"(decoder_model_merged.onnx) branches so on use_cache_branch: import its decoder_model.onnx and "
                f"decoder_with_past_model.onnx apart (python -m optimum.exporters.onnx --no-post-process writes them)")


def _refuse_unsupported(loaded: OnnxFile, nodes: list[GraphNode]) -> None:
    """One error listing every operator the importer lacks, with its domain and opset."""
    missing = missing_operators(nodes)
    if missing:
        raise OnnxFileError(f"{loaded.path}: {len(missing)} operator type{'s' if len(missing) > 1 else ''} "
                            f"not supported by blockc's ONNX import: {', '.join(missing)}")


def _input_specs(loaded: OnnxFile, nodes: list[GraphNode], dims: dict) -> list[InputSpec]:
    """Each graph input as blockc feeds it: its dtype, its shape and the kind
    of values a check samples for it. A dim_param that ``dims`` gives is that
    dim; one that names a sum of the others (``cache_io.summed_dim``) is their
    sum; both are written in the symbols the plain names get."""
    g = loaded.model.graph
    names = [d.dim_param for v in g.input if v.name not in loaded.initializers
             for d in v.type.tensor_type.shape.dim if d.dim_param]
    dims, symbols = _named_dims(names, dims)
    rows = _id_tables(loaded, nodes)
    counted = _counted_masks(nodes)
    specs = []
    for v in g.input:
        if v.name in loaded.initializers:
            continue   # an initializer listed as an input (IR version < 4): a weight, not a feed
        t = v.type.tensor_type
        if not v.type.HasField("tensor_type") or not t.HasField("shape"):
            raise OnnxFileError(f"{loaded.path}: input {label(v.name)} has no tensor type with a shape")
        try:
            dtype = DType.from_onnx(t.elem_type)
        except KeyError:
            raise OnnxFileError(f"{loaded.path}: input {label(v.name)} has element type "
                                f"{element_type_name(t.elem_type)}, "
                                f"which blockc does not support") from None
        shape = tuple(_input_shape(v, dims, symbols))
        specs.append(InputSpec(v.name, dtype, shape, **_input_kind(v.name, dtype, counted, rows)))
    return specs


def _named_dims(names: list[str], dims: dict) -> tuple[dict, dict[str, str]]:
    """The dim of each dim_param in ``names`` that is not a plain symbol (one
    ``dims`` gives, one that names a sum of the others), and a symbol for each
    plain one: the former written in the latter."""
    sums = {key: parts for key in names if (parts := summed_dim(key, set(names))) is not None}
    symbols = _symbols(names, {**sums, **dims})
    out = {key: _in_symbols(d, symbols) for key, d in dims.items()}
    for key, parts in sums.items():
        if key not in out:
            terms = [out[p] if p in out else Sym.var(symbols[p]) for p in parts]
            out[key] = sum(terms[1:], terms[0])
    return out, symbols


def _symbols(names: list[str], dims: dict) -> dict[str, str]:
    """A valid, distinct symbol for each dim_param that ``dims`` does not give, in the file's order."""
    taken: set[str] = set()
    symbols: dict[str, str] = {}
    for key in names:
        if key not in symbols and key not in dims:
            symbols[key] = symbol_name(key, taken)
    return symbols


def _in_symbols(d, symbols: dict[str, str]):
    """``d``, a dim in the file's dim_params, in their symbols (``seq len`` is ``seq_len``)."""
    if not isinstance(d, Sym):
        return d
    out = 0
    for mono, coeff in d.terms.items():
        term = coeff
        for name in mono:
            term = Sym.var(symbols.get(name, name)) * term
        out = term + out
    return out


def _input_shape(v, dims: dict, symbols: dict[str, str]) -> list:
    """``v``'s dims: sizes, the dims ``dims`` gives, symbols; a dim with neither name nor size is named for it."""
    shape = []
    for i, d in enumerate(v.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
            continue
        key = d.dim_param if d.HasField("dim_param") and d.dim_param else f"{v.name}_dim{i}"
        if key in dims:
            shape.append(dims[key])
            continue
        if key not in symbols:
            symbols[key] = symbol_name(key, set(symbols.values()))
        shape.append(Sym.var(symbols[key]))
    return shape


def _input_kind(name: str, dtype: DType, counted: set[str], rows: dict[str, int]) -> dict:
    """What a check samples for the input ``name`` (``InputSpec``'s kind and high)."""
    name_l = name.lower()
    if name in counted:
        return {"kind": "ones"}
    if dtype == DType.bool or (not dtype.is_float and "mask" in name_l):
        return {"kind": "mask"}
    if not dtype.is_float and "position" in name_l and name not in rows:
        # positions computed with (Hugging Face's position_ids feeding rotary angles), not
        # looked up in a table: sampled as 0..seq-1, as a prompt's are
        return {"kind": "positions"}
    if not dtype.is_float:
        return {"kind": "ids", "high": rows.get(name, 1)}
    return {}


def _counted_masks(nodes: list[GraphNode]) -> set[str]:
    """The names a GroupQueryAttention's ``seqlens_k`` is computed from (ONNX
    Runtime GenAI's ``ReduceSum(attention_mask) - 1``): the graph inputs among
    them are masks of 1s (``contrib._mask_keys_last``)."""
    made = {o: n for n in nodes for o in n.output}
    todo = [n.input[5] for n in nodes if n.op_type == "GroupQueryAttention" and len(n.input) > 5]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name and name not in seen:
            seen.add(name)
            todo += made[name].input if name in made else []
    return seen


# Ops an index passes through unchanged on its way to a Gather (an exporter
# reshapes or casts the ids before looking them up).
_PASS_THROUGH = ("Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity", "Flatten")


def _id_tables(loaded: OnnxFile, nodes: list[GraphNode]) -> dict[str, int]:
    """For each graph input used as the indices of a Gather from a weight
    table: the table's rows (what sampled ids may be)."""
    source = {}
    for n in nodes:
        if n.op_type in _PASS_THROUGH and n.input:
            for o in n.output:
                source[o] = source.get(n.input[0], n.input[0])
    rows: dict[str, int] = {}
    for n in nodes:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[0] in loaded.initializers:
            table = loaded.initializers[n.input[0]]
            origin = source.get(n.input[1], n.input[1])
            if table.ndim >= 1:
                rows[origin] = min(rows.get(origin, table.shape[0]), table.shape[0])
    return rows


def load_onnx(path: str | os.PathLike):
    """``(graph, weights)``: the ONNX file at ``path`` imported as a traced,
    verified blockc graph, and its initializers by parameter name."""
    from ..module import check_weights_fit, init_weights, trace
    from ..weights import materialize
    model = OnnxModel(path)
    check_weights_fit(model)   # before any external data is read
    return trace(model), materialize(init_weights(model))
