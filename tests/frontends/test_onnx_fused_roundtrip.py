"""Every fused-op encoding blockc writes imports back: each built-in model,
fused and exported in each encoding (``function``, ``contrib``'s
com.microsoft ops, ``onnx23``, ``auto``), is read by the importer, and the
fusion passes make the same fused ops of it as of the model itself; the
imported graph, fused or not, computes what blockc computes on the model and
what ONNX Runtime computes on the file."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import blockc
from blockc.cli import main
from blockc.codegen.fused_encodings import ENCODINGS
from blockc.codegen.onnx_export import export_onnx
from blockc.frontends.onnx import load_onnx
from blockc.ops.registry import fused_ops
from blockc.passes.manager import optimize
from blockc.runtime.reference import run_reference
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)


# gpt2 and bert-base narrowed: the encodings are the point, not the width, and at
# their own sizes (a 50257- or 30522-row embedding) each case wrote, loaded and
# ran some 150 MB of weights
NARROW = {"layers": "1", "d_model": "64", "heads": "4", "vocab": "100"}
MODELS = {"tiny": {}, "gpt2": NARROW, "bert-base": NARROW, "llama-tiny": {}, "qwen3-tiny": {}}
TOL = 1e-4


def fused_counts(graph) -> Counter:
    return Counter(n.op for n in graph.nodes if n.op in fused_ops())


def ort_run(path, feeds: dict) -> dict:
    s = peer_session(str(path))
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def assert_close(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k], np.float64), np.asarray(want[k], np.float64),
                                   rtol=TOL, atol=TOL, err_msg=f"{what}: {k}")


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_case(request):
    name = request.param
    model = blockc.build_model(name, MODELS[name])
    graph = blockc.trace(model)
    weights = dict(blockc.init_weights(model, seed=3))
    f = {s.name: s.sample({"batch": 2, "seq": 5}, np.random.default_rng(0)) for s in model.inputs()}
    if "attention_mask" in f:
        f["attention_mask"][0, 2:] = 0   # some keys masked
    return name, optimize(graph).graph, weights, f, run_reference(graph, weights, f)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_fused_export_imports_back_to_its_fused_ops(model_case, encoding, tmp_path):
    name, fused, weights, feeds, want = model_case
    path = tmp_path / f"{name}-{encoding}.onnx"
    onnx.save(export_onnx(fused, weights, fused_as=encoding), str(path))
    graph, file_weights = load_onnx(path)
    again = optimize(graph).graph
    assert fused_counts(again) == fused_counts(fused), f"{name} as {encoding}"
    assert_close(ort_run(path, feeds), want, f"{name} {encoding}: ONNX Runtime on the file")
    assert_close(run_reference(graph, file_weights, feeds), want, f"{name} {encoding}: the file imported")
    assert_close(run_reference(again, file_weights, feeds), want, f"{name} {encoding}: the file imported, fused")


def test_blockc_runs_its_own_fused_export(tmp_path):
    """The issue's case: ``export llama-tiny --form fused`` (auto: GroupQueryAttention) then ``run`` the file."""
    path = str(tmp_path / "lf.onnx")
    assert main(["export", "llama-tiny", "--form", "fused", "-o", path]) == 0
    assert main(["run", path, "--backend", "reference", "--check"]) == 0


def _gqa_file(tmp_path, seqlens_k_input: bool = False, **attrs):
    """GroupQueryAttention over q, k, v inputs [batch, seq, 2 heads * 8], its
    seqlens_k seq - 1 computed from the shape (or a graph input)."""
    from onnx import TensorProto, helper
    from test_onnx_import import _file_with
    qkv = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", 16]) for n in "qkv"]
    lens = [helper.make_tensor_value_info("lens", TensorProto.INT32, ["batch"])] if seqlens_k_input else []
    consts = [helper.make_node("Constant", [], [n], value=helper.make_tensor(n, TensorProto.INT64, s, v))
              for n, s, v in (("one", [], [1]), ("zero", [], [0]), ("zero1", [1], [0]))]
    shape = [helper.make_node("Shape", ["q"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq64"], axis=0),
             helper.make_node("Cast", ["seq64"], ["total"], to=TensorProto.INT32),
             helper.make_node("Sub", ["seq64", "one"], ["last64"]),
             helper.make_node("Cast", ["last64"], ["last"], to=TensorProto.INT32),
             helper.make_node("Gather", ["shape", "zero"], ["batch1"], axis=0),
             helper.make_node("Unsqueeze", ["batch1", "zero1"], ["batch"]),
             helper.make_node("Expand", ["last", "batch"], ["seqlens"])]
    gqa = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "lens" if lens else "seqlens", "total"],
                           ["y"], domain="com.microsoft", num_heads=2, kv_num_heads=2, **attrs)
    return _file_with(consts + shape + [gqa], tmp_path, inputs=qkv + lens)


def test_group_query_attention_imports_as_ort_runs_it(tmp_path):
    path = _gqa_file(tmp_path)
    graph, weights = load_onnx(path)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 5, 16)).astype(np.float32) for n in "qkv"}
    assert_close(run_reference(graph, weights, feeds), ort_run(path, feeds), "GroupQueryAttention")
    assert fused_counts(optimize(graph).graph) == {"attention": 1}


@pytest.mark.parametrize("attrs, lens_input, error", [
    ({"do_rotary": 1}, False, "GroupQueryAttention with do_rotary=1 and no cos_cache and sin_cache"),
    ({"local_window_size": 2}, False, "GroupQueryAttention with local_window_size=2: blockc's op has no such mode"),
    ({}, True, "GroupQueryAttention's seqlens_k is computed at run time (blockc needs it known)"),
])
def test_what_blockc_cannot_express_of_a_contrib_op_is_refused_by_name(tmp_path, capsys, attrs, lens_input, error):
    path = _gqa_file(tmp_path, lens_input, **attrs)
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blockc: error: ") and err.count("\n") == 1 and error in err, err


def test_multi_head_attention_imports_back(tmp_path):
    """What no built-in model writes: attention on its own (not from a packed
    projection) as com.microsoft.MultiHeadAttention, causal, with a key
    padding mask and with an additive bias."""
    from blockc.ir.dims import parse_dim
    from blockc.ir.dtypes import DType
    from blockc.ir.graph import Graph
    from blockc.ir.types import TensorType

    def t(dtype, *shape):
        return TensorType(dtype, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))
    g = Graph("mha")
    q, k, v, q2, q3 = (g.add_input(n, t(DType.float32, "batch", 2, "seq", 8)) for n in ("q", "k", "v", "q2", "q3"))
    keep = g.add_input("keep", t(DType.bool, "batch", 1, 1, "seq"))
    bias = g.add_input("bias", t(DType.float32, "seq", "seq"))
    fill = -1e30
    # each its own queries: the scores of one q and k would be one value, which no attention fusion takes
    g.set_outputs([("causal", g.op("attention", q, k, v, scale=0.5, causal=True)),
                   ("padded", g.op("attention", q2, k, v, keep, mask="bool", fill=fill)),
                   ("biased", g.op("attention", q3, k, v, bias, mask="additive", fill=fill))])
    path = tmp_path / "mha.onnx"
    onnx.save(export_onnx(g, {}, fused_as="contrib"), str(path))
    assert sum(n.op_type == "MultiHeadAttention" for n in onnx.load(str(path)).graph.node) == 3
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 2, 5, 8)).astype(np.float32) for n in ("q", "k", "v", "q2", "q3")}
    feeds["keep"] = rng.random((2, 1, 1, 5)) < 0.6
    feeds["keep"][:, ..., 0] = True
    feeds["bias"] = rng.standard_normal((5, 5)).astype(np.float32)
    graph, weights = load_onnx(path)
    assert fused_counts(optimize(graph).graph) == fused_counts(g) == {"attention": 3}
    want = run_reference(g, {}, feeds)
    assert_close(ort_run(path, feeds), want, "MultiHeadAttention: ONNX Runtime on the file")
    assert_close(run_reference(graph, weights, feeds), want, "MultiHeadAttention: the file imported")


def test_a_decode_step_with_its_cache_in_place_imports_back(tmp_path):
    """The generation step whose cache is a buffer written in place:
    ``cache_attention``, written as GroupQueryAttention on a past and present
    buffer, imports back to ``cache_attention`` (the step's rows written at
    ``total - 1``, the first ``total`` rows read)."""
    model = blockc.build_model("llama-tiny", {"layers": "1"}).for_cache("decode", cache_len=16)
    graph = blockc.trace(model)
    weights = dict(blockc.init_weights(model, seed=3))
    fused = optimize(graph).graph
    path = tmp_path / "step.onnx"
    onnx.save(export_onnx(fused, weights, fused_as="contrib"), str(path))
    assert sum(n.op_type == "GroupQueryAttention" for n in onnx.load(str(path)).graph.node) == 1
    imported, file_weights = load_onnx(path)
    again = optimize(imported).graph
    assert fused_counts(again) == fused_counts(fused) and fused_counts(fused)["cache_attention"] == 1
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 2, "total": 6}, rng) for s in model.inputs()}
    want = run_reference(graph, weights, feeds)
    assert_close(run_reference(imported, file_weights, feeds), want, "the step imported")
    assert_close(run_reference(again, file_weights, feeds), want, "the step imported, fused")
    # ONNX Runtime copies only the past's first total-1 rows into a present of its own: the logits agree
    assert_close({"logits": ort_run(path, feeds)["logits"]}, {"logits": want["logits"]}, "ONNX Runtime")
