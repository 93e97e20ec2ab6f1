"""Weightless ONNX export: parameters declared as external data in a file
laid out ahead of time, and that file written later.

``export_onnx(graph, None)`` gives every parameter an initializer that holds
no bytes, only where they will be: ONNX's own external-data fields
(``data_location = EXTERNAL``, ``location``, ``offset``, ``length``). The
model is complete and standard the moment it is written; the weights file
(the ``location``, next to the model) can be written later, by
``save_onnx_weights`` or by anything that reads the layout, one tensor at a
time. A GPT-3-sized model (about 700 GB in float32) is exported this way in
seconds and a few MB of memory.

The layout (``plan_layout``) puts the parameters in the graph's parameter
order, each at the next offset that is a multiple of ``ALIGN`` (64 bytes, so
any dtype can be viewed in place), or of ``LARGE_ALIGN`` (64 KiB) for tensors
of ``LARGE_TENSOR`` (1 MiB) and more: 64 KiB is the memory-mapping
granularity on every OS ONNX Runtime runs on (4 KiB pages on Linux, 64 KiB on
Windows), so a runtime can map the big tensors instead of copying them, and
it is the most padding ``onnx``'s own writer accepts between tensors. Small
tensors are not padded that far, which would waste 64 KiB per bias.
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import BlockcError, WeightsError
from ..files import atomic_write
from ..frontends.weights import contiguous
from ..ir.graph import Graph
from ..progress import WRITING_WEIGHTS, Progress, ticker

ALIGN = 64
LARGE_ALIGN = 64 * 1024
LARGE_TENSOR = 1 << 20


@dataclass(frozen=True)
class Slot:
    """Where one parameter's bytes go in the weights file."""

    name: str
    onnx_type: int       # onnx.TensorProto.DataType
    dims: tuple
    offset: int
    length: int


def plan_layout(graph: Graph) -> list[Slot]:
    """One slot per parameter of ``graph``, in parameter order (see the module
    docstring for the alignment); a parameter with a symbolic dim is an error."""
    slots, end = [], 0
    symbolic = [f"{name}: {v.type}" for name, v in graph.params.items()
                if any(not isinstance(d, int) for d in v.shape)]
    if symbolic:
        raise BlockcError("ONNX export: parameters need fixed shapes to be laid out in a weights file; "
                          "these have symbolic dims:\n  " + "\n  ".join(symbolic))
    for name, v in graph.params.items():
        length = int(np.prod(v.shape, dtype=np.int64)) * v.dtype.itemsize
        align = LARGE_ALIGN if length >= LARGE_TENSOR else ALIGN
        offset = -(-end // align) * align
        slots.append(Slot(name, v.dtype.onnx_code, tuple(v.shape), offset, length))
        end = offset + length
    return slots


def check_location(location: str) -> None:
    """A data file name ONNX accepts: relative, inside the model's folder."""
    if not isinstance(location, str) or not location.strip():
        raise BlockcError("ONNX export: the weights file name is empty")
    parts = location.replace("\\", "/").split("/")
    if posixpath.isabs(location) or os.path.isabs(location) or ".." in parts:
        raise BlockcError(f"ONNX export: the weights file {location!r} must be a path relative to the "
                          "model's folder, without '..' (ONNX resolves it against the model file)")


def external_initializers(slots: list[Slot], location: str) -> list[TensorProto]:
    """Initializers that declare the slots' data in ``location`` and hold none."""
    check_location(location)
    out = []
    for s in slots:
        t = TensorProto(name=s.name, data_type=s.onnx_type, dims=s.dims, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", location), ("offset", s.offset), ("length", s.length)):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        out.append(t)
    return out


def read_layout(model: onnx.ModelProto) -> tuple[str, list[Slot]]:
    """The weights file name and its slots, from ``model``'s initializers
    that declare external data and hold none; checked to be one file whose
    slots fit their tensors and do not overlap."""
    slots, locations = [], set()
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL or t.HasField("raw_data"):
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            offset, length = int(info.get("offset", 0)), int(info["length"])
            locations.add(info["location"])
        except (KeyError, ValueError):
            raise BlockcError(f"initializer {t.name!r} has incomplete external data: {info}") from None
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        except KeyError:
            raise BlockcError(f"initializer {t.name!r} has an unknown data type {t.data_type}") from None
        if offset < 0 or length != int(np.prod(t.dims, dtype=np.int64)) * itemsize:
            raise BlockcError(f"initializer {t.name!r}: external data at offset {offset}, length {length} "
                              f"does not fit a tensor of {list(t.dims)}")
        slots.append(Slot(t.name, t.data_type, tuple(t.dims), offset, length))
    if not slots:
        raise BlockcError("the model declares no weights to be written later (was it exported with weights?)")
    if len(locations) != 1:
        raise BlockcError(f"the model's weights are declared in {len(locations)} files; expected one")
    (location,) = locations
    check_location(location)
    ordered = sorted(slots, key=lambda s: s.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.length > b.offset:
            raise BlockcError(f"initializers {a.name!r} and {b.name!r} overlap in the weights file")
    return location, slots


def save_onnx_weights(path: str | os.PathLike, weights: Mapping[str, np.ndarray], *,
                      progress: Progress | None = None) -> str:
    """Write ``weights`` into the weights file that the ONNX model at ``path``
    (exported with ``weights=None``) declares; returns the file's path.

    Each weight is read once and written at its slot, so at most one is in
    memory at a time (``weights`` may be lazy). Every missing or mismatched
    weight is reported at once. The file is written under a temporary name
    and renamed into place: on any error no new file is left behind.
    ``progress`` (``blockc.progress``) hears of each weight written.
    """
    path = os.path.abspath(os.fspath(path))
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as err:  # a missing file, or bytes that are not a model
        raise BlockcError(f"cannot read ONNX model {path}: {err}") from err
    location, slots = read_layout(model)
    target = os.path.join(os.path.dirname(path), location)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise BlockcError(f"cannot write {target}: folder {folder} does not exist")
    # Written under a temporary name beside the target (partial files of a
    # killed run removed first), then renamed into place, with the usual
    # permissions (files.atomic_write).
    with atomic_write(target, "wb") as f:
        write_slots(f, slots, weights, progress)
    return target


def write_slots(f, slots: list[Slot], weights: Mapping[str, np.ndarray], progress: Progress | None = None) -> None:
    """Write each weight at its slot in the open binary file ``f``, each read
    once; every missing or mismatched weight is reported at once (WeightsError).
    ``progress`` hears of each one."""
    problems, end = [], 0
    tick = ticker(progress, WRITING_WEIGHTS, len(slots), every=1)  # a weight is made, then written
    for done, s in enumerate(sorted(slots, key=lambda s: s.offset), 1):
        try:
            w = np.asarray(weights[s.name])  # read once: a lazy mapping may compute it
        except KeyError:
            problems.append(f"{s.name}: missing (the model expects {list(s.dims)})")
            continue
        want = helper.tensor_dtype_to_np_dtype(s.onnx_type)
        if tuple(w.shape) != s.dims or w.dtype != want:
            problems.append(f"{s.name}: got {w.dtype}{list(w.shape)}, the model expects {want}{list(s.dims)}")
            continue
        f.seek(s.offset)  # the gap before it reads as zeros
        # row-major, as ONNX stores it (a checkpoint's transposed view: a tiled copy, 3x numpy's own)
        f.write(contiguous(w).reshape(-1).view(np.uint8))
        end = max(end, s.offset + s.length)
        del w
        tick(done)
    if problems:
        raise WeightsError(f"{len(problems)} weight(s) do not match the model:\n  " + "\n  ".join(problems))
    f.truncate(end)
