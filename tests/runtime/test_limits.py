"""Feeds outside what the graph's tables hold are refused before running, by
one rule (``ops/limits.py``, checked in ``runtime/bindings.bind_inputs``) on
every backend, and by the generated C API's ``blockc_run`` itself."""
from __future__ import annotations

import numpy as np
import pytest

import blockc
from blockc.ir.dims import evaluate
from blockc.codegen.cuda import toolchain
from blockc.errors import InputsError
from blockc.ops.limits import graph_limits
from blockc.runtime.backend import make_backend

TINY = {"layers": "1"}   # vocab 256, 128 positions
needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="g++ not found")


@pytest.fixture(scope="module")
def tiny():
    model = blockc.build_model("tiny", TINY)
    graph = blockc.to_form(blockc.trace(model), "fused")
    return model, graph, dict(blockc.init_weights(model))


def test_limits_come_from_the_graph(tiny):
    model, graph, _ = tiny
    limits = graph_limits(graph)
    assert {k: high for k, (high, _) in limits.ids.items()} == {"input_ids": model.cfg.vocab}
    assert [(str(d.dim), d.limit) for d in limits.dims] == [("seq", model.cfg.max_positions)]
    bert = blockc.trace(blockc.build_model("bert-base", {"layers": "1"}))
    assert {k: high for k, (high, _) in graph_limits(bert).ids.items()} == {"input_ids": 30522, "token_type_ids": 2}


BACKENDS = ["reference", "ort-cpu", pytest.param("cuda-emu", marks=needs_gxx)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [-1, 256, 10**6])
def test_ids_outside_the_vocabulary_are_refused_everywhere(tiny, backend, bad):
    _, graph, weights = tiny
    ids = np.array([[3, bad, 7]], np.int64)
    with pytest.raises(InputsError, match=r"input 'input_ids': 1 of 3 ids out of range \[0, 256\)"):
        make_backend(backend).run(graph, weights, {"input_ids": ids})
    with make_backend(backend).compile(graph, weights) as compiled:   # the path compare and the benches take
        with pytest.raises(InputsError, match=r"ids out of range \[0, 256\)"):
            compiled.run({"input_ids": ids})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sequence_longer_than_the_position_table_is_refused_everywhere(tiny, backend):
    _, graph, weights = tiny
    with pytest.raises(InputsError, match=r"dimension 'seq' is 200, over the model's maximum of 128"):
        make_backend(backend).run(graph, weights, {"input_ids": np.zeros((1, 200), np.int64)})


@needs_gxx
def test_the_c_api_checks_dims_against_the_model_limits(tiny):
    """blockc_run, called directly (no Python check in front), returns an error
    and a message for seq over the position table instead of reading past it."""
    from blockc.codegen.cuda.build import weights_blob
    from blockc.codegen.cuda.lower import generate
    from blockc.runtime.cuda_runner import CudaRunError, emulated_library, run_emulated
    _, graph, weights = tiny
    model = generate(graph, weights)
    assert "over the model's maximum of 128" in model.source
    so = emulated_library(model)
    image = np.frombuffer(weights_blob(model.params), np.uint8)

    def run(seq):
        dims = {"batch": 1, "seq": seq}
        ids = np.zeros((1, seq), np.int64)
        outs = [np.zeros([evaluate(d, dims) for d in v.shape], v.dtype.numpy) for _, v in model.outputs]
        return run_emulated(so, "blockc_entry", [image, ids, *outs, *[dims[s] for s in model.symbols],
                                                 int(image.nbytes)])

    assert all(np.isfinite(out).all() for out in run(4)[2:])
    with pytest.raises(CudaRunError, match=r"dimension 'seq' is 200, over the model's maximum of 128"):
        run(200)
