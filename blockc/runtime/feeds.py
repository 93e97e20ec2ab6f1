"""Named arrays in and out of a run: ``.npz`` files read, checked and written.

``load_npz`` reads a file of named arrays and never unpickles anything;
``check_feeds`` holds the arrays against a graph's inputs with the one
checker every backend uses (``bindings.input_problems``) and lists every
mismatch at once, binding the symbolic dims on the way; ``save_npz`` writes
arrays by name, atomically.
"""
from __future__ import annotations

import os
import zipfile
from typing import Mapping

import numpy as np

from ..errors import BlockcError, InputsError
from ..files import atomic_write, check_writable
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ops.limits import graph_limits
from .bindings import input_problems


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


def check_feeds(graph: Graph, arrays: Mapping[str, np.ndarray], *, dims: Mapping[str, int] | None = None,
                source: str = "the inputs") -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """``arrays`` checked against ``graph``'s inputs: ``(feeds, bindings)``.

    Every problem ``bindings.input_problems`` finds (names, dtypes, ranks,
    sizes, the graph's id and dim limits) is listed, in one ``InputsError``.
    Two rules are added for arrays a user gave: each dim they show must be
    positive (a runtime accepts an empty ``past``; a file of inputs with an
    empty batch is a mistake), and must agree with ``dims``, the sizes the
    caller asked for (which also bind dims no input shows). ``feeds`` are the
    arrays as the graph takes them (bfloat16 restored, contiguous).
    """
    dims = dict(dims or {})
    takes = {v.name: v for v in graph.inputs}
    feeds = {name: np.ascontiguousarray(_as_graph_dtype(np.asarray(a), takes[name].dtype)) if name in takes else a
             for name, a in arrays.items()}
    bindings = dict(dims)
    problems = list(input_problems(graph, feeds, bindings))
    for sym, n in bindings.items():
        if n <= 0:
            problems.append(f"dimension '{sym}' is {n}: dimensions must be positive")
        if sym in dims and dims[sym] != n:
            problems.append(f"dimension '{sym}' is {n} in {source}, but {dims[sym]} was asked for")
    too_big = None if problems else graph_limits(graph).size_over(bindings)   # a value the arrays imply
    if too_big:
        problems.append(too_big)
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise InputsError(f"{source} do not fit {graph.name}'s inputs ({count}):\n"
                          + "\n".join(f"  {p}" for p in problems), problems)
    return ({name: a for name, a in feeds.items() if name in takes},
            {k: v for k, v in bindings.items() if k in graph.symbols()})


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
