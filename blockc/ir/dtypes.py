"""Element types of IR tensors and their numpy / ONNX counterparts."""
from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    """An element type. ``short`` is the spelling used in printed IR."""

    float32 = ("f32", np.dtype(np.float32), 1)
    float16 = ("f16", np.dtype(np.float16), 10)
    bfloat16 = ("bf16", np.dtype(ml_dtypes.bfloat16), 16)
    float64 = ("f64", np.dtype(np.float64), 11)
    int64 = ("i64", np.dtype(np.int64), 7)
    int32 = ("i32", np.dtype(np.int32), 6)
    bool = ("bool", np.dtype(np.bool_), 9)

    def __init__(self, short: str, numpy: np.dtype, onnx_code: int):
        self.short = short
        self.numpy = numpy
        # onnx.TensorProto.DataType codes; kept here so dtypes need no onnx import.
        self.onnx_code = onnx_code

    @property
    def is_float(self) -> bool:
        return self in (DType.float32, DType.float16, DType.bfloat16, DType.float64)

    @property
    def lowest(self) -> float:
        """The most negative finite value (what masks fill with)."""
        return float(ml_dtypes.finfo(self.numpy).min)

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    def __str__(self) -> str:
        return self.short

    @staticmethod
    def parse(text: str) -> "DType":
        """The dtype spelled ``text``: a short form (``f32``) or a full name."""
        for d in DType:
            if text in (d.short, d.name):
                return d
        raise KeyError(text)

    @staticmethod
    def from_numpy(dtype) -> "DType":
        dtype = np.dtype(dtype)
        for d in DType:
            if d.numpy == dtype:
                return d
        raise KeyError(str(dtype))

    @staticmethod
    def from_onnx(code: int) -> "DType":
        for d in DType:
            if d.onnx_code == code:
                return d
        raise KeyError(code)


FLOAT_NAMES = [d.name for d in DType if d.is_float]


def is_float_numpy(dtype) -> bool:
    """Whether numpy ``dtype`` is one of blockc's floats. numpy's own
    ``issubdtype(..., np.floating)`` says no to ml_dtypes' bfloat16 (kind
    'V'), which blockc computes in like any other float."""
    try:
        return DType.from_numpy(dtype).is_float
    except (KeyError, TypeError):
        return False
