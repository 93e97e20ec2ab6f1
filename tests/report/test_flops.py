"""The FLOP model: GEMMs as 2·M·N·K, and each fused op counting what its
decomposition counts (so a roofline point does not move when a fusion
changes only where the data goes)."""
import pytest

from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.passes.decompose import decompose
from blockc.report.flops import node_flops, total_flops

F32 = DType.float32
DIMS = {"batch": 3, "seq": 7}


def T(*shape):
    from blockc.ir.dims import parse_dim
    return TensorType(F32, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


def test_matmul_is_two_m_n_k():
    g = Graph("mm")
    x = g.add_input("x", T("batch", "seq", 8))
    y = g.op("matmul", x, g.add_param("w", T(8, 5)))
    g.set_outputs([("y", y)])
    assert node_flops(y.producer, DIMS) == 2 * 3 * 7 * 8 * 5


@pytest.mark.parametrize("op", ["attention", "qkv_attention"])
def test_fused_attention_counts_what_its_decomposition_does(op):
    g = Graph(op)
    if op == "attention":
        q, k, v = (g.add_input(n, T("batch", 2, "seq", 4)) for n in "qkv")
        y = g.op(op, q, k, v, scale=0.5, causal=True)
    else:
        x = g.add_input("x", T("batch", "seq", 6))
        y = g.op(op, x, g.add_param("w", T(6, 20)), g.add_param("b", T(20)), heads=2, sizes=[4, 4, 12],
                 scale=0.5, causal=True)
    g.set_outputs([("y", y)])
    # down to matmuls, the masked softmax and data movement; the bias add is one per element
    plain = decompose(g, ops=["qkv_attention", "attention"]).graph
    assert total_flops(g, DIMS) == total_flops(plain, DIMS) > 0
