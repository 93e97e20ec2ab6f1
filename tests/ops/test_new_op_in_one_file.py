"""Adding an op is one place: the ops below are declared here, in this file
alone, and run on the reference interpreter, ONNX Runtime, the PyTorch
backend and the emulated CUDA backend with no other edit to blockc.

``softplus`` is an elementwise op with a rule for every target. The fused
op ``bias_softplus`` gives only its meaning and its decomposition: ONNX
export writes it as a function, and the PyTorch and CUDA backends legalize it
by decomposition. Both are removed from the registry after the test."""
from __future__ import annotations

import numpy as np
import pytest

from blockc.ir.graph import Graph
from blockc.ir.dtypes import DType
from blockc.ir.dims import parse_dim
from blockc.ir.types import TensorType
from blockc.ir.verify import verify
from blockc.ops import registry
from blockc.ops._rules import elementwise
from blockc.runtime.backend import backend_names, make_backend

BATCH, SEQ, WIDTH = parse_dim("batch"), parse_dim("seq"), 16


def declare_ops():
    softplus = registry.define("softplus", ("x",), doc="log(1 + exp(x))", cuda="elementwise",
                               cuda_expr="log1pf(expf({0}))", flops=2)
    softplus.infer(lambda types, attrs: elementwise("softplus", types, floats=True))
    softplus.numpy(lambda xs, attrs, env: np.logaddexp(np.zeros((), xs[0].dtype), xs[0]))
    softplus.onnx(lambda e, node, ins: [e.emit("Softplus", ins)])
    softplus.torch(lambda b, node, xs: b.call(b.F.softplus, xs[0]))

    bias_softplus = registry.define("bias_softplus", ("x", "bias"), doc="softplus(x + bias)", fused=True)
    bias_softplus.infer(lambda types, attrs: elementwise("bias_softplus", types, floats=True))
    bias_softplus.numpy(lambda xs, attrs, env: np.logaddexp(np.zeros((), xs[0].dtype), xs[0] + xs[1]))
    bias_softplus.decompose(lambda b, node, ins: [b.op("softplus", b.op("add", ins[0], ins[1]))])


@pytest.fixture
def new_ops():
    declare_ops()
    try:
        yield
    finally:
        for name in ("softplus", "bias_softplus"):
            registry.OPS.pop(name, None)


def model() -> Graph:
    g = Graph("softplus_model")
    x = g.add_input("x", TensorType(DType.float32, (BATCH, SEQ, WIDTH)))
    bias = g.add_param("bias", TensorType(DType.float32, (WIDTH,)))
    h = g.op("bias_softplus", x, bias)
    g.set_outputs([("y", g.op("softplus", g.op("mul", h, x)))])
    verify(g)
    return g


def expected(x, bias):
    x, bias = x.astype(np.float64), bias.astype(np.float64)
    return np.log1p(np.exp(np.log1p(np.exp(x + bias)) * x))


@pytest.mark.parametrize("backend", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
def test_a_new_op_runs_on_every_backend(new_ops, backend):
    assert backend in backend_names()
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    graph = model()
    rng = np.random.default_rng(0)
    weights = {"bias": rng.standard_normal(WIDTH).astype(np.float32)}
    feeds = {"x": rng.standard_normal((2, 5, WIDTH)).astype(np.float32)}
    got = b.run(graph, weights, feeds)["y"]
    np.testing.assert_allclose(got, expected(feeds["x"], weights["bias"]), rtol=2e-5, atol=2e-6)


def test_the_new_ops_join_every_derived_list(new_ops):
    from blockc.codegen.cuda.lower import lowers
    from blockc.report.flops import node_flops
    from blockc.report.plots import fused_colour

    assert "bias_softplus" in registry.fused_ops() and "softplus" not in registry.fused_ops()
    assert lowers(registry.get("softplus")) and not lowers(registry.get("bias_softplus"))
    node = next(n for n in model().nodes if n.op == "softplus")
    assert node_flops(node, {"batch": 2, "seq": 5}) == 2 * 2 * 5 * WIDTH
    assert fused_colour("bias_softplus") != fused_colour("softplus")
