"""The ONNX Runtime runner: results against the float64 reference, sessions
reused across dim values, providers, options, external data and errors."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from blockc.errors import BlockcError
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.runtime.ort_runner import OrtSession, run_ort
from blockc.runtime.reference import run_reference

F32, F16, BF16, I64 = DType.float32, DType.float16, DType.bfloat16, DType.int64


def T(dtype, *shape) -> TensorType:
    return TensorType(dtype, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


def attention_block(dtype=F32, d=16, heads=2, vocab=20) -> tuple[Graph, dict]:
    """Embedding, layernorm, causal self-attention over a KV cache, gelu MLP, rmsnorm."""
    g = Graph("block")
    rng = np.random.default_rng(0)
    weights = {}

    def param(name, *shape):
        weights[name] = (rng.standard_normal(shape) * 0.3).astype(dtype.numpy)
        return g.add_param(name, T(dtype, *shape))

    ids = g.add_input("ids", T(I64, "batch", "seq"))
    past = g.add_input("past_kv", T(dtype, "batch", "past", d))
    b, s, p, hd = parse_dim("batch"), parse_dim("seq"), parse_dim("past"), d // heads
    x = g.op("gather", param("wte", vocab, d), ids)
    h = g.op("layernorm", x, param("ln.g", d), param("ln.b", d))
    q, k, v = g.add_node("split", [g.op("matmul", h, param("qkv", d, 3 * d))],
                         {"axis": -1, "sizes": [d, d, d]}).outputs
    kv = g.op("concat", past, k, axis=1)
    split_heads = lambda t, n: g.op("transpose", g.op("reshape", t, shape=[b, n, heads, hd]),  # noqa: E731
                                    perm=[0, 2, 1, 3])
    qh, kh, vh = split_heads(q, s), split_heads(kv, p + s), split_heads(g.op("concat", past, v, axis=1), p + s)
    scores = g.op("mul", g.op("matmul", qh, g.op("transpose", kh, perm=[0, 1, 3, 2])),
                  g.op("constant", value=np.array(hd ** -0.5, dtype.numpy)))
    mask = g.op("causal_mask", rows=s, cols=p + s)
    scores = g.op("where", mask, scores, g.op("constant", value=np.array(-1e4, dtype.numpy)))
    att = g.op("matmul", g.op("softmax", scores), vh)
    att = g.op("reshape", g.op("transpose", att, perm=[0, 2, 1, 3]), shape=[0, 0, -1])
    x = g.op("add", x, g.op("matmul", att, param("proj", d, d)))
    m = g.op("gelu", g.op("matmul", g.op("rmsnorm", x, param("rms.g", d)), param("fc", d, 2 * d)), approximate="tanh")
    x = g.op("add", x, g.op("matmul", m, param("fc2", 2 * d, d)))
    g.set_outputs([("hidden", x), ("present_kv", kv),
                   ("last", g.op("slice", x, axis=1, start=s - 1, end=s))])
    return g, weights


def feeds_for(g: Graph, bindings, seed=1, vocab=20) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for v in g.inputs:
        shape = v.type.concrete_shape(bindings)
        if v.dtype.is_float:
            out[v.name] = rng.standard_normal(shape).astype(v.dtype.numpy)
        else:
            out[v.name] = rng.integers(0, vocab, shape).astype(v.dtype.numpy)
    return out


def assert_close(graph, weights, feeds, got, tol):
    ref = run_reference(graph, weights, feeds, float64=True)
    assert list(got) == [name for name, _ in graph.outputs]
    for name, want in ref.items():
        assert got[name].dtype == graph.output(name).dtype.numpy, name
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name].astype(np.float64), want, rtol=tol, atol=tol, err_msg=name)


# -- numbers --------------------------------------------------------------------------
def test_run_ort_matches_reference():
    g, w = attention_block()
    feeds = feeds_for(g, {"batch": 2, "seq": 5, "past": 3})
    assert_close(g, w, feeds, run_ort(g, w, feeds), 1e-4)


def test_one_session_runs_several_sequence_lengths():
    g, w = attention_block()
    with OrtSession(g, w) as sess:
        for bindings in ({"batch": 2, "seq": 4, "past": 0}, {"batch": 1, "seq": 9, "past": 5},
                         {"batch": 3, "seq": 1, "past": 7}):
            feeds = feeds_for(g, bindings, seed=bindings["seq"])
            out = sess.run(feeds)
            assert out["hidden"].shape == (bindings["batch"], bindings["seq"], 16)
            assert_close(g, w, feeds, out, 1e-4)


def test_float16_model():
    g, w = attention_block(F16)
    feeds = feeds_for(g, {"batch": 2, "seq": 4, "past": 2})
    assert_close(g, w, feeds, run_ort(g, w, feeds), 5e-2)


@pytest.mark.parametrize("level", ["disabled", "basic", "extended", "all"])
def test_optimization_levels_agree(level):
    g, w = attention_block()
    feeds = feeds_for(g, {"batch": 2, "seq": 3, "past": 2})
    assert_close(g, w, feeds, run_ort(g, w, feeds, optimization=level, threads=1), 1e-4)


def test_bfloat16_inputs_and_outputs_cross_the_numpy_bridge():
    g = Graph("bf16")
    x = g.add_input("x", T(BF16, "seq", 4))
    g.set_outputs([("same", g.op("reshape", x, shape=[-1])), ("wide", g.op("cast", x, to="f32"))])
    x = np.array([[1.5, -2.25, 3.0, 0.0078125]] * 3, ml_dtypes.bfloat16)
    out = run_ort(g, {}, {"x": x})
    assert out["same"].dtype == ml_dtypes.bfloat16
    assert out["same"].view(np.uint16).tolist() == x.reshape(-1).view(np.uint16).tolist()
    assert out["wide"].dtype == np.float32 and np.array_equal(out["wide"], x.astype(np.float32))


# -- weights: OrtValues over the caller's arrays, never through protobuf ------------------------
def spy_on_sessions(monkeypatch) -> list:
    """The model bytes each ``InferenceSession`` is made from."""
    made, real = [], ort.InferenceSession

    def spy(model, *a, **k):
        made.append(model)
        return real(model, *a, **k)
    monkeypatch.setattr(ort, "InferenceSession", spy)
    return made


def test_the_session_gets_the_weights_without_serializing_them(monkeypatch):
    made = spy_on_sessions(monkeypatch)
    g, w = attention_block(d=64)
    feeds = feeds_for(g, {"batch": 2, "seq": 3, "past": 2})
    with OrtSession(g, w) as sess:
        assert_close(g, w, feeds, sess.run(feeds), 1e-4)
        assert all(sess.weights[name] is w[name] for name in w)   # the caller's arrays, not copies
    [model] = made
    assert len(model) < sum(a.nbytes for a in w.values()) / 10
    assert_declared_only(g, model)


def assert_declared_only(g: Graph, model: bytes) -> None:
    """Each parameter's initializer in ``model`` is declared external and holds no bytes."""
    params = [t for t in onnx.load_from_string(model).graph.initializer if t.name in g.params]
    assert sorted(t.name for t in params) == sorted(g.params)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data for t in params)


def test_weights_are_bound_on_every_level_and_dtype(monkeypatch):
    made = spy_on_sessions(monkeypatch)
    g, w = attention_block(F16)
    feeds = feeds_for(g, {"batch": 1, "seq": 3, "past": 1})
    for level in ("basic", "all"):
        assert_close(g, w, feeds, run_ort(g, w, feeds, optimization=level), 5e-2)
    assert len(made) == 2
    for model in made:
        assert_declared_only(g, model)


def test_bfloat16_weights_are_bound_as_bfloat16():
    g = Graph("bf16_param")
    x = g.add_input("x", T(BF16, "seq", 4))
    g.set_outputs([("y", g.op("cast", g.op("concat", x, g.add_param("w", T(BF16, 2, 4)), axis=0), to="f32"))])
    w = {"w": np.array([[1.5, -2.25, 3.0, 0.0078125], [7, 8, 9, 10]], ml_dtypes.bfloat16)}
    x = np.array([[0.5, 1, 2, 4]], ml_dtypes.bfloat16)
    assert np.array_equal(run_ort(g, w, {"x": x})["y"], np.concatenate([x, w["w"]]).astype(np.float32))


def test_read_only_and_strided_weights_are_bound():
    # memory-mapped weights are read-only; a transposed view is not contiguous (bound as a copy)
    g, w = attention_block()
    for a in w.values():
        a.setflags(write=False)
    w["qkv"] = np.asfortranarray(w["qkv"])
    feeds = feeds_for(g, {"batch": 1, "seq": 3, "past": 1})
    with OrtSession(g, w) as sess:
        assert_close(g, w, feeds, sess.run(feeds), 1e-4)
        assert sess.weights["proj"] is w["proj"] and sess.weights["qkv"].flags.c_contiguous


def test_weights_changed_between_two_sessions_are_used():
    g, w = attention_block()
    feeds = feeds_for(g, {"batch": 1, "seq": 3, "past": 1})
    first = run_ort(g, w, feeds)["hidden"]
    changed = {name: a * 0.5 for name, a in w.items()}
    assert_close(g, changed, feeds, run_ort(g, changed, feeds), 1e-4)
    assert np.array_equal(run_ort(g, w, feeds)["hidden"], first)


def test_closing_releases_the_weights():
    g, w = attention_block()
    sess = OrtSession(g, w)
    sess.close()
    assert sess.weights == {}
    with pytest.raises(BlockcError, match="closed"):
        sess.run(feeds_for(g, {"batch": 1, "seq": 3, "past": 1}))


# -- weights in a .safetensors file: ONNX Runtime maps the file itself ----------------------------
def saved_block(tmp_path, **kw):
    """``attention_block``'s graph and its weights loaded back from a .safetensors file (views of its map)."""
    from blockc.frontends.weights import load_weights, save_weights
    g, w = attention_block(**kw)
    save_weights(tmp_path / "w.safetensors", w)
    return g, load_weights(tmp_path / "w.safetensors")


def external_places(model: bytes) -> dict:
    """``{initializer: (location, offset, length)}`` as the model declares them."""
    out = {}
    for t in onnx.load_from_string(model).graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        out[t.name] = (info.get("location"), int(info.get("offset", -1)), int(info.get("length", -1)))
    return out


def test_weights_from_a_safetensors_file_are_declared_at_their_place_in_it(tmp_path, monkeypatch):
    """No OrtValue, no copy: each initializer names the file, and the offset and
    length its header gives, which ONNX Runtime memory-maps itself."""
    from blockc.frontends.weights import SafetensorsFiles
    made = spy_on_sessions(monkeypatch)
    g, w = saved_block(tmp_path, d=64)
    feeds = feeds_for(g, {"batch": 2, "seq": 3, "past": 2})
    with OrtSession(g, w) as sess:
        assert_close(g, w, feeds, sess.run(feeds), 1e-4)
        assert sess._weight_values == []   # nothing handed over as an OrtValue (ONNX Runtime would copy it)
    files = SafetensorsFiles([tmp_path / "w.safetensors"])
    want = {name: ("w.safetensors", *files._where[name]) for name in g.params}
    assert {name: (loc, start, start + n) for name, (loc, start, n) in external_places(made[0]).items()
            if name in g.params} == want


def test_mixed_weights_map_the_file_and_bind_the_rest(tmp_path):
    g, w = saved_block(tmp_path)
    w = dict(w, qkv=np.asfortranarray(w["qkv"]), proj=np.array(w["proj"]))   # not views of the file
    feeds = feeds_for(g, {"batch": 1, "seq": 3, "past": 1})
    with OrtSession(g, w) as sess:
        assert_close(g, w, feeds, sess.run(feeds), 1e-4)
        assert len(sess._weight_values) == 2


def test_a_linked_weights_file_is_mapped_where_it_lies(tmp_path):
    """A Hugging Face cache's layout: snapshots/<rev>/model.safetensors links to
    ../../blobs/<hash>; ONNX Runtime refuses a file that resolves outside the
    folder it is given, so the folder is the file's own."""
    from blockc.frontends.weights import load_weights, save_weights
    g, w = attention_block()
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snapshots" / "rev").mkdir(parents=True)
    save_weights(tmp_path / "blobs" / "1234abcd.safetensors", w)
    (tmp_path / "snapshots" / "rev" / "model.safetensors").symlink_to("../../blobs/1234abcd.safetensors")
    linked = load_weights(tmp_path / "snapshots" / "rev" / "model.safetensors")
    feeds = feeds_for(g, {"batch": 1, "seq": 3, "past": 1})
    with OrtSession(g, linked) as sess:
        assert_close(g, w, feeds, sess.run(feeds), 1e-4)
        assert sess._weight_values == []


def test_a_weights_file_rewritten_between_two_sessions_is_read_afresh(tmp_path):
    from blockc.frontends.weights import load_weights, save_weights
    g, w = saved_block(tmp_path)
    feeds = feeds_for(g, {"batch": 1, "seq": 3, "past": 1})
    first = run_ort(g, w, feeds)["hidden"]
    save_weights(tmp_path / "w.safetensors", {name: np.asarray(a) * 0.5 for name, a in w.items()})
    changed = load_weights(tmp_path / "w.safetensors")
    got = run_ort(g, changed, feeds)["hidden"]
    assert_close(g, changed, feeds, {**run_ort(g, changed, feeds)}, 1e-4)
    assert not np.allclose(got, first)


def anonymous_kib() -> int:
    return int(next(line for line in open("/proc/self/smaps_rollup") if line.startswith("Anonymous:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="reads Linux's memory accounting")
def test_sessions_over_a_file_share_its_pages_instead_of_copying(tmp_path):
    """Two sessions over 16 MiB of weights in a file (an embedding table and a
    head, unpacked as a decode step at batch 1 runs them) add no anonymous
    memory of that size: both read the file's pages, one copy in memory.
    Handed over as OrtValues, ONNX Runtime 1.31 copied them, per session."""
    from blockc.frontends.weights import load_weights, save_weights
    g = Graph("table")
    ids = g.add_input("ids", T(I64, "batch", "seq"))
    x = g.op("gather", g.add_param("wte", T(F32, 32768, 128)), ids)
    g.set_outputs([("logits", g.op("matmul", x, g.add_param("head", T(F32, 128, 32768))))])
    rng = np.random.default_rng(0)
    save_weights(tmp_path / "w.safetensors", {"wte": rng.standard_normal((32768, 128), np.float32),
                                              "head": rng.standard_normal((128, 32768), np.float32)})
    w = load_weights(tmp_path / "w.safetensors")
    nbytes = sum(a.nbytes for a in w.values())
    before = anonymous_kib()
    sessions = [OrtSession(g, w, prepack=False) for _ in range(2)]
    feeds = {"ids": np.array([[1, 2, 3]], np.int64)}
    outs = [s.run(feeds)["logits"] for s in sessions]
    grown = (anonymous_kib() - before) * 1024
    for s in sessions:
        s.close()
    np.testing.assert_allclose(outs[0], np.asarray(w["wte"])[[[1, 2, 3]]] @ w["head"], rtol=1e-4, atol=1e-3)
    assert grown < nbytes / 2, (grown, nbytes)   # copied: 2 x nbytes


# -- providers and options -------------------------------------------------------------------
def test_cpu_provider():
    g, w = attention_block()
    with OrtSession(g, w, provider="cpu") as sess:
        assert sess.providers == ["CPUExecutionProvider"]


def test_auto_provider_always_runs():
    g, w = attention_block()
    feeds = feeds_for(g, {"batch": 1, "seq": 2, "past": 1})
    with OrtSession(g, w, provider="auto") as sess:
        assert sess.providers[-1] == "CPUExecutionProvider"
        assert_close(g, w, feeds, sess.run(feeds), 1e-3)


def test_cuda_when_not_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    g, w = attention_block()
    with pytest.raises(BlockcError, match="CUDA execution provider is not available"):
        run_ort(g, w, feeds_for(g, {"batch": 1, "seq": 2, "past": 0}), provider="cuda")
    with OrtSession(g, w, provider="auto") as sess:  # auto falls back quietly
        assert sess.providers == ["CPUExecutionProvider"]


def test_cuda_provider_is_used_or_refused():
    g, w = attention_block()
    feeds = feeds_for(g, {"batch": 1, "seq": 3, "past": 2})
    try:
        sess = OrtSession(g, w, provider="cuda")
    except BlockcError as err:  # no GPU, or CUDA libraries missing: said plainly
        assert "CUDA" in str(err)
        return
    with sess:
        assert sess.providers[0] == "CUDAExecutionProvider"
        assert_close(g, w, feeds, sess.run(feeds), 1e-3)


@pytest.mark.parametrize("kw,match", [({"provider": "tpu"}, "provider"), ({"optimization": "max"}, "optimization"),
                                      ({"threads": 0}, "threads")])
def test_bad_options(kw, match):
    g, w = attention_block()
    with pytest.raises(BlockcError, match=match):
        OrtSession(g, w, **kw)


# -- errors -------------------------------------------------------------------------------
def test_feeds_are_checked_against_the_graph():
    g, w = attention_block()
    good = feeds_for(g, {"batch": 2, "seq": 3, "past": 1})
    with OrtSession(g, w) as sess:
        with pytest.raises(BlockcError, match="missing input 'past_kv'"):
            sess.run({"ids": good["ids"]})
        with pytest.raises(BlockcError, match="dtype"):
            sess.run({**good, "past_kv": good["past_kv"].astype(np.float64)})
        with pytest.raises(BlockcError, match="batch"):
            sess.run({**good, "past_kv": np.zeros((3, 1, 16), np.float32)})
        with pytest.raises(BlockcError, match="axis 2"):
            sess.run({**good, "past_kv": np.zeros((2, 1, 8), np.float32)})


def test_runtime_failure_is_wrapped(monkeypatch):
    g, w = attention_block()
    feeds = feeds_for(g, {"batch": 1, "seq": 2, "past": 0})
    feeds["ids"][0, 1] = 999  # outside the 20-row embedding table
    with pytest.raises(BlockcError, match=r"ids out of range \[0, 20\)"):   # refused before ONNX Runtime sees it
        run_ort(g, w, feeds)
    import blockc.runtime.ort_runner as ort_runner
    monkeypatch.setattr(ort_runner, "bind_inputs", lambda graph, feeds: {})  # let ONNX Runtime fail on it
    with pytest.raises(BlockcError, match="onnxruntime failed to run"):
        run_ort(g, w, feeds)


def test_load_failure_is_wrapped():
    # onnxruntime's CPU provider has no bfloat16 Erf kernel.
    g = Graph("bf16_erf")
    x = g.add_input("x", T(BF16, "seq", 4))
    g.set_outputs([("y", g.op("erf", x))])
    with pytest.raises(BlockcError, match="onnxruntime could not load the exported model: .*Erf"):
        OrtSession(g, {})


def test_weight_errors_surface_before_onnxruntime():
    g, w = attention_block()
    del w["fc2"]
    with pytest.raises(BlockcError, match="fc2: missing"):
        run_ort(g, w, feeds_for(g, {"batch": 1, "seq": 2, "past": 0}))
