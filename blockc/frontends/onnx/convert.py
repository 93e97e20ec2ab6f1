"""The ONNX operators blockc imports: one table from op type to the function
that replays a node through the DSL.

A value met while walking the graph is one of three things:

* a ``Tensor`` of the graph being traced (the model's real computation);
* a numpy array known now (initializer constants, ``Constant`` nodes and
  everything computed from them only): folded here, never in the IR;
* a numpy *object* array holding symbolic dims (``ir/dims.py`` ``Sym``s):
  ``Shape`` of an input yields ``[batch, sequence]``, and the exporter's
  shape arithmetic on it (Gather, Concat, Unsqueeze, Mul...) is folded on
  the ``Sym`` objects, so a ``Reshape`` receives ``[batch, sequence, 4, 8]``
  and stays symbolic.

Each entry folds when every input is known and otherwise emits blockc ops.
It folds with the numpy rule of the blockc op it would emit (``_fold``,
``ops/evaluate.fold``): one meaning for each op, whether an ONNX file's
constants are folded at import or the same values are computed at run time.
An operator a handler cannot express raises ``Unsupported`` with the reason,
and so does a node ONNX itself refuses (an axis out of range or named twice:
``in_range``, ``axes_in_range``), never wrapped into an answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from onnx import helper

from ...errors import BlockcError
from ...ir.dims import Sym
from ...ir.dtypes import DType
from ...ops.evaluate import fold
from ..tensor import Tensor, apply, _apply
from .safe_load import element_type_name

INT64_MAX = 2**63 - 1
# The newest ai.onnx opset a rule claims by default. Opsets 25 to 28 changed
# no operator in the table except to admit new element types (int2, uint2,
# float6, which blockc refuses by type; Range-27 float16 and bfloat16,
# computed in its stash_type, float32) and to give Attention sliding windows
# (25), which its rule refuses by name.
NEWEST_OPSET = 28


class Unsupported(BlockcError):
    """A node this importer cannot express; the model names it."""


# Ops that move or retype a value's elements without computing new ones: what a
# walk back to the constants or dims a value was made from may pass through.
MOVES = ("expand", "reshape", "transpose", "cast")


def input_at(ins, i: int):
    """The node's ``i``-th input, or None where the node gives none (an
    optional input left out, or named as ``""``)."""
    return ins[i] if len(ins) > i else None


def is_tensor(v) -> bool:
    return isinstance(v, Tensor)


def is_symbolic(v) -> bool:
    return isinstance(v, np.ndarray) and v.dtype == object


def dims_of(v) -> list:
    """A known 1-D value as a list of dims (Python ints and ``Sym``s)."""
    if is_tensor(v):
        raise Unsupported("a shape computed at run time (blockc needs shapes known when the graph is built)")
    return [d if isinstance(d, Sym) else int(d) for d in np.asarray(v).reshape(-1)]


def ints_of(v) -> list[int]:
    out = dims_of(v)
    if any(isinstance(d, Sym) for d in out):
        raise Unsupported(f"needs constant integers, got {[str(d) for d in out]}")
    return out


def tensor(v, like: Tensor | None = None) -> Tensor:
    """``v`` as a tensor of the traced graph: known arrays become constants
    (in ``like``'s dtype, where given), symbolic dims ``dim_value`` nodes."""
    if is_tensor(v):
        return v
    if is_symbolic(v):
        if v.ndim == 0:
            d = v.item()
            return apply("dim_value", value=d) if isinstance(d, Sym) else tensor(np.array(int(d), np.int64))
        parts = [apply("reshape", tensor(np.array(d, dtype=object)), shape=[1]) for d in v.reshape(-1)]
        flat = parts[0] if len(parts) == 1 else _apply("concat", parts, axis=0)[0]
        return apply("reshape", flat, shape=list(v.shape)) if v.ndim != 1 else flat
    arr = np.asarray(v)
    if like is not None and arr.dtype != like.dtype.numpy and arr.size == 1:
        arr = arr.astype(like.dtype.numpy)   # a scalar written in another width (0 vs 0.0)
    try:
        DType.from_numpy(arr.dtype)
    except KeyError:
        raise Unsupported(f"element type {arr.dtype} is not supported by blockc") from None
    return apply("constant", value=arr)


def as_value(v):
    """A node's result as the importer keeps it: numpy gives a bare element
    (an int, a ``Sym``) for a 0-d result, and every known value is an array."""
    if is_tensor(v) or isinstance(v, np.ndarray):
        return v
    return np.array(v, dtype=object if isinstance(v, Sym) else None)


def _known(v) -> np.ndarray:
    """A known value for numpy folding; object arrays of plain ints become int64."""
    if is_symbolic(v) and not any(isinstance(d, Sym) for d in v.reshape(-1)):
        return v.astype(np.int64)
    return v


def _fold(ir_op: str, *ins, **attrs):
    """``ir_op`` on known values, computed now by its own numpy rule (its
    first result): the import folds each op as the graph would run it."""
    return as_value(fold(ir_op, [np.asarray(_known(v)) for v in ins], attrs)[0])


def _shape_of(v) -> list:
    return list(v.shape) if is_tensor(v) else list(np.shape(v))


def _reshaped(v, shape: list):
    return v.reshape(shape) if is_tensor(v) else _fold("reshape", v, shape=shape)


def _int_array(values) -> np.ndarray:
    """Dims as an array: int64 when all are known, else an object array."""
    values = list(values)
    if any(isinstance(d, Sym) for d in values):
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr
    return np.array(values, dtype=np.int64)


def _operands(ins):
    """Known operands as tensors beside the first tensor operand (in its dtype)."""
    like = next(v for v in ins if is_tensor(v))
    return [tensor(v, like) for v in ins]


def _attr(node, name, default=None):
    a = node.attrs.get(name)
    if a is None:
        return default
    v = helper.get_attribute_value(a)
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def in_range(what: str, axis: int, rank: int, *, end: bool = False) -> int:
    """``axis`` (``what`` names the attribute or input that gave it) as an
    index in ``[0, rank)``, or ``[0, rank]`` where ``end`` (Flatten's may be
    the end). One outside is refused, never wrapped: ONNX Runtime refuses
    such a file, and an answer to it would be a silent wrong one."""
    top = rank if end else rank - 1
    if not -rank <= axis <= top:
        raise Unsupported(f"{what} {axis} is out of range for a rank-{rank} tensor (ONNX takes {-rank} to {top})")
    return axis + rank if axis < 0 else axis


def axes_in_range(what: str, axes, rank: int, *, repeats: bool = False) -> list[int]:
    """Each of ``axes`` as ``in_range`` takes it. An axis named twice is
    refused, unless ``repeats`` (the axes are a set, as Squeeze's and the
    reductions' are to ONNX Runtime): then they come back once each, sorted."""
    axes = list(axes)
    out = [in_range(f"{what} {axes}: axis", a, rank) for a in axes]
    if repeats:
        return sorted(set(out))
    twice = [a for a in out if out.count(a) > 1]
    if twice:
        raise Unsupported(f"{what} {axes} names axis {twice[0]} twice (ONNX takes each axis once)")
    return out


def axis_of(node, rank: int, default: int = -1, *, end: bool = False) -> int:
    """The node's ``axis`` attribute as ``in_range`` takes it."""
    return in_range("attribute axis", _attr(node, "axis", default), rank, end=end)


@dataclass(frozen=True)
class Rule:
    """How one ONNX op type is imported, for opsets ``since`` to ``until``."""

    fn: Callable
    since: int = 1
    until: int = NEWEST_OPSET


def _refuse_axis_broadcast(node):
    if _attr(node, "axis") is not None:   # before opset 7, B could be aligned at an axis, not at the end
        raise Unsupported(f"{node.op_type} broadcasting along axis {_attr(node, 'axis')} (opset < 7)")


def _elementwise(ir_op: str):
    def run(node, ins, ctx):
        _refuse_axis_broadcast(node)
        if not any(is_tensor(v) for v in ins):
            return [_fold(ir_op, *ins)]
        return [apply(ir_op, *_operands(ins))]
    return Rule(run)


def _pow(node, ins, ctx):
    _refuse_axis_broadcast(node)
    base, exponent = ins
    # Pow's exponent has its own type (T1); the result has the base's
    if not is_tensor(base) and not is_tensor(exponent):
        if np.asarray(base).dtype != np.asarray(exponent).dtype:
            exponent = _fold("cast", exponent, to=DType.from_numpy(np.asarray(base).dtype).name)
        return [_fold("pow", base, exponent)]
    if is_tensor(base) and not is_tensor(exponent) and base.dtype.is_float:
        exponent = np.asarray(_known(exponent)).astype(base.dtype.numpy)
    elif is_tensor(base) and is_tensor(exponent) and base.dtype != exponent.dtype:
        if not base.dtype.is_float:
            raise Unsupported(f"Pow of a {base.dtype.name} base with a {exponent.dtype.name} exponent")
        exponent = exponent.cast(base.dtype)
    return [apply("pow", *_operands([base, exponent]))]


def _isnan(node, ins, ctx):
    (x,) = ins
    if not is_tensor(x):
        return [_fold("logical_not", _fold("equal", x, x))]
    return [apply("logical_not", apply("equal", x, x))]


def _cast(node, ins, ctx):
    to = DType.from_onnx(_attr(node, "to")) if _attr(node, "to") in [d.onnx_code for d in DType] else None
    (x,) = ins
    if to is None:
        raise Unsupported(f"Cast to element type {element_type_name(_attr(node, 'to'))} is not supported by blockc")
    if is_symbolic(x) and to in (DType.int64, DType.int32):
        return [x]
    if not is_tensor(x):
        return [_fold("cast", x, to=to.name)]
    return [x if x.dtype == to else x.cast(to)]


def _identity(node, ins, ctx):
    return [ins[0]]


def _dropout(node, ins, ctx):
    x = ins[0]
    ratio = _scalar(ins[1]) if len(ins) > 1 and ins[1] is not None else _attr(node, "ratio", 0.5)
    # opset 12 takes the mode as an input; before opset 7 an is_test attribute said it (training by default)
    training = ins[2] if len(ins) > 2 and ins[2] is not None else node.opset < 7 and not _attr(node, "is_test", 0)
    if is_tensor(training) or is_tensor(ratio):
        raise Unsupported("Dropout whose ratio or training mode is computed at run time")
    if bool(_scalar(training)) and float(ratio) != 0.0:
        raise Unsupported("Dropout in training mode (it draws random numbers)")
    shape = list(x.shape) if is_tensor(x) else list(np.shape(x))
    if not is_tensor(x) or all(isinstance(d, int) for d in shape):
        return [x, np.ones(shape, dtype=bool)]
    return [x, apply("expand", tensor(np.array(True)), shape=shape)]


def _shape(node, ins, ctx):
    (x,) = ins
    shape = list(x.shape) if is_tensor(x) else list(np.shape(x))
    start, end = _attr(node, "start", 0), _attr(node, "end", None)
    return [_int_array(shape[start:end])]


def _gather(node, ins, ctx):
    data, idx = ins
    axis = axis_of(node, len(_shape_of(data)), 0)
    n = _shape_of(data)[axis]
    if not is_tensor(idx) and isinstance(n, int):
        outside = [int(i) for i in np.asarray(_known(idx)).reshape(-1) if not -n <= i < n]
        if outside:   # known now: refused now, as every backend's gather would refuse it when run
            raise Unsupported(f"input indices: index {outside[0]} is out of range for axis {axis}, of size {n} "
                              f"(ONNX takes {-n} to {n - 1})")
    if not is_tensor(data) and not is_tensor(idx):
        return [_fold("gather", data, idx, axis=axis)]
    if not is_tensor(idx) and np.asarray(idx).ndim == 0 and is_tensor(data):
        # one slice of a tensor: slice + reshape is what the fusions read
        i = int(idx) + n if int(idx) < 0 else int(idx)
        picked = data.slice(axis, i, i + 1)
        return [picked.reshape([d for k, d in enumerate(picked.shape) if k != axis])]
    return [apply("gather", tensor(data), tensor(idx), axis=axis)]


def _gather_elements(node, ins, ctx):
    # out[p] = data[p with p[axis] replaced by idx[p]]: idx's own coordinates on
    # the other axes (HF BERT's default token types: a buffer expanded to the
    # batch, read at the positions). Known values too are gathered so (the
    # graph's constant folding folds them): one meaning, the gathers'.
    data, idx = (tensor(v) for v in ins)
    rank = data.ndim
    axis = axis_of(node, rank, 0)
    if idx.ndim != rank:
        raise Unsupported(f"GatherElements with rank-{idx.ndim} indices into a rank-{rank} tensor")
    for d, (n, m) in enumerate(zip(idx.shape, data.shape)):
        if d != axis and n != m and not (isinstance(n, int) and isinstance(m, int) and n <= m):
            raise Unsupported(f"GatherElements with indices {n} long on axis {d}, where the data is {m}")
    if idx.dtype != DType.int64:
        idx = idx.cast(DType.int64)
    coords = [idx if d == axis else _iota(n, d, rank) for d, n in enumerate(idx.shape)]
    # idx's own coordinates lie inside data's (checked above): only the axis's can fall outside
    return [_gather_at(data, coords, wraps=[d == axis for d in range(rank)], checked=[d == axis for d in range(rank)])]


def _iota(n, axis: int, rank: int) -> Tensor:
    """0, 1, ..., n-1 along ``axis`` of a rank-``rank`` tensor, 1 long on every other axis."""
    values = tensor(np.arange(n, dtype=np.int64)) if isinstance(n, int) else apply("arange", n=n)
    return values.reshape([1] * axis + [n] + [1] * (rank - axis - 1)) if rank > 1 else values


def _gather_at(data: Tensor, coords: list[Tensor], wraps: list[bool], checked: list[bool]) -> Tensor:
    """``data[coords[0], ..., coords[k-1]]``, the index tensors broadcast
    together over data's first k axes: one row-major offset into those axes,
    then a gather along them flattened. A ``wraps`` coordinate may be negative,
    counted from the end as ONNX's indices are. A ``checked`` coordinate may
    lie outside its own axis: ONNX Runtime refuses that, and a flattened
    offset would read another row instead, so such an offset is made one past
    the flattened rows, where every backend's gather refuses it (``ops/tensor``)."""
    lead, offset, outside = data.shape[:len(coords)], None, None
    for i, (col, n) in enumerate(zip(coords, lead)):
        if wraps[i]:
            negative = apply("less", col, tensor(np.array(0, col.dtype.numpy)))
            col = apply("where", negative, col + tensor(_dim_array(n), col), col)
        if checked[i]:
            bad = apply("logical_or", apply("less", col, tensor(np.array(0, col.dtype.numpy))),
                        apply("greater_equal", col, tensor(_dim_array(n), col)))
            outside = bad if outside is None else apply("logical_or", outside, bad)
        stride = 1
        for d in lead[i + 1:]:
            stride = d * stride
        term = col if isinstance(stride, int) and stride == 1 else col * tensor(_dim_array(stride), col)
        offset = term if offset is None else offset + term
    rows = 1
    for d in lead:
        rows = d * rows
    if outside is not None:
        offset = apply("where", outside, tensor(_dim_array(rows), offset), offset)
    return apply("gather", data.reshape([rows, *data.shape[len(coords):]]), offset, axis=0)


def _gather_nd(node, ins, ctx):
    data, idx = ins
    if _attr(node, "batch_dims", 0):
        raise Unsupported(f"GatherND with batch_dims={_attr(node, 'batch_dims')}")
    # torch's advanced indexing (HF's padding mask read as mask[batch_ids, kv_ids]):
    # the k index columns are the coordinates of data's first k dims. Known
    # values too are gathered so (the graph's constant folding folds them).
    data, idx = tensor(data), tensor(idx)
    k = idx.shape[-1]
    if not isinstance(k, int) or k > data.ndim:
        raise Unsupported(f"GatherND with index tuples of length {k} into a rank-{data.ndim} tensor")
    cols = [idx.slice(idx.ndim - 1, i, i + 1).reshape(list(idx.shape[:-1])) for i in range(k)]
    return [_gather_at(data, cols, wraps=[True] * k, checked=[True] * k)]


def _dim_array(d) -> np.ndarray:
    """One dim as a 0-d value ``tensor`` turns into a constant or a ``dim_value``."""
    return np.array(d, dtype=object) if isinstance(d, Sym) else np.array(d, np.int64)


def _extremum(pick: str):
    """Max/Min of any number of operands: ``where(a pick b, a, b)`` pairwise."""
    def run(node, ins, ctx):
        if not any(is_tensor(v) for v in ins):
            out = ins[0]
            for v in ins[1:]:
                out = _fold("where", _fold(pick, out, v), out, v)
            return [out]
        out, *rest = _operands(ins)
        for v in rest:
            out = apply("where", apply(pick, out, v), out, v)
        return [out]
    return Rule(run)


def _given_axes(node, ins, position: int) -> tuple[list[int] | None, str]:
    """Axes from an input (newer opsets) or the ``axes`` attribute (older), and which gave them."""
    if len(ins) > position and ins[position] is not None:
        return ints_of(ins[position]), "input axes"
    axes = _attr(node, "axes")
    return (list(axes) if axes is not None else None), "attribute axes"


def _axes(node, ins, position: int, rank, *, repeats: bool = False) -> list[int] | None:
    """The given axes as ``axes_in_range`` takes them for a rank-``rank``
    tensor (a function of the axes' count, where that decides it:
    Unsqueeze's output rank)."""
    axes, what = _given_axes(node, ins, position)
    if axes is None:
        return None
    return axes_in_range(what, axes, rank(len(axes)) if callable(rank) else rank, repeats=repeats)


def _unsqueeze(node, ins, ctx):
    x = ins[0]
    shape = _shape_of(x)
    for a in sorted(_axes(node, ins, 1, lambda n: len(shape) + n) or []):
        shape.insert(a, 1)
    return [_reshaped(x, shape)]


def _squeeze(node, ins, ctx):
    x = ins[0]
    shape = _shape_of(x)
    axes = _axes(node, ins, 1, len(shape), repeats=True)
    for a in axes or []:
        if isinstance(shape[a], int) and shape[a] != 1:
            given, what = _given_axes(node, ins, 1)
            raise Unsupported(f"{what} {given}: axis {a} has size {shape[a]} (ONNX squeezes only axes of size 1)")
    drop = set(axes) if axes else {i for i, d in enumerate(shape) if d == 1}
    return [_reshaped(x, [d for i, d in enumerate(shape) if i not in drop])]


def _concat(node, ins, ctx):
    axis = _attr(node, "axis")
    if axis is None:   # opset 1 defaulted it to 1; opset 4 made it required
        raise Unsupported("Concat without an axis (opset < 4)")
    axis = axis_of(node, len(_shape_of(ins[0])))
    ins = [v for v in ins if not (not is_tensor(v) and 0 in np.shape(v))]   # empty pieces
    if not any(is_tensor(v) for v in ins):
        return [_known(_fold("concat", *ins, axis=axis))]
    return [_apply("concat", _operands(ins), axis=axis)[0]]


def _reshape(node, ins, ctx):
    x, shape = ins[0], dims_of(ins[1])
    if _attr(node, "allowzero", 0) and 0 in shape:
        raise Unsupported("Reshape with allowzero=1 and a 0 in the shape")
    return [_reshaped(x, shape)]


def _flatten(node, ins, ctx):
    (x,) = ins
    shape = _shape_of(x)
    axis = axis_of(node, len(shape), 1, end=True)
    outer, inner = 1, 1
    for d in shape[:axis]:
        outer = d * outer
    for d in shape[axis:]:
        inner = d * inner
    return [_reshaped(x, [outer, inner])]


def _transpose(node, ins, ctx):
    (x,) = ins
    rank = x.ndim if is_tensor(x) else np.ndim(x)
    perm = list(_attr(node, "perm", list(range(rank))[::-1]))
    return [x.permute(perm) if is_tensor(x) else _fold("transpose", x, perm=perm)]


def _expand(node, ins, ctx):
    x, shape = ins[0], dims_of(ins[1])
    if not is_tensor(x) and all(isinstance(d, int) for d in shape):
        return [_fold("expand", x, shape=shape)]
    return [apply("expand", tensor(x), shape=shape)]


def _scalar(v):
    """A known scalar (ONNX Runtime also takes a one-element tensor where a scalar is due)."""
    return np.asarray(v).reshape(-1)[0]


def _range(node, ins, ctx):
    if any(is_tensor(v) for v in ins):
        raise Unsupported("Range whose bounds are computed at run time")
    start, limit, delta = (_scalar(v) for v in ins)
    if not any(isinstance(v, Sym) for v in (start, limit, delta)):
        dtype = np.asarray(ins[0]).dtype
        stash = np.float32 if dtype.kind in "fV" and dtype.itemsize == 2 else dtype   # Range-27's stash_type
        return [np.arange(start, limit, delta, dtype=stash).astype(dtype)]
    if not isinstance(delta, Sym) and delta == 1:
        # a cache step's positions run from the past's length: Range(past, past + seq)
        start = start if isinstance(start, Sym) else int(start)
        out = apply("arange", n=limit - start)
        return [out if isinstance(start, int) and start == 0 else out + tensor(as_value(start))]
    raise Unsupported("Range whose step is computed at run time")


def _constant_of_shape(node, ins, ctx):
    shape = dims_of(ins[0])
    value = ctx.attr_tensor(node, "value")
    value = np.zeros(1, np.float32) if value is None else value
    if all(isinstance(d, int) for d in shape):
        return [_fold("expand", value.reshape(()), shape=shape)]
    return [apply("expand", tensor(value.reshape(())), shape=shape)]


def _constant(node, ins, ctx):
    for name, kind in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if kind is None:
            v = ctx.attr_tensor(node, name)
            if v is not None:
                return [v]
        elif _attr(node, name) is not None:
            return [np.array(_attr(node, name), kind)]
    raise Unsupported("Constant without a value, value_float(s) or value_int(s)")


def _slice_args(node, ins, rank: int):
    """Slice's starts, ends, axes (each in range, once) and steps (none 0), as many of each."""
    if len(ins) > 1:
        starts, ends, what = dims_of(ins[1]), dims_of(ins[2]), "input axes"
        axes, steps = (ints_of(ins[i]) if len(ins) > i and ins[i] is not None else None for i in (3, 4))
    else:   # Slice-1: attributes
        starts, ends, what = list(_attr(node, "starts")), list(_attr(node, "ends")), "attribute axes"
        axes, steps = _attr(node, "axes"), None
    axes = axes_in_range(what, range(len(starts)) if axes is None else axes, rank)
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Unsupported(f"{len(starts)} starts, {len(ends)} ends, {len(axes)} axes and {len(steps)} steps "
                          f"(ONNX takes as many of each)")
    if 0 in steps:
        raise Unsupported(f"steps {steps} hold a 0 (ONNX takes steps other than 0)")
    return starts, ends, axes, steps


def _slice(node, ins, ctx):
    x = ins[0]
    starts, ends, axes, steps = _slice_args(node, ins, len(_shape_of(x)))
    if not is_tensor(x) and any(isinstance(d, Sym) for d in starts + ends):
        x = tensor(x)   # a known table cut to a symbolic length (position ids [:seq]): sliced at run time
    if not is_tensor(x) and any(st != 1 for st in steps):
        index = [slice(None)] * np.ndim(x)   # known values taken with a step (a blockc slice has none)
        for s, e, a, st in zip(starts, ends, axes, steps):
            index[a] = _stepped(s, e, st, np.shape(x)[a])
        return [x[tuple(index)]]
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st != 1:
            raise Unsupported(f"Slice of a tensor with step {st}")
        n = _shape_of(x)[a]
        s, e = (_clamp(_from_end(d, n), n) for d in (s, e))
        if is_tensor(x) and not (s == 0 and e == n):
            x = x.slice(a, s, e)
        elif not is_tensor(x):
            x = _fold("slice", x, axis=a, start=s, end=max(s, e))   # ONNX's end before its start: nothing
    return [x]


def _stepped(start: int, end: int, step: int, n: int) -> slice:
    """Slice's bounds as ONNX clamps them, which is not as Python does for a
    negative step (``x[-3:-3:-1]`` of 2 elements is empty, ONNX's one element)."""
    start, end = (d + n if d < 0 else d for d in (start, end))
    if step > 0:
        return slice(min(max(start, 0), n), min(max(end, 0), n), step)
    end = min(max(end, -1), n - 1)
    return slice(min(max(start, 0), n - 1), end if end >= 0 else None, step)


def _from_end(d, n):
    return d + n if isinstance(d, int) and d < 0 else d


def _clamp(d, n):
    if isinstance(d, int):
        return max(0, min(d, n)) if isinstance(n, int) else (n if d >= INT64_MAX // 2 else max(0, d))
    return d


def _split(node, ins, ctx):
    x = ins[0]
    axis = axis_of(node, len(_shape_of(x)), 0)
    n = _shape_of(x)[axis]
    sizes = dims_of(ins[1]) if len(ins) > 1 and ins[1] is not None else _attr(node, "split")
    if sizes is None:
        parts = len(node.output)
        if not isinstance(n, int) or (n % parts and _attr(node, "num_outputs") is None):
            raise Unsupported(f"Split of {n} into {parts} equal parts")
        chunk = -(-n // parts)   # num_outputs (opset 18): parts of ceil(n / parts), the last one smaller
        sizes = [chunk] * (parts - 1) + [n - chunk * (parts - 1)]
    if not is_tensor(x):
        return fold("split", [np.asarray(_known(x))], {"axis": axis, "sizes": list(sizes)})
    return x.split(list(sizes), axis=axis)


def _matmul(node, ins, ctx):
    known = not any(is_tensor(v) for v in ins)
    a, b = ins if known else _operands(ins)
    if not _shape_of(a) or not _shape_of(b):
        raise Unsupported("MatMul of a scalar")
    # a 1-D operand is a row on the left or a column on the right, that axis dropped after (numpy's rule)
    drop = [k for k, vector in ((-2, len(_shape_of(a)) == 1), (-1, len(_shape_of(b)) == 1)) if vector]
    a = _reshaped(a, [1, _shape_of(a)[0]]) if len(_shape_of(a)) == 1 else a
    b = _reshaped(b, [_shape_of(b)[0], 1]) if len(_shape_of(b)) == 1 else b
    y = _fold("matmul", a, b) if known else apply("matmul", a, b)
    if drop:
        y = _reshaped(y, [d for k, d in enumerate(_shape_of(y)) if k - len(_shape_of(y)) not in drop])
    return [y]


def _gemm(node, ins, ctx):
    a, b, c = (list(ins) + [None])[:3]
    a, b = _operands([a, b])
    if _attr(node, "transA", 0):
        a = a.T
    if _attr(node, "transB", 0):
        b = b.T
    y = a @ b
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
    if alpha != 1.0:
        y = y * np.array(alpha, y.dtype.numpy)
    if c is not None and beta != 0.0:
        c = tensor(c, y)
        y = y + (c if beta == 1.0 else c * np.array(beta, y.dtype.numpy))
    return [y]


def _last_axis(node, x, default):
    if axis_of(node, x.ndim, default) != x.ndim - 1:
        raise Unsupported(f"{node.op_type} over axis {_attr(node, 'axis', default)} of a rank-{x.ndim} tensor "
                          f"(blockc's is the last axis)")


def _softmax(node, ins, ctx):
    (x,) = ins
    if node.opset < 13:   # before 13 Softmax ran over the axes from `axis` on, flattened: one axis only when last
        _last_axis(node, x, 1)
        return [x.softmax(-1)]
    axis = axis_of(node, x.ndim)
    if axis == x.ndim - 1:
        return [x.softmax(-1)]
    swap = list(range(x.ndim))
    swap[axis], swap[-1] = swap[-1], swap[axis]   # blockc's softmax is over the last axis; a swap undoes itself
    return [x.permute(swap).softmax(-1).permute(swap)]


def _layernorm(node, ins, ctx):
    x, gamma = ins[0], ins[1]
    eps = float(_attr(node, "epsilon", 1e-5))
    axis = axis_of(node, x.ndim)
    beta = ins[2] if len(ins) > 2 and ins[2] is not None else _zeros(list(x.shape[axis:]), x.dtype)
    stats = _layernorm_stats(node, x, axis, eps) if any(o and ctx.used(o) for o in node.output[1:]) else []
    return [normalize_from(axis, "layernorm", x, [gamma, beta], eps=eps), *stats]


def _zeros(shape: list, dtype: DType):
    """Zeros of ``shape`` (an omitted bias: blockc's norms take one of the normalized shape)."""
    if all(isinstance(d, int) for d in shape):
        return np.zeros(shape, dtype.numpy)
    return apply("expand", tensor(np.zeros((), dtype.numpy)), shape=shape)


def normalize_from(axis: int, ir_op: str, x, params, **attrs):
    """``ir_op`` (a norm over the last axis, with per-element ``params``) over
    every axis of ``x`` from ``axis`` on, as ONNX's normalizations mean it:
    blockc's norm over those axes flattened into one."""
    x = tensor(x)
    if axis == x.ndim - 1:
        return apply(ir_op, x, *[tensor(p, x) for p in params], **attrs)
    normalized = list(x.shape[axis:])
    inner = 1
    for d in normalized:
        inner = d * inner

    def flat(v):   # a parameter over the normalized axes, flattened as x is
        if is_tensor(v):
            return apply("expand", v, shape=normalized).reshape([inner])
        return np.broadcast_to(_known(v), [int(d) for d in normalized]).reshape(-1)

    y = apply(ir_op, x.reshape(list(x.shape[:axis]) + [inner]), *[tensor(flat(p), x) for p in params], **attrs)
    return y.reshape(list(x.shape))


def _layernorm_stats(node, x, axis, eps):
    """LayerNormalization's optional Mean and InvStdDev outputs (a training graph's), computed
    apart in its stash_type so that Y stays one layernorm for the fusions."""
    stash = DType.from_onnx(_attr(node, "stash_type", 1))
    xs = x if x.dtype == stash else x.cast(stash)
    axes = list(range(axis, x.ndim))
    mean = apply("reduce_mean", xs, axes=axes, keepdims=True)
    centered = xs - mean
    var = apply("reduce_mean", centered * centered, axes=axes, keepdims=True)
    return [mean, apply("reciprocal", apply("sqrt", var + np.array(eps, stash.numpy)))]


def _reduce(ir_op: str, axes_input_since: int):
    def run(node, ins, ctx):
        x = ins[0]
        rank = len(_shape_of(x))
        axes = _axes(node, ins if node.opset >= axes_input_since else ins[:1], 1, rank, repeats=True)
        if not axes and _attr(node, "noop_with_empty_axes", 0):
            return [x]   # no axes given and told so: the input unchanged, not a full reduction
        axes = axes or list(range(rank))
        keep = bool(_attr(node, "keepdims", 1))
        if not is_tensor(x):
            return [_fold(ir_op, x, axes=axes, keepdims=keep)]
        return [apply(ir_op, x, axes=axes, keepdims=keep)]
    return Rule(run)


def _where(node, ins, ctx):
    cond, x, y = ins
    if not any(is_tensor(v) for v in ins):
        return [_fold("where", cond, x, y)]
    ref = x if is_tensor(x) else y
    return [apply("where", tensor(cond), tensor(x, ref if is_tensor(ref) else None),
                  tensor(y, ref if is_tensor(ref) else None))]


def _trilu(node, ins, ctx):
    x = ins[0]
    k = int(ints_of(ins[1])[0]) if len(ins) > 1 and ins[1] is not None else 0
    tri = np.triu if _attr(node, "upper", 1) else np.tril
    rows, cols = _shape_of(x)[-2:]
    if not (isinstance(rows, int) and isinstance(cols, int)):
        raise Unsupported(f"Trilu of a tensor with symbolic matrix dims [{rows}, {cols}]")
    keep = tri(np.ones((rows, cols), dtype=bool), k)
    zero = np.zeros((), _known(x).dtype if not is_tensor(x) else x.dtype.numpy)
    return [apply("where", tensor(keep), x, tensor(zero)) if is_tensor(x) else _fold("where", keep, x, zero)]


def _cumsum(node, ins, ctx):
    x, axis = ins
    if is_tensor(axis):
        raise Unsupported("CumSum's axis is computed at run time (blockc needs it known)")
    axis = in_range("input axis", int(ints_of(axis)[0]), len(_shape_of(x)))
    flags = {f: bool(_attr(node, f, 0)) for f in ("exclusive", "reverse")}
    return [apply("cumsum", x, axis=axis, **flags) if is_tensor(x) else _fold("cumsum", x, axis=axis, **flags)]


def _gelu(node, ins, ctx):
    return [ins[0].gelu(_attr(node, "approximate", "none"))]


def _unary(ir_op: str):
    def run(node, ins, ctx):
        (x,) = ins
        return [apply(ir_op, x) if is_tensor(x) else _fold(ir_op, x)]
    return Rule(run)


# ONNX op type -> how it is imported (the default domain, ai.onnx).
RULES: dict[str, Rule] = {
    "Add": _elementwise("add"), "Sub": _elementwise("sub"), "Mul": _elementwise("mul"),
    "Div": _elementwise("div"), "Pow": Rule(_pow),
    "Equal": _elementwise("equal"), "Less": _elementwise("less"), "LessOrEqual": _elementwise("less_equal"),
    "Greater": _elementwise("greater"), "GreaterOrEqual": _elementwise("greater_equal"),
    "And": _elementwise("logical_and"), "Or": _elementwise("logical_or"),
    "Not": _unary("logical_not"), "IsNaN": Rule(_isnan),
    "Neg": _unary("neg"), "Sqrt": _unary("sqrt"), "Reciprocal": _unary("reciprocal"), "Exp": _unary("exp"),
    "Tanh": _unary("tanh"), "Relu": _unary("relu"), "Erf": _unary("erf"),
    "Sin": _unary("sin"), "Cos": _unary("cos"), "Sigmoid": _unary("sigmoid"),
    "Gelu": Rule(_gelu, since=20),
    "Cast": Rule(_cast), "Identity": Rule(_identity), "Dropout": Rule(_dropout),
    "Shape": Rule(_shape), "Gather": Rule(_gather), "GatherElements": Rule(_gather_elements),
    "GatherND": Rule(_gather_nd, since=11), "Unsqueeze": Rule(_unsqueeze), "Squeeze": Rule(_squeeze),
    "Concat": Rule(_concat), "Reshape": Rule(_reshape, since=5), "Flatten": Rule(_flatten),
    "Transpose": Rule(_transpose), "Expand": Rule(_expand), "Range": Rule(_range),
    "ConstantOfShape": Rule(_constant_of_shape), "Constant": Rule(_constant), "Slice": Rule(_slice),
    "Split": Rule(_split), "MatMul": Rule(_matmul), "Gemm": Rule(_gemm), "Softmax": Rule(_softmax),
    "LayerNormalization": Rule(_layernorm, since=17),
    "ReduceMean": _reduce("reduce_mean", 18), "ReduceSum": _reduce("reduce_sum", 13),
    "ReduceMax": _reduce("reduce_max", 18),
    "Max": _extremum("greater"), "Min": _extremum("less"),
    "Where": Rule(_where), "Trilu": Rule(_trilu, since=14), "CumSum": Rule(_cumsum, since=11),
}
