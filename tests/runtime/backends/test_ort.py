"""The ``ort`` backend: its kernel count reads ONNX Runtime's optimized graph,
never the weights saved beside it."""
from __future__ import annotations

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
    compiled = make_backend("ort-cpu").compile(g, w, threads=1)
    try:
        x = np.ones((3, 128), np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], compiled.run({"x": x})["y"])
        assert compiled.kernels == 3
    finally:
        compiled.close()
    [size] = counted
    assert size < sum(a.nbytes for a in w.values()) / 10
