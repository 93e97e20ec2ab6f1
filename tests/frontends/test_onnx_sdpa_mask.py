"""Torch's SDPA as TorchScript and Optimum export it, with Hugging Face's
padding mask: the boolean mask given as an additive one, ``Where(allowed, 0,
-inf)``, and a NaN guard after the softmax, ``Where(IsNaN(p), 0, p)``, for
the queries that see no key at all. Built here with onnx.helper in the form
Optimum's decoder writes (test_onnx_optimum.py runs Optimum itself, where
installed): it imports, fuses to one ``guarded`` attention (its mask the
boolean one; a row with no key gives zeros, ops/masking.guard_rows) and
matches ONNX Runtime on the file, whose mask rows include ones padded whole,
on every backend and fused-op encoding."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from blockc import optimize
from blockc.codegen.onnx_export import export_onnx_decided
from blockc.frontends import trace
from blockc.frontends.onnx import OnnxModel
from blockc.ir.parser import parse_graph
from blockc.ir.printer import print_graph

from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)
from test_onnx_import import _feeds, check_against_ort

HEADS, SIZE = 2, 4


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value), name))


def sdpa_file(path, allows: bool = True, past: bool = False):
    """q, k, v ``[batch, heads, seq, size]`` and a 0/1 ``attention_mask``:
    causal AND padding as a bool, made additive, softmax, NaN guard, · V.
    ``past``: the cache step as torch.onnx and Optimum write it, k and v
    appended to ``past_key``/``past_value`` (``present_key``/``present_value``
    out), the mask as long as the keys and the causal mask offset by the past."""
    f32 = np.float32
    seq, keys = ("sequence_length", "past_sequence_length+sequence_length") if past else ("seq", "seq")
    nodes = [
        _const("zero", np.array([0.0], f32)), _const("neg_inf", np.array([-np.inf], f32)),
        _const("half", np.array(0.5 ** 0.5, f32)), _const("two", np.array(2, np.int64)),
        _const("i0", np.array(0, np.int64)), _const("i1", np.array(1, np.int64)),
        _const("ax_rows", np.array([1], np.int64)), _const("ax_cols", np.array([0], np.int64)),
        _const("ax_pad", np.array([1, 2], np.int64)),
        # the causal mask from the lengths: key j <= query i + (keys - queries)
        helper.make_node("Shape", ["q"], ["q_shape"]),
        helper.make_node("Gather", ["q_shape", "two"], ["seq"], axis=0),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "i1"], ["total"], axis=0),
        helper.make_node("Sub", ["total", "seq"], ["first"]),
        helper.make_node("Range", ["first", "total", "i1"], ["q_pos"]),
        helper.make_node("Range", ["i0", "total", "i1"], ["k_pos"]),
        helper.make_node("Unsqueeze", ["q_pos", "ax_rows"], ["pos_col"]),
        helper.make_node("Unsqueeze", ["k_pos", "ax_cols"], ["pos_row"]),
        helper.make_node("LessOrEqual", ["pos_row", "pos_col"], ["causal"]),
        # padding: [batch, 1, 1, keys]
        helper.make_node("Cast", ["attention_mask"], ["keep"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["keep", "ax_pad"], ["keep4"]),
        helper.make_node("And", ["causal", "keep4"], ["allowed"]),
    ]
    if allows:
        nodes.append(helper.make_node("Where", ["allowed", "zero", "neg_inf"], ["bias"]))
    else:
        nodes += [helper.make_node("Not", ["allowed"], ["masked"]),
                  helper.make_node("Where", ["masked", "neg_inf", "zero"], ["bias"])]
    key, value = ("present_key", "present_value") if past else ("k", "v")
    if past:
        nodes += [helper.make_node("Concat", ["past_key", "k"], ["present_key"], axis=-2),
                  helper.make_node("Concat", ["past_value", "v"], ["present_value"], axis=2)]
    nodes += [
        helper.make_node("Mul", ["q", "half"], ["q_s"]),
        helper.make_node("Transpose", [key], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["kt", "half"], ["kt_s"]),
        helper.make_node("MatMul", ["q_s", "kt_s"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["masked_scores"]),
        helper.make_node("Softmax", ["masked_scores"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["p_guarded"]),
        helper.make_node("MatMul", ["p_guarded", value], ["y"]),
    ]
    qkv = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", HEADS, seq, SIZE]) for n in "qkv"]
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", keys])
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", HEADS, seq, SIZE])]
    if past:
        qkv += [helper.make_tensor_value_info(f"past_{n}", TensorProto.FLOAT,
                                              ["batch", HEADS, "past_sequence_length", SIZE]) for n in ("key", "value")]
        out += [helper.make_tensor_value_info(f"present_{n}", TensorProto.FLOAT, ["batch", HEADS, keys, SIZE])
                for n in ("key", "value")]
    graph = helper.make_graph(nodes, "sdpa", qkv + [mask], out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("allows", [True, False], ids=["where-allowed-0-inf", "where-masked-inf-0"])
def test_sdpa_mask_fuses_to_one_attention(tmp_path, allows):
    graph = optimize(trace(OnnxModel(sdpa_file(tmp_path / "sdpa.onnx", allows)))).graph
    ops = graph.op_counts()
    assert ops.get("attention") == 1
    assert not {"softmax", "masked_softmax", "is_nan", "where", "reduce_max"} & set(ops), ops   # the guard in the op
    (att,) = [n for n in graph.nodes if n.op == "attention"]
    assert att.attrs["guarded"] and att.attrs["mask"] == "bool"
    text = print_graph(graph)
    assert "guarded=true" in text and print_graph(parse_graph(text)) == text


RUNS = ["reference", "fused-reference", "fused-ort-function", "fused-ort-contrib", "fused-ort-onnx23",
        "fused-torch-eager", "fused-cuda-emu"]


@pytest.mark.parametrize("run", RUNS)
def test_sdpa_mask_matches_ort_with_rows_padded_whole(tmp_path, run):
    check_against_ort(sdpa_file(tmp_path / "sdpa.onnx"), run=run)


# ---- the cache step: k and v appended to the past -------------------------------------------
def test_appended_cache_fuses_to_one_cache_step(tmp_path):
    graph = optimize(trace(OnnxModel(sdpa_file(tmp_path / "past.onnx", past=True)))).graph
    ops = graph.op_counts()
    assert ops.get("append_attention") == 1 and not {"attention", "concat", "softmax"} & set(ops), ops
    (step,) = [n for n in graph.nodes if n.op == "append_attention"]
    assert step.attrs["guarded"] and step.attrs["mask"] == "bool"
    forms = {}
    for form in ("function", "contrib", "onnx23"):
        (decision,) = export_onnx_decided(graph, {}, fused_as=form).decisions
        forms[form] = (decision["form"], decision["reason"])
    assert forms == {form: (form, "requested") for form in ("function", "contrib", "onnx23")}


def test_appended_cache_is_one_function_whose_body_checks(tmp_path):
    """The function's inputs keep the graph's dims as expressions (the mask
    as long as past+seq, the concat of past and new keys too): the step is a
    call of one function, not its body written in place, and it runs."""
    path = sdpa_file(tmp_path / "past.onnx", past=True)
    imported = OnnxModel(path)
    graph = optimize(trace(imported)).graph
    model, decisions = export_onnx_decided(graph, {}, fused_as="function")
    assert [(d["form"], d["reason"]) for d in decisions] == [("function", "requested")]
    onnx.checker.check_model(model, full_check=True)
    (function,) = model.functions
    calls = [n for n in model.graph.node if n.domain == function.domain]
    assert [n.op_type for n in calls] == [function.name]
    assert "Softmax" not in {n.op_type for n in model.graph.node}   # the body is not also written in place
    session = peer_session(model.SerializeToString())
    theirs = peer_session(str(path))
    feeds = _feeds(imported, graph, 4, dims=lambda seq: {"past_sequence_length": 3})
    names = [o.name for o in theirs.get_outputs()]
    for got, want, name in zip(session.run(names, feeds), theirs.run(names, feeds), names):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=name)


# (PyTorch and CUDA run the step decomposed: concat and the guarded attention checked above)
@pytest.mark.parametrize("run", [r for r in RUNS if r not in ("fused-torch-eager", "fused-cuda-emu")])
def test_appended_cache_matches_ort_at_two_pasts(tmp_path, run):
    # a past of 0 at 5 new rows, of 3 at 11; the mask's rows left-padded and padded whole
    check_against_ort(sdpa_file(tmp_path / "past.onnx", past=True), run=run,
                      dims=lambda seq: {"past_sequence_length": 0 if seq == 5 else 3})
