"""Reading an ONNX file as untrusted input.

An ONNX file is data anyone can write, so nothing in it is believed before it
is checked: its size before it is parsed (protobuf caps a message at 2 GiB
and its own recursion limit refuses deep nesting), every tensor's claimed
shape against the bytes it really holds before anything is allocated, every
external-data ``location`` against the model's folder (absolute paths,
``..`` and symlinks leading out are refused) and its offset and length
against the data file, and the graph's structure (an input no one defines, a
cycle) before it is walked (a local function's body is checked alike when it
is inlined: ``functions.py``). ``onnx.load`` is never called: it would follow
any location it is given.

Every refusal is an ``OnnxFileError`` of one line naming the file and the
problem; names from the file are labels, shown escaped and shortened.
"""
from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from ...errors import OnnxFileError, printable
from ...files import format_bytes
from ...ir.types import size_problem
from ..module import available_memory

# protobuf cannot hold a message of 2 GiB or more; such a model keeps its
# weights as external data.
MAX_PROTO_BYTES = 2**31 - 1
# How much of a name from the file a message shows (a name may be 10,000
# characters long).
LABEL_CHARS = 60

# The repeated field that holds a tensor's values when it has no raw_data
# (onnx.proto: "For float16/bfloat16/int8/uint8/int16/uint16/bool, int32_data").
_TYPED_FIELD = {
    TensorProto.FLOAT: "float_data", TensorProto.DOUBLE: "double_data", TensorProto.INT64: "int64_data",
    TensorProto.UINT64: "uint64_data", TensorProto.UINT32: "uint64_data",
}


def label(name: str) -> str:
    """A name from the file as a message shows it: escaped, quoted, shortened."""
    text = printable(name)
    if len(text) > LABEL_CHARS:
        text = text[:LABEL_CHARS] + f"... ({len(name):,} characters)"
    return f"'{text}'"


def node_label(node) -> str:
    """How a message names a node: its name, else its first output, else its op type."""
    return label(node.name or (list(node.output) or [node.op_type])[0])


def element_type_name(code: int) -> str:
    """An ONNX element type code as its name (``FLOAT8E4M3FN``), or the code where unknown."""
    return TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else str(code)


@dataclass
class OnnxFile:
    """A checked ONNX model: its proto (initializers' data not yet decoded),
    the value of every initializer (an ``ExternalTensor`` for one kept as
    external data, read when asked: ``array``), and its nodes in an order
    that defines each value before its use."""

    path: str
    model: onnx.ModelProto
    initializers: dict[str, "np.ndarray | ExternalTensor"]
    nodes: list = field(default_factory=list)

    def error(self, message: str) -> OnnxFileError:
        return OnnxFileError(f"{self.path}: {message}")

    def array(self, name: str) -> np.ndarray:
        """Initializer ``name``'s values, its external data read now."""
        value = self.initializers[name]
        return value.read() if isinstance(value, ExternalTensor) else value


@dataclass(frozen=True)
class ExternalTensor:
    """An initializer kept as external data, its location, shape and length
    checked, its bytes not yet read: what needs no values (``blockc
    summary``, a file run with ``--weights``) reads none, and a file
    exported with ``--no-weights``, whose data file does not exist yet, is
    refused only where its values are needed (``missing``: why they cannot be read)."""

    loaded: OnnxFile = field(repr=False)
    where: str
    shape: tuple
    dtype: np.dtype
    path: str | None
    offset: int
    missing: str | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def read(self) -> np.ndarray:
        """The values, refused where the data file is missing or they cannot fit in memory."""
        if self.missing:
            raise self.loaded.error(f"{self.where}: {self.missing}")
        nbytes, have = self.size * self.dtype.itemsize, available_memory()
        if have is not None and nbytes > have:
            raise self.loaded.error(f"{self.where}: its external data takes {format_bytes(nbytes)}, more than "
                                    f"the {format_bytes(have)} of memory available")
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            raw = f.read(nbytes)
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.shape)


def read_onnx(path: str | os.PathLike) -> OnnxFile:
    """Read and check the ONNX model at ``path``: its external data checked
    where it exists, read only when its values are asked for (``OnnxFile.array``)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise OnnxFileError(f"ONNX file {path!r} not found" if not os.path.exists(path)
                            else f"{path}: not a file")
    size = os.path.getsize(path)
    have = available_memory()
    if size > MAX_PROTO_BYTES:
        raise OnnxFileError(f"{path}: {format_bytes(size)} is more than an ONNX protobuf can hold (2 GiB); "
                            f"a model this large keeps its weights as external data")
    if have is not None and 3 * size > have:  # the bytes, the parsed message, the arrays made from it
        raise OnnxFileError(f"{path}: reading {format_bytes(size)} would need more than the "
                            f"{format_bytes(have)} of memory available")
    with open(path, "rb") as f:
        data = f.read()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError) as e:
        raise OnnxFileError(f"{path}: not a valid ONNX file (truncated or malformed protobuf: "
                            f"{printable(str(e)) or type(e).__name__})") from None
    del data
    loaded = OnnxFile(path, model, {})
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise loaded.error("not a valid ONNX file: it holds no graph (truncated, or not ONNX)")
    folder = os.path.dirname(os.path.abspath(path))
    for t in model.graph.initializer:
        where = f"initializer {label(t.name)}"
        external = t.data_location == TensorProto.EXTERNAL
        loaded.initializers[t.name] = (external_tensor(loaded, t, folder, where) if external
                                       else tensor_array(loaded, t, folder, where))
    if model.graph.sparse_initializer:
        raise loaded.error("sparse initializers are not supported")
    loaded.nodes = _ordered_nodes(loaded)
    return loaded


def _external_info(loaded: OnnxFile, t: TensorProto, where: str) -> tuple[str, int, int | None]:
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    try:
        offset = int(info.get("offset", "0") or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise loaded.error(f"{where}: external data offset/length {printable(info.get('offset', ''))!r}/"
                           f"{printable(info.get('length', ''))!r} are not integers") from None
    if offset < 0 or (length is not None and length < 0):
        raise loaded.error(f"{where}: external data offset {offset} or length {length} is negative")
    return location, offset, length


def _external_path(loaded: OnnxFile, location: str, folder: str, where: str) -> str | None:
    """The data file ``location`` names, refused unless it lies in the model's
    folder; None where no such file is there."""
    if not location:
        raise loaded.error(f"{where}: external data names no location")
    if "\x00" in location:
        raise loaded.error(f"{where}: external data location {label(location)} holds a NUL character")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or os.path.splitdrive(location)[0]:
        raise loaded.error(f"{where}: external data location {label(location)} is an absolute path; "
                           f"it must be relative to the model's folder")
    norm = os.path.normpath(location)
    if norm == os.pardir or norm.startswith(os.pardir + os.sep):
        raise loaded.error(f"{where}: external data location {label(location)} climbs out of the model's folder")
    full = os.path.join(folder, norm)
    real, root = os.path.realpath(full), os.path.realpath(folder)
    if not real.startswith(root + os.sep):
        raise loaded.error(f"{where}: external data location {label(location)} is a link pointing out of the "
                           f"model's folder")
    return real if os.path.isfile(real) else None


def _claimed(loaded: OnnxFile, t: TensorProto, where: str) -> tuple[tuple, np.dtype, int]:
    """``(shape, numpy dtype, bytes)`` the tensor claims, refused when impossible."""
    dims = tuple(int(d) for d in t.dims)
    if any(d < 0 for d in dims):
        raise loaded.error(f"{where}: negative dimension in shape {list(dims)}")
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise loaded.error(f"{where}: element type {TensorProto.DataType.Name(t.data_type)} is not supported")
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
    except (KeyError, ValueError, TypeError):
        raise loaded.error(f"{where}: unknown element type {t.data_type}") from None
    too_big = size_problem(dims)
    if too_big:
        raise loaded.error(f"{where}: shape {list(dims)} {too_big}")
    return dims, dtype, math.prod(dims) * dtype.itemsize


def tensor_array(loaded: OnnxFile, t: TensorProto, folder: str, where: str) -> np.ndarray:
    """The value of ``t``, after checking that the file holds every byte its
    shape claims (nothing is allocated for data that is not there)."""
    if t.data_location == TensorProto.EXTERNAL:
        return external_tensor(loaded, t, folder, where).read()
    dims, dtype, nbytes = _claimed(loaded, t, where)
    if t.HasField("raw_data"):
        if len(t.raw_data) != nbytes:
            raise loaded.error(f"{where}: shape {list(dims)} of {dtype} needs {nbytes:,} bytes, but the file holds "
                               f"{len(t.raw_data):,}")
        return np.frombuffer(t.raw_data, dtype=dtype).reshape(dims)
    held = len(getattr(t, _TYPED_FIELD.get(t.data_type, "int32_data")))
    if held != nbytes // dtype.itemsize:
        raise loaded.error(f"{where}: shape {list(dims)} claims {nbytes // dtype.itemsize:,} values, but the file "
                           f"holds {held:,}")
    return onnx.numpy_helper.to_array(t)


def external_tensor(loaded: OnnxFile, t: TensorProto, folder: str, where: str) -> ExternalTensor:
    """External tensor ``t``, checked but not read: its location lies in the
    model's folder, and the data file, where it exists, holds every byte its
    shape claims."""
    dims, dtype, nbytes = _claimed(loaded, t, where)
    location, offset, length = _external_info(loaded, t, where)
    if length is not None and length != nbytes:
        raise loaded.error(f"{where}: shape {list(dims)} of {dtype} needs {nbytes:,} bytes, but its external "
                           f"data has length {length:,}")
    real = _external_path(loaded, location, folder, where)
    if real is None:
        return ExternalTensor(loaded, where, dims, dtype, None, offset,
                              f"external data file {label(location)} not found beside the model (give the "
                              f"weights with --weights FILE)")
    size, end = os.path.getsize(real), offset + nbytes
    if offset > size or end > size:
        raise loaded.error(f"{where}: external data [{offset}, {end}) runs past the end of {label(location)} "
                           f"({size:,} bytes)")
    return ExternalTensor(loaded, where, dims, dtype, real, offset)


def _ordered_nodes(loaded: OnnxFile) -> list:
    """The graph's nodes, each after the nodes defining its inputs; refuses an
    input that nothing defines, a value defined twice, and a cycle."""
    g = loaded.model.graph
    order = order_nodes(loaded, list(g.node), [v.name for v in g.input] + [t.name for t in g.initializer])
    defined = set(loaded.initializers) | {v.name for v in g.input} | {o for n in g.node for o in n.output}
    for o in g.output:
        if o.name not in defined:
            raise loaded.error(f"graph output {label(o.name)} is not defined by any node or input")
    return order


def order_nodes(loaded: OnnxFile, nodes: list, given, function: str | None = None) -> list:
    """``nodes``, each after the nodes defining its inputs, where the names
    ``given`` are defined before any node: the graph's (its inputs and
    initializers), or with ``function`` (its name, as a label) a local
    function's body (its inputs). Refuses an input that nothing defines, a
    value defined twice, and a cycle, naming the function where there is one."""
    where = f"function {function}: " if function else ""
    sources = "none of its inputs or nodes defines" if function else "no input, initializer or node defines"
    defined: dict[str, int | None] = {name: None for name in given}
    for i, n in enumerate(nodes):
        for o in n.output:
            if not o:
                continue
            if o in defined:
                raise loaded.error(f"{where}value {label(o)} is defined twice (node {i}, {label(n.op_type)})")
            defined[o] = i
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            if not name:
                continue  # an omitted optional input
            if name not in defined:
                raise loaded.error(f"{where}node {i} ({label(n.op_type)}) reads {label(name)}, which {sources}")
            src = defined[name]
            if src is not None:
                waiting[i] += 1
                users.setdefault(src, []).append(i)
    # Kahn's algorithm, taking the lowest index first: the file's own order
    # wherever it is already topological.
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        i = next(i for i, w in enumerate(waiting) if w > 0)
        stuck = nodes[i]
        raise loaded.error(f"{where}{'its body' if function else 'the graph'} has a cycle (through node {i}, "
                           f"{label(stuck.op_type)} {label(stuck.name or (list(stuck.output) or [''])[0])})")
    return [nodes[i] for i in order]
