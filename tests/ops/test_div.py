"""div on every backend: integers truncate toward zero, as ONNX and C do
(-7 / 2 is -3; numpy's // floors to -4), exactly past 2**53 (a float64
quotient rounds there)."""
import numpy as np
import pytest

from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ir.verify import verify
from blockc.runtime.backend import make_backend

BIG = 2**62 + 3
A = [-7, 7, -7, 7, -8, -1, 0, 9, -9, BIG, -BIG]
B = [2, 2, -2, -2, 2, 3, 5, -4, 4, 1, 3]
TRUNCATED = [-3, 3, 3, -3, -4, 0, 0, -2, -2, BIG, -(BIG // 3)]


def graph(dtype: DType) -> Graph:
    g = Graph("div")
    n = parse_dim("n")
    a, b = (g.add_input(k, TensorType(dtype, (n,))) for k in "ab")
    g.set_outputs([("y", g.op("div", a, b))])
    verify(g)
    return g


@pytest.mark.parametrize("backend", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
@pytest.mark.parametrize("dtype", [DType.int64, DType.int32])
def test_integer_div_truncates_on_every_backend(backend, dtype):
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    keep = slice(None) if dtype == DType.int64 else slice(0, 9)   # the big ones fit int64 only
    a, d = (np.array(v[keep], dtype.numpy) for v in (A, B))
    got = b.run(graph(dtype), {}, {"a": a, "b": d})["y"]
    assert got.dtype == dtype.numpy
    np.testing.assert_array_equal(got, np.array(TRUNCATED[keep], dtype.numpy))


def test_a_shape_computation_holding_dims_truncates_its_plain_integers():
    """An imported shape computation's values are an object array when a dim
    is among them (``batch`` beside a Reshape's -1, say). Its dims are never
    negative, but its plain integers may be: each must truncate as int64
    does, not floor (-7 / 2 is -3, not -4)."""
    from blockc.ops.evaluate import fold
    batch = parse_dim("batch")
    a = np.array([batch * 4, -7, 7, -1, BIG], dtype=object)
    b = np.array([2, 2, -2, 2, -3], dtype=object)
    (got,) = fold("div", [a, b])
    assert got.dtype == object
    assert list(got) == [batch * 2, -3, -3, 0, -(BIG // 3)]
