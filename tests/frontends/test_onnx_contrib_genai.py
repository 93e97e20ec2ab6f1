"""The com.microsoft ops as ONNX Runtime GenAI's model builder writes them,
each in a small hand-built graph, imported and checked against ONNX Runtime
running the file: GroupQueryAttention with its query, key and value packed in
one input, rotary from its cos/sin caches, ``seqlens_k`` computed from the
attention mask, and a past of 0 rows or more; SimplifiedLayerNormalization
(in the ONNX domain) and SkipSimplifiedLayerNormalization."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from blockc.cli import main
from blockc.frontends.onnx import load_onnx
from blockc.passes.manager import optimize
from blockc.runtime.reference import run_reference

from test_onnx_fused_roundtrip import assert_close, fused_counts, ort_run

VOCAB, HEADS, KV_HEADS, SIZE, POSITIONS = 50, 4, 2, 16, 32   # ORT: head_size a multiple of 16


def _save(nodes, inputs, outputs, initializers, tmp_path, name="m.onnx"):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=10)   # what the installed ONNX Runtime reads
    path = tmp_path / name
    onnx.save(m, str(path))
    return path


def _gqa_step_file(tmp_path, interleaved: int = 0, **attrs):
    """One layer as GenAI writes it: ids -> packed q/k/v -> GroupQueryAttention
    (do_rotary, seqlens_k = ReduceSum(attention_mask) - 1, total from the
    mask's width) over past_key_values.0.* -> present.0.*."""
    rng = np.random.default_rng(1)
    width = (HEADS + 2 * KV_HEADS) * SIZE
    angles = np.arange(POSITIONS)[:, None] * 10000.0 ** (-np.arange(0, SIZE, 2) / SIZE)
    inits = [numpy_helper.from_array(rng.standard_normal((VOCAB, width)).astype(np.float32), "embed"),
             numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos_cache"),
             numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin_cache"),
             numpy_helper.from_array(np.array([1], np.int64), "one1"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    kv = ["batch_size", KV_HEADS, "past_sequence_length", SIZE]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch_size", "total_sequence_length"]),
              *(helper.make_tensor_value_info(f"past_key_values.0.{n}", TensorProto.FLOAT, kv)
                for n in ("key", "value"))]
    present = ["batch_size", KV_HEADS, "total_sequence_length", SIZE]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", "sequence_length", HEADS * SIZE]),
               *(helper.make_tensor_value_info(f"present.0.{n}", TensorProto.FLOAT, present)
                 for n in ("key", "value"))]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["qkv"]),
             helper.make_node("ReduceSum", ["attention_mask", "one1"], ["sum"], keepdims=0),
             helper.make_node("Sub", ["sum", "one1"], ["last64"]),
             helper.make_node("Cast", ["last64"], ["seqlens_k"], to=TensorProto.INT32),
             helper.make_node("Shape", ["attention_mask"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["total64"], axis=0),
             helper.make_node("Cast", ["total64"], ["total"], to=TensorProto.INT32),
             helper.make_node("GroupQueryAttention",
                              ["qkv", "", "", "past_key_values.0.key", "past_key_values.0.value", "seqlens_k", "total",
                               "cos_cache", "sin_cache"],
                              ["y", "present.0.key", "present.0.value"], domain="com.microsoft",
                              num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1, rotary_interleaved=interleaved,
                              **attrs)]
    return _save(nodes, inputs, outputs, inits, tmp_path)


def _step_feeds(past: int, seq: int, batch: int) -> dict:
    rng = np.random.default_rng(past * 10 + seq)
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)),
             "attention_mask": np.ones((batch, past + seq), np.int64)}
    for n in ("key", "value"):
        feeds[f"past_key_values.0.{n}"] = rng.standard_normal((batch, KV_HEADS, past, SIZE)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("past, seq", [(0, 5), (5, 1), (3, 4)])
def test_genai_group_query_attention_imports_as_ort_runs_it(tmp_path, interleaved, past, seq):
    """Packed q/k/v, rotary inside the op, seqlens_k from the mask, a past of 0 rows or more."""
    path = _gqa_step_file(tmp_path, interleaved)
    graph, weights = load_onnx(path)
    feeds = _step_feeds(past, seq, batch=1 if past and seq > 1 else 2)   # ORT's rule for a chunk after a past
    want = ort_run(path, feeds)
    assert_close(run_reference(graph, weights, feeds), want, f"GroupQueryAttention past {past}, seq {seq}")
    fused = optimize(graph).graph
    assert fused_counts(fused) == {"rotary": 2, "append_attention": 1}   # the cache step: concat(past, new) + attention
    assert_close(run_reference(fused, weights, feeds), want, "fused")


def test_a_genai_step_binds_total_to_past_and_seq(tmp_path):
    """The file names past, total and seq apart; the import ties them
    (total = past + seq), so the present is the past with the step appended."""
    graph, _ = load_onnx(_gqa_step_file(tmp_path))
    mask = next(v for v in graph.inputs if v.name == "attention_mask")
    assert str(mask.shape[1]) == "past_sequence_length+sequence_length"
    assert str(dict(graph.outputs)["present.0.key"].shape[2]) == "past_sequence_length+sequence_length"


def _norm_file(tmp_path):
    rng = np.random.default_rng(2)
    x, skip = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", 16]) for n in ("x", "skip"))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z", "sum")]
    inits = [numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), n) for n in ("g1", "g2")]
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g1"], ["y"], epsilon=1e-5, axis=-1,
                              stash_type=1),
             helper.make_node("SkipSimplifiedLayerNormalization", ["y", "skip", "g2"], ["z", "", "", "sum"],
                              domain="com.microsoft", epsilon=1e-6)]
    return _save(nodes, [x, skip], outs, inits, tmp_path, "norms.onnx")


def test_simplified_layer_norms_import_as_ort_runs_them(tmp_path):
    path = _norm_file(tmp_path)
    graph, weights = load_onnx(path)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((2, 3, 16)).astype(np.float32) for n in ("x", "skip")}
    want = ort_run(path, feeds)
    assert_close(run_reference(graph, weights, feeds), want, "the simplified norms")
    assert sorted(n.op for n in optimize(graph).graph.nodes) == ["add_rmsnorm", "rmsnorm"]


@pytest.mark.parametrize("attrs, error", [
    ({"softcap": 30.0}, "GroupQueryAttention with softcap=30.0: blockc's op has no such mode"),
    ({"local_window_size": 2}, "GroupQueryAttention with local_window_size=2: blockc's op has no such mode"),
])
def test_what_a_genai_attention_asks_beyond_blockc_is_refused_by_name(tmp_path, capsys, attrs, error):
    assert main(["show", str(_gqa_step_file(tmp_path, **attrs))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blockc: error: ") and err.count("\n") == 1 and error in err, err
