"""A warm start does not trace: the compile cache keys a built-in model's
fused step graphs by what the trace depends on (``frontends/trace_key.py``:
class, name, config, step; for a Hugging Face directory, what its
config.json makes), so a second generation from the same directory loads
both graphs and binds the weights without tracing. Weights are never part
of the key: changed in place, the new ones are used (checked against
Hugging Face's own ``generate`` on the changed directory)."""
import json
import os
import shutil

import numpy as np
import pytest
from cache_testing import DAMAGES, damage

from blockc import files
from blockc.frontends import build_model, init_weights
from blockc.generate import generate, loop
from blockc.passes import forms

PROMPT, NEW = [[5, 9, 13, 2, 7]], 4


@pytest.fixture
def llama(hf_dir, tmp_path, monkeypatch):
    """A copy of the shared random Llama directory, to change, and an empty cache."""
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    files.CACHE_COUNTS.clear()
    return shutil.copytree(hf_dir("llama"), tmp_path / "llama")


@pytest.fixture
def traces(monkeypatch):
    """How many graphs generation traced."""
    made = []
    real = loop.trace

    def counted(model):
        made.append(model.name)
        return real(model)
    monkeypatch.setattr(loop, "trace", counted)
    return made


def run(path):
    model = build_model(str(path), {})
    return generate(model, init_weights(model, seed=0), PROMPT, NEW).tokens


def test_a_second_generation_from_a_directory_does_not_trace(llama, traces):
    first = run(llama)
    assert len(traces) == 2 and files.CACHE_COUNTS["model", "miss"] == 2   # prefill and decode
    files.CACHE_COUNTS.clear()
    assert run(llama) == first
    assert len(traces) == 2   # none more
    compiled = {k: n for k, n in files.CACHE_COUNTS.items() if k[0] != "weights"}   # prepared: test_hf_dir_prepared
    assert compiled == {("model", "hit"): 2, ("onnx", "hit"): 2}


def test_weights_changed_in_the_directory_are_used_never_cached_ones(llama, traces):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file, save_file
    before = run(llama)
    weights = llama / "model.safetensors"
    rng = np.random.default_rng(7)
    changed = {k: rng.standard_normal(a.shape).astype(a.dtype) * 0.5 for k, a in load_file(weights).items()}
    save_file(changed, str(weights) + ".new", metadata={"format": "pt"})
    os.replace(str(weights) + ".new", weights)   # a new file: the first run's mapping keeps the old one
    got = run(llama)
    assert len(traces) == 2   # the graphs came from the cache; the weights did not
    hf = transformers.AutoModelForCausalLM.from_pretrained(llama, attn_implementation="eager")
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                           do_sample=False, pad_token_id=0)
    assert got == [want[0, len(PROMPT[0]):].tolist()]
    assert got != before


def test_a_changed_config_misses(llama, traces):
    run(llama)
    config = json.loads((llama / "config.json").read_text())
    config["rms_norm_eps"] = config["rms_norm_eps"] * 10
    (llama / "config.json").write_text(json.dumps(config))
    run(llama)
    assert len(traces) == 4 and files.CACHE_COUNTS["model", "miss"] == 4


def test_a_changed_option_or_version_misses(llama, monkeypatch):
    step = build_model(str(llama), {}).for_cache("prefill")
    traced = []

    def make():
        traced.append(True)
        return loop.trace(step)
    from blockc.frontends.trace_key import trace_key
    for options in ({}, {}, {"disable": ["fuse_attention"]}):
        forms.form_of(trace_key(step), make, "fused", **options)
    assert len(traced) == 2
    # printing asked for by empty values is none asked for: the kept form, not a trace
    forms.form_of(trace_key(step), make, "fused", print_after=[], print_after_all=False, out=None)
    assert len(traced) == 2
    monkeypatch.setattr(forms, "code_version", lambda: "0.0.0+other")
    forms.form_of(trace_key(step), make, "fused")
    assert len(traced) == 3


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_entry_is_rebuilt(llama, traces, how):
    first = run(llama)
    entries = list((llama.parent / "cache" / "model").glob("*/fused.json"))
    assert len(entries) == 2
    for entry in entries:
        damage(entry, how)
    files.CACHE_COUNTS.clear()
    assert run(llama) == first
    assert len(traces) == 4 and files.CACHE_COUNTS["model", "miss"] == 2


def test_a_second_generation_from_an_onnx_decoder_file_does_not_trace(tmp_path, monkeypatch):
    """The file's step keyed by its graph without its weights (``trace_key``)."""
    import onnx

    import blockc
    from blockc.codegen.onnx_export import export_onnx
    from blockc.frontends.onnx import decoder as onnx_decoder
    from blockc.passes.manager import optimize
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    model = blockc.build_model("llama-tiny", {"layers": "1"})
    weights = dict(init_weights(model, seed=3))
    path = tmp_path / "step.onnx"
    onnx.save(export_onnx(optimize(blockc.trace(model.for_cache("decode"))).graph, weights), str(path))
    want = generate(model, weights, PROMPT, NEW).tokens
    made, real = [], onnx_decoder.trace
    monkeypatch.setattr(onnx_decoder, "trace", lambda m: made.append(m.name) or real(m))
    for _ in range(2):
        decoder = onnx_decoder.OnnxDecoder(path)
        assert generate(decoder, decoder.init_weights(), PROMPT, NEW, cache="concat").tokens == want
    assert made == ["step.onnx"]   # the concat cache's prefill and decode are one step: traced once, ever
