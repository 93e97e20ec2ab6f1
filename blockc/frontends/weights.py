"""Weights on disk and checking weights against a model.

Weights are a ``{name: ndarray}`` mapping keyed by the model's parameter
names (``blocks.0.attn.w_q.weight``). Two file formats, chosen by extension:

* ``.safetensors``: the standard, mmap-able format; float16, bfloat16
  (``ml_dtypes``), float32/64 and integer arrays round-trip. One reader,
  ``SafetensorsFiles``, serves a file and a Hugging Face checkpoint's shards
  alike: it reads the headers (names, shapes, dtypes) up front, and each
  tensor is a read-only array over the memory-mapped file, never copied, so
  the weights take no memory of the process's own until something reads them
  (``safetensors.numpy`` copies every tensor out of its map: twice the file
  at the peak).
* ``.npz``: numpy's zip of ``.npy`` files. numpy has no bfloat16 of its own and
  would read one back as raw ``|V2`` bytes, so dtypes numpy cannot describe are
  stored as same-sized unsigned ints and named in a small side entry.

Loading reports non-finite values: a file whose float tensors hold NaN or
Inf still loads (a broken checkpoint is something to look into, not to
hide), but ``load_weights`` warns with a ``NonFiniteWeightsWarning`` that
names each such tensor and how many of its values are NaN, +Inf and -Inf.
Every output computed from them will be non-finite too, and ``blockc run
--check`` and ``blockc check`` fail on it, naming the first node whose
result is not finite.

Saving is atomic (``files.replace_together``): the data goes to a temporary
file in the target directory that replaces the target only once it is
complete, so a failed save leaves either the old file or nothing, never half
a file.
"""
from __future__ import annotations

import json
import mmap
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np

from ..errors import BlockcError, WeightsError, printable
from ..files import check_writable, replace_together, same_file, start_writeback
from ..ir.dtypes import DType, is_float_numpy
from ..ir.graph import Graph

FORMATS = (".safetensors", ".npz")

# The .npz side entry: {name: dtype name} for arrays stored as raw uint views.
_NPZ_DTYPES_KEY = "__blockc_dtypes__"

# safetensors' dtype codes; what numpy lacks comes from ml_dtypes, as DType's bfloat16 does
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": DType.bfloat16.numpy,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64,
                       "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}
_SAFETENSORS_CODES = {np.dtype(dtype): code for code, dtype in _SAFETENSORS_DTYPES.items()}


def materialize(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A plain ``dict`` of numpy arrays from any mapping (e.g. the lazy one
    ``init_weights`` returns): every value is made now, once."""
    return {name: np.asarray(weights[name]) for name in weights}


def _format_of(path: str | os.PathLike) -> str:
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext not in FORMATS:
        raise WeightsError(f"{os.fspath(path)!r}: unknown weights format {ext or '(no extension)'!r}; "
                           f"use a {' or '.join(FORMATS)} file")
    return ext


# -- saving -----------------------------------------------------------------------
def save_weights(path: str | os.PathLike, weights: Mapping[str, np.ndarray]) -> None:
    """Write ``weights`` to ``path`` (``.safetensors`` or ``.npz``), atomically."""
    path = os.fspath(path)
    fmt = _format_of(path)
    # np.asarray keeps 0-d arrays 0-d (np.ascontiguousarray would make them [1])
    arrays = {name: np.asarray(a, order="C") for name, a in materialize(weights).items()}
    bad = [f"{name} ({a.dtype})" for name, a in arrays.items()
           if a.dtype.kind not in "biuf" and not is_float_numpy(a.dtype)]
    if bad:
        raise WeightsError(f"cannot save non-numeric arrays: {', '.join(bad)}")
    write = _write_safetensors if fmt == ".safetensors" else _write_npz
    try:
        check_writable(path)
        with replace_together([path]) as (staged,):
            write(staged, arrays)
    except WeightsError:
        raise
    except BlockcError as e:  # the folder, or an OSError while writing: files names the path
        raise WeightsError(str(e)) from None
    except Exception as e:
        raise WeightsError(f"cannot save weights to {path!r}: {type(e).__name__}: {e}") from e


def _write_safetensors(path: str, arrays: dict[str, np.ndarray]) -> None:
    write_safetensors(path, {name: (a.dtype, a.shape) for name, a in arrays.items()}, arrays.__getitem__)


_TILE = 256   # rows and columns a tile of a 2-D copy: its source and target both stay in cache


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` in C order, ``a`` itself where it is already. A transposed matrix
    (a tied head, a checkpoint's ``nn.Linear`` weight) is copied tile by
    tile: numpy's own copy walks the source a column at a time, 5x slower on
    a tied head (50257 x 768 float32: 0.72 s against 0.14 s, measured), 3x
    on a Llama's MLP weight (2048 x 768: 8.1 ms against 2.5 ms)."""
    if a.flags.c_contiguous or a.ndim != 2:
        return np.ascontiguousarray(a)
    out = np.empty(a.shape, a.dtype)
    _copy_tiles(a, out)
    return out


@dataclass(frozen=True)
class SideBySide:
    """Matrices of equal height side by side (a concat along their columns:
    a q/k/v or gate/up merge) not yet made: a file's writer writes it band by
    band (``in_order_bands``), with no array of its size in memory; numpy
    gets it made whole (``np.asarray``)."""

    parts: tuple[np.ndarray, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype

    @property
    def shape(self) -> tuple[int, int]:
        return (self.parts[0].shape[0], sum(p.shape[1] for p in self.parts))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = np.concatenate([contiguous(p) for p in self.parts], axis=1)
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def bands(self) -> Iterator[np.ndarray]:
        rows, _ = self.shape
        band = np.empty((min(_TILE, rows), self.shape[1]), self.dtype)
        for i in range(0, rows, _TILE):
            out, col = band[:min(_TILE, rows - i)], 0
            for part in self.parts:
                _copy_tiles(part[i:i + _TILE], out[:, col:col + part.shape[1]])
                col += part.shape[1]
            yield out


def in_order_bands(a: np.ndarray | SideBySide) -> Iterator[np.ndarray]:
    """``a``'s elements in C order as C-ordered pieces: ``a`` itself where it
    is in order; a matrix out of order (a transpose) ``_TILE`` rows at a time,
    tile by tile (``contiguous``'s copy) into one band reused for all of
    them. A file written from the bands holds no array of ``a``'s size in
    memory: in a new process each page of one is a fault to take and zero
    (a 288 MB set of transposed weights written in 0.23-0.28 s so, against
    0.41-1.08 s through whole copies, measured in fresh processes)."""
    if isinstance(a, SideBySide):
        yield from a.bands()
        return
    if a.flags.c_contiguous or a.ndim != 2:
        yield np.ascontiguousarray(a)
        return
    yield from SideBySide((a,)).bands()   # one matrix side by side with nothing: the same band loop


def _copy_tiles(a: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = a`` for matrices, a ``_TILE`` square at a time."""
    for i in range(0, a.shape[0], _TILE):
        for j in range(0, a.shape[1], _TILE):
            out[i:i + _TILE, j:j + _TILE] = a[i:i + _TILE, j:j + _TILE]


def write_safetensors(path: str | os.PathLike, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                      make: Callable[[str], np.ndarray]) -> None:
    """Write a new ``.safetensors`` file at ``path`` holding a tensor of each
    ``specs`` entry ``name: (dtype, shape)``: the header first, from the specs
    alone, then each tensor's bytes as ``make(name)`` makes it, so no more
    than one tensor is in memory at a time (the safetensors library wants
    every array at once). Tensors lie in order of falling item size, as the
    library lays them, so each starts aligned to its own item size. A made
    array of another dtype or shape than its spec is a ``WeightsError``.
    Not atomic by itself: callers write to a temporary name
    (``replace_together``, ``files.cached_file``)."""
    order = sorted(specs, key=lambda name: -np.dtype(specs[name][0]).itemsize)
    header, offset = {}, 0
    for name in order:
        dtype, shape = np.dtype(specs[name][0]), tuple(int(d) for d in specs[name][1])
        if dtype not in _SAFETENSORS_CODES:
            raise WeightsError(f"cannot write {printable(name)} to a .safetensors file: its dtype {dtype} has no "
                               f"safetensors code")
        size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": _SAFETENSORS_CODES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)   # the data starts 8-aligned, as the library's own files do
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name in order:
            start = f.tell()
            _write_in_order(f, _checked(name, make(name), specs[name]))
            start_writeback(f, start, f.tell() - start)   # on its way to disk while the next is made
        f.flush()
        os.fsync(f.fileno())


def _write_in_order(f, a: np.ndarray | SideBySide) -> None:
    """``a``'s bytes in C order (a transpose band by band: ``in_order_bands``), none held after."""
    for piece in in_order_bands(a):
        f.write(piece.reshape(-1).view(np.uint8))


def _checked(name: str, made, spec: tuple[np.dtype, tuple[int, ...]]) -> np.ndarray | SideBySide:
    """``made`` as an array (in order or not: the writer puts it in order), once it has its spec's dtype and shape."""
    a = made if isinstance(made, SideBySide) else np.asarray(made)
    dtype, shape = np.dtype(spec[0]), tuple(int(d) for d in spec[1])
    if a.dtype != dtype or a.shape != shape:
        raise WeightsError(f"{printable(name)} was made as {a.dtype}{list(a.shape)}, but the file's header says "
                           f"{dtype}{list(shape)}")
    return a


def _write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    if _NPZ_DTYPES_KEY in arrays:
        raise WeightsError(f"the name {_NPZ_DTYPES_KEY!r} is reserved in .npz weight files")
    stored, special = {}, {}
    for name, a in arrays.items():
        if a.dtype.kind == "V":  # bfloat16 & co.: keep the bits, remember the dtype
            special[name] = a.dtype.name
            a = a.view(f"u{a.dtype.itemsize}")
        stored[name] = a
    if special:
        stored[_NPZ_DTYPES_KEY] = np.array(json.dumps(special))
    with open(path, "xb") as f:  # a file object, so numpy does not append ".npz" to the name
        np.savez(f, **stored)
        f.flush()
        os.fsync(f.fileno())


# -- loading ----------------------------------------------------------------------


class SafetensorsFiles(Mapping):
    """``{name: array}`` over one or more ``.safetensors`` files (a checkpoint's
    shards): ``shapes`` and ``dtypes`` come from the headers, which the
    safetensors library checks (its errors for a corrupt file), and each
    tensor is a read-only array over its file's memory map, made on access
    and never copied; the files must not change while the arrays are in use.
    ``files`` maps each name to the file holding it; a name in two files is
    refused, and so is a dtype blockc has no type for. Problems name the file
    (and the tensor).

    Lifetime: ``close()`` (or leaving a ``with`` block) drops the object's
    own hold on its memory maps and refuses further reads; an array handed
    out before keeps its file's map alive, and stays valid, until the last
    array over it is gone (the map is unmapped then, by garbage collection).
    ``file_region(array)`` says where in which file such an array lies, so a
    runtime can map the same bytes itself (``ort_runner.OrtSession``)."""

    def __init__(self, paths):
        self.files: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}   # safetensors' codes: F32, F16, BF16, I64...
        self._where: dict[str, tuple[int, int]] = {}   # name -> (first byte, end) in its file
        self._maps: dict[str, _FileMap] | None = {}
        self.stats: dict[str, os.stat_result] = {}   # each file as its header was read (os.fstat)
        for path in map(os.fspath, paths):
            tensors, self.stats[path] = _safetensors_header(path)
            for name, entry, start in tensors:
                if name in self.files:
                    raise WeightsError(f"{path}: tensor {printable(name)} is also in {self.files[name]}")
                if entry["dtype"] not in _SAFETENSORS_DTYPES:
                    raise WeightsError(f"{path!r}: {printable(name)} has the dtype {entry['dtype']}, which blockc "
                                       f"does not read")
                self.files[name], self.shapes[name] = path, tuple(entry["shape"])
                self.dtypes[name] = entry["dtype"]
                self._where[name] = (start + entry["data_offsets"][0], start + entry["data_offsets"][1])

    def __getitem__(self, name: str) -> np.ndarray:
        if self._maps is None:
            raise WeightsError(f"these weights ({', '.join(sorted(set(self.files.values())))}) were closed; "
                               f"read tensors before closing them")
        path, (start, end) = self.files[name], self._where[name]
        dtype = self.dtype_of(name)
        if start == end:   # an empty tensor (it may sit at the very end, where no buffer starts)
            return np.empty(self.shapes[name], dtype)
        if path not in self._maps:
            m = _FileMap.of(path)
            if not same_file(self.stats[path], m.stat):   # its header described another file
                raise WeightsError(f"{path} changed since its header was read: load the weights again")
            self._maps[path] = m
        return np.frombuffer(self._maps[path], dtype, (end - start) // dtype.itemsize, start).reshape(self.shapes[name])

    def dtype_of(self, name: str) -> np.dtype:
        """The numpy dtype of the tensor ``name``, from its header."""
        return np.dtype(_SAFETENSORS_DTYPES[self.dtypes[name]])

    def release_pages(self) -> None:
        """Take the pages read so far out of this process's memory (they stay
        in the OS's page cache, and come back on the next read): a scan of
        every tensor (``load_weights``'s check for NaN) would otherwise count
        the whole file in this process's resident memory a second time
        beside ONNX Runtime's own map of it (``ort_runner.OrtSession``)."""
        for m in (self._maps or {}).values():
            _drop_pages(m)

    def close(self) -> None:
        """Drop this object's maps; arrays already handed out keep theirs (see the class docstring)."""
        self._maps = None

    def __enter__(self) -> "SafetensorsFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


class _FileMap(mmap.mmap):
    """A read-only memory map of a whole file that remembers the file's path
    and where the map starts in memory, so ``file_region`` can turn a view's
    address back into an offset in the file."""

    path: str
    address: int
    stat: os.stat_result

    @classmethod
    def of(cls, path: str) -> "_FileMap":
        with open(path, "rb") as f:
            m = cls(f.fileno(), 0, access=mmap.ACCESS_READ)
            m.stat = os.fstat(f.fileno())   # the file mapped, which the path may no longer name
        # the file itself: a Hugging Face cache links snapshots/*/model.safetensors to ../../blobs/<hash>,
        # and ONNX Runtime refuses an external file that resolves outside the folder it was given
        m.path = os.path.realpath(path)
        m.address = np.frombuffer(m, np.uint8, 1).ctypes.data
        return m


@dataclass(frozen=True)
class FileRegion:
    """Bytes ``[offset, offset + length)`` of the file ``path`` (absolute, links resolved)."""

    path: str
    offset: int
    length: int


def file_region(array: np.ndarray) -> FileRegion | None:
    """Where ``array``'s bytes lie in a ``.safetensors`` file, when it is a
    C-contiguous little-endian view over a ``SafetensorsFiles`` map (what
    ``SafetensorsFiles[name]`` hands out, reshaped or not); None for anything
    else (a copy, a transposed view, an array made in memory). The file must
    not change while the bytes are in use."""
    view = file_view(array)   # the one rule for where an array lies in a file; a region is a view in order
    if view is None or not array.flags.c_contiguous:
        return None
    return FileRegion(view.path, view.offset, array.nbytes)


@dataclass(frozen=True)
class FileView:
    """An array's place in a ``.safetensors`` file: its first byte's
    ``offset`` in the file ``path``, and numpy's ``shape`` and ``strides``
    (in bytes) over the bytes from there: a checkpoint's tensor as a model
    reads it (transposed, a slice of its columns) without a copy."""

    path: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def file_view(array: np.ndarray) -> FileView | None:
    """Where ``array``'s bytes lie in a ``.safetensors`` file when it is a
    little-endian view over a ``SafetensorsFiles`` map in any order (a
    transpose, a column slice; not reversed); None for anything else. A
    C-contiguous one also has a ``file_region``, which ONNX Runtime can map;
    the others are made contiguous once, into the cache
    (``runtime/folded_params.py``)."""
    if not isinstance(array, np.ndarray) or array.nbytes == 0 or array.dtype.byteorder == ">" \
            or any(s < 0 for s in array.strides):
        return None
    base = _file_map(array)
    if base is None:
        return None
    return FileView(base.path, array.ctypes.data - base.address, tuple(array.shape), tuple(array.strides))


def _file_map(array: np.ndarray) -> _FileMap | None:
    """The ``SafetensorsFiles`` map ``array`` is a view of, if it is one."""
    base = array
    while base is not None and not isinstance(base, _FileMap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return base


def mapped_files(arrays: Iterable[np.ndarray]) -> dict[str, os.stat_result]:
    """``{path: fstat}`` of the files that ``arrays`` view, as they were when
    mapped: what their bytes are, whatever the paths name now."""
    return {m.path: m.stat for a in arrays if (m := _file_map(a)) is not None}


def check_still_mapped(arrays: Iterable[np.ndarray]) -> None:
    """A ``WeightsError`` naming the first file that ``arrays`` view which is
    no longer the file at its path (replaced or rewritten since it was
    mapped: ``rsync``, ``git checkout``, a save over it). ONNX Runtime opens
    the weights by their path when a session is made (``OrtSession``): it
    would read the new file's bytes at the old file's offsets, beside weights
    made from the old bytes, and nothing would say so."""
    for path, mapped in mapped_files(arrays).items():
        try:
            now = os.stat(path)
        except OSError:
            now = None
        if not same_file(mapped, now):
            raise WeightsError(f"{path} was replaced or changed after its weights were loaded; a session made now "
                               f"would read the new file beside weights made from the old one: load the weights again")


def release_pages(arrays: Iterable[np.ndarray]) -> None:
    """``SafetensorsFiles.release_pages`` for the maps that ``arrays`` view:
    after reading every byte of some weights to make others from them
    (``runtime/folded_params.py``), those pages would count in this
    process's resident memory a second time beside ONNX Runtime's own map
    of the file."""
    for m in _maps_of(arrays):
        _drop_pages(m)


def keep_with_maps(arrays: Iterable[np.ndarray], holder: object) -> None:
    """Keep ``holder`` alive as long as any map that ``arrays`` view (a
    cache entry's ``files.EntryUse``: the entry stays while its views live)."""
    for m in _maps_of(arrays):
        m.holder = holder


def _maps_of(arrays: Iterable[np.ndarray]) -> list[_FileMap]:
    return list({id(m): m for a in arrays if (m := _file_map(a)) is not None}.values())


def _drop_pages(m: mmap.mmap) -> None:
    if hasattr(mmap, "MADV_DONTNEED"):   # not on every OS; where absent, the pages stay
        m.madvise(mmap.MADV_DONTNEED)


class NonFiniteWeightsWarning(UserWarning):
    """Weights that hold NaN or Inf; ``tensors`` lists each one and its counts."""

    def __init__(self, message: str, tensors: list[str]):
        super().__init__(message)
        self.tensors = tensors


def _safetensors_header(path: str):
    """(name, header entry, where the data begins) for each tensor of a
    ``.safetensors`` file, once the safetensors library has checked its
    header and offsets."""
    from safetensors import safe_open
    if not os.path.isfile(path):
        raise WeightsError(f"weights file {path!r} not found")
    try:
        with safe_open(path, framework="numpy"):   # the library's own checks of the header and the offsets
            pass
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
    except Exception as e:   # a bad header: safetensors' own error says what is wrong with it
        raise WeightsError(f"cannot read weights from {path!r}: {type(e).__name__}: {e}") from None
    return [(name, entry, 8 + size) for name, entry in header.items() if name != "__metadata__"], st


def non_finite_weights(weights: Mapping[str, np.ndarray]) -> list[str]:
    """``"'name': 3 NaN, 1 +Inf of 64 values"`` for every float tensor holding non-finite values."""
    found = []
    for name in weights:
        a = np.asarray(weights[name])
        if not is_float_numpy(a.dtype) and a.dtype.kind not in "fc":
            continue
        if a.dtype.kind == "V":
            a = a.astype(np.float32)  # bfloat16 & co.: numpy's isnan needs a type it knows
        bad = ~np.isfinite(a)
        if not bad.any():
            continue
        counts = [(int(np.isnan(a).sum()), "NaN"), (int(np.isposinf(a).sum()), "+Inf"),
                  (int(np.isneginf(a).sum()), "-Inf")]
        found.append(f"{name!r}: {', '.join(f'{n} {what}' for n, what in counts if n)} of {a.size} values")
    return found


def load_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a ``.safetensors`` or ``.npz`` weights file into ``{name: array}``.

    Tensors holding NaN or Inf are loaded, with a ``NonFiniteWeightsWarning``
    that names them (see the module docstring)."""
    path = os.fspath(path)
    fmt = _format_of(path)
    if not os.path.isfile(path):
        raise WeightsError(f"weights file {path!r} not found")
    try:
        files = SafetensorsFiles([path]) if fmt == ".safetensors" else None
        weights = materialize(files) if files is not None else _read_npz(path)
    except WeightsError:
        raise
    except Exception as e:
        raise WeightsError(f"cannot read weights from {path!r}: {type(e).__name__}: {e}") from e
    bad = non_finite_weights(weights)
    if files is not None:
        files.release_pages()
    if bad:
        shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
        warnings.warn(NonFiniteWeightsWarning(
            f"{path}: {len(bad)} of {len(weights)} weight tensors hold non-finite values ({shown}); "
            f"outputs computed from them will not be finite", bad), stacklevel=2)
    return weights


def _read_npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        out = {name: z[name] for name in z.files}
    special = json.loads(str(out.pop(_NPZ_DTYPES_KEY, "{}")))
    for name, dtype_name in special.items():
        try:
            dtype = DType.parse(dtype_name).numpy
        except KeyError:
            raise WeightsError(f"{path!r}: {name!r} has unknown dtype {dtype_name!r}") from None
        out[name] = out[name].view(dtype)
    return out


# -- checking ---------------------------------------------------------------------
def expected_params(model_or_graph) -> dict[str, tuple[tuple, DType]]:
    """``{name: (shape, dtype)}`` of the parameters of a model or a graph."""
    if isinstance(model_or_graph, Graph):
        out = {}
        for name, v in model_or_graph.params.items():
            try:
                shape = v.type.concrete_shape({})
            except Exception:
                raise WeightsError(f"parameter {name!r} has a symbolic shape {v.type}") from None
            out[name] = (shape, v.dtype)
        return out
    if not hasattr(model_or_graph, "named_parameters"):
        raise WeightsError(f"cannot check weights against a {type(model_or_graph).__name__}: "
                           f"pass a blockc Model, Module or Graph")
    model_dtype = getattr(model_or_graph, "dtype", DType.float32)
    if isinstance(model_dtype, str):
        model_dtype = DType.parse(model_dtype)
    return {name: (tuple(p.shape), p.dtype or model_dtype) for name, p in model_or_graph.named_parameters()}


def check_weights(model_or_graph, weights: Mapping[str, np.ndarray], *, strict: bool = True,
                  cast: bool = False) -> Mapping[str, np.ndarray]:
    """Check ``weights`` against a model's ``named_parameters()`` or a graph's
    ``params``: names, shapes and dtypes.

    Every problem is collected and reported in one ``WeightsError`` (its
    ``problems`` attribute holds them as a list of strings): missing names,
    names the model does not have (only when ``strict``), wrong shapes, wrong
    dtypes. A float array of another float dtype is an error unless ``cast``
    is true; then it is cast, provided no finite value overflows.

    Returns ``weights`` itself, or with ``cast=True`` a new ``dict`` holding
    the cast arrays (and the others unchanged).
    """
    expected = expected_params(model_or_graph)
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected] if strict else []
    # A file's names are anyone's text: shown escaped (printable), one per line.
    problems = [f"missing: {printable(name)} ({_fmt_type(*expected[name])})" for name in missing]
    problems += [f"unexpected: {printable(name)}" for name in unexpected]
    checked: dict[str, np.ndarray] = {}  # what cast=True returns, so a lazy mapping is made once
    for name, (shape, dtype) in expected.items():
        if name not in weights:
            continue
        a = checked[name] = np.asarray(weights[name])
        if tuple(a.shape) != shape:
            problems.append(f"shape: {printable(name)} is {list(a.shape)}, expected {list(shape)}")
        if a.dtype == dtype.numpy:
            continue
        try:
            got = DType.from_numpy(a.dtype)
        except KeyError:
            got = None
        if cast and got is not None and got.is_float and dtype.is_float:
            with np.errstate(over="ignore"):
                converted = a.astype(dtype.numpy)
            if np.isfinite(a.astype(np.float64)).sum() != np.isfinite(converted.astype(np.float64)).sum():
                problems.append(f"dtype: {printable(name)} overflows when cast from {got.name} to {dtype.name}")
            else:
                checked[name] = converted
        else:
            hint = " (pass cast=True to cast it)" if got is not None and got.is_float and dtype.is_float else ""
            problems.append(f"dtype: {printable(name)} is {got.name if got else a.dtype}, expected {dtype.name}{hint}")
    problems += _fixed_problems(model_or_graph, checked)
    if problems:
        what = getattr(model_or_graph, "name", type(model_or_graph).__name__)
        err = WeightsError(f"weights do not match {what!r} ({len(problems)} problem"
                           f"{'s' if len(problems) != 1 else ''}):\n  " + "\n  ".join(problems))
        err.problems = problems
        raise err
    if not cast:
        return weights
    return {name: checked[name] if name in checked else weights[name] for name in weights}


def _fixed_problems(model_or_graph, given: Mapping[str, np.ndarray]) -> list[str]:
    """Fixed parameters (``Parameter.fixed``: made from the model's settings)
    given values other than those the model makes. A graph does not know
    which are fixed; its model is checked where the weights are loaded."""
    if isinstance(model_or_graph, Graph):
        return []
    problems = []
    for name, p in model_or_graph.named_parameters():
        a = given.get(name)
        if not p.fixed or a is None or a.shape != p.shape or a.dtype.kind != "f":
            continue
        made = p.make(name, 0, DType.from_numpy(a.dtype))
        if not np.allclose(a.astype(np.float64), made.astype(np.float64), rtol=1e-3, atol=1e-3):
            problems.append(f"fixed: {printable(name)} differs from the table the model's settings make (at most "
                            f"{float(np.max(np.abs(a.astype(np.float64) - made))):.3g} apart); it is made, not "
                            f"read: change the settings (rope_theta, rotary_dim, rope_form) instead")
    return problems


def _fmt_type(shape: tuple, dtype: DType) -> str:
    return f"{dtype.short}[{','.join(str(d) for d in shape)}]"
