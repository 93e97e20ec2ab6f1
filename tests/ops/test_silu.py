"""silu (x * sigmoid(x), SwiGLU's gate) on every backend against its float64
closed form, at values where a careless formula overflows or loses the sign."""
import numpy as np
import pytest

from blockc.errors import ShapeError
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ir.verify import verify
from blockc.runtime.backend import make_backend

# exp(-x) overflows float32 below -88 and float64 below -709; silu is -0 there, never NaN
EDGES = np.array([-1000.0, -100.0, -88.7, -20.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 20.0, 100.0, 1000.0])


def graph(dtype=DType.float32) -> Graph:
    g = Graph("silu")
    x = g.add_input("x", TensorType(dtype, (parse_dim("n"),)))
    g.set_outputs([("y", g.op("silu", x))])
    verify(g)
    return g


def closed_form(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = x[pos] / (1.0 + np.exp(-x[pos]))
    out[~pos] = x[~pos] * np.exp(x[~pos]) / (1.0 + np.exp(x[~pos]))  # the same, without overflow
    return out


@pytest.mark.parametrize("backend", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
def test_silu_on_every_backend(backend):
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    x = np.concatenate([EDGES, np.random.default_rng(0).standard_normal(52) * 6]).astype(np.float32)
    with np.errstate(over="raise"):  # the reference must not overflow on the way either
        got = b.run(graph(), {}, {"x": x})["y"]
    assert got.dtype == np.float32 and np.isfinite(got).all()
    if backend == "ort-cpu":
        # ONNX Runtime's CPU Sigmoid is a rational approximation (MLAS): ~2e-5 relative,
        # and 0 below about -17 where silu is -4e-8 and less
        np.testing.assert_allclose(got, closed_form(x), rtol=5e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(got, closed_form(x), rtol=3e-6, atol=1e-30)
    assert not np.signbit(got[x > 0]).any()


def test_silu_refuses_integers():
    g = Graph()
    x = g.add_input("x", TensorType(DType.int64, (4,)))
    with pytest.raises(ShapeError, match="silu: needs a floating-point tensor"):
        g.add_node("silu", [x], {})
