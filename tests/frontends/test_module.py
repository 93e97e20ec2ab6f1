"""``frontends/module.py``: how a declared input is sampled for ``run``, ``check`` and ``compare``."""
import numpy as np
import pytest

from blockc.frontends import InputSpec, symbol
from blockc.ir.dtypes import DType


@pytest.mark.parametrize("seed", range(5))
def test_sampled_masks_hold_left_padded_and_fully_masked_rows(seed):
    """A fused op that gets a fully masked row wrong (ONNX Runtime's Attention
    gives zeros where blockc averages the values) shows only on such rows:
    a left-padded row (under a causal mask its first queries see no key)
    and a row with no key at all. Right padding alone never makes one."""
    spec = InputSpec("attention_mask", DType.int64, (symbol("batch"), symbol("seq")), "mask")
    mask = spec.sample({"batch": 3, "seq": 6}, np.random.default_rng(seed))
    assert mask.dtype == np.int64 and mask.shape == (3, 6) and set(np.unique(mask)) <= {0, 1}
    assert mask[0, 0] == 0 and mask[0].any()         # left-padded
    assert mask[1].any()
    assert not mask[-1].any()                        # fully masked
    for row in mask[:-1]:                            # one span of 1s each: padding, not holes
        ones = np.flatnonzero(row)
        assert ones[-1] - ones[0] + 1 == len(ones)


def test_a_single_row_is_padded_but_never_fully_masked():
    spec = InputSpec("mask", DType.bool, (1, 6), "mask")
    for seed in range(5):
        row = spec.sample({}, np.random.default_rng(seed))[0]
        assert not row[0] and row.any()
    assert InputSpec("mask", DType.bool, (2, 1), "mask").sample({}, np.random.default_rng(0)).tolist() == [[True],
                                                                                                          [False]]
