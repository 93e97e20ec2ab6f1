"""Tensor types: a dtype and a shape of (possibly symbolic) dims."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from .dims import Dim, evaluate, is_dim
from .dtypes import DType


def size_problem(shape: Sequence[int], itemsize: int = 1) -> str | None:
    """Why no tensor of ``shape``, of elements of ``itemsize`` bytes, can
    exist anywhere (``has ... elements, more than any tensor can hold``), or
    None. ONNX's dims, numpy's array sizes and the generated C API all count
    a tensor's elements (and numpy its bytes) in int64, so a product past
    2**63 - 1 is not a size but an overflow."""
    numel = math.prod(shape)   # Python ints: exact however large
    if numel * itemsize < 2**63:
        return None
    count = f"{numel:.3g} elements" + (f" of {itemsize} bytes" if itemsize > 1 else "")
    return f"has {count}, more than any tensor can hold (2**63{' bytes' if itemsize > 1 else ''})"


@dataclass(frozen=True)
class TensorType:
    """``f32[batch,seq,768]``: what every IR value carries."""

    dtype: DType
    shape: tuple

    def __post_init__(self):
        shape = tuple(self.shape)
        for d in shape:
            if not is_dim(d):
                raise TypeError(f"bad dimension {d!r} in shape {shape}")
        object.__setattr__(self, "shape", shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape)

    def concrete_shape(self, bindings: Mapping[str, int]) -> tuple:
        return tuple(evaluate(d, bindings) for d in self.shape)

    def nbytes(self, bindings: Mapping[str, int]) -> int:
        n = self.dtype.itemsize
        for d in self.concrete_shape(bindings):
            n *= d
        return n

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(str(d) for d in self.shape)}]"
