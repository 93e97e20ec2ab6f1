"""An op's attributes are checked against their declared kinds; the refusal
names the value, and is written only when there is one to give (a tensor
attribute's repr formats the whole array: made on every node, it was some
8% of sharding GPT-3's graph)."""
import numpy as np
import pytest

import blockc.ops  # noqa: F401  (registers the ops)
from blockc.errors import BlockcError
from blockc.ir.opdef import OPS


class Unprintable(np.ndarray):
    def __repr__(self):
        raise AssertionError("formatted a tensor attribute that was not refused")


def test_a_tensor_attribute_is_not_formatted_unless_refused():
    value = np.arange(6.0).view(Unprintable)
    assert OPS["constant"].normalize_attrs({"value": value})["value"] is value


def test_a_refused_attribute_names_its_value():
    with pytest.raises(BlockcError, match=r"constant: attribute value=\[1, 2\] is not a tensor"):
        OPS["constant"].normalize_attrs({"value": [1, 2]})
    with pytest.raises(BlockcError, match="transpose: attribute perm=3 is not a dims"):
        OPS["transpose"].normalize_attrs({"perm": 3})
