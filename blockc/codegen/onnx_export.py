"""Export a blockc graph and its weights as a standard ONNX model.

Each node lowers through its op's ``onnx_fn`` (declared in ``blockc/ops``)
into an ``OnnxEmitter``. The fused ops are written in the form ``fused_as``
asks for (ONNX functions, ONNX Runtime contrib ops, opset-23 ops, or the
measured fastest: see ``fused_encodings``); other ops without a lowering are
first rewritten with their ``decompose`` rule (``rmsnorm``: ONNX's
RMSNormalization only arrived in opset 23, and the registry has no lowering
to it yet). Graph inputs and outputs keep their names, with symbolic dims
written as ``dim_param`` (``past+seq``); parameters become initializers named
by their labels. The result passes ``onnx.checker.check_model(full_check=True)``.

With ``weights=None`` the export is weightless: each parameter's initializer
declares where its bytes will be in a weights file (ONNX external data, laid
out by ``onnx_weights_file``) and holds none, so any model, GPT-3 included,
exports without its weights in memory; ``save_onnx_weights`` fills the file
in later.
"""
from __future__ import annotations

import os
from typing import Iterator, Mapping, NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import BlockcError, WeightsError
from ..files import output_target, replace_together
from ..frontends.weights import contiguous
from ..ir.graph import Graph
from ..ir.types import TensorType
from ..ops.registry import fused_ops
from ..passes.read_whole_tables import read_whole_tables
from ..progress import CHECKING_ONNX, WRITING_WEIGHTS, Progress, ticker
from .fused_encodings import FusedLowering, check_encoding, pick_opset
from .onnx_emitter import OnnxEmitter, lower_composites, lower_nodes, name_outputs
from .onnx_weights_file import check_location, external_initializers, plan_layout, write_slots

# Opset -> IR version written into the model. onnx 1.23 stamps IR 14 on every
# model it makes, but onnxruntime 1.31 refuses anything above IR 13, and a
# reader rejects a newer IR even when the model uses nothing from it. So each
# opset is paired with the IR version of the onnx release that introduced it
# (onnx.helper.VERSION_TABLE: 1.16 -> opset 21 / IR 10, 1.18 -> opset 23 /
# IR 11, 1.19 -> opset 24 / IR 12), all loadable by onnxruntime 1.31. Opsets
# below 21 are left out: the lowerings use Gelu (opset 20) and ReduceMean with
# axes as an input (opset 18).
OPSET_IR_VERSION = {21: 10, 22: 10, 23: 11, 24: 12}
DEFAULT_OPSET = 21

# Weights above this many bytes are saved as external data. Protobuf cannot
# serialize a message past 2 GiB; the margin leaves room for the graph itself.
EXTERNAL_DATA_THRESHOLD = 2_000_000_000


class OnnxExport(NamedTuple):
    """An ONNX export and what it decided: one dict per fused node, with its
    original nodes, op, requested and chosen form, and why."""

    model: onnx.ModelProto
    decisions: list[dict]


def export_onnx(graph: Graph, weights: Mapping[str, np.ndarray] | None, **kw) -> onnx.ModelProto:
    """``graph`` with ``weights`` as an ONNX ``ModelProto``, checked: the
    model of ``export_onnx_decided`` (``kw`` goes to it), for the callers
    that want only the model."""
    return export_onnx_decided(graph, weights, **kw).model


def export_onnx_decided(graph: Graph, weights: Mapping[str, np.ndarray] | None, *, fused_as: str = "auto",
                        provider: str = "cpu", opset: int | None = None, external_data: bool | None = None,
                        external_threshold: int = EXTERNAL_DATA_THRESHOLD,
                        data_location: str | None = None, progress: Progress | None = None) -> OnnxExport:
    """``graph`` with ``weights`` as an ONNX ``ModelProto``, checked, and the
    form each fused node was written in (``OnnxExport``).

    ``weights`` maps every parameter name to an array of exactly the
    parameter's shape and dtype; it may compute values lazily, each is read
    once. ``fused_as`` is the form of the fused ops: ``function``,
    ``contrib``, ``onnx23`` or ``auto`` (the fastest measured on
    ``provider``, ``cpu`` or ``cuda``); see ``blockc.codegen.fused_encodings``.
    ``opset`` None picks the lowest the form needs (21, or 23 for
    ``onnx23``). ``external_data`` says whether the weights will be stored outside the
    protobuf (None: when they total more than ``external_threshold`` bytes);
    the returned model always holds its weights in memory, but a model too big
    for one protobuf is checked without them, and ``external_data=False`` on
    such a model is an error. ``save_onnx`` writes a model to disk.

    ``weights=None`` exports without weights. Every parameter still becomes
    an initializer -- its name, dtype and dims -- marked as ONNX external
    data (``location`` = ``data_location``, ``offset``, ``length``) in a
    weights file laid out by ``onnx_weights_file.plan_layout``: parameter
    order, big tensors aligned for memory mapping. ``data_location`` is that
    file's name relative to the model file (None: ``<graph name>.onnx.data``;
    ``save_onnx`` uses ``<model file>.data``). Declaring the weights as
    external data, rather than dropping them or turning them into graph
    inputs, is what keeps this a normal ONNX model: its initializers, types
    and signature are those of the full export, tools that read it without
    its data (``onnx.load(load_external_data=False)``, viewers) see the
    parameters, and once the file exists (``save_onnx_weights``, or any
    writer that follows the declared offsets) ONNX Runtime loads it as it
    is. Without the file the model is checked by ``check_model(weightless=
    True)``, which is everything but the bytes.

    ``progress`` (``blockc.progress``) hears of the nodes lowered, the check,
    and each weight added. Nothing is printed.
    """
    if weights is None and external_data is False:
        raise BlockcError("ONNX export: a weightless export declares its weights as external data; "
                          "external_data=False contradicts it")
    if weights is None:
        data_location = data_location if data_location is not None else f"{graph.name}.onnx.data"
        check_location(data_location)
    if opset is not None and opset not in OPSET_IR_VERSION:
        raise BlockcError(f"ONNX export: opset {opset} is not supported "
                          f"(supported: {', '.join(map(str, OPSET_IR_VERSION))})")
    check_encoding(fused_as, provider, opset)
    _check_names(graph)
    graph = lower_composites(graph, keep=fused_ops())
    graph = read_whole_tables(graph).graph   # ONNX Runtime's Slice copies: ids read the whole table
    if opset is None:
        opset = pick_opset(graph, fused_as, provider, DEFAULT_OPSET)

    reserved = [v.name for v in graph.inputs] + list(graph.params) + [name for name, _ in graph.outputs]
    e = OnnxEmitter(graph, opset, reserved)
    fused = FusedLowering(fused_as, provider, opset)
    names: dict[int, str] = {id(v): v.name for v in graph.inputs}
    names.update({id(v): name for name, v in graph.params.items()})
    lower_nodes(e, graph, names, fused, progress=progress)

    nodes = name_outputs(e, [(name, names[id(v)]) for name, v in graph.outputs])
    model = helper.make_model(
        helper.make_graph(nodes, graph.name,
                          [_value_info(v.name, v.type) for v in graph.inputs],
                          [_value_info(name, v.type) for name, v in graph.outputs]),
        opset_imports=[helper.make_opsetid("", opset)]
        + [helper.make_opsetid(d, version) for d, version in sorted(e.domains.items())],
        functions=fused.functions.protos,
        producer_name="blockc")
    model.ir_version = OPSET_IR_VERSION[opset]
    if weights is None:
        model.graph.initializer.extend(external_initializers(plan_layout(graph), data_location))
        model.graph.initializer.extend(e.initializers)
        weightless = True
    else:
        _add_weights(model.graph, graph, weights, progress)
        model.graph.initializer.extend(e.initializers)
        size = initializer_bytes(model)
        weightless = size > external_threshold
        if weightless and external_data is False:
            raise BlockcError(f"ONNX export: the weights take {size / 2**30:.2f} GiB, more than "
                              "one protobuf holds; export with external_data=True (or None)")
    checked = ticker(progress, CHECKING_ONNX, 1)
    check_model(model, weightless=weightless)
    checked(1)
    return OnnxExport(model, fused.decisions)


def save_onnx(graph: Graph, weights: Mapping[str, np.ndarray] | None, path: str | os.PathLike,
              **kw) -> list[dict]:
    """Export and write to ``path`` atomically; returns what the export
    decided for each fused node (``OnnxExport``).

    Weights go to ``<name>.onnx.data`` next to the model when
    ``external_data`` is True, or when it is None and they total more than
    ``external_threshold`` bytes; they are then written straight into the
    layout a weightless export declares (``onnx_weights_file``), one at a
    time, so a tensor of any size works. The files are written under
    temporary names in the destination folder and renamed into place together
    (``files.replace_together``), replacing a previous export's: on any error
    nothing at the destination changes. ``kw`` goes to ``export_onnx_decided``
    (``fused_as``, ``provider``, ``opset``, ``external_data``,
    ``external_threshold``, ``progress``). ``progress`` (``blockc.progress``)
    hears of each stage of the export and of each weight written.

    ``weights=None`` writes only the model, its parameters declared in
    ``<name>.onnx.data`` (see ``export_onnx``), which is not written: fill it
    in with ``onnx_weights_file.save_onnx_weights(path, weights)``. A file of
    that name left by an earlier export is removed, never paired with the new
    model (its layout is another model's); so is one beside a model whose
    weights are stored inside it.
    """
    return _write_onnx(graph, weights, path, **kw)


def _write_onnx(graph: Graph, weights: Mapping[str, np.ndarray] | None, path: str | os.PathLike, *,
                external_data: bool | None = None, external_threshold: int = EXTERNAL_DATA_THRESHOLD,
                progress: Progress | None = None, **kw) -> list[dict]:
    """``save_onnx``'s work."""
    path = output_target(path)   # a symlink's target, whose folder its data file goes beside
    folder, base = os.path.split(path)
    location = base + ".data"
    if weights is None:
        exported = export_onnx_decided(graph, None, external_data=external_data, data_location=location,
                                       progress=progress, **kw)
        write_model(exported.model, path, external_data=False)
        return exported.decisions
    if external_data is None:
        external_data = _param_bytes(graph) > external_threshold
    if not external_data:
        exported = export_onnx_decided(graph, weights, external_data=False, external_threshold=external_threshold,
                                       progress=progress, **kw)
        write_model(exported.model, path, external_data=False)
        return exported.decisions
    # External data: the model declares the layout (as a weightless export
    # does) and the weights are written into it one at a time, straight from
    # numpy. They never pass through protobuf, so a tensor of any size works
    # (protobuf refuses a message over 2 GiB) and no second copy is made.
    exported = export_onnx_decided(graph, None, data_location=location, progress=progress, **kw)
    if not os.path.isdir(folder):
        raise BlockcError(f"cannot write {path}: folder {folder} does not exist")
    with replace_together([path, os.path.join(folder, location)]) as (tmp_model, tmp_data):
        with open(tmp_data, "wb") as f:
            write_slots(f, plan_layout(graph), weights, progress)
        try:
            onnx.save_model(exported.model, tmp_model)
        except Exception as err:  # protobuf's and onnx's errors share no base class
            raise BlockcError(f"cannot write ONNX model {path}: {err}") from err
    return exported.decisions


def _param_bytes(graph: Graph) -> int:
    return sum(int(np.prod([d if isinstance(d, int) else 1 for d in v.shape], dtype=np.int64)) * v.dtype.itemsize
               for v in graph.params.values())


def wants_external_data(model: onnx.ModelProto, external_data: bool | None,
                        threshold: int = EXTERNAL_DATA_THRESHOLD) -> bool:
    """Whether ``model`` is to be stored with external data: as forced by
    ``external_data``, or (None) when its weights exceed ``threshold`` bytes."""
    return external_data if external_data is not None else initializer_bytes(model) > threshold


def write_model(model: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool) -> None:
    """Write ``model`` to ``path``, its weights in ``<name>.data`` when
    ``external_data`` (``onnx.save_model`` then moves the weight bytes out of
    ``model`` in place).

    Both files are written under temporary names beside ``path`` and renamed
    into place together (``files.replace_together``), replacing a previous
    export's. A ``<name>.data`` this write does not lay out -- one left by an
    earlier export, with or without weights -- is removed: ONNX Runtime would
    otherwise load it silently as this model's weights. Partial files of a
    killed export into the same place are removed first."""
    path = output_target(path)   # a symlink's target, whose folder its data file goes beside
    folder, base = os.path.split(path)
    data_name = base + ".data"
    if not os.path.isdir(folder):
        raise BlockcError(f"cannot write {path}: folder {folder} does not exist")
    try:
        # The staged files carry their final names, because the model refers
        # to its data file by name.
        with replace_together([path, os.path.join(folder, data_name)]) as (tmp_model, _):
            if external_data:
                onnx.save_model(model, tmp_model, save_as_external_data=True, all_tensors_to_one_file=True,
                                location=data_name)
            else:
                onnx.save_model(model, tmp_model)
    except BlockcError:
        raise
    except Exception as err:  # protobuf's EncodeError, onnx's ValidationError share no base class
        raise BlockcError(f"cannot write ONNX model {path}: {err}") from err


def check_model(model: onnx.ModelProto, *, weightless: bool = False) -> None:
    """``onnx.checker`` with full type and shape inference; a failure is a
    ``BlockcError``. ``weightless`` checks a copy whose large initializers,
    and those whose data is declared external but absent, are turned into
    typed graph inputs: for models too big to serialize, and for weightless
    exports (the checker otherwise requires an external data file to exist)."""
    if weightless:
        model = _without_weights(model)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as err:  # checker and shape-inference errors share no base class
        raise BlockcError(f"exported ONNX model fails the ONNX checker: {err}") from err


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of data held by the model's initializers (from their dims: reading
    ``raw_data`` would copy it)."""
    total = 0
    for t in model.graph.initializer:
        total += int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


# -- helpers ------------------------------------------------------------------
def _check_names(graph: Graph) -> None:
    inputs = [v.name for v in graph.inputs]
    clash = sorted(set(inputs) & set(graph.params))
    if clash:
        raise BlockcError(f"ONNX export: {', '.join(map(repr, clash))} names both a graph input and a parameter")
    owners = {v.name: v for v in graph.inputs} | dict(graph.params)
    for name, v in graph.outputs:
        if name in owners and owners[name] is not v:
            raise BlockcError(f"ONNX export: graph output {name!r} has the name of a different "
                              "input or parameter")
        if not name:
            raise BlockcError("ONNX export: a graph output has an empty name")


def _add_weights(target: onnx.GraphProto, graph: Graph, weights: Mapping[str, np.ndarray],
                 progress: Progress | None) -> None:
    """One initializer per parameter, added one at a time so that at most one
    extra copy of one weight is alive."""
    tick = ticker(progress, WRITING_WEIGHTS, len(graph.params), every=1)  # a weight is made, then copied
    for done, (name, w) in enumerate(checked_weights(graph, weights), 1):
        # add + CopyFrom, not append: append serializes, which fails past 2 GiB
        target.initializer.add().CopyFrom(numpy_helper.from_array(contiguous(w), name))
        del w
        tick(done)


def checked_weights(graph: Graph, weights: Mapping[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, array)`` for each parameter of ``graph``, read from ``weights``
    once and checked against the parameter's type, not copied (a view of a
    checkpoint out of order stays one: ``runtime/folded_params.py`` puts it
    in order once, into the cache, where it can); after the last,
    every problem is raised at once as a ``WeightsError``."""
    problems = []
    for name, v in graph.params.items():
        try:
            w = weights[name]  # read once: a lazy mapping may compute it
        except KeyError:
            problems.append(f"{name}: missing (the graph expects {v.type})")
            continue
        w = np.asarray(w)
        if any(not isinstance(d, int) for d in v.shape):
            problems.append(f"{name}: the parameter type {v.type} has symbolic dims")
        elif tuple(w.shape) != tuple(v.shape) or w.dtype != v.dtype.numpy:
            problems.append(f"{name}: got {w.dtype}{list(w.shape)}, the graph expects {v.type}")
        else:
            yield name, w
        del w
    if problems:
        raise WeightsError(f"{len(problems)} weight(s) do not match the graph:\n  " + "\n  ".join(problems))


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    shape = [d if isinstance(d, int) else str(d) for d in t.shape]
    return helper.make_tensor_value_info(name, t.dtype.onnx_code, shape)


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.producer_name = model.producer_name
    light.functions.extend(model.functions)
    g = light.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    for t in model.graph.initializer:
        declared_only = t.data_location == onnx.TensorProto.EXTERNAL and not t.HasField("raw_data")
        big = int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize > 1024
        if big or declared_only:  # from dims: reading raw_data would copy it
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            g.initializer.append(t)
    return light

