"""What every import rule shares: the ``Rule`` a table holds (op type -> the
function that replays a node through the DSL), ``Unsupported``, and the
helpers the rules are written with. The rules themselves are in modules by
op group (``convert_math.py``, ``convert_shape.py``, ``convert_nn.py``,
``opset23.py``, ``contrib.py``), assembled into one table in ``rules.py``.

A value met while walking the graph is one of three things:

* a ``Tensor`` of the graph being traced (the model's real computation);
* a numpy array known now (initializer constants, ``Constant`` nodes and
  everything computed from them only): folded here, never in the IR;
* a numpy *object* array holding symbolic dims (``ir/dims.py`` ``Sym``s):
  ``Shape`` of an input yields ``[batch, sequence]``, and the exporter's
  shape arithmetic on it (Gather, Concat, Unsqueeze, Mul...) is folded on
  the ``Sym`` objects, so a ``Reshape`` receives ``[batch, sequence, 4, 8]``
  and stays symbolic.

Each rule folds when every input is known and otherwise emits blockc ops.
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


def _scalar(v):
    """A known scalar (ONNX Runtime also takes a one-element tensor where a scalar is due)."""
    return np.asarray(v).reshape(-1)[0]


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
