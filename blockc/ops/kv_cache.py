"""A key/value cache written in place: ``cache_write``.

A decode step with a preallocated cache (``DecoderLM.for_cache("decode",
cache_len=...)``) takes each layer's cache as a buffer of ``cache_len``
positions, writes the step's keys and values at ``[start, start+seq)`` and
returns the whole buffer as the present::

    %20:f32[batch,4,64,16] = cache_write %"past.0.key", %17 {axis=2, start=total-seq}
    %21:f32[batch,4,total,16] = slice %20 {axis=2, start=0, end=total}

Its meaning is a copy with the rows replaced; what makes it in place is the
runtime: ONNX Runtime's ``ScatterElements`` writes straight into its input
when the output is bound to the same buffer (IO binding), so the step costs
the rows written, not the cache. Targets without a lowering decompose it into
the slices around the rows and a concat.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.types import TensorType
from ._rules import fmt, norm_axis, same_dtype
from .registry import DIM, INT, REQUIRED, define

cache_write = define("cache_write", ("cache", "update"), attrs={"axis": (INT, REQUIRED), "start": (DIM, REQUIRED)},
                     flops=0, doc="cache with update written at [start, start+len(update)) along axis")


@cache_write.infer
def _(types, attrs):
    cache, update = types
    dtype = same_dtype("cache_write", [cache, update])
    if cache.rank != update.rank:
        raise ShapeError(f"cache_write: cache {fmt(cache.shape)} and update {fmt(update.shape)} differ in rank")
    axis = norm_axis("cache_write", attrs["axis"], cache.rank)
    if any(cache.shape[i] != update.shape[i] for i in range(cache.rank) if i != axis):
        raise ShapeError(f"cache_write: update {fmt(update.shape)} does not fit cache {fmt(cache.shape)} "
                         f"off axis {axis}")
    end = attrs["start"] + update.shape[axis]
    if isinstance(end, int) and isinstance(cache.shape[axis], int) and end > cache.shape[axis]:
        raise ShapeError(f"cache_write: rows up to {end} do not fit a cache of {cache.shape[axis]}")
    return TensorType(dtype, cache.shape)


@cache_write.numpy
def _(xs, attrs, env):
    cache, update = xs
    axis = attrs["axis"] % cache.ndim
    (start,) = env.eval_dims([attrs["start"]])
    end = start + update.shape[axis]
    if start < 0 or end > cache.shape[axis]:
        raise ShapeError(f"cache_write: rows [{start}, {end}) do not fit a cache of {cache.shape[axis]} "
                         f"(a sequence longer than the preallocated cache?)")
    out = cache.copy()
    index = [slice(None)] * cache.ndim
    index[axis] = slice(start, end)
    out[tuple(index)] = update
    return out


@cache_write.decompose
def _(b, node, ins):
    cache, update = ins
    axis, start = node.attrs["axis"] % cache.type.rank, node.attrs["start"]
    end = start + update.type.shape[axis]
    before = b.op("slice", cache, axis=axis, start=0, end=start)
    after = b.op("slice", cache, axis=axis, start=end, end=cache.type.shape[axis])
    return [b.op("concat", before, update, after, axis=axis)]


@cache_write.onnx
def _(e, node, ins):
    # ScatterElements with the rows' positions as indices: ONNX Runtime runs it
    # in place when its output is bound to its input's buffer, and copies
    # otherwise (the same meaning either way).
    cache_t, update_t = (v.type for v in node.inputs)
    axis = node.attrs["axis"] % cache_t.rank
    start = node.attrs["start"]
    scalar = lambda dim: e.emit("Squeeze", [e.dims([dim])])   # noqa: E731
    rows = e.emit("Range", [scalar(start), scalar(start + update_t.shape[axis]), e.const(np.array(1, np.int64))])
    along = [1] * cache_t.rank
    along[axis] = -1
    index = e.emit("Expand", [e.emit("Reshape", [rows, e.const(np.array(along, np.int64))]),
                              e.emit("Shape", [ins[1]])])
    return [e.emit("ScatterElements", [ins[0], index, ins[1]], axis=axis)]
