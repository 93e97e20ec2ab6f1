"""Data-movement and contraction ops: matmul, transpose, reshape, concat,
split, slice, gather."""
from __future__ import annotations

import operator

import numpy as np

from ..errors import ShapeError
from ..ir.dims import Sym, exact_div
from ..ir.dtypes import DType
from ..ir.types import TensorType
from ._rules import broadcast_shapes, fmt, matmul_flops, norm_axis, same_dtype
from .registry import DIM, DIMS, INT, REQUIRED, define

# ---- matmul -----------------------------------------------------------------
matmul = define("matmul", ("a", "b"), doc="batched matrix product, numpy semantics, rank >= 2",
                cuda="gemm", flops=lambda node, bindings: matmul_flops(node, bindings))


@matmul.infer
def _(types, attrs):
    a, b = types
    dtype = same_dtype("matmul", types, floats=True)
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"matmul: operands must have rank >= 2, got {a} and {b}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {fmt(a.shape)} @ {fmt(b.shape)} "
                         f"({a.shape[-1]} against {b.shape[-2]})")
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    return TensorType(dtype, batch + (a.shape[-2], b.shape[-1]))


matmul.numpy(lambda xs, attrs, env: np.matmul(xs[0], xs[1]))
matmul.onnx(lambda e, node, ins: [e.emit("MatMul", ins)])
matmul.torch(lambda b, node, xs: b.call(b.torch.matmul, *xs))

# ---- transpose -------------------------------------------------------------
transpose = define("transpose", ("x",), attrs={"perm": (DIMS, REQUIRED)}, doc="permute axes", cuda="copy", flops=0,
                   moves_data=True)


@transpose.infer
def _(types, attrs):
    (x,), perm = types, attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"transpose: perm {list(perm)} is not a permutation of {x.rank} axes")
    return x.with_shape(x.shape[p] for p in perm)


transpose.numpy(lambda xs, attrs, env: np.transpose(xs[0], attrs["perm"]))
transpose.onnx(lambda e, node, ins: [e.emit("Transpose", ins, perm=list(node.attrs["perm"]))])
transpose.torch(lambda b, node, xs: b.method("permute", xs[0], list(node.attrs["perm"])))

# ---- reshape ---------------------------------------------------------------
reshape = define("reshape", ("x",), attrs={"shape": (DIMS, REQUIRED)}, cuda="alias", flops=0, moves_data=True,
                 doc="reshape; ONNX rules: 0 copies the input dim, -1 is inferred")


def reshape_dims(x: TensorType, target) -> tuple:
    out, infer_at = [], None
    for i, d in enumerate(target):
        if d == 0:
            if i >= x.rank:
                raise ShapeError(f"reshape: 0 at position {i} has no input dim to copy from {fmt(x.shape)}")
            out.append(x.shape[i])
        elif d == -1:
            if infer_at is not None:
                raise ShapeError(f"reshape: more than one -1 in {list(target)}")
            infer_at = i
            out.append(None)
        elif isinstance(d, int) and d < 0:
            raise ShapeError(f"reshape: negative dimension {d} in {list(target)}")
        else:
            out.append(d)
    total = 1
    for d in x.shape:
        total = d * total
    known = 1
    for d in out:
        if d is not None:
            known = d * known
    if infer_at is not None:
        q = exact_div(total, known)
        if q is None:
            raise ShapeError(f"reshape: cannot reshape {fmt(x.shape)} to {list(map(str, target))}")
        out[infer_at] = q
    elif not _same_size(total, known):
        raise ShapeError(f"reshape: {fmt(x.shape)} and {fmt(out)} have different sizes")
    return tuple(out)


def _same_size(a, b) -> bool:
    return a == b or (isinstance(a, Sym) == isinstance(b, Sym) and exact_div(a, b) == 1)


@reshape.infer
def _(types, attrs):
    return types[0].with_shape(reshape_dims(types[0], attrs["shape"]))


@reshape.numpy
def _(xs, attrs, env):
    x = xs[0]
    return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(env.eval_dims(attrs["shape"]))])


reshape.onnx(lambda e, node, ins: [e.emit("Reshape", [ins[0], e.dims(node.attrs["shape"])])])


@reshape.torch
def _(b, node, xs):
    # ONNX rules: 0 copies the input dim, -1 is inferred; symbolic entries
    # (batch, seq) are computed from the input sizes.
    in_shape = node.inputs[0].shape
    shape = [b.dim(in_shape[i]) if d == 0 else b.dim(d) for i, d in enumerate(node.attrs["shape"])]
    return b.method("reshape", xs[0], shape)

# ---- concat ------------------------------------------------------------------
concat = define("concat", ("*xs",), attrs={"axis": (INT, REQUIRED)}, doc="join along an axis", cuda="copy",
                flops=0, moves_data=True)


@concat.infer
def _(types, attrs):
    if not types:
        raise ShapeError("concat needs at least one input")
    dtype = same_dtype("concat", types)
    rank = types[0].rank
    axis = norm_axis("concat", attrs["axis"], rank)
    total = 0
    for t in types:
        if t.rank != rank or any(t.shape[i] != types[0].shape[i] for i in range(rank) if i != axis):
            raise ShapeError(f"concat: shapes {', '.join(fmt(t.shape) for t in types)} differ off axis {axis}")
        total = t.shape[axis] + total
    shape = list(types[0].shape)
    shape[axis] = total
    return TensorType(dtype, tuple(shape))


concat.numpy(lambda xs, attrs, env: np.concatenate(xs, axis=attrs["axis"]))
concat.onnx(lambda e, node, ins: [e.emit("Concat", ins, axis=node.attrs["axis"])])
concat.torch(lambda b, node, xs: b.call(b.torch.cat, list(xs), dim=node.attrs["axis"]))

# ---- split ---------------------------------------------------------------------
split = define("split", ("x",), outputs=lambda attrs, n: len(attrs["sizes"]), cuda="copy", flops=0, moves_data=True,
               attrs={"axis": (INT, REQUIRED), "sizes": (DIMS, REQUIRED)}, doc="split into pieces of given sizes")


@split.infer
def _(types, attrs):
    (x,) = types
    axis = norm_axis("split", attrs["axis"], x.rank)
    if any(isinstance(s, int) and s < 0 for s in attrs["sizes"]):
        raise ShapeError(f"split: sizes [{', '.join(map(str, attrs['sizes']))}] hold a negative size")
    total = 0
    for s in attrs["sizes"]:
        total = s + total
    if total != x.shape[axis]:
        raise ShapeError(f"split: sizes {list(map(str, attrs['sizes']))} do not add up to dim {x.shape[axis]}")
    out = []
    for s in attrs["sizes"]:
        shape = list(x.shape)
        shape[axis] = s
        out.append(x.with_shape(shape))
    return out


@split.numpy
def _(xs, attrs, env):
    bounds = np.cumsum(env.eval_dims(attrs["sizes"]))[:-1]
    return np.split(xs[0], bounds, axis=attrs["axis"])


split.onnx(lambda e, node, ins: e.emit("Split", [ins[0], e.dims(node.attrs["sizes"])], n=len(node.outputs),
                                       axis=node.attrs["axis"]))


@split.torch
def _(b, node, xs):
    parts = b.call(b.torch.split, xs[0], [b.dim(s) for s in node.attrs["sizes"]], dim=node.attrs["axis"])
    return [b.call(operator.getitem, parts, i) for i in range(len(node.outputs))]

# ---- slice -----------------------------------------------------------------------
slice_ = define("slice", ("x",), attrs={"axis": (INT, REQUIRED), "start": (DIM, REQUIRED), "end": (DIM, REQUIRED)},
                cuda="copy", flops=0, moves_data=True, bounds=lambda n: [(n.attrs["end"], n.inputs[0], n.attrs["axis"])],
                doc="x[start:end] along one axis; start/end may be symbolic (e.g. end=past+seq)")


@slice_.infer
def _(types, attrs):
    (x,) = types
    axis = norm_axis("slice", attrs["axis"], x.rank)
    length = attrs["end"] - attrs["start"]
    if isinstance(length, int) and length < 0:
        raise ShapeError(f"slice: end {attrs['end']} is before start {attrs['start']}")
    shape = list(x.shape)
    if isinstance(shape[axis], int) and isinstance(attrs["end"], int) and attrs["end"] > shape[axis]:
        raise ShapeError(f"slice: end {attrs['end']} is past dim {shape[axis]}")
    shape[axis] = length
    return x.with_shape(shape)


@slice_.numpy
def _(xs, attrs, env):
    x = xs[0]
    start, end = env.eval_dims([attrs["start"], attrs["end"]])
    axis = attrs["axis"] % x.ndim
    if end > x.shape[axis]:
        raise ShapeError(f"slice: end {end} is past dim {x.shape[axis]} (a sequence longer than the model allows?)")
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, end)
    return x[tuple(index)]


slice_.onnx(lambda e, node, ins: [e.emit("Slice", [ins[0], e.dims([node.attrs["start"]]), e.dims([node.attrs["end"]]),
                                                    e.const(np.array([node.attrs["axis"]], np.int64))])])


@slice_.torch
def _(b, node, xs):
    # narrow, not x[start:end]: it refuses an end past the dim (a sequence
    # longer than max_positions) where indexing would clamp silently.
    start, end = node.attrs["start"], node.attrs["end"]
    return b.call(b.torch.narrow, xs[0], node.attrs["axis"], b.dim(start), b.dim(end - start))

# ---- gather ----------------------------------------------------------------------
gather = define("gather", ("data", "indices"), attrs={"axis": (INT, 0)}, doc="take rows (embedding lookup)",
                cuda="copy", flops=0, moves_data=True, indexes=lambda n: [(n.inputs[1], n.inputs[0], n.attrs["axis"])])


@gather.infer
def _(types, attrs):
    data, idx = types
    if idx.dtype not in (DType.int64, DType.int32):
        raise ShapeError(f"gather: indices must be int64 or int32, got {idx.dtype.name}")
    axis = norm_axis("gather", attrs["axis"], data.rank)
    return data.with_shape(data.shape[:axis] + idx.shape + data.shape[axis + 1:])


@gather.numpy
def _(xs, attrs, env):
    data, idx = xs
    n = data.shape[attrs["axis"]]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ShapeError(f"gather: index {int(idx.max()) if idx.max() >= n else int(idx.min())} is out of range "
                         f"for a dimension of {n}")
    return np.take(data, idx, axis=attrs["axis"])


gather.onnx(lambda e, node, ins: [e.emit("Gather", ins, axis=node.attrs["axis"])])


@gather.torch
def _(b, node, xs):
    data, idx = xs
    axis = node.attrs["axis"] % node.inputs[0].type.rank
    if axis == 0 and node.inputs[0].type.rank == 2:
        return b.call(b.F.embedding, idx, data)
    return b.call(operator.getitem, data, (slice(None),) * axis + (idx,))
