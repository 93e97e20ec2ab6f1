"""Non-finite weights are reported when loaded: which tensors, how many values."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from blockc.frontends.weights import NonFiniteWeightsWarning, load_weights, save_weights
from blockc.ir.dtypes import DType


@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_loading_names_each_non_finite_tensor(tmp_path, ext):
    a = np.ones((4, 4), np.float32)
    a[0, :2] = np.nan
    a[1, 0] = np.inf
    b = np.ones(8, DType.bfloat16.numpy)
    b[3] = -np.inf
    path = tmp_path / f"w{ext}"
    save_weights(path, {"a": a, "b": b, "ok": np.zeros(3, np.float32), "ids": np.arange(3)})
    with pytest.warns(NonFiniteWeightsWarning) as caught:
        load_weights(path)
    assert caught[0].message.tensors == ["'a': 2 NaN, 1 +Inf of 16 values", "'b': 1 -Inf of 8 values"]
    assert "2 of 4 weight tensors hold non-finite values" in str(caught[0].message)


def test_finite_weights_load_quietly(tmp_path):
    save_weights(tmp_path / "w.npz", {"a": np.ones(3, np.float32)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_weights(tmp_path / "w.npz")
