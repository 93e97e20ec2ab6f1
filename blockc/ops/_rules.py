"""Shape rules shared by several ops."""
from __future__ import annotations

from ..errors import ShapeError
from math import prod

from ..ir.dims import Dim, evaluate
from ..ir.dtypes import DType
from ..ir.types import TensorType


def fmt(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def broadcast_shapes(op: str, *shapes) -> tuple:
    """Numpy broadcasting over symbolic dims: equal, or one of them is 1."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        dim: Dim = 1
        for d in dims:
            if d == 1:
                continue
            if dim == 1:
                dim = d
            elif d != dim:
                raise ShapeError(f"{op}: shapes {' and '.join(fmt(s) for s in shapes)} do not broadcast "
                                 f"(dimension {dim} against {d})")
        out.append(dim)
    return tuple(out)


def same_dtype(op: str, types, *, floats: bool = False) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"{op}: operands have different dtypes {', '.join(sorted(str(d) for d in dtypes))}")
    dtype = dtypes.pop()
    if floats and not dtype.is_float:
        raise ShapeError(f"{op}: needs a floating-point tensor, got {dtype.name}")
    return dtype


def norm_axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: axis {axis} is out of range for a rank-{rank} tensor")
    return axis % rank


def elementwise(op: str, types, *, floats: bool = False) -> TensorType:
    dtype = same_dtype(op, types, floats=floats)
    return TensorType(dtype, broadcast_shapes(op, *(t.shape for t in types)))


def numel(shape, bindings) -> int:
    """The number of elements of ``shape`` with its symbols bound."""
    return prod(evaluate(d, bindings) for d in shape)


def matmul_flops(node, bindings) -> int:
    """2·M·N·K for a (batched) product of the node's first two inputs."""
    k = evaluate(node.inputs[0].shape[-1], bindings)
    return 2 * k * numel(node.outputs[0].shape, bindings)
