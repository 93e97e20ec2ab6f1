"""hf_common.Take: ``copies`` says of a stored tensor's shape and dtype
alone what ``apply`` does to the tensor itself (a view of it, or a new array)."""
from __future__ import annotations

import numpy as np
import pytest

from blockc.frontends.hf_common import Take
from blockc.ir.dtypes import DType


@pytest.mark.parametrize("take, shape, stored", [
    (Take("w", False, 0, 8), (4, 8), np.float32),     # as stored: a view
    (Take("w", True, 0, 4), (4, 8), np.float32),      # nn.Linear's transpose: a copy
    (Take("w", False, 2, 6), (4, 8), np.float32),     # columns of a matrix (GPT-2's c_attn): a copy
    (Take("b", False, 2, 6), (8,), np.float32),       # a bias's slice: a view
    (Take("w", False, 0, 8), (4, 8), np.float16),     # a cast: a copy
    (Take("w", True, 0, 1), (1, 8), np.float32),      # a one-row transpose is the same bytes: a view
    (Take("w", False, 2, 6), (1, 8), np.float32),     # columns of one row: a view
])
def test_copies_says_what_apply_does(take, shape, stored):
    tensor = np.arange(int(np.prod(shape)), dtype=stored).reshape(shape)
    made = take.apply(tensor, DType.float32)
    assert take.copies(shape, np.dtype(stored), DType.float32) == (not np.shares_memory(made, tensor))
