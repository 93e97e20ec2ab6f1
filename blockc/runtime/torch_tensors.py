"""numpy arrays to torch tensors and back, in blockc's dtypes. It imports
torch: only the PyTorch backend imports it, lazily."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from ..frontends.weights import contiguous
from ..ir.dtypes import DType

TORCH_DTYPES = {
    DType.float32: torch.float32, DType.float16: torch.float16, DType.bfloat16: torch.bfloat16,
    DType.float64: torch.float64, DType.int64: torch.int64, DType.int32: torch.int32, DType.bool: torch.bool,
}


def to_torch(array: np.ndarray, dtype: DType, *, copy: bool) -> torch.Tensor:
    """``array`` as a tensor of ``dtype`` (cast if needed; torch has no numpy
    bridge for bfloat16, so its bits travel as int16)."""
    array = np.asarray(array)
    if array.dtype != dtype.numpy:
        array, copy = array.astype(dtype.numpy), False
    if dtype == DType.bfloat16:
        array = array.view(np.int16)
    if not array.flags.c_contiguous:   # a checkpoint's transposed view: put in order tile by tile, a new array
        array = contiguous(array)
    elif copy or not array.flags.writeable:
        array = np.array(array, order="C")
    t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if dtype == DType.bfloat16 else t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
