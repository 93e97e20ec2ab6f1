"""Named arrays in and out of a run: ``.npz`` files read, checked and written.

``load_npz`` reads a file of named arrays and never unpickles anything;
``check_feeds`` holds the arrays against a graph's inputs and lists every
mismatch at once (names, dtypes, ranks, sizes, dims that disagree between
inputs or exceed the model's limits, ids out of range), binding the
symbolic dims on the way; ``save_npz`` writes arrays by name, atomically.
"""
from __future__ import annotations

import os
import zipfile
from typing import Mapping

import numpy as np

from ..errors import BlockcError, InputsError
from ..files import atomic_write, check_writable
from ..ir.dims import evaluate, is_plain_symbol
from ..ir.dtypes import DType
from ..ir.graph import Graph


def load_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file at ``path``, by name.

    Pickled contents (object arrays, a pickle in place of an archive) are
    refused: loading them would run code from the file.
    """
    if not os.path.exists(path):
        raise BlockcError(f"cannot read {path}: no such file")
    if os.path.isdir(path):
        raise BlockcError(f"cannot read {path}: it is a folder, not an .npz file")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        raise BlockcError(f"cannot read {path}: {e.strerror}") from None
    # numpy takes anything that is neither a zip nor a .npy for a pickle; say which it is.
    if not magic.startswith((b"PK", b"\x93NUMPY")):
        if magic.startswith(b"\x80"):
            raise BlockcError(f"cannot read {path}: it is a Python pickle, which blockc does not load "
                              "(write plain arrays with numpy.savez)")
        raise BlockcError(f"cannot read {path}: not an .npz file (numpy.savez writes one)")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise BlockcError(f"cannot read {path}: not an .npz file ({e})") from None
    if isinstance(loaded, np.ndarray):
        raise BlockcError(f"cannot read {path}: it is a single .npy array; blockc wants an .npz of arrays named "
                          "after the graph's inputs (numpy.savez(path, input_ids=...))")
    arrays, pickled = {}, []
    with loaded:
        for name in loaded.files:
            try:
                arrays[name] = loaded[name]
            except ValueError as e:
                if "allow_pickle" not in str(e):
                    raise BlockcError(f"cannot read {path}: array {name!r}: {e}") from None
                pickled.append(name)
            except (OSError, EOFError, zipfile.BadZipFile) as e:
                raise BlockcError(f"cannot read {path}: array {name!r} is damaged ({e})") from None
    if pickled:
        raise BlockcError(f"cannot read {path}: {', '.join(map(repr, pickled))} "
                          f"{'holds' if len(pickled) == 1 else 'hold'} Python objects (pickled), which blockc "
                          "does not load; save plain numeric arrays")
    return arrays


def _as_graph_dtype(a: np.ndarray, want: DType) -> np.ndarray:
    # .npz keeps no bfloat16: numpy writes it as raw 2-byte records ("V2").
    if want is DType.bfloat16 and a.dtype.kind == "V" and a.dtype.itemsize == 2:
        return a.view(DType.bfloat16.numpy)
    return a


def check_feeds(graph: Graph, arrays: Mapping[str, np.ndarray], *,
                value_ranges: Mapping[str, tuple[int, int]] | None = None,
                max_dims: Mapping[str, int] | None = None, dims: Mapping[str, int] | None = None,
                source: str = "the inputs") -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """``arrays`` checked against ``graph``'s inputs: ``(feeds, bindings)``.

    ``value_ranges`` maps an integer input to the half-open range its values
    must lie in (ids below the vocabulary size); ``max_dims`` bounds
    symbolic dims (the model's limits); ``dims`` are sizes the caller asked
    for, which the arrays must agree with (and which bind dims no input
    shows). Every mismatch is collected and raised as one ``InputsError``.
    ``feeds`` are the arrays as the graph takes them (bfloat16 restored).
    """
    value_ranges, max_dims, dims = value_ranges or {}, max_dims or {}, dict(dims or {})
    problems: list[str] = []
    takes = ", ".join(f"{v.name}: {v.type}" for v in graph.inputs)
    names = {v.name for v in graph.inputs}
    unexpected = [name for name in arrays if name not in names]
    if unexpected:
        problems.append(f"unexpected array{'s' if len(unexpected) > 1 else ''} {', '.join(map(repr, unexpected))} "
                        f"(the graph takes {takes})")
    feeds: dict[str, np.ndarray] = {}
    seen: dict[str, list[tuple[str, int, int]]] = {}  # symbol -> (input, axis, size) where it appears
    compound = []
    for v in graph.inputs:
        if v.name not in arrays:
            problems.append(f"missing input {v.name!r}: {v.type}")
            continue
        a = _as_graph_dtype(np.asarray(arrays[v.name]), v.dtype)
        feeds[v.name] = np.ascontiguousarray(a)
        if a.dtype != v.dtype.numpy:
            problems.append(f"{v.name}: dtype {a.dtype}, expected {v.dtype.name}")
        if a.ndim != v.type.rank:
            problems.append(f"{v.name}: rank {a.ndim} (shape {list(a.shape)}), expected rank {v.type.rank}: {v.type}")
            continue
        for axis, (d, n) in enumerate(zip(v.shape, a.shape)):
            sym = next(iter(d.symbols)) if is_plain_symbol(d) else None
            if isinstance(d, int):
                if d != n:
                    problems.append(f"{v.name}: axis {axis} is {n}, expected {d} ({v.type})")
            elif sym is not None:
                seen.setdefault(sym, []).append((v.name, axis, n))
            else:
                compound.append((v.name, axis, d, n))
        if v.name in value_ranges and a.dtype.kind in "iu" and a.size:  # even at a wrong integer dtype
            low, high = value_ranges[v.name]
            outside = (a < low) | (a >= high)
            if outside.any():
                problems.append(f"{v.name}: {int(outside.sum())} of {a.size} values outside [{low}, {high}) "
                                f"(min {a.min()}, max {a.max()})")

    bindings: dict[str, int] = {}
    for sym, where in seen.items():
        sizes = sorted({n for _, _, n in where})
        if len(sizes) > 1:
            problems.append(f"dimension '{sym}' disagrees between inputs: "
                            + ", ".join(f"{n} in {name} axis {axis}" for name, axis, n in where))
            continue
        n = sizes[0]
        bindings[sym] = n
        if n <= 0:
            problems.append(f"dimension '{sym}' is {n}: dimensions must be positive")
        if sym in max_dims and n > max_dims[sym]:
            problems.append(f"dimension '{sym}' is {n}, over the model's maximum of {max_dims[sym]}")
        if sym in dims and dims[sym] != n:
            problems.append(f"dimension '{sym}' is {n} in {source}, but {dims[sym]} was asked for")
    for sym, n in dims.items():
        bindings.setdefault(sym, n)  # a dim no input shows on its own (only inside past+seq, say)
    for name, axis, d, n in compound:
        if not d.symbols <= bindings.keys():
            missing = ", ".join(sorted(d.symbols - bindings.keys()))
            problems.append(f"{name}: axis {axis} is '{d}', and no input determines {missing}")
        elif evaluate(d, bindings) != n:
            problems.append(f"{name}: axis {axis} is {n}, expected {d} = {evaluate(d, bindings)}")
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise InputsError(f"{source} do not fit {graph.name}'s inputs ({count}):\n"
                          + "\n".join(f"  {p}" for p in problems), problems)
    return feeds, {k: v for k, v in bindings.items() if k in graph.symbols()}


def save_npz(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` as an ``.npz`` (``numpy.load`` reads it back).

    Atomic: the archive is written under a temporary name in the same folder
    and renamed over ``path`` when complete, so a failure leaves no partial
    file. Written member by member rather than with ``numpy.savez``, whose
    keyword arguments would clash with arrays named ``file`` or
    ``allow_pickle``.
    """
    check_writable(path)
    with atomic_write(path) as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, a in arrays.items():
                with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(a), allow_pickle=False)
