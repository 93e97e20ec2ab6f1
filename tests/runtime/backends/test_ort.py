"""The ``ort`` backend: its kernel count reads ONNX Runtime's optimized graph,
never the weights saved beside it, and is made only when a caller asks."""
from __future__ import annotations

import inspect
import os

import numpy as np

from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.runtime.backend import make_backend
from blockc.runtime.backends import ort as ort_backend

F32 = DType.float32


def mlp(d=128) -> tuple[Graph, dict]:
    g = Graph("mlp")
    x = g.add_input("x", TensorType(F32, (parse_dim("seq"), d)))
    h = g.op("gelu", g.op("matmul", x, g.add_param("fc", TensorType(F32, (d, 2 * d)))))
    g.set_outputs([("y", g.op("matmul", h, g.add_param("fc2", TensorType(F32, (2 * d, d)))))])
    rng = np.random.default_rng(0)
    return g, {"fc": rng.standard_normal((d, 2 * d)).astype(np.float32),
               "fc2": rng.standard_normal((2 * d, d)).astype(np.float32)}


def test_the_kernel_count_reads_the_graph_without_the_weights(monkeypatch):
    counted, real = [], ort_backend.count_onnx_nodes

    def spy(path):
        counted.append(os.path.getsize(path))
        return real(path)
    monkeypatch.setattr(ort_backend, "count_onnx_nodes", spy)
    g, w = mlp()
    compiled = make_backend("ort-cpu").compile(g, w, threads=1, count_kernels=True)
    try:
        x = np.ones((3, 128), np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], compiled.run({"x": x})["y"])
        assert compiled.kernels == 3
    finally:
        compiled.close()
    [size] = counted
    assert size < sum(a.nbytes for a in w.values()) / 10


def saved_models(monkeypatch) -> list:
    """Where each ONNX Runtime session made from now on saves its optimized model (None: nowhere)."""
    from blockc.runtime import ort_runner
    saved, real = [], ort_runner.session_options

    def spy(*args, **kwargs):
        saved.append(inspect.signature(real).bind(*args, **kwargs).arguments.get("optimized_model_path"))
        return real(*args, **kwargs)
    monkeypatch.setattr(ort_runner, "session_options", spy)
    return saved


def test_a_compile_that_is_not_asked_for_kernels_saves_no_optimized_model(monkeypatch):
    """Saving ONNX Runtime's optimized model only to count its nodes was a
    third of GPT-2's start: a run never pays it."""
    saved = saved_models(monkeypatch)
    g, w = mlp()
    x = {"x": np.ones((3, 128), np.float32)}
    with make_backend("ort-cpu").compile(g, w, threads=1) as compiled:
        got = compiled.run(x)["y"]
        assert compiled.kernels is None
    assert saved == [None]
    with make_backend("ort-cpu").compile(g, w, threads=1, count_kernels=True) as counted:
        np.testing.assert_array_equal(counted.run(x)["y"], got)
        assert counted.kernels == 3
    assert saved[1] is not None


def test_generate_saves_no_optimized_model(monkeypatch):
    from blockc.frontends import build_model, init_weights
    from blockc.generate import generate
    saved = saved_models(monkeypatch)
    model = build_model("tiny")
    generate(model, init_weights(model, seed=0), [[1, 2, 3]], 3, backend="ort-cpu")
    assert saved == [None, None]   # prefill and decode


def test_a_graph_run_once_or_on_one_row_is_not_prepacked():
    """Prepacking copies every MatMul weight at load: worth it only for many runs of many rows."""
    from blockc.runtime.interface import CompileHints
    assert CompileHints().packs_weights
    assert CompileHints(rows=4, runs=None).packs_weights
    assert not CompileHints(rows=1).packs_weights
    assert not CompileHints(runs=1).packs_weights


def prepacked_sessions(monkeypatch) -> list:
    """Whether each ONNX Runtime session made from now on prepacks its weights."""
    from blockc.runtime import ort_runner
    made, real = [], ort_runner.session_options

    def spy(*args, **kwargs):
        made.append(inspect.signature(real).bind(*args, **kwargs).arguments.get("prepack", True))
        return real(*args, **kwargs)
    monkeypatch.setattr(ort_runner, "session_options", spy)
    return made


def test_a_one_shot_run_is_compiled_as_a_graph_run_once(monkeypatch):
    """``Backend.run``, ``blockc run`` and ``run_ort`` compile a graph for
    one run, as generate does its prefill (``packs_weights``): no prepacked copy
    of each weight, the same outputs."""
    from blockc.cli.run import build_and_run
    from blockc.runtime.ort_runner import run_ort
    g, w = mlp()
    feeds = {"x": np.ones((3, 128), np.float32)}
    made = prepacked_sessions(monkeypatch)
    backend = make_backend("ort-cpu")
    once = backend.run(g, w, feeds)["y"]
    _, _, outputs = build_and_run(backend, g, w, feeds)
    np.testing.assert_array_equal(run_ort(g, w, feeds)["y"], once)
    with backend.compile(g, w) as compiled:   # many runs, as compare's timing sessions: prepacked
        np.testing.assert_allclose(compiled.run(feeds)["y"], once, rtol=1e-5, atol=1e-4)
    assert made == [False, False, False, True]
    np.testing.assert_array_equal(outputs["y"], once)
