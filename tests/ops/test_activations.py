"""An activation is one row of ``ops/activations.py``: the fusion, the fused
op's meaning and decomposition, every ONNX encoding, the PyTorch backend, the
CUDA GEMM epilogue, the DSL's feed-forward and the Hugging Face loaders read
it there. SiLU fuses into ``matmul_bias_act`` and runs on every backend; an
activation declared in this file alone does too, and the ``contrib``
encoding, which has no op for either, declines them instead of writing
another activation's op (it wrote ``FastGelu`` for any it did not know)."""
from __future__ import annotations

import numpy as np
import pytest

from blockc.codegen.onnx_export import export_onnx_decided
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ops import activations, registry
from blockc.ops.activations import ACTIVATIONS, Activation
from blockc.passes.manager import optimize
from blockc.runtime.backend import make_backend
from blockc.runtime.reference import run_reference
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)

F32 = DType.float32
BACKENDS = ["reference", "ort-cpu", "torch-eager", "cuda-emu"]
ENCODINGS = ["function", "contrib", "onnx23", "auto"]
# declared by the tests below only: tanh(x @ w + bias), which no encoding has an op for
TANH = Activation("tanh_test", "tanh", "Tanh", "tanh")


@pytest.fixture
def tanh_declared(monkeypatch):
    monkeypatch.setitem(activations._DECLARED, TANH.name, TANH)   # removed again after the test
    return TANH


def unfused(act: Activation) -> Graph:
    """``act(x @ w + b)`` written out, as a model or an import has it."""
    g = Graph(f"ffn_{act.name}")
    x = g.add_input("x", TensorType(F32, (parse_dim("batch"), parse_dim("seq"), 8)))
    w, b = g.add_param("w", TensorType(F32, (8, 16))), g.add_param("b", TensorType(F32, (16,)))
    g.set_outputs([("y", g.op(act.op, g.op("add", g.op("matmul", x, w), b), **act.attrs))])
    return g


def fused(act: Activation) -> Graph:
    graph = optimize(unfused(act)).graph
    assert [(n.op, n.attrs.get("activation")) for n in graph.nodes] == [("matmul_bias_act", act.name)]
    return graph


def data(graph: Graph, seed: int = 0):
    rng = np.random.default_rng(seed)
    weights = {n: rng.standard_normal(v.type.concrete_shape({})).astype(np.float32) for n, v in graph.params.items()}
    return weights, {"x": (2 * rng.standard_normal((2, 5, 8))).astype(np.float32)}


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def run_on(backend: str, graph: Graph, weights, feeds, **options) -> np.ndarray:
    b = make_backend(backend, **options)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    return b.run(graph, weights, feeds)["y"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["silu", "tanh_test"])
def test_an_activation_fuses_and_runs_on_every_backend(request, name, backend):
    act = request.getfixturevalue("tanh_declared") if name == "tanh_test" else ACTIVATIONS[name]
    graph = fused(act)
    weights, feeds = data(graph)
    want = run_reference(unfused(act), weights, feeds, float64=True)["y"]
    for encoding in (ENCODINGS if backend == "ort-cpu" else [None]):
        options = {"fused_as": encoding} if encoding else {}
        assert relative_error(run_on(backend, graph, weights, feeds, **options), want) < 1e-5, encoding


@pytest.mark.parametrize("name", ["silu", "tanh_test"])
def test_an_encoding_declines_an_activation_it_has_no_op_for(request, name):
    """Written as a function, with the reason, and right on ONNX Runtime."""
    act = request.getfixturevalue("tanh_declared") if name == "tanh_test" else ACTIVATIONS[name]
    graph = fused(act)
    weights, feeds = data(graph, seed=1)
    want = run_reference(unfused(act), weights, feeds, float64=True)["y"]
    for encoding in ("contrib", "onnx23"):
        model, decisions = export_onnx_decided(graph, weights, fused_as=encoding)
        [decision] = decisions
        assert decision["form"] == "function" and decision["reason"].startswith(f"{encoding} declined"), decision
        assert encoding != "contrib" or f"no bias + {act.title} op" in decision["reason"]
        assert not any(n.domain == "com.microsoft" for n in model.graph.node)
        session = peer_session(model.SerializeToString())
        assert relative_error(session.run(None, feeds)[0], want) < 1e-5


def test_each_encoding_writes_the_activation_it_names():
    """The contrib ops each activation declares, and none for the others."""
    for act in ACTIVATIONS.values():
        graph = fused(act)
        weights, _ = data(graph)
        model, decisions = export_onnx_decided(graph, weights, fused_as="contrib")
        written = [n.op_type for n in model.graph.node if n.domain == "com.microsoft"]
        assert written == ([act.contrib] if act.contrib else []), act.name
        assert decisions[0]["form"] == ("contrib" if act.contrib else "function")


def test_every_list_of_activations_is_read_from_the_registry(tanh_declared):
    from blockc.codegen.cuda.kernels.gemm import Epilogue
    from blockc.frontends.hf_common import HF_ACTIVATIONS
    from blockc.frontends.layers import FeedForward
    assert {"relu", "gelu", "gelu_tanh", "silu", "tanh_test"} <= set(ACTIVATIONS)
    assert HF_ACTIVATIONS["silu"] == "silu" and HF_ACTIVATIONS["gelu_new"] == "gelu_tanh"
    for act in ACTIVATIONS.values():
        assert registry.get(act.op)
        assert Epilogue(activation=act.name).describe() == f"{act.title}(A B)"
        ffn = FeedForward(8, 16, act.name)
        assert ffn.activation == act.name
    with pytest.raises(AssertionError, match="declared twice"):
        activations.declare(TANH)
