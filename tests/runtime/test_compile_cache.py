"""The compile cache: what tracing, optimizing and exporting make, kept under
$BLOCKC_CACHE, keyed by the graph, the options and the versions, never by the
weights (bound at load)."""
from __future__ import annotations

import numpy as np
import pytest
from cache_testing import DAMAGES, damage

from blockc import files, trace
from blockc.frontends import build_model, init_weights
from blockc.generate import generate
from blockc.ir.parser import parse_graph
from blockc.ir.printer import print_graph
from blockc.passes import forms
from blockc.passes.forms import to_form
from blockc.runtime import ort_runner
from blockc.runtime.backend import make_backend
from blockc.runtime.reference import run_reference


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    files.CACHE_COUNTS.clear()
    return tmp_path / "cache"


def counts() -> dict:
    return dict(files.CACHE_COUNTS)


def tiny_graph():
    model = build_model("tiny", {"layers": "1"})
    return model, trace(model)


def feeds():
    return {"input_ids": np.array([[1, 5, 7, 2]], np.int64)}


def test_a_second_optimization_of_the_same_trace_hits_and_keeps_sources_and_origins():
    _, traced = tiny_graph()
    first = to_form(traced, "fused")
    assert counts() == {("ir", "miss"): 1}
    again = to_form(traced, "fused")
    assert counts() == {("ir", "miss"): 1, ("ir", "hit"): 1}
    assert print_graph(again) == print_graph(first)
    assert [(n.loc, n.origin) for n in again.nodes] == [(n.loc, n.origin) for n in first.nodes]
    assert any(n.origin for n in again.nodes) and any(n.loc for n in again.nodes)


def test_a_graph_made_now_is_not_parsed_back_and_a_hit_is(monkeypatch):
    """A miss keeps the entry and returns the graph it made: parsing the entry
    back (for each kind, ``model`` and ``ir``) would be a cold start's waste."""
    parsed = []
    monkeypatch.setattr(forms, "parse_graph", lambda text: parsed.append(1) or parse_graph(text))
    model = build_model("tiny", {"layers": "1"})
    forms.form_of("tiny-model", lambda: trace(model), "fused")
    assert counts() == {("model", "miss"): 1, ("ir", "miss"): 1} and not parsed
    again = forms.form_of("tiny-model", lambda: trace(model), "fused")
    assert counts()["model", "hit"] == 1 and len(parsed) == 1
    assert print_graph(again) == print_graph(to_form(trace(model), "fused"))


def test_a_changed_option_or_code_misses(monkeypatch):
    _, traced = tiny_graph()
    to_form(traced, "fused")
    to_form(traced, "fused", disable=["fuse_attention"])
    assert counts() == {("ir", "miss"): 2}
    monkeypatch.setattr(forms, "code_version", lambda: "0.0.0+other")
    to_form(traced, "fused")
    assert counts() == {("ir", "miss"): 3}


def test_a_second_session_of_the_same_graph_hits_the_export_and_a_changed_option_or_version_misses(monkeypatch):
    import onnx
    model, traced = tiny_graph()
    weights = init_weights(model, seed=0)
    for fused_as in ("auto", "auto", "function"):
        with make_backend("ort-cpu", fused_as=fused_as).compile(traced, weights) as c:
            c.run(feeds())
    assert counts() == {("onnx", "miss"): 2, ("onnx", "hit"): 1}
    monkeypatch.setattr(onnx, "__version__", "0.0.0")
    with make_backend("ort-cpu").compile(traced, weights) as c:
        c.run(feeds())
    assert counts()["onnx", "miss"] == 3


def test_weights_changed_between_two_runs_are_used_never_cached_ones(tmp_path):
    model, traced = tiny_graph()
    graph = to_form(traced, "fused")
    outputs = []
    for seed in (0, 1):
        weights = init_weights(model, seed=seed)
        with make_backend("ort-cpu").compile(to_form(traced, "fused"), weights) as c:
            got = c.run(feeds())["logits"]
        want = run_reference(graph, weights, feeds())["logits"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        outputs.append(got)
    assert counts() == {("ir", "miss"): 1, ("ir", "hit"): 2, ("onnx", "miss"): 1, ("onnx", "hit"): 1}
    assert not np.allclose(outputs[0], outputs[1])


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_entry_is_rebuilt(cache, how):
    model, traced = tiny_graph()
    weights = init_weights(model, seed=0)
    with make_backend("ort-cpu").compile(to_form(traced, "fused"), weights) as c:
        want = c.run(feeds())["logits"]
    for entry in [*cache.glob("ir/*/fused.json"), *cache.glob("onnx/*/model.onnx")]:
        damage(entry, how)
    files.CACHE_COUNTS.clear()
    with make_backend("ort-cpu").compile(to_form(traced, "fused"), weights) as c:
        np.testing.assert_array_equal(c.run(feeds())["logits"], want)
    assert counts() == {("ir", "miss"): 1, ("onnx", "miss"): 1}


def test_a_second_generation_starts_from_the_cache():
    model = build_model("tiny", {"layers": "1"})
    weights = init_weights(model, seed=0)
    first = generate(model, weights, [[1, 2, 3]], 4)
    # prefill and decode: each traced, optimized (kept by its trace and by the model's description) and exported
    assert counts() == {("model", "miss"): 2, ("ir", "miss"): 2, ("onnx", "miss"): 2}
    files.CACHE_COUNTS.clear()
    again = generate(model, weights, [[1, 2, 3]], 4)
    assert counts() == {("model", "hit"): 2, ("onnx", "hit"): 2}   # no trace: see tests/generate/test_warm_start.py
    assert again.tokens == first.tokens


def test_the_cache_is_listed_and_cleared_with_the_cuda_builds(cache):
    """One cache policy: its entries are blockc cache's entries, pruned to the same cap."""
    _, traced = tiny_graph()
    to_form(traced, "fused")
    [entry] = files.cache_entries()
    assert entry.path.parent == cache / "ir"
    files.prune_cache(0)
    assert files.cache_entries() == []
    to_form(traced, "fused")
    assert counts() == {("ir", "miss"): 2}


def test_asking_for_the_encoding_decisions_exports_afresh():
    model, traced = tiny_graph()
    session = ort_runner.OrtSession(to_form(traced, "fused"), init_weights(model, seed=0), decide=True)
    session.close()
    assert session.decisions and ("onnx", "hit") not in counts() and ("onnx", "miss") not in counts()
