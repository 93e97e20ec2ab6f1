"""The cache kinds: an enum whose values are the CLI's ``--cache`` strings,
either taken wherever a kind is, anything else refused listing the kinds."""
import pytest

from blockc.errors import BlockcError
from blockc.frontends import build_model
from blockc.generate.cache import CacheKind, cache_length


def test_the_clis_strings_are_the_kinds():
    assert [k.value for k in CacheKind] == ["inplace", "concat"]
    assert CacheKind.of("concat") is CacheKind.CONCAT and CacheKind.of(CacheKind.INPLACE) is CacheKind.INPLACE
    assert CacheKind.INPLACE.preallocated and not CacheKind.CONCAT.preallocated
    model = build_model("tiny")
    assert cache_length(model, [[1, 2]], 4, CacheKind.INPLACE, None) == cache_length(model, [[1, 2]], 4,
                                                                                      "inplace", None)
    assert cache_length(model, [[1, 2]], 4, CacheKind.CONCAT, None) is None


def test_other_kinds_are_refused_listing_the_kinds():
    with pytest.raises(BlockcError, match="cache must be one of inplace, concat, got 'ring'"):
        CacheKind.of("ring")
