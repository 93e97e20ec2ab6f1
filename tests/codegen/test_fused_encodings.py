"""The ONNX forms of the fused ops (function, contrib, onnx23, auto): every
built-in model, optimized, exports in every form, passes the full checker,
contains the ONNX ops the form promises, and matches the float64 reference of
the *unoptimized* graph on ONNX Runtime; every fallback names its reason.
Small graphs cover what the models do not (rmsnorm, relu, masks with past,
fills a runtime op cannot express)."""
from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter

import numpy as np
import onnx
import pytest

import blockc
from blockc.codegen import fused_encodings
from blockc.codegen.fused_encodings import FUNCTION_DOMAIN, TABLE_PATH, load_table, table_key
from blockc.codegen.onnx_export import OPSET_IR_VERSION, export_onnx, export_onnx_decided
from blockc.errors import BlockcError
from blockc.frontends.catalog import BUILTINS
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ops.fused import group_heads, ungroup_heads
from blockc.ops.registry import fused_ops
from blockc.passes.forms import to_form
from blockc.passes.manager import optimize
from blockc.runtime.ort_runner import OrtSession
from blockc.runtime.reference import run_reference
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)

MS = "com.microsoft"
# the built-ins whose attention has fewer K/V heads than query heads (llama-tiny, qwen3-tiny)
GQA_MODELS = {name for name, b in BUILTINS.items() if b.defaults.get("kv_heads", 0) not in (0, b.defaults.get("heads"))}
FORMS = ("function", "contrib", "onnx23", "auto")
F32, BOOL = DType.float32, DType.bool


def T(dtype, *shape) -> TensorType:
    return TensorType(dtype, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


def ort_run(model: onnx.ModelProto, feeds: dict) -> dict:
    s = peer_session(model.SerializeToString())
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def ops(model) -> Counter:
    return Counter((n.domain, n.op_type) for n in model.graph.node)


def assert_close(got: dict, want: dict, what: str, tol: float = 2e-5) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape, (what, k)
        np.testing.assert_allclose(got[k], want[k], rtol=5 * tol, atol=tol, err_msg=f"{what} {k}")


def forms_of(decisions: list, op: str) -> int:
    return sum(d["op"] == op for d in decisions)


def check_decisions(decisions: list, graph: Graph) -> None:
    """One decision per fused node, in order, with its origin; a reason for
    every form, and for every fallback a reason that says so."""
    fused = [n for n in graph.nodes if n.op in fused_ops()]
    assert [d["op"] for d in decisions] == [n.op for n in fused]
    assert [d["nodes"] for d in decisions] == [list(n.origin) for n in fused]
    assert [d["kind"] for d in decisions] == [table_key(n) for n in fused]
    for d in decisions:
        assert d["form"] in ("function", "contrib", "onnx23") and d["reason"]
        if d["form"] != d["requested"]:   # declined: a function, or (auto) the form measured next fastest
            assert d["reason"].startswith(f"{d['requested']} declined: "), d
            assert f"written as {'a function' if d['form'] == 'function' else d['form']}" in d["reason"], d


# ---- every built-in model, every form --------------------------------------------------
@pytest.fixture(scope="module", params=sorted(BUILTINS))
def model_case(request):
    name = request.param
    sets = {"layers": "2", "d_model": "32", "heads": "4"}
    if "vocab" in BUILTINS[name].config.__dataclass_fields__:
        sets["vocab"] = "50"
    model = blockc.build_model(name, sets)
    graph = blockc.trace(model)
    weights = dict(blockc.init_weights(model, seed=3))
    rng = np.random.default_rng(0)
    feeds = []
    for batch, seq in [(2, 5), (3, 2)]:
        f = {s.name: s.sample({"batch": batch, "seq": seq}, rng) for s in model.inputs()}
        if "attention_mask" in f:
            f["attention_mask"][0] = 0  # a fully masked row: masked_softmax averages it uniformly
        feeds.append((f, run_reference(graph, weights, f)))
    return name, optimize(graph).graph, weights, feeds


@pytest.mark.parametrize("form", FORMS)
def test_builtin_model_in_every_form(model_case, form):
    name, fused, weights, feeds = model_case
    model, decisions = export_onnx_decided(fused, weights, fused_as=form)
    onnx.checker.check_model(model, full_check=True)
    check_decisions(decisions, fused)
    for f, want in feeds:
        assert_close(ort_run(model, f), want, f"{name} {form}")

    found = ops(model)
    forms = Counter(d["form"] for d in decisions)
    if form == "function":
        assert set(forms) == {"function"} and model.opset_import[0].version == 21
        # One function per op and attribute set (input shapes that give the same body share it).
        kinds = {(n.op, tuple(sorted(n.attrs.items()))) for n in fused.nodes if n.op in fused_ops()}
        assert len(model.functions) == len(kinds)
        assert sum(n for (domain, _), n in found.items() if domain == FUNCTION_DOMAIN) == len(decisions)
        assert not any(domain == MS for domain, _ in found)
    elif name in GQA_MODELS and form != "auto":
        # Grouped-query attention's core is rank 5 ([batch, kv_heads, group, seq, d], its own table
        # kind): GroupQueryAttention, or opset-23 Attention with fewer K/V heads (numbers and head
        # order: test_grouped_attention_encodings.py); the norms and rotary take their runtime ops.
        assert {d["kind"] for d in decisions if d["op"] == "attention"} == {"attention/grouped"}
        assert set(forms) == {form}, decisions
        if form == "contrib":
            assert found[(MS, "GroupQueryAttention")] == forms_of(decisions, "attention") == 2
            assert found[(MS, "SkipSimplifiedLayerNormalization")] == forms_of(decisions, "add_rmsnorm") == 4
            assert found[(MS, "RotaryEmbedding")] == forms_of(decisions, "rotary") == 4
        elif form == "onnx23":
            assert found[("", "Attention")] == forms_of(decisions, "attention") == 2
            assert found[("", "RMSNormalization")] == forms_of(decisions, "add_rmsnorm") == 4
            assert found[("", "RotaryEmbedding")] == forms_of(decisions, "rotary") == 4
    elif form == "contrib":
        assert set(forms) == {"contrib"}, decisions  # every fused op of these models has a contrib op
        assert found[(MS, "SkipLayerNormalization")] == sum(d["op"] == "add_layernorm" for d in decisions)
        # attention from the packed projection is com.microsoft.Attention, a bare core MultiHeadAttention
        assert found[(MS, "Attention")] == forms_of(decisions, "qkv_attention") == 2
        assert found[(MS, "MultiHeadAttention")] == forms_of(decisions, "attention") == 0
        assert found[(MS, "BiasGelu" if name == "bert-base" else "FastGelu")] == 2
        assert not model.functions
    elif form == "onnx23":
        assert model.opset_import[0].version == 23 and model.ir_version == OPSET_IR_VERSION[23]
        assert found[("", "Attention")] == 2 and forms["onnx23"] == 2
        attention = [n for n in model.graph.node if n.op_type == "Attention"]
        causal = [{a.name: a.i for a in n.attribute}.get("is_causal", 0) for n in attention]
        assert causal == ([0, 0] if name == "bert-base" else [1, 1])  # bert: its padding mask is a bias input
        assert all(len(n.input) == (4 if name == "bert-base" else 3) for n in attention)
        for d in decisions:
            if d["op"] not in ("attention", "qkv_attention"):
                assert d["form"] == "function" and "ONNX has no fused" in d["reason"]
    else:
        table = load_table()["providers"]["cpu"]["kinds"]
        tried = set()   # every form auto may write: each entry's form, then its fallbacks
        for d in decisions:
            entry = table.get(d["kind"]) or table[d["op"]]   # a variant not measured apart: its op's entry
            assert d["requested"] == entry["form"] and d["form"] in [entry["form"], *entry.get("then", []), "function"]
            tried.update([entry["form"], *entry.get("then", [])])
        want_opset = 23 if "onnx23" in tried else 21
        assert model.opset_import[0].version == want_opset


def test_function_bodies_read_dims_from_their_own_inputs(model_case):
    name, fused, weights, _ = model_case
    model = export_onnx(fused, weights, fused_as="function")
    for f in model.functions:
        assert f.domain == FUNCTION_DOMAIN and [(o.domain, o.version) for o in f.opset_import] == [("", 21)]
        # No free names: everything a body reads is a formal input or made in the body.
        made = set(f.input) | {x for n in f.node for x in n.output}
        assert {x for n in f.node for x in n.input} <= made, f.name
        for n in f.node:
            if n.op_type == "Shape":
                assert n.input[0] in f.input, f.name
    if name == "gpt2":  # one function per kind and attribute set, named after them
        assert sorted(f.name for f in model.functions) == [
            "AddLayerNorm", "AddLayerNorm_with_sum", "MatMulBiasAct_gelu_tanh", "QkvAttention_causal"]
        causal = next(f for f in model.functions if f.name == "QkvAttention_causal")
        assert list(causal.input) == ["x", "w", "bias"] and "Shape" in {n.op_type for n in causal.node}


# ---- small graphs: what the models do not cover ----------------------------------------
def rmsnorm_and_relu() -> Graph:
    g = Graph("rms_relu")
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    r = g.add_input("r", T(F32, "batch", "seq", 8))
    y, s = g.add_node("add_rmsnorm", [x, r, g.add_param("g", T(F32, 8))], {"with_sum": True}).outputs
    h = g.op("matmul_bias_act", y, g.add_param("w", T(F32, 8, 16)), g.add_param("b", T(F32, 16)), activation="relu")
    g.set_outputs([("y", y), ("sum", s), ("h", h), ("y2", g.op("add_rmsnorm", s, r, g.add_param("g2", T(F32, 8))))])
    return g


def attention_with_past(fill: float = float(np.finfo(np.float32).min)) -> Graph:
    """Non-square causal attention (a kv cache), a boolean and an additive mask."""
    g = Graph("past")
    q = g.add_input("q", T(F32, "batch", 2, "seq", 4))
    k = g.add_input("k", T(F32, "batch", 2, "past+seq", 4))
    v = g.add_input("v", T(F32, "batch", 2, "past+seq", 4))
    keep = g.add_input("keep", T(BOOL, "batch", 1, 1, "past+seq"))
    bias = g.add_input("bias", T(F32, "seq", "past+seq"))
    g.add_input("pos", T(DType.int64, "past"))  # gives 'past' a source
    g.set_outputs([("causal", g.op("attention", q, k, v, scale=0.5, causal=True)),
                   ("masked", g.op("attention", q, k, v, keep, mask="bool", fill=fill)),
                   ("keep_causal", g.op("attention", q, k, v, keep, mask="bool", causal=True, fill=fill)),
                   ("bias_causal", g.op("attention", q, k, v, bias, mask="additive", causal=True, fill=fill)),
                   ("softmax", g.op("masked_softmax", g.op("matmul", q, g.op("transpose", k, perm=[0, 1, 3, 2])),
                                    keep, mask="bool", causal=True, fill=fill))])
    return g


def small_feeds(g: Graph, bindings: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.inputs:
        shape = v.type.concrete_shape(bindings)
        feeds[v.name] = (rng.random(shape) < 0.6 if v.dtype == BOOL else
                         rng.integers(0, 5, shape).astype(np.int64) if v.dtype == DType.int64 else
                         rng.uniform(-2, 2, shape).astype(np.float32))
    for name in ("keep", "own"):
        if name in feeds:
            feeds[name][0] = False  # a fully masked row
    return feeds


def small_weights(g: Graph) -> dict:
    rng = np.random.default_rng(1)
    return {n: rng.uniform(-1, 1, v.type.concrete_shape({})).astype(np.float32) for n, v in g.params.items()}


def run_small(g: Graph, form: str, bindings_list=({"batch": 2, "seq": 3, "past": 4}, {"batch": 1, "seq": 5, "past": 0})):
    weights = small_weights(g)
    model, decisions = export_onnx_decided(g, weights, fused_as=form)
    onnx.checker.check_model(model, full_check=True)
    check_decisions(decisions, g)
    for i, b in enumerate(bindings_list):
        feeds = small_feeds(g, b, seed=i)
        assert_close(ort_run(model, feeds), run_reference(g, weights, feeds), f"{g.name} {form} {b}")
    return model, decisions


@pytest.mark.parametrize("form", FORMS)
def test_add_rmsnorm_and_relu(form):
    model, decisions = run_small(rmsnorm_and_relu(), form)
    by_op = {d["op"]: d for d in decisions}
    found = ops(model)
    if form == "contrib":
        assert found[(MS, "SkipSimplifiedLayerNormalization")] == 2
        assert by_op["matmul_bias_act"]["form"] == "function" and "ReLU" in by_op["matmul_bias_act"]["reason"]
    elif form == "onnx23":
        assert found[("", "RMSNormalization")] == 2 and model.opset_import[0].version == 23
        assert by_op["add_rmsnorm"]["form"] == "onnx23"
    elif form == "function":
        assert {f.name for f in model.functions} == {"AddRMSNorm_with_sum", "AddRMSNorm", "MatMulBiasAct_relu"}


@pytest.mark.parametrize("form", FORMS)
def test_attention_with_past_and_masks(form):
    model, decisions = run_small(attention_with_past(), form)
    attention = [d for d in decisions if d["op"] == "attention"]
    if form in ("contrib", "onnx23"):
        assert [d["form"] for d in attention] == [form] * 4
        op = (MS, "MultiHeadAttention") if form == "contrib" else ("", "Attention")
        nodes = [n for n in model.graph.node if (n.domain, n.op_type) == op]
        assert len(nodes) == 4
        # past+seq keys: causal alignment is not the op's own, so none uses its causal flag
        assert not any(a.name in ("unidirectional", "is_causal") for n in nodes for a in n.attribute)
        softmax = next(d for d in decisions if d["op"] == "masked_softmax")
        assert softmax["form"] == "function" and "masked softmax" in softmax["reason"]


@pytest.mark.parametrize("form", ["contrib", "onnx23"])
def test_a_fill_an_added_bias_cannot_express_falls_back(form):
    model, decisions = run_small(attention_with_past(fill=-1e4), form)
    masked = [d for d in decisions if d["op"] == "attention"][1:]
    assert [d["form"] for d in masked] == ["function"] * 3
    assert all("fill=-10000" in d["reason"] for d in masked)


def test_bert_padding_mask_becomes_key_padding_mask():
    g = Graph("pad")
    q, k, v = (g.add_input(n, T(F32, "batch", 2, "seq", 4)) for n in "qkv")
    keep = g.add_input("keep", T(BOOL, "batch", 1, 1, "seq"))
    g.set_outputs([("y", g.op("attention", q, k, v, keep, mask="bool", scale=0.5))])
    model, _ = run_small(g, "contrib", [{"batch": 3, "seq": 4}])
    mha = next(n for n in model.graph.node if n.op_type == "MultiHeadAttention")
    assert len(mha.input) == 5 and mha.input[4]  # key_padding_mask, no attention_bias


def qkv_attentions(fill: float = float(np.finfo(np.float32).min)) -> Graph:
    """Attention through the packed projection: every masking its runtime
    ops take differently, and a v wider than q and k."""
    g = Graph("qkv")
    x = g.add_input("x", T(F32, "batch", "seq", 6))
    keep = g.add_input("keep", T(BOOL, "batch", 1, 1, "seq"))
    bias = g.add_input("bias", T(F32, "seq", "seq"))
    w, b = g.add_param("w", T(F32, 6, 24)), g.add_param("b", T(F32, 24))
    w2, b2 = g.add_param("w2", T(F32, 6, 32)), g.add_param("b2", T(F32, 32))
    common = dict(heads=2, sizes=[8, 8, 8], scale=0.3)
    g.set_outputs([("causal", g.op("qkv_attention", x, w, b, causal=True, **common)),
                   ("padding", g.op("qkv_attention", x, w, b, keep, mask="bool", fill=fill, **common)),
                   ("padding_causal", g.op("qkv_attention", x, w, b, keep, mask="bool", causal=True, fill=fill,
                                           **common)),
                   ("bias_causal", g.op("qkv_attention", x, w, b, bias, mask="additive", causal=True, fill=fill,
                                        **common)),
                   ("wide_v", g.op("qkv_attention", x, w2, b2, causal=True, heads=2, sizes=[8, 8, 16],
                                   scale=0.3))])
    return g


@pytest.mark.parametrize("form", FORMS)
def test_qkv_attention_masks_and_widths(form):
    model, decisions = run_small(qkv_attentions(), form, [{"batch": 2, "seq": 3}, {"batch": 1, "seq": 5}])
    if form in ("contrib", "onnx23"):
        assert [d["form"] for d in decisions] == [form] * 5
        op = (MS, "Attention") if form == "contrib" else ("", "Attention")
        nodes = [n for n in model.graph.node if (n.domain, n.op_type) == op]
        assert len(nodes) == 5
        flags = [{a.name: a.i for a in n.attribute}.get("unidirectional" if form == "contrib" else "is_causal", 0)
                 for n in nodes]
        if form == "contrib":
            # padding alone goes in as mask_index; with a causal mask, and any other mask, as one bias
            assert flags == [1, 0, 0, 0, 1]
            assert [len(n.input) for n in nodes] == [3, 4, 6, 6, 3]
            assert [a.ints for a in nodes[4].attribute if a.name == "qkv_hidden_sizes"] == [[8, 8, 16]]
        else:
            assert flags == [1, 0, 0, 0, 1] and [len(n.input) for n in nodes] == [3, 4, 4, 4, 3]
            assert not any(n.op_type == "Transpose" for n in model.graph.node)   # 3-D q, k, v: no head moves


@pytest.mark.parametrize("form", ["contrib", "onnx23"])
def test_qkv_attention_fill_an_added_bias_cannot_express_falls_back(form):
    _, decisions = run_small(qkv_attentions(fill=-1e4), form, [{"batch": 2, "seq": 3}])
    assert [d["form"] for d in decisions] == [form, "function", "function", "function", form]
    assert all("fill=-10000" in d["reason"] for d in decisions[1:4])


def guarded_attentions() -> Graph:
    """``guarded`` attention and qkv_attention: a row with no key gives zeros
    (small_feeds masks batch 0 whole), in each runtime op's layout; a
    per-head mask on qkv_attention, whose guarded rows are per head."""
    g = Graph("guarded")
    q = g.add_input("q", T(F32, "batch", 2, "seq", 8))
    k, v = (g.add_input(n, T(F32, "batch", 2, "past+seq", 8)) for n in "kv")
    keep = g.add_input("keep", T(BOOL, "batch", 1, 1, "past+seq"))
    g.add_input("pos", T(DType.int64, "past"))  # gives 'past' a source
    x = g.add_input("x", T(F32, "batch", "seq", 6))
    own = g.add_input("own", T(BOOL, "batch", 1, 1, "seq"))
    heads = g.add_input("heads", T(BOOL, "batch", 2, "seq", "seq"))
    w, b = g.add_param("w", T(F32, 6, 24)), g.add_param("b", T(F32, 24))
    common = dict(heads=2, sizes=[8, 8, 8], scale=0.3, guarded=True, mask="bool")
    g.set_outputs([("att", g.op("attention", q, k, v, keep, mask="bool", scale=0.5, guarded=True)),
                   ("att_causal", g.op("attention", q, k, v, keep, mask="bool", causal=True, guarded=True)),
                   ("qkv", g.op("qkv_attention", x, w, b, own, **common)),
                   ("qkv_causal", g.op("qkv_attention", x, w, b, own, causal=True, **common)),
                   ("qkv_per_head", g.op("qkv_attention", x, w, b, heads, causal=True, **common))])
    return g


def torch_guarded(feeds: dict, weights: dict, past: int) -> dict:
    """``guarded_attentions`` as PyTorch writes it: SDPA with a boolean
    mask (``True``: attend), whose rows with no key to attend are zeros."""
    torch = pytest.importorskip("torch")
    sdpa, t = torch.nn.functional.scaled_dot_product_attention, {k: torch.from_numpy(v) for k, v in feeds.items()}
    w, b = torch.from_numpy(weights["w"]), torch.from_numpy(weights["b"])
    seq = feeds["q"].shape[2]
    below = torch.ones(seq, past + seq, dtype=torch.bool).tril(past)   # key j <= query i + past

    def qkv(mask):   # x @ w + b, split in q, k, v of 2 heads of 4; the heads joined after
        q, k, v = ((t["x"] @ w + b).split(8, dim=-1))
        heads = [part.unflatten(-1, (2, 4)).transpose(1, 2) for part in (q, k, v)]
        return sdpa(*heads, attn_mask=mask, scale=0.3).transpose(1, 2).flatten(2)
    out = {"att": sdpa(t["q"], t["k"], t["v"], attn_mask=t["keep"], scale=0.5),
           "att_causal": sdpa(t["q"], t["k"], t["v"], attn_mask=t["keep"] & below, scale=1.0),
           "qkv": qkv(t["own"]), "qkv_causal": qkv(t["own"] & below[:, past:]),
           "qkv_per_head": qkv(t["heads"] & below[:, past:])}
    return {k: v.numpy() for k, v in out.items()}


# The op ONNX Runtime runs for each guarded node: a blockc.fused function, or the runtime op; the per-head
# mask is a function in every form (no runtime op takes one mask per head and guards its rows).
GUARDED_OPS = {
    "function": [(FUNCTION_DOMAIN, f) for f in ("Attention_bool_guarded", "Attention_bool_causal_guarded",
                                                "QkvAttention_bool_guarded", "QkvAttention_bool_causal_guarded")],
    "contrib": [(MS, "MultiHeadAttention")] * 2 + [(MS, "Attention")] * 2,
    "onnx23": [("", "Attention")] * 4}


@pytest.mark.parametrize("form", ["function", "contrib", "onnx23"])
def test_guarded_rows_with_no_key_are_zero_in_every_form(form):
    g = guarded_attentions()
    bindings = {"batch": 2, "seq": 3, "past": 4}
    model, decisions = run_small(g, form, [bindings, {"batch": 2, "seq": 5, "past": 0}])
    assert [d["form"] for d in decisions] == [form] * 4 + ["function"]
    if form != "function":
        assert "per head" in decisions[4]["reason"]
    per_head = (FUNCTION_DOMAIN, "QkvAttention_bool_causal_guarded")
    runs = [(n.domain, n.op_type) for n in model.graph.node if n.domain or n.op_type == "Attention"]
    assert runs == GUARDED_OPS[form] + [per_head]
    assert {f.name for f in model.functions} == {name for domain, name in runs if domain == FUNCTION_DOMAIN}
    # batch 0's rows see no key: zeros, as PyTorch's SDPA gives, where the float64 reference agrees
    feeds, weights = small_feeds(g, bindings), small_weights(g)
    got, ref, want = ort_run(model, feeds), run_reference(g, weights, feeds), torch_guarded(feeds, weights, 4)
    assert not want["att"][0].any() and not want["qkv"][0].any() and want["att"][1].all()
    assert_close(got, want, f"{form} against torch")
    assert_close(ref, want, "the float64 reference against torch")


def test_a_decomposition_whose_shapes_do_not_check_is_an_error_not_inlined(monkeypatch):
    """A function's body is the op's decomposition over the node's own dims:
    one that does not type (a bug in the decomposition) is raised naming the
    node, not retried as the op written in place."""
    from blockc.errors import ShapeError
    from blockc.ops import registry
    calls = []

    def broken(b, node, xs):   # adds x [batch, seq, 8] to r transposed, [8, seq, batch]
        calls.append(node.op)
        x, r, _ = xs
        return [b.op("add", x, b.op("transpose", r, perm=[2, 1, 0]))]
    monkeypatch.setattr(registry.get("add_rmsnorm"), "decompose_fn", broken)
    g = Graph("broken")
    x, r = (g.add_input(n, T(F32, "batch", "seq", 8)) for n in "xr")
    g.set_outputs([("y", g.op("add_rmsnorm", x, r, g.add_param("g", T(F32, 8))))])
    with pytest.raises(ShapeError, match=r"decomposition of add_rmsnorm \(node 0\) does not type.*broadcast"):
        export_onnx_decided(g, {"g": np.ones(8, np.float32)}, fused_as="function")
    assert calls == ["add_rmsnorm"]


# ---- Hugging Face's padding masks: float32's lowest, left-padded and fully masked rows ----------
def padding_bias(keep: np.ndarray) -> np.ndarray:
    """An additive mask as Hugging Face's exports make it: float32's lowest on the masked keys."""
    return np.where(keep, 0, np.finfo(np.float32).min).astype(np.float32)


def hf_padding_masks() -> Graph:
    """Each attention that takes an additive mask, as an exported Hugging Face
    model feeds it: over the keys ([batch,1,1,seq]), with the causal mask
    merged in ([batch,1,seq,seq], GPT-2 and Llama), grouped, and through the
    packed projection."""
    g = Graph("hf_padding")
    q, k, v = (g.add_input(n, T(F32, "batch", 4, "seq", 8)) for n in "qkv")
    k2, v2 = (g.add_input(n, T(F32, "batch", 2, "seq", 8)) for n in ("k2", "v2"))
    x = g.add_input("x", T(F32, "batch", "seq", 6))
    keys = g.add_input("keys", T(F32, "batch", 1, 1, "seq"))
    merged = g.add_input("merged", T(F32, "batch", 1, "seq", "seq"))
    w, b = g.add_param("w", T(F32, 6, 48)), g.add_param("b", T(F32, 48))
    reshape = lambda t, dims: g.op("reshape", t, shape=dims)   # noqa: E731
    gq, gk, gv, gm = group_heads(q, k2, v2, keys, 2, reshape)
    grouped = g.op("attention", gq, gk, gv, gm, mask="additive", causal=True, scale=0.4)
    g.set_outputs([("by_key", g.op("attention", q, k, v, keys, mask="additive", scale=0.4)),
                   ("keys_causal", g.op("attention", q, k, v, keys, mask="additive", causal=True, scale=0.4)),
                   ("causal_merged", g.op("attention", q, k, v, merged, mask="additive", scale=0.4)),
                   ("grouped", ungroup_heads(grouped, reshape)),
                   ("qkv", g.op("qkv_attention", x, w, b, keys, mask="additive", causal=True, heads=2,
                                sizes=[16, 16, 16], scale=0.3))])
    return g


def hf_padding_feeds(g: Graph) -> dict:
    """Batch rows right-padded, left-padded (its first queries see no key
    under a causal mask) and fully masked."""
    feeds = small_feeds(g, {"batch": 3, "seq": 5})
    keep = np.ones((3, 5), bool)
    keep[0, 3:] = keep[1, :2] = keep[2] = False
    feeds["keys"] = padding_bias(keep[:, None, None, :])
    feeds["merged"] = padding_bias(keep[:, None, None, :] & np.tril(np.ones((5, 5), bool)))
    return feeds


@pytest.mark.parametrize("form", FORMS)
def test_float32_lowest_in_an_additive_mask_averages_fully_masked_rows(form):
    """ONNX Runtime's Attention reads float32's lowest as -inf, which gives
    zeros for a row with every key masked; the fused op, the float64
    reference and the original graph on ONNX Runtime average the values."""
    g = hf_padding_masks()
    rng = np.random.default_rng(1)
    weights = {n: rng.uniform(-1, 1, v.type.concrete_shape({})).astype(np.float32) for n, v in g.params.items()}
    feeds = hf_padding_feeds(g)
    model, decisions = export_onnx_decided(g, weights, fused_as=form)
    got = ort_run(model, feeds)
    if form != "function":   # the runtime ops are what is checked: only GroupQueryAttention falls back
        gqa = [d for d in decisions if d["requested"] == "contrib" and d["kind"] == "attention/grouped"]
        assert all("GroupQueryAttention masks causally apart from its bias" in d["reason"] for d in gqa)
        assert [d["form"] for d in decisions if d not in gqa] == [d["requested"] for d in decisions if d not in gqa]
        assert [d["form"] for d in gqa] == ["function" if form == "contrib" else "onnx23"] * len(gqa)
    unfused = ort_run(export_onnx(to_form(g, "decomposed"), weights), feeds)
    assert_close(got, unfused, f"{form} against the unfused graph on ONNX Runtime")
    assert_close(got, run_reference(g, weights, feeds, float64=True), f"{form} against float64")


# ---- choosing the form and the opset -------------------------------------------------------
def test_onnx23_picks_opset_23_and_refuses_an_older_one():
    g = rmsnorm_and_relu()
    weights = {n: np.zeros(v.type.concrete_shape({}), np.float32) for n, v in g.params.items()}
    assert export_onnx(g, weights, fused_as="onnx23").opset_import[0].version == 23
    assert export_onnx(g, weights, fused_as="onnx23", opset=24).opset_import[0].version == 24
    with pytest.raises(BlockcError, match="need opset 23 or later.*got opset 21"):
        export_onnx(g, weights, fused_as="onnx23", opset=21)
    with pytest.raises(BlockcError, match="unknown fused-op encoding 'fast'"):
        export_onnx(g, weights, fused_as="fast")
    with pytest.raises(BlockcError, match="unknown execution provider 'tpu'"):
        export_onnx(g, weights, provider="tpu")
    assert export_onnx(g, weights, fused_as="function").opset_import[0].version == 21


def test_auto_follows_the_table_and_falls_back_for_an_unmeasured_provider(monkeypatch):
    table = {"providers": {"cpu": {"machine": "test machine", "onnxruntime": "0", "kinds": {
        "add_rmsnorm": {"form": "onnx23", "why": "fast"},
        "matmul_bias_act/relu": {"form": "contrib", "why": "pretend"}}}}}
    monkeypatch.setattr(fused_encodings, "load_table", lambda path=TABLE_PATH: table)
    g = rmsnorm_and_relu()
    model, decisions = run_small(g, "auto")
    assert model.opset_import[0].version == 23  # because the table picks onnx23 for a node here
    assert [(d["requested"], d["form"]) for d in decisions] == [("onnx23", "onnx23"), ("contrib", "function"),
                                                                 ("onnx23", "onnx23")]
    assert "test machine" in decisions[0]["reason"] and "fast" in decisions[0]["reason"]
    assert "contrib declined" in decisions[1]["reason"] and "auto picked contrib" in decisions[1]["reason"]

    weights = {n: np.zeros(v.type.concrete_shape({}), np.float32) for n, v in g.params.items()}
    model, decisions = export_onnx_decided(g, weights, provider="cuda")
    assert model.opset_import[0].version == 21
    assert {d["form"] for d in decisions} == {"function"}
    assert all("cuda was not measured" in d["reason"] for d in decisions)
    # A form asked for with an opset too old for it: auto falls back, it does not fail.
    decisions = export_onnx_decided(g, weights, opset=21).decisions
    assert "needs opset 23" in decisions[0]["reason"]


def test_ort_session_passes_the_form_through():
    g = rmsnorm_and_relu()
    weights = {n: np.ones(v.type.concrete_shape({}), np.float32) for n, v in g.params.items()}
    with OrtSession(g, weights, fused_as="contrib", decide=True) as s:
        feeds = small_feeds(g, {"batch": 2, "seq": 3})
        assert_close(s.run(feeds), run_reference(g, weights, feeds), "OrtSession contrib")
    assert [d["form"] for d in s.decisions] == ["contrib", "function", "contrib"]
    with OrtSession(g, weights, fused_as="function") as s:
        assert_close(s.run(feeds), run_reference(g, weights, feeds), "OrtSession function")


# ---- the shipped table and the script that makes it -------------------------------------
def test_shipped_table_covers_every_fused_kind_on_cpu():
    with open(TABLE_PATH) as f:
        table = json.load(f)
    cpu = table["providers"]["cpu"]
    assert cpu["machine"] and cpu["onnxruntime"] and cpu["intra_op_threads"] == 2 and cpu["optimization"] == "basic"
    assert {k.split("/")[0] for k in cpu["kinds"]} == set(fused_ops())
    # every kind the bench measures, the variants it keys apart included (attention/grouped)
    assert {case.key for case in _bench().cases()} <= set(cpu["kinds"])
    for key, entry in cpu["kinds"].items():
        assert entry["form"] in ("function", "contrib", "onnx23") and entry["why"], key
        assert set(entry.get("then", [])) <= {"contrib", "onnx23"} - {entry["form"]}, key
        for case in entry["cases"]:
            assert case["shape"] and entry["form"] in case["ms"] and "function" in case["ms"], key
            assert set(case["ms"]) | set(case["declined"]) == {"function", "contrib", "onnx23"}, key


def _bench():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "fused_encodings.py")
    spec = importlib.util.spec_from_file_location("bench_fused_forms", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_chooses_the_fastest_unless_function_is_within_the_margin():
    choose = _bench().choose
    cases = [{"shape": "[a]", "ms": {"function": 1.0, "contrib": 4.0, "onnx23": 0.5}},
             {"shape": "[b]", "ms": {"function": 10.0, "contrib": 30.0, "onnx23": 6.0}}]
    form, why = choose(cases, 0.05)
    assert form == "onnx23" and "onnx23 0.5 ms, function 1 ms, contrib 4 ms at [a]" in why
    form, why = choose([{"shape": "[a]", "ms": {"function": 1.0, "contrib": 0.97}}], 0.05)
    assert form == "function" and "within 5%" in why
    # Geometric mean over shapes: a big win at one shape beats a small loss at another.
    form, _ = choose([{"shape": "[a]", "ms": {"function": 1.0, "contrib": 1.1}},
                      {"shape": "[b]", "ms": {"function": 10.0, "contrib": 5.0}}], 0.05)
    assert form == "contrib"


def test_bench_keeps_the_next_fastest_forms_for_where_the_chosen_one_declines():
    fallbacks = _bench().fallbacks
    ms = {"function": 2.0, "contrib": 1.0, "onnx23": 1.5}
    assert fallbacks([{"shape": "[a]", "ms": ms}], "contrib", 0.05) == ["onnx23"]
    # only forms that beat function by the margin: a slower or tied one is not worth writing
    assert fallbacks([{"shape": "[a]", "ms": {**ms, "onnx23": 1.95}}], "contrib", 0.05) == []
    assert fallbacks([{"shape": "[a]", "ms": {"function": 1.0, "contrib": 1.02}}], "function", 0.05) == []
