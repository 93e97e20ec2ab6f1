"""``generate`` on a decoder ONNX file that carries its cache, with blockc's
own loop: the past/present pairs found by ``genai_config.json`` or by name,
the prefill the file's step over a past of 0 rows, the decode step the same
file with the past appended to or, where its attention allows, a buffer
written in place.

Checked against the peers: ONNX Runtime GenAI's model builder makes the file
from a random Hugging Face directory, and ``og.Generator`` running that file
and Hugging Face's ``generate`` on the directory pick the same greedy tokens
as blockc. Those tests need an interpreter with ``onnxruntime-genai``, named
by ``BLOCKC_GENAI_PYTHON`` (its builder runs in this Python, which has the
transformers it needs: ``tests/frontends/genai_builder``); without it they
skip saying so. blockc's own exported step needs no peer: it
generates what blockc generates from the model itself."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import pytest

import blockc
from blockc.cli import main
from blockc.codegen.onnx_export import export_onnx
from blockc.errors import BlockcError, OnnxFileError
from blockc.frontends.onnx.cache_io import find_cache
from blockc.frontends.onnx.decoder import OnnxDecoder
from blockc.generate.loop import generate
from blockc.passes.forms import to_form
from blockc.passes.manager import optimize

GENAI_PYTHON = os.environ.get("BLOCKC_GENAI_PYTHON")
PROMPT = [5, 17, 33, 2, 99, 140]
NEW = 10


# ---- blockc's own exported step: no peer needed -------------------------------------
@pytest.fixture(scope="module")
def own_step(tmp_path_factory):
    model = blockc.build_model("llama-tiny", {})
    weights = dict(blockc.init_weights(model, seed=3))
    path = tmp_path_factory.mktemp("own") / "step.onnx"
    onnx.save(export_onnx(optimize(blockc.trace(model.for_cache("decode"))).graph, weights), str(path))
    return model, weights, path


def test_blockcs_own_exported_step_generates_what_blockc_does(own_step):
    """Found by name (past.N.key -> present.N.key), 'past+seq' read as the sum;
    prompts of two lengths, left-padded through the file's own mask."""
    model, weights, path = own_step
    prompts = [[5, 17, 33, 2], [9, 8, 7]]
    want = generate(model, weights, prompts, NEW).tokens
    decoder = OnnxDecoder(path)
    assert decoder.cache.pairs[0] == ("past.0.key", "present.0.key") and decoder.position_ids == "position_ids"
    assert generate(decoder, decoder.init_weights(), prompts, NEW, cache="concat").tokens == want


def test_a_file_that_appends_to_its_past_has_no_in_place_step(own_step):
    _, _, path = own_step
    decoder = OnnxDecoder(path)
    with pytest.raises(BlockcError, match=r"its cache cannot be written in place .* --cache concat"):
        generate(decoder, decoder.init_weights(), [PROMPT], 3, cache="inplace")


def test_pairs_given_explicitly_must_name_the_files_inputs(own_step):
    _, _, path = own_step
    graph = onnx.load(str(path), load_external_data=False).graph
    with pytest.raises(OnnxFileError, match=r"cache pair 'past.9.key' -> 'present.0.key': the file has no 'past.9.key'"):
        find_cache(path, graph, [("past.9.key", "present.0.key")])
    with pytest.raises(OnnxFileError, match=r"not \[batch, kv_heads, length, head_size\] alike"):
        find_cache(path, graph, [("past.0.key", "logits")])


def test_a_genai_config_without_the_cache_names_is_refused_naming_it(own_step, tmp_path, capsys):
    import shutil
    shutil.copy(own_step[2], tmp_path / "step.onnx")
    (tmp_path / "genai_config.json").write_text('{"model": {}}')
    assert main(["show", str(tmp_path / "step.onnx")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'genai_config.json'} has no field model.decoder.inputs" in err and err.count("\n") == 1, err


def genai_config_of_own_step(**model) -> dict:
    """A ``genai_config.json`` naming blockc's own step's cache (llama-tiny: 2 layers, 2 kv heads of 16)."""
    decoder = {"inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                          "past_key_names": "past.%d.key", "past_value_names": "past.%d.value"},
               "outputs": {"present_key_names": "present.%d.key", "present_value_names": "present.%d.value"},
               "num_hidden_layers": 2, "num_key_value_heads": 2, "head_size": 16}
    return {"model": {"decoder": decoder, **model}}


@pytest.mark.parametrize("text, says", [
    (json.dumps(genai_config_of_own_step(context_length="long")),
     "genai_config.json: model.context_length is a string ('long'), not an integer"),
    (json.dumps(genai_config_of_own_step(decoder={"num_hidden_layers": "2"})),
     "genai_config.json has no field model.decoder.inputs"),
    ("{bad", "genai_config.json is not valid JSON: "),
    ("[]", "genai_config.json holds a JSON list, not an object of GenAI settings")],
    ids=["context_length-a-string", "no-decoder-inputs", "not-json", "a-list"])
def test_a_broken_genai_config_is_refused_naming_the_file_and_field(own_step, tmp_path, text, says):
    import shutil
    shutil.copy(own_step[2], tmp_path / "step.onnx")
    (tmp_path / "genai_config.json").write_text(text)
    with pytest.raises(OnnxFileError, match=f"^{re.escape(str(tmp_path))}/{re.escape(says)}"):
        OnnxDecoder(tmp_path / "step.onnx")


def test_a_genai_config_gives_the_context_length(own_step, tmp_path):
    import shutil
    shutil.copy(own_step[2], tmp_path / "step.onnx")
    (tmp_path / "genai_config.json").write_text(json.dumps(genai_config_of_own_step(context_length=96)))
    decoder = OnnxDecoder(tmp_path / "step.onnx")
    assert decoder.cfg.max_positions == 96 and decoder.cache.pairs[0] == ("past.0.key", "present.0.key")


def test_generate_refuses_a_model_file_with_no_cache(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    assert main(["export", "tiny", "-o", str(path)]) == 0
    assert main(["generate", str(path), "--prompt-ids", "1,2,3"]) == 2
    err = capsys.readouterr().err
    assert "no cache inputs and outputs found" in err and err.count("\n") == 1, err


# ---- ONNX Runtime GenAI's own file ---------------------------------------------------
OG_GENERATE = """
import json, sys
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
prompt, new = json.loads(sys.argv[2]), int(sys.argv[3])
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(prompt) + new)
g = og.Generator(model, params)
g.append_tokens(prompt)
out = []
while not g.is_done() and len(out) < new:
    g.generate_next_token()
    out.append(int(g.get_next_tokens()[0]))
print(json.dumps(out))
"""


def _genai(*args) -> str:
    done = subprocess.run([GENAI_PYTHON, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{GENAI_PYTHON} {args[:2]} failed:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def genai_model(request, tmp_path_factory):
    """(HF directory, GenAI's fp32 CPU model directory) of one family."""
    if not GENAI_PYTHON:
        pytest.skip("BLOCKC_GENAI_PYTHON is not set: it names a Python with onnxruntime-genai, whose model "
                    "builder makes the file these tests read")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "frontends"))
    from hf_dirs import save_hf_dir
    root = tmp_path_factory.mktemp(f"genai-{request.param}")
    hf = save_hf_dir(request.param, root / "hf", seed=0)
    out = root / "og"
    from genai_builder import build_genai
    build_genai(GENAI_PYTHON, hf, out, root / "cache")
    return hf, out


def test_genai_file_generates_as_onnx_runtime_genai_and_hugging_face(genai_model, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_dir, og_dir = genai_model
    script = tmp_path / "og_generate.py"
    script.write_text(OG_GENERATE)
    og_tokens = json.loads(_genai(str(script), str(og_dir), json.dumps(PROMPT), str(NEW)))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir))
    ids = torch.tensor([PROMPT])
    hf_tokens = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                            min_new_tokens=NEW)[0, len(PROMPT):].tolist()
    assert og_tokens == hf_tokens and len(set(hf_tokens)) >= 3
    decoder = OnnxDecoder(og_dir / "model.onnx")
    weights = decoder.init_weights()
    for cache in ("inplace", "concat"):
        for backend in ("ort-cpu", "reference"):
            got = generate(decoder, weights, [PROMPT], NEW, cache=cache, backend=backend)
            assert got.tokens == [hf_tokens], f"{cache} cache on {backend}"


def test_genai_files_in_place_step_fuses_to_cache_attention(genai_model):
    """GroupQueryAttention over a past buffer: the step writes its rows into it."""
    decoder = OnnxDecoder(genai_model[1] / "model.onnx")
    fused = Counter(n.op for n in to_form(decoder.step(32), "fused").nodes)
    assert fused["cache_attention"] == decoder.cfg.layers and fused["rotary"] == 2 * decoder.cfg.layers


def test_genai_file_generates_from_the_command_line(genai_model, capsys):
    path = str(genai_model[1] / "model.onnx")
    assert main(["generate", path, "--prompt-ids", "1,2,3", "--prompt-ids", "4,5,6", "--max-new", "3"]) == 0
    assert main(["generate", path, "--prompt-ids", "1,2,3", "--prompt-ids", "4,5", "--max-new", "3"]) == 2
    err = capsys.readouterr().err
    assert "give prompts of one length" in err and err.count("\n") == 1, err


def test_genai_config_names_the_cache(genai_model):
    decoder = OnnxDecoder(genai_model[1] / "model.onnx")
    c = decoder.cache
    assert c.pairs[:2] == (("past_key_values.0.key", "present.0.key"), ("past_key_values.0.value", "present.0.value"))
    assert (c.past, c.total, c.seq) == ("past_sequence_length", "total_sequence_length", "sequence_length")
    assert decoder.one_length and decoder.position_ids is None
    assert np.all(next(s for s in decoder.inputs() if s.name == "attention_mask").sample(
        {"batch_size": 2, "past_sequence_length": 1, "sequence_length": 3}, np.random.default_rng(0)) == 1)


def test_cache_pairs_from_the_command_line(own_step, tmp_path, capsys):
    """A file whose cache names say nothing (``kv_in_N.key`` / ``kv_out_N.key``)
    generates from ``blockc generate --cache-pairs`` what blockc's own loop does."""
    model, weights, path = own_step
    proto = onnx.load(str(path))
    renamed = {}
    for v in [*proto.graph.input, *proto.graph.output]:
        if v.name.startswith(("past.", "present.")):
            renamed[v.name] = v.name.replace("past.", "kv_in_").replace("present.", "kv_out_")
            v.name = renamed[v.name]
    for node in proto.graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [renamed.get(n, n) for n in node.output]
    file = tmp_path / "renamed.onnx"
    onnx.save(proto, str(file))
    pairs = ",".join(f"{renamed[p]}={renamed[p.replace('past.', 'present.')]}"
                     for p in renamed if p.startswith("past."))
    argv = ["generate", str(file), "--prompt-ids", "5,17,33,2", "--max-new", str(NEW), "--cache", "concat"]
    assert main(argv) == 2 and "no cache inputs and outputs found" in capsys.readouterr().err
    assert main([*argv, "--cache-pairs", pairs, "--json", str(tmp_path / "g.json")]) == 0
    got = json.loads((tmp_path / "g.json").read_text())["tokens"]
    assert got == generate(model, weights, [[5, 17, 33, 2]], NEW).tokens


GENAI_DIMS = ["--dim", "batch_size=1", "--dim", "sequence_length=4", "--dim", "past_sequence_length=3"]


def test_compare_puts_blockcs_forms_beside_the_genai_file(genai_model, tmp_path, capsys):
    """``blockc compare`` on GenAI's file: blockc's standard and fused forms and
    the file as it is (``ort-original``), each run and checked against float64
    (a past of 3 rows, a step of 4: the smallest shapes that still exercise both)."""
    path = tmp_path / "compare.json"
    assert main(["compare", str(genai_model[1] / "model.onnx"), *GENAI_DIMS, "--backends", "ort-cpu",
                 "--peers", "ort-original", "--no-kernels", "--no-progress", "--blocks", "1", "--rounds", "1",
                 "--repeats", "1", "--warmup", "0", "--min-time", "0", "--json", str(path)]) == 0, capsys.readouterr().err
    report = json.loads(path.read_text())
    rows = {(r["variant"], r["form"]): r for r in report["results"] if r["backend"] == "ort-cpu"}
    for form in ("standard", "fused", "ort-original"):
        r = rows[("all", form)]
        assert r["status"] == "ok" and r["max_abs_error"] <= 1e-4, (form, r["error"])
    ops = report["forms"]["fused"]["ops"]   # the file as given appends its past: attention over it, one cache step
    assert (ops["append_attention"], ops["rotary"], ops["add_rmsnorm"]) == (2, 4, 4), ops
    assert next(p for p in report["peers"] if p["name"] == "ort-original")["detail"].startswith("the user's file")
