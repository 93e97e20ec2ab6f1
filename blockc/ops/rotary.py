"""``rotary``: rotary position embeddings (RoPE) as one fused op.

``rotary(x, cos, sin, position_ids) {interleaved}`` turns the first
``rotary_dim`` dimensions of each head of ``x`` (``[batch, heads, seq,
head_dim]``) by the angles of its positions and passes the rest through::

    c, s = cos[position_ids], sin[position_ids]        # [batch, seq, rotary_dim] -> one row per token
    y[..., :rd] = x[..., :rd] * c + rotated(x[..., :rd]) * s
    y[..., rd:] = x[..., rd:]

with ``rd = cos.shape[-1]`` and ``rotated`` the pair swap with one sign
flipped: ``concat(-x2, x1)`` of the two halves (``interleaved=false``,
Llama's rotate-half) or the same per adjacent pair (``interleaved=true``,
GPT-J). ``cos``/``sin`` are tables ``[positions, rotary_dim]`` in
``frontends/rotary.py``'s layout, each angle written for both members of its
pair; ``position_ids`` is ``[batch, seq]`` or ``[seq]``. ``fuse_rotary``
makes it from the ops the DSL's ``RotaryEmbedding`` emits, which is also
what ``decompose`` gives back, node for node.

ONNX encodings (``codegen/fused_encodings.py`` chooses among them):

* ``function``: the decomposition;
* ``contrib``: ``com.microsoft.RotaryEmbedding`` (input, position_ids,
  cos_cache, sin_cache), which ONNX Runtime 1.31's CPU kernel runs on the
  4-D ``[batch, heads, seq, head]`` layout, interleaved or not, with partial
  rotation -- as long as ``num_heads`` is given with ``rotary_embedding_dim``
  (its constructor refuses the one without the other), so the heads must be
  a fixed number;
* ``onnx23``: opset-23 ``RotaryEmbedding`` (X, cos_cache, sin_cache,
  position_ids), which ONNX Runtime 1.31 runs on the CPU.

Both runtime ops take caches of one angle per pair, ``[positions, rd/2]``:
the encodings slice it from the op's tables (columns ``:rd/2``, or every
second one when interleaved). That is the same table exactly when each angle
is written for both members of its pair, as every table ``RotaryEmbedding``
makes is; a graph fed other tables must be exported ``--fused-as function``.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..ir.dtypes import DType
from ._rules import fmt, numel, same_dtype
from .fused_onnx import MS, needs_opset_23, runtime_dtype
from .registry import BOOL, NotApplicable, define, get

rotary = define(
    "rotary", ("x", "cos", "sin", "position_ids"), attrs={"interleaved": (BOOL, False)},
    doc="rotary position embedding of x [batch, heads, seq, head_dim] by the cos/sin table rows of position_ids; "
        "the first cos.shape[-1] dims of each head turn, the rest pass through",
    fused=True, colour="#17BECF", cuda="rotary",
    # a multiply, a multiply-add per turned element; the rest is copied
    flops=lambda node, bindings: 3 * numel(node.outputs[0].shape[:-1], bindings) * node.inputs[1].shape[-1],
    indexes=lambda node: [(node.inputs[3], node.inputs[1], 0), (node.inputs[3], node.inputs[2], 0)])


@rotary.infer
def _(types, attrs):
    x, cos, sin, pos = types
    same_dtype("rotary", [x, cos, sin], floats=True)
    if x.rank != 4:
        raise ShapeError(f"rotary: x must be [batch, heads, seq, head_dim], got {x}")
    if cos.rank != 2 or cos.shape != sin.shape:
        raise ShapeError(f"rotary: cos and sin must be tables [positions, rotary_dim] of one shape, got {cos}, {sin}")
    rd, head = cos.shape[1], x.shape[3]
    if not (isinstance(rd, int) and isinstance(head, int) and rd > 0 and rd % 2 == 0 and rd <= head):
        raise ShapeError(f"rotary: the tables' {rd} columns must be an even number of dims, "
                         f"at most the head size {head}")
    if pos.dtype not in (DType.int64, DType.int32):
        raise ShapeError(f"rotary: position_ids must be int64 or int32, got {pos.dtype.name}")
    want = (x.shape[0], x.shape[2]) if pos.rank == 2 else (x.shape[2],)
    if tuple(pos.shape) != want:
        raise ShapeError(f"rotary: position_ids must be {fmt(want)} for x {fmt(x.shape)}, got {fmt(pos.shape)}")
    return x


def rotated(x: np.ndarray, interleaved: bool) -> np.ndarray:
    """Each pair ``(a, b)`` of the last axis as ``(-b, a)``."""
    if interleaved:
        pairs = x.reshape(x.shape[:-1] + (-1, 2))
        return np.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


@rotary.numpy
def _(xs, attrs, env):
    x, cos, sin, pos = xs
    rd = cos.shape[-1]
    take = get("gather").numpy_fn   # gather's range check and its message
    c, s = (take([t, pos], {"axis": 0}, env) for t in (cos, sin))
    if pos.ndim == 2:   # [batch, seq, rd] -> [batch, 1, seq, rd]: the same angles for every head
        c, s = c[:, None], s[:, None]
    turned = x[..., :rd]
    out = turned * c + rotated(turned, attrs["interleaved"]) * s
    return np.concatenate([out, x[..., rd:]], axis=-1) if rd < x.shape[-1] else out


@rotary.decompose
def _(b, node, ins):
    # The ops frontends/rotary.py emits, in its order, so that fuse_rotary
    # finds them again and a decomposed graph reads like a traced one.
    x, cos, sin, pos = ins
    rd, head = node.inputs[1].shape[1], node.inputs[0].shape[3]
    c, s = (b.op("gather", t, pos, axis=0) for t in (cos, sin))
    if node.inputs[3].type.rank == 2:
        c, s = (b.op("reshape", t, shape=[0, 1, -1, rd]) for t in (c, s))
    turned, rest = (x, None) if rd == head else b.node("split", x, axis=-1, sizes=[rd, head - rd]).outputs
    if node.attrs["interleaved"]:
        pairs = b.op("reshape", turned, shape=[0, 0, 0, rd // 2, 2])
        even, odd = b.node("split", pairs, axis=-1, sizes=[1, 1]).outputs
        swapped = b.op("reshape", b.op("concat", b.op("neg", odd), even, axis=-1), shape=[0, 0, 0, rd])
    else:
        first, second = b.node("split", turned, axis=-1, sizes=[rd // 2, rd // 2]).outputs
        swapped = b.op("concat", b.op("neg", second), first, axis=-1)
    out = b.op("add", b.op("mul", turned, c), b.op("mul", swapped, s))
    return [out if rest is None else b.op("concat", out, rest, axis=-1)]


# ---- ONNX runtime ops ---------------------------------------------------------------
def _caches_and_positions(e, node, ins) -> tuple[str, str, str]:
    """(cos cache, sin cache, int64 [batch, seq] positions) as the runtime
    ops take them: one angle per pair, sliced from the op's tables."""
    rd = node.inputs[1].shape[1]
    cols = ([0], [rd], [1], [2]) if node.attrs["interleaved"] else ([0], [rd // 2], [1], [1])
    starts, ends, axes, steps = (e.const(np.array(v, np.int64)) for v in cols)
    cos, sin = (e.emit("Slice", [t, starts, ends, axes, steps]) for t in ins[1:3])
    pos, x = ins[3], node.inputs[0]
    if node.inputs[3].dtype != DType.int64:
        pos = e.emit("Cast", [pos], to=int(DType.int64.onnx_code))
    if node.inputs[3].type.rank == 1:   # the same positions for every row of the batch
        pos = e.emit("Expand", [e.emit("Unsqueeze", [pos, e.const(np.array([0], np.int64))]),
                                e.dims([x.shape[0], x.shape[2]])])
    return cos, sin, pos


@rotary.onnx_encoding("contrib")
def _(e, node, ins):
    runtime_dtype(node, "RotaryEmbedding")
    heads = node.inputs[0].shape[1]
    if not isinstance(heads, int):
        raise NotApplicable(f"com.microsoft.RotaryEmbedding needs num_heads, a fixed number; x is {node.inputs[0].type}")
    cos, sin, pos = _caches_and_positions(e, node, ins)
    # num_heads with rotary_embedding_dim: ONNX Runtime's CPU kernel refuses the one without the other
    return [e.emit("RotaryEmbedding", [ins[0], pos, cos, sin], domain=MS, num_heads=heads,
                   rotary_embedding_dim=node.inputs[1].shape[1], interleaved=int(node.attrs["interleaved"]))]


@rotary.onnx_encoding("onnx23")
def _(e, node, ins):
    needs_opset_23(e, "RotaryEmbedding")
    runtime_dtype(node, "RotaryEmbedding")
    rd, head = node.inputs[1].shape[1], node.inputs[0].shape[3]
    cos, sin, pos = _caches_and_positions(e, node, ins)
    partial = {"rotary_embedding_dim": rd} if rd < head else {}
    return [e.emit("RotaryEmbedding", [ins[0], cos, sin, pos], interleaved=int(node.attrs["interleaved"]), **partial)]
