"""A key/value cache written in place: ``cache_write``, and the fused
``cache_attention`` that writes the step's rows and attends in one op.

A decode step with a preallocated cache (``DecoderLM.for_cache("decode",
cache_len=...)``) takes each layer's cache as a buffer of ``cache_len``
positions, writes the step's keys and values at ``[start, start+seq)`` and
returns the whole buffer as the present::

    %20:f32[batch,4,64,16] = cache_write %"past.0.key", %17 {axis=2, start=total-seq}
    %21:f32[batch,4,total,16] = slice %20 {axis=2, start=0, end=total}

Its meaning is a copy with the rows replaced; what makes it in place is the
runtime: ONNX Runtime's ``ScatterElements`` writes straight into its input
when the output is bound to the same buffer (IO binding), and the generated
CUDA skips its copy when the C API is given the cache's own buffer as the
output (``codegen/cuda/kernels/copy.py``), so the step costs the rows
written, not the cache. Targets without a lowering decompose it into the
slices around the rows and a concat.

``cache_attention`` (made by ``passes/fuse_cache_attention.py``) is the
write of keys and values, the read of the first ``total`` rows and the
attention core as one op, because the read is where a plain graph still
pays for the past: ONNX Runtime's ``Slice`` copies the rows it reads. Its
``contrib`` encoding is ``com.microsoft.GroupQueryAttention``, which writes
the new rows into a past buffer shared with its present output and attends
to each row's first ``seqlens_k + 1`` keys, reading the buffer where it is:
on ONNX Runtime 1.31's CPU provider a step then costs the same at a buffer
of 128 or 4096 positions and grows with the past only by the attention's
reads. (The opset-24 alternative, ``TensorScatter`` + ``Attention`` with
``nonpad_kv_seqlen``, is also in place there, but its CPU kernel still
works over the whole buffer: measured 1.1 ms at a 1024-row buffer holding
64 rows against 0.07 ms at 128 rows.)
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.types import TensorType
from ._rules import fmt, norm_axis, same_dtype
from .fused import ATTENTION_ATTRS, attention, attention_attrs, kv_as_read
from .fused_onnx import (MASK_BIAS, check_group_query_attention, emit_group_query_attention, emit_guard,
                         runtime_dtype)
from .registry import DIM, INT, REQUIRED, NotApplicable, define

cache_write = define("cache_write", ("cache", "update"), attrs={"axis": (INT, REQUIRED), "start": (DIM, REQUIRED)},
                     flops=0, cuda="copy", doc="cache with update written at [start, start+len(update)) along axis",
                     bounds=lambda n: [(n.attrs["start"] + n.inputs[1].shape[n.attrs["axis"]], n.inputs[0],
                                        n.attrs["axis"])])


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


# ---- cache_attention ------------------------------------------------------------------
cache_attention = define(
    "cache_attention", ("q", "k", "v", "cache_k", "cache_v", "*mask"), outputs=3,
    attrs={**ATTENTION_ATTRS, "start": (DIM, REQUIRED)}, fused=True, colour="#E45756", flops=0,
    bounds=lambda n: [(n.attrs["start"] + n.inputs[1].shape[2], cache, 2) for cache in n.inputs[3:5]],
    doc="write k, v into the caches at [start, start+seq) along axis 2, then attention of q over their first "
        "start+seq rows; returns the output and both caches. q is [b, heads, seq, d] or grouped "
        "[b, kv_heads, group, seq, d] (the cache then read as [b, kv_heads, 1, total, d])")


def _read(cache, rows, grouped: bool):
    """The first ``rows`` of a cache ``[b, kv, len, d]``, as attention reads them."""
    head = cache[:, :, :rows]
    return head.reshape(kv_as_read(head.shape, grouped))


@cache_attention.infer
def _(types, attrs):
    q, k, v, cache_k, cache_v = types[:5]
    kinds = []
    for new, cache in ((k, cache_k), (v, cache_v)):
        written = cache_write.infer_fn([cache, new], {"axis": 2, "start": attrs["start"]})
        total = attrs["start"] + new.shape[2]
        shape = kv_as_read((*written.shape[:2], total, *written.shape[3:]), q.rank == 5)
        kinds.append((written, TensorType(written.dtype, shape)))
    if q.rank not in (4, 5):
        raise ShapeError(f"cache_attention: q must be [b, heads, seq, d] or [b, kv_heads, group, seq, d], got {q}")
    mask_attrs = attention_attrs(attrs)
    out = attention.infer_fn([q, kinds[0][1], kinds[1][1], *types[5:]], mask_attrs)
    return [out, kinds[0][0], kinds[1][0]]


@cache_attention.numpy
def _(xs, attrs, env):
    q, k, v, cache_k, cache_v = xs[:5]
    written = [cache_write.numpy_fn([cache, new], {"axis": 2, "start": attrs["start"]}, env)
               for cache, new in ((cache_k, k), (cache_v, v))]
    (total,) = env.eval_dims([attrs["start"] + k.shape[2]])
    keys, values = (_read(w, total, q.ndim == 5) for w in written)
    out = attention.numpy_fn([q, keys, values, *xs[5:]], attention_attrs(attrs), env)
    return [out, *written]


@cache_attention.decompose
def _(b, node, ins):
    q, k, v, cache_k, cache_v = ins[:5]
    start = node.attrs["start"]
    total = start + k.type.shape[2]
    written, read = [], []
    for cache, new in ((cache_k, k), (cache_v, v)):
        w = b.op("cache_write", cache, new, axis=2, start=start)
        r = b.op("slice", w, axis=2, start=0, end=total)
        if q.type.rank == 5:
            kv, size = r.type.shape[1], r.type.shape[3]
            r = b.op("reshape", r, shape=list(kv_as_read([0, kv, -1, size], True)))
        written.append(w)
        read.append(r)
    attrs = attention_attrs(node.attrs)
    return [b.op("attention", q, *read, *ins[5:], **attrs), *written]


@cache_attention.onnx_encoding("contrib")
def _(e, node, ins):
    """``com.microsoft.GroupQueryAttention`` with the caches as its past and
    present (one buffer when the runtime binds them so), written by
    ``fused_onnx.emit_group_query_attention``, and the mask as its
    attention_bias.

    One difference, in rows no step reads: given a present buffer of its
    own (no shared buffer), ONNX Runtime's kernel copies only the past's
    first ``total-seq`` rows into it and leaves the rows after ``total``
    zero, where the op's meaning keeps the past's. The two agree for a
    cache filled in order from a zeroed buffer, which is how the generation
    loop makes it (``generate.loop.into_cache``)."""
    dtype = runtime_dtype(node, "GroupQueryAttention")
    q_t, k_t, v_t = (x.type for x in node.inputs[:3])
    grouped = q_t.rank == 5
    kv, seq, size = k_t.shape[1], k_t.shape[2], k_t.shape[3]
    heads = q_t.shape[1] * q_t.shape[2] if grouped else q_t.shape[1]
    check_group_query_attention(node, dtype, heads, kv, size, v_t.shape[3])
    if seq != 1:
        raise NotApplicable(f"GroupQueryAttention takes several new rows after a past only at batch 1 (ONNX "
                            f"Runtime 1.31): lowered for a one-token step (seq=1), not seq={seq}")
    if node.attrs["mask"] not in ("none", "bool"):
        raise NotApplicable(f"only a boolean key mask becomes GroupQueryAttention's bias, not a "
                            f"{node.attrs['mask']} one")
    if node.attrs["mask"] == "bool":
        mask_t = node.inputs[5].type
        if any(d != 1 for d in mask_t.shape[1:-1]):
            raise NotApplicable(f"GroupQueryAttention takes a key mask [b, 1, ..., total]; got {mask_t}")

    total = node.attrs["start"] + seq
    bias = None
    if node.attrs["mask"] == "bool":   # [b, 1, ..., total] booleans -> an additive [b, 1, 1, total] bias
        keep = e.emit("Reshape", [ins[5], e.const(np.array([0, 1, 1, -1], np.int64))])
        bias = e.emit("Where", [keep, e.const(np.array(0, dtype.numpy)), e.const(np.array(MASK_BIAS, dtype.numpy))])
        bias = e.emit("Expand", [bias, e.dims([1, 1, seq, total])])   # the op wants [.., seq, total]
    q = e.emit("Reshape", [ins[0], e.const(np.array([0, heads, -1, size], np.int64))]) if grouped else ins[0]
    out, present_k, present_v = emit_group_query_attention(e, q, ins[1], ins[2], heads=heads, kv_heads=kv, size=size,
                                                           total=total, scale=node.attrs["scale"],
                                                           past=(ins[3], ins[4]), bias=bias)
    if grouped:
        out = e.emit("Reshape", [out, e.const(np.array([0, kv, heads // kv, -1, size], np.int64))])
    mask = ins[5] if node.attrs["mask"] != "none" else None
    return [emit_guard(e, node, out, mask, seq, total), present_k, present_v]
