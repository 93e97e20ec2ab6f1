"""Grouped-query attention (``attention`` in the rank-5 layout of
``ops.fused.group_heads``) in each ONNX encoding: opset-23 ``Attention``
with fewer K/V heads, ``com.microsoft.GroupQueryAttention`` (or
``MultiHeadAttention`` for a group of one) and the function. Every mask kind,
groups of 1, 2 and 4 and one K/V head for all (MQA), square and after a
past, on ONNX Runtime against a float64 oracle that repeats each K/V head
for its group (what Hugging Face's ``repeat_kv`` does): query head ``h``
reads K/V head ``h // group``. Every K/V head holds its own numbers, so a
lowering that read another head's would fail."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from blockc.codegen import fused_encodings
from blockc.codegen.fused_encodings import TABLE_PATH
from blockc.codegen.onnx_export import export_onnx_decided
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ops.fused import group_heads, ungroup_heads
from blockc.ops.masking import DEFAULT_FILL, apply_masks, causal_mask_array
from blockc.runtime.reference import run_reference
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)

MS = "com.microsoft"
F32, BOOL = DType.float32, DType.bool
SIZE = 8            # GroupQueryAttention wants a head size that is a multiple of 8
SCALE = 0.4
# (query heads, K/V heads): groups of 1, 2 and 4, and one K/V head for all
HEADS = [(4, 4), (4, 2), (8, 2), (4, 1)]
# name: (mask kind, mask shape over [batch, heads, rows, keys], causal)
MASKS = {
    "none": ("none", None, False),
    "causal": ("none", None, True),
    "padding": ("bool", ("batch", 1, 1, "keys"), False),
    "padding_causal": ("bool", ("batch", 1, 1, "keys"), True),
    "additive_causal": ("additive", ("seq", "keys"), True),
    "additive_heads": ("additive", ("batch", "heads", "seq", "keys"), False),
    "bool_heads_causal": ("bool", ("batch", "heads", "seq", "keys"), True),
}


def T(dtype, *shape) -> TensorType:
    return TensorType(dtype, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


def grouped_graph(heads: int, kv_heads: int, keys: str) -> Graph:
    """One grouped attention per mask of ``MASKS``, over ``keys`` keys ("seq":
    square; "past+seq": after a past), built as the DSL's grouped_attention
    builds it."""
    g = Graph(f"gqa_{heads}_{kv_heads}")
    q = g.add_input("q", T(F32, "batch", heads, "seq", SIZE))
    k, v = (g.add_input(n, T(F32, "batch", kv_heads, keys, SIZE)) for n in "kv")
    if keys != "seq":
        g.add_input("pos", T(DType.int64, "past"))  # gives 'past' a source
    reshape = lambda x, dims: g.op("reshape", x, shape=dims)   # noqa: E731
    outputs = []
    for name, (kind, shape, causal) in MASKS.items():
        mask = None
        if shape is not None:
            dims = [{"keys": keys, "heads": heads}.get(d, d) for d in shape]
            mask = g.add_input(f"{name}_mask", T(BOOL if kind == "bool" else F32, *dims))
        gq, gk, gv, gm = group_heads(q, k, v, mask, kv_heads, reshape)
        out = g.op("attention", gq, gk, gv, *([gm] if gm is not None else []), scale=SCALE, mask=kind,
                   causal=causal, fill=DEFAULT_FILL)
        outputs.append((name, ungroup_heads(out, reshape)))
    g.set_outputs(outputs)
    return g


def feeds_for(g: Graph, bindings: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.inputs:
        shape = v.type.concrete_shape(bindings)
        feeds[v.name] = (rng.random(shape) < 0.6 if v.dtype == BOOL else
                         rng.integers(0, 5, shape) if v.dtype == DType.int64 else
                         rng.uniform(-2, 2, shape).astype(np.float32))
    for v in g.inputs:   # fully masked rows: the op averages every value, the causal ones too
        if v.dtype == BOOL:
            feeds[v.name][0] = False
        elif v.name.endswith("_mask"):   # as Hugging Face's additive masks hide a key
            feeds[v.name][0] = np.finfo(np.float32).min
    return feeds


def oracle(feeds: dict, name: str, heads: int, kv_heads: int) -> np.ndarray:
    """float64 attention over each K/V head repeated for its group."""
    kind, _, causal = MASKS[name]
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    k, v = (np.repeat(x, heads // kv_heads, axis=1) for x in (k, v))   # head h: K/V head h // group
    s = q @ k.swapaxes(-1, -2)
    masks = [feeds[f"{name}_mask"].astype(np.float64 if kind == "additive" else bool)] if kind != "none" else []
    s = apply_masks(s, masks, {"scale": SCALE, "mask": kind, "causal": causal},
                    mul=lambda x, c: x * c, add=np.add, where=np.where, fill=DEFAULT_FILL,
                    causal=lambda: causal_mask_array(*s.shape[-2:]))
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def ort_run(model: onnx.ModelProto, feeds: dict) -> dict:
    s = peer_session(model.SerializeToString())
    names = [o.name for o in s.get_outputs()]
    used = {i.name for i in s.get_inputs()}
    return dict(zip(names, s.run(names, {k: v for k, v in feeds.items() if k in used})))


def expected_form(form: str, name: str, heads: int, kv_heads: int, square: bool) -> str:
    """The form each encoding writes; the rest are functions, for the reasons the test checks."""
    kind, _, causal = MASKS[name]
    if form == "contrib" and heads != kv_heads:   # GroupQueryAttention: causal, square, no mask
        return form if causal and square and kind == "none" else "function"
    return form


@pytest.mark.parametrize("keys", ["seq", "past+seq"])
@pytest.mark.parametrize("heads,kv_heads", HEADS, ids=lambda x: str(x))
@pytest.mark.parametrize("form", ["function", "onnx23", "contrib"])
def test_grouped_attention_in_every_form(form, heads, kv_heads, keys):
    g = grouped_graph(heads, kv_heads, keys)
    model, decisions = export_onnx_decided(g, {}, fused_as=form)
    onnx.checker.check_model(model, full_check=True)
    square = keys == "seq"
    want_forms = [expected_form(form, name, heads, kv_heads, square) for name in MASKS]
    assert [d["form"] for d in decisions] == want_forms, [d["reason"] for d in decisions]
    for d, want in zip(decisions, want_forms):
        if want != form:
            assert d["reason"].startswith(f"{form} declined: GroupQueryAttention"), d["reason"]
    found = Counter((n.domain, n.op_type) for n in model.graph.node)
    runtime_op = {"onnx23": ("", "Attention"),
                  "contrib": (MS, "GroupQueryAttention" if heads != kv_heads else "MultiHeadAttention")}.get(form)
    if runtime_op:
        assert found[runtime_op] == want_forms.count(form)
    for i, bindings in enumerate([{"batch": 2, "seq": 5, "past": 3}, {"batch": 1, "seq": 3, "past": 0}]):
        if square:
            bindings["past"] = 0
        feeds = feeds_for(g, bindings, seed=i)
        got = ort_run(model, feeds)
        reference = run_reference(g, {}, feeds)
        for name in MASKS:
            want = oracle(feeds, name, heads, kv_heads)
            np.testing.assert_allclose(reference[name], want, rtol=1e-9, atol=1e-9, err_msg=f"reference {name}")
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=2e-5, err_msg=f"{form} {name} {bindings}")


def test_the_oracle_tells_the_head_orders_apart():
    # Query head h on K/V head h % kv_heads (np.tile) instead of h // group: the numbers the test
    # compares must differ, or a lowering that read K/V heads in that order would pass.
    g = grouped_graph(8, 2, "seq")
    feeds = feeds_for(g, {"batch": 1, "seq": 4}, seed=0)
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    k, v = (np.tile(x, (1, 4, 1, 1)) for x in (k, v))
    s = q @ k.swapaxes(-1, -2) * SCALE
    p = np.exp(s - s.max(-1, keepdims=True))
    tiled = (p / p.sum(-1, keepdims=True)) @ v
    assert np.abs(tiled - oracle(feeds, "none", 8, 2)).max() > 0.1


def test_auto_writes_the_next_fastest_form_where_the_fastest_declines(monkeypatch):
    # GroupQueryAttention declines a boolean mask; opset-23 Attention, measured next, takes it.
    table = {"providers": {"cpu": {"machine": "test machine", "onnxruntime": "0", "kinds": {
        "attention/grouped": {"form": "contrib", "then": ["onnx23"], "why": "pretend"}}}}}
    monkeypatch.setattr(fused_encodings, "load_table", lambda path=TABLE_PATH: table)
    g = grouped_graph(4, 2, "seq")
    model, decisions = export_onnx_decided(g, {})
    assert model.opset_import[0].version == 23   # onnx23 may be written: its opset
    by_mask = {name: d for name, d in zip(MASKS, decisions)}
    assert by_mask["causal"]["form"] == "contrib"
    assert by_mask["none"]["form"] == by_mask["padding_causal"]["form"] == "onnx23"
    reason = by_mask["padding_causal"]["reason"]
    assert reason.startswith("contrib declined: GroupQueryAttention masks causally apart from its bias")
    assert "written as onnx23, measured next fastest (auto picked contrib" in reason
    feeds = feeds_for(g, {"batch": 2, "seq": 5}, seed=0)
    got = ort_run(model, feeds)
    for name in MASKS:
        np.testing.assert_allclose(got[name], oracle(feeds, name, 4, 2), rtol=1e-4, atol=2e-5, err_msg=name)
