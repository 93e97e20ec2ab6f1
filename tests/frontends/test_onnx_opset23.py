"""Importing opset-23 Attention, RMSNormalization and RotaryEmbedding
(``blockc/frontends/onnx/opset23.py``): blockc's own ``onnx23`` exports come
back as the fused ops they were written from, with the original numbers;
what blockc cannot express is refused by name. (ONNX's own node cases for the
three ops run in ``test_onnx_conformance.py``.)"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from blockc import BlockcError
from blockc.codegen.onnx_export import export_onnx
from blockc.frontends import init_weights, trace
from blockc.frontends.catalog import build_model
from blockc.frontends.onnx import load_onnx
from blockc.frontends.weights import materialize
from blockc.passes.manager import optimize
from blockc.runtime.reference import run_reference

FUSED = ("attention", "qkv_attention", "append_attention", "rotary", "add_rmsnorm", "rmsnorm")

# (model, settings, passes left out so that every fused op is one the onnx23
# encoding writes as an opset-23 op rather than a function, the ONNX ops it must hold)
ROUND_TRIPS = {
    # grouped-query attention (4 heads on 2 K/V heads): Attention with fewer K/V heads, imported back as
    # grouped attention; gelu: Sigmoid (silu) is not imported yet
    "llama-tiny": (dict(activation="gelu"), (),
                   {"Attention": 2, "RotaryEmbedding": 4, "RMSNormalization": 4}),
    # add+LayerNorm and bias+GELU have no opset-23 op: left unfused, they export as standard ops
    "gpt2-block": (dict(d_model="32", heads="4"), ("fuse_add_layernorm", "fuse_bias_activation"),
                   {"Attention": 1}),
}


def fused_ops(graph) -> Counter:
    return Counter(n.op for n in graph.nodes if n.op in FUSED)


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_onnx23_export_imports_back_as_the_same_fused_ops(name, tmp_path):
    settings, disable, want_onnx = ROUND_TRIPS[name]
    model = build_model(name, settings)
    graph, weights = trace(model), materialize(init_weights(model))
    fused = optimize(graph, disable=disable).graph
    proto = export_onnx(fused, weights, fused_as="onnx23")
    assert Counter(n.op_type for n in proto.graph.node if n.op_type in want_onnx) == want_onnx
    assert not proto.functions
    path = tmp_path / "model.onnx"
    onnx.save(proto, path)

    imported, imported_weights = load_onnx(path)
    refused = optimize(imported, disable=disable).graph
    assert fused_ops(refused) == fused_ops(fused) and fused_ops(fused)
    ranks = lambda g: [n.inputs[0].type.rank for n in g.nodes if n.op == "attention"]   # noqa: E731
    assert ranks(refused) == ranks(fused)   # grouped (rank 5) stays grouped

    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 2, "seq": 5}, rng) for s in model.inputs()}
    want = run_reference(graph, weights, feeds)
    got = run_reference(refused, imported_weights, feeds)
    assert list(got) == list(want)
    for out in want:
        np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-5, err_msg=f"{name} {out}")


def _model(node, inputs, outputs, path):
    graph = helper.make_graph([node], "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    onnx.save(model, path)
    return path


def _info(name, *shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def test_causal_decode_step_with_symbolic_past(tmp_path):
    """One query after a past of any length: ONNX's causal frontier (at
    past_key's length) is blockc's (at the end), so the causal flag is kept
    and the past stays symbolic. The attention over the appended past is the
    cache step, ``append_attention``, which opset-23 Attention with a past encodes."""
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "present_k", "present_v"],
                            is_causal=1)
    path = _model(node, [_info("q", 1, 2, 1, 4), _info("k", 1, 2, 1, 4), _info("v", 1, 2, 1, 4),
                         _info("pk", 1, 2, "past", 4), _info("pv", 1, 2, "past", 4)],
                  [_info("y", 1, 2, 1, 4), _info("present_k", 1, 2, "total", 4),
                   _info("present_v", 1, 2, "total", 4)], tmp_path / "decode.onnx")
    graph, weights = load_onnx(path)
    assert fused_ops(optimize(graph).graph) == {"append_attention": 1}
    rng = np.random.default_rng(1)
    for past in (1, 6):
        feeds = {n: rng.standard_normal((1, 2, 1 if n in "qkv" else past, 4)).astype(np.float32)
                 for n in ("q", "k", "v", "pk", "pv")}
        want = ReferenceEvaluator(onnx.load(path)).run(None, feeds)
        got = run_reference(graph, weights, feeds, float64=False)
        for name, w in zip(("y", "present_k", "present_v"), want):
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6, err_msg=f"past={past} {name}")


REFUSALS = {
    "3-D attention without head counts": (
        helper.make_node("Attention", ["q", "k", "v"], ["y"]),
        [_info("q", 1, 3, 8), _info("k", 1, 3, 8), _info("v", 1, 3, 8)], [_info("y", 1, 3, 8)],
        r"Attention on 3-D inputs without q_num_heads"),
    "causal over unknown, unequal lengths": (
        helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1),
        [_info("q", 1, 2, "s", 4), _info("k", 1, 2, "t", 4), _info("v", 1, 2, "t", 4)], [_info("y", 1, 2, "s", 4)],
        r"ONNX aligns its causal mask at past_key's length"),
    "a past key without its past value": (
        helper.make_node("Attention", ["q", "k", "v", "", "pk"], ["y"]),
        [_info("q", 1, 2, 3, 4), _info("k", 1, 2, 3, 4), _info("v", 1, 2, 3, 4), _info("pk", 1, 2, 2, 4)],
        [_info("y", 1, 2, 3, 4)], r"only one of past_key and past_value"),
    "an integer mask": (
        helper.make_node("Attention", ["q", "k", "v", "m"], ["y"]),
        [_info("q", 1, 2, 3, 4), _info("k", 1, 2, 3, 4), _info("v", 1, 2, 3, 4), _info("m", 3, 3, dtype=TensorProto.INT64)],
        [_info("y", 1, 2, 3, 4)], r"attn_mask is int64: ONNX takes a bool mask or one of the inputs' float32"),
    "RMSNormalization over an axis the input lacks": (
        helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=2),
        [_info("x", 2, 4), _info("w", 4)], [_info("y", 2, 4)], r"attribute axis 2 is out of range for a rank-2 tensor"),
    "RMSNormalization's stash_type": (
        helper.make_node("RMSNormalization", ["x", "w"], ["y"], stash_type=TensorProto.DOUBLE),
        [_info("x", 2, 4), _info("w", 4)], [_info("y", 2, 4)], r"stash_type=11"),
    "3-D rotary without num_heads": (
        helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"]),
        [_info("x", 1, 3, 8), _info("c", 8, 2), _info("s", 8, 2), _info("p", 1, 3, dtype=TensorProto.INT64)],
        [_info("y", 1, 3, 8)], r"needs num_heads"),
    "caches of the wrong width": (
        helper.make_node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], rotary_embedding_dim=4),
        [_info("x", 1, 2, 3, 8), _info("c", 8, 4), _info("s", 8, 4), _info("p", 1, 3, dtype=TensorProto.INT64)],
        [_info("y", 1, 2, 3, 8)], r"rotary_embedding_dim/2"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_blockc_cannot_express_is_refused_by_name(case, tmp_path):
    node, inputs, outputs, says = REFUSALS[case]
    path = _model(node, inputs, outputs, tmp_path / "m.onnx")
    with pytest.raises(BlockcError, match=says):
        load_onnx(path)


def test_bool_mask_with_a_row_masked_whole_runs_emulated_as_onnx_runs_it(tmp_path):
    """A query that sees no key gets zeros (ONNX's Attention); blockc guards
    the fused op's output with a ``reduce_max`` over the mask's keys, which
    the CUDA backend runs as a reduction kernel (codegen/cuda/kernels/reduce.py)."""
    from blockc.runtime.backend import make_backend
    backend = make_backend("cuda-emu")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"])
    path = _model(node, [_info("q", 1, 2, 3, 4), _info("k", 1, 2, 5, 4), _info("v", 1, 2, 5, 4),
                         _info("m", 3, 5, dtype=TensorProto.BOOL)], [_info("y", 1, 2, 3, 4)], tmp_path / "m.onnx")
    graph, weights = load_onnx(path)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, 2, 3 if n == "q" else 5, 4)).astype(np.float32) for n in "qkv"}
    feeds["m"] = np.array([[1, 0, 1, 1, 0], [0] * 5, [1] * 5], bool)   # query 1 sees no key
    want = ReferenceEvaluator(onnx.load(path)).run(None, feeds)[0]
    with backend.compile(optimize(graph).graph, weights) as compiled:
        got = compiled.run(feeds)["y"]
    assert not want[:, :, 1].any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
