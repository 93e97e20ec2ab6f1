"""hf_common.Take: ``view`` cuts a stored tensor as ``apply`` does (a
transpose, columns) without a copy, out of order or not; only a cast copies
(``copies``), as ``hf_dir.Checkpoint`` reads a checkpoint."""
from __future__ import annotations

import numpy as np
import pytest

from blockc.frontends.hf_common import Take
from blockc.ir.dtypes import DType

TAKES = [
    Take("w", False, 0, 8),     # as stored
    Take("w", True, 0, 4),      # nn.Linear's transpose
    Take("w", False, 2, 6),     # columns of a matrix (GPT-2's c_attn)
    Take("w", True, 0, 1),      # a one-row transpose
]


@pytest.mark.parametrize("take", TAKES)
def test_view_is_what_apply_makes_without_a_copy(take):
    tensor = np.arange(32, dtype=np.float32).reshape(4, 8)
    view = take.view(tensor)
    assert np.shares_memory(view, tensor)
    np.testing.assert_array_equal(view, take.apply(tensor, DType.float32))


@pytest.mark.parametrize("stored, copies", [(np.float32, False), (np.float16, True)])
def test_only_a_cast_copies(stored, copies):
    assert all(take.copies(np.dtype(stored), DType.float32) == copies for take in TAKES)
