"""Import rules for ONNX's shape and index operators: Shape, Reshape and its
kin (Flatten, Unsqueeze, Squeeze), Transpose, Expand, Concat, Split, Slice,
the Gathers, Range, Constant and ConstantOfShape, Cast, Identity, Trilu.
Their operands are often dims (``Sym``s) rather than tensors: the
exporter's shape arithmetic is folded here, so that a ``Reshape`` receives
its target shape symbolically (``convert.py`` says how values are kept)."""
from __future__ import annotations

import numpy as np

from ...ir.dims import Sym
from ...ir.dtypes import DType
from ...ops.evaluate import fold
from ..tensor import Tensor, apply, _apply
from .convert import (Rule, Unsupported, _attr, _axes, _fold, _given_axes, _int_array, _known, _operands,
                      _reshaped, _scalar, _shape_of, as_value, axes_in_range, axis_of, dims_of, ints_of, is_symbolic,
                      is_tensor, tensor)
from .safe_load import element_type_name

INT64_MAX = 2**63 - 1


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



# ONNX op type -> how it is imported (ai.onnx)
RULES: dict[str, Rule] = {
    "Cast": Rule(_cast), "Identity": Rule(_identity), "Shape": Rule(_shape), "Gather": Rule(_gather),
    "GatherElements": Rule(_gather_elements), "GatherND": Rule(_gather_nd, since=11), "Unsqueeze": Rule(_unsqueeze),
    "Squeeze": Rule(_squeeze), "Concat": Rule(_concat), "Reshape": Rule(_reshape, since=5), "Flatten": Rule(_flatten),
    "Transpose": Rule(_transpose), "Expand": Rule(_expand), "Range": Rule(_range),
    "ConstantOfShape": Rule(_constant_of_shape), "Constant": Rule(_constant), "Slice": Rule(_slice),
    "Split": Rule(_split), "Trilu": Rule(_trilu, since=14),
}
