"""A Hugging Face checkpoint directory as a MODEL (frontends/hf_dir.py): every
family's outputs against transformers' own model on the same directory,
shards read tensor by tensor, float16/bfloat16 kept or cast, each command on
a directory, and every refusal."""
import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_dirs import DECODERS, FAMILIES, save_hf_dir  # noqa: E402

from blockc.cli import main  # noqa: E402
from blockc.errors import BlockcError, ModelError, WeightsError  # noqa: E402
from blockc.frontends import build_model, init_weights  # noqa: E402
from blockc.ir.dtypes import DType  # noqa: E402
from blockc.frontends import weights as weights_module  # noqa: E402
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """``hf_dir(family, **save_hf_dir options)``: the directory, made once per module."""
    made = {}

    def make(family, **kw):
        key = (family, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = save_hf_dir(family, tmp_path_factory.mktemp(family) / family, **kw)
        return str(made[key])
    return make


def run(capsys, *argv):
    capsys.readouterr()   # what came before (transformers' progress, making a directory) is not the command's
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def feeds_for(path, batch=2, seq=7):
    """Inputs named as the directory's model names them: ids clear of the
    special tokens, and for an encoder the second row padded at its end."""
    rng = np.random.default_rng(0)
    vocab = json.loads(open(os.path.join(path, "config.json")).read())["vocab_size"]
    feeds = {"input_ids": rng.integers(4, vocab, (batch, seq)).astype(np.int64)}
    names = [spec.name for spec in build_model(path).inputs()]
    if "position_ids" in names:
        feeds["position_ids"] = np.tile(np.arange(seq, dtype=np.int64), (batch, 1))
    if "attention_mask" in names:
        mask = np.ones((batch, seq), np.int64)
        mask[1, -2:] = 0
        feeds["attention_mask"] = mask
    if "token_type_ids" in names:
        feeds["token_type_ids"] = np.zeros((batch, seq), np.int64)
    assert sorted(feeds) == sorted(names)
    return feeds


def hugging_face_outputs(path, feeds) -> dict[str, np.ndarray]:
    """transformers' own model of the directory, in float32, on ``feeds``."""
    config = transformers.AutoConfig.from_pretrained(path)
    cls = transformers.AutoModelForCausalLM if config.model_type in DECODERS else transformers.AutoModel
    model = cls.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    names = ("logits",) if config.model_type in DECODERS else ("last_hidden_state", "pooler_output")
    return {n: out[n].numpy() for n in names}


def blockc_run(capsys, tmp_path, path, feeds, *options):
    np.savez(tmp_path / "in.npz", **feeds)
    code, out, err = run(capsys, "run", path, "--inputs", tmp_path / "in.npz", "--save", tmp_path / "out.npz",
                         *options)
    assert code == 0, err
    with np.load(tmp_path / "out.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("family", FAMILIES)
def test_run_matches_hugging_face(family, hf_dir, tmp_path, capsys):
    path = hf_dir(family)
    feeds = feeds_for(path)
    got, want = blockc_run(capsys, tmp_path, path, feeds), hugging_face_outputs(path, feeds)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_tied_head_is_the_token_table(family, hf_dir, tmp_path, capsys):
    path = hf_dir(family, tie_word_embeddings=True)
    assert build_model(path).cfg.tie_embeddings
    feeds = feeds_for(path)
    got, want = blockc_run(capsys, tmp_path, path, feeds), hugging_face_outputs(path, feeds)
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-4, rtol=1e-4)


def test_legacy_layer_norm_names_read_as_transformers_reads_them(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path, "bert")   # bert-base-uncased's files still say gamma and beta

    def legacy(tensors):
        for key in [k for k in tensors if k.endswith("LayerNorm.weight") or k.endswith("LayerNorm.bias")]:
            tensors[key.replace(".weight", ".gamma").replace(".bias", ".beta")] = tensors.pop(key)
    rewrite_weights(path, legacy)
    feeds = feeds_for(str(path))
    got, want = blockc_run(capsys, tmp_path, path, feeds), hugging_face_outputs(str(path), feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=1e-4, err_msg=name)


def test_roberta_positions_start_after_the_padding_row(hf_dir):
    model = build_model(hf_dir("roberta"))
    pad = json.loads(open(os.path.join(hf_dir("roberta"), "config.json")).read())["pad_token_id"]
    assert model.cfg.position_offset == pad + 1


def test_shards_are_read_tensor_by_tensor(hf_dir, tmp_path, capsys, monkeypatch):
    path = hf_dir("llama", shard_size="100KB")
    assert os.path.isfile(os.path.join(path, "model.safetensors.index.json"))
    reads = []
    real = weights_module.SafetensorsFiles.__getitem__
    monkeypatch.setattr(weights_module.SafetensorsFiles, "__getitem__",
                        lambda self, name: reads.append(name) or real(self, name))
    import safetensors.numpy
    monkeypatch.setattr(safetensors.numpy, "load_file", lambda *a, **k: pytest.fail("read a whole file"))
    model = build_model(path)
    assert reads == []   # building reads the headers alone
    weights = init_weights(model)
    first = next(n for n in weights if n != "rope.cos")
    weights[first]
    assert len(reads) == 1   # one weight made: one tensor read
    feeds = feeds_for(path)
    got, want = blockc_run(capsys, tmp_path, path, feeds), hugging_face_outputs(path, feeds)
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_checkpoints_own_tensors_stay_views_of_its_file(family, hf_dir):
    """What needs no transposing, cutting or casting is handed out as the file's
    own bytes (a runtime maps them: ort_runner), never copied on the way."""
    weights = init_weights(build_model(hf_dir(family)))
    views = {name for name, a in weights.items() if weights_module.file_region(a) is not None}
    assert "tok.weight" in views   # the embedding, as the checkpoint stores it
    if family == "gpt2":   # Conv1D stores [in, out], blockc's order: every matrix is the file's
        assert {n for n in weights if n.endswith("ffn.fc1.weight")} <= views


@pytest.mark.parametrize("family, dtype", [("gpt2", "float16"), ("qwen2", "bfloat16"), ("bert", "float16")])
def test_half_checkpoints_keep_their_dtype_or_are_cast(family, dtype, hf_dir, tmp_path, capsys):
    path = hf_dir(family, dtype=dtype)
    model = build_model(path)
    assert model.dtype.name == dtype and all(np.asarray(w).dtype.name == dtype
                                             for w in init_weights(model).values())
    feeds, want = feeds_for(path), None
    want = hugging_face_outputs(path, feeds)   # the half weights, computed in float32
    got = blockc_run(capsys, tmp_path, path, feeds, "--set", "dtype=float32")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=1e-4, err_msg=name)
    # in its own dtype (the reference backend: ONNX Runtime's CPU has no bfloat16 Mul)
    native = blockc_run(capsys, tmp_path, path, feeds, "--backend", "reference")
    for name in want:
        got = native[name]
        if got.dtype.kind == "V":   # numpy's .npz keeps bfloat16's two bytes, not its name
            got = got.view(DType.bfloat16.numpy)
        assert got.dtype.name == dtype
        np.testing.assert_allclose(got.astype(np.float32), want[name], atol=0.1, err_msg=name)


# ---- each command on a directory ---------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [(["show"], "graph llama(%input_ids"), (["summary"], "llama (DecoderLM)"),
                                        (["fusions"], "rmsnorm"), (["check"], "PASS"),
                                        (["cuda", "--no-compile", "-o", "{tmp}/cuda"], "wrote")])
def test_commands_take_a_directory(argv, says, hf_dir, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, out, err = run(capsys, argv[0], hf_dir("llama"), *argv[1:])
    assert code == 0, err
    assert says in out, out


def test_show_names_the_checkpoints_sizes(hf_dir, capsys):
    code, out, _ = run(capsys, "show", hf_dir("qwen3"))
    assert code == 0 and "param @tok.weight: f32[400,64]" in out and "attn.q_norm.weight: f32[16]" in out


def test_export_runs_on_onnx_runtime_as_hugging_face(hf_dir, tmp_path, capsys):
    path = hf_dir("bert")
    code, _, err = run(capsys, "export", path, "-o", tmp_path / "m.onnx")
    assert code == 0, err
    feeds = feeds_for(path)
    session = peer_session(str(tmp_path / "m.onnx"))
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for name, want in hugging_face_outputs(path, feeds).items():
        np.testing.assert_allclose(got[name], want, atol=1e-4, rtol=1e-4, err_msg=name)


def test_generate_picks_hugging_faces_greedy_tokens(hf_dir, capsys):
    path = hf_dir("qwen3")
    prompt = [5, 6, 7, 8]
    code, out, err = run(capsys, "generate", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new", "6")
    assert code == 0, err
    got = [int(t) for t in out.splitlines()[0].split()[1:]]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):].tolist()
    assert len(ids) >= 3 and got[:len(ids)] == ids   # HF stops at its eos; blockc runs --max-new


def test_compare_takes_a_directory(hf_dir, tmp_path, capsys):
    code, out, err = run(capsys, "compare", hf_dir("gpt2"), "--backends", "ort", "--peers", "ort-original",
                         "--seq", "8", "--blocks", "1", "--rounds", "1", "--warmup", "0", "--repeats", "1",
                         "--min-time", "0", "--no-kernels")
    assert code == 0, err
    assert "ort/all/fused" in out


# ---- refusals ----------------------------------------------------------------------------------
def copy_of(hf_dir, tmp_path, family="llama"):
    path = tmp_path / family
    shutil.copytree(hf_dir(family), path)
    return path


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def rewrite_weights(path, change):
    """``model.safetensors`` again, with ``change(tensors)`` applied."""
    import safetensors.numpy
    tensors = safetensors.numpy.load_file(str(path / "model.safetensors"))
    change(tensors)
    safetensors.numpy.save_file(tensors, str(path / "model.safetensors"))


def refused(capsys, path, *needles, options=()):
    code, out, err = run(capsys, "show", path, *options)
    assert code == 2 and err.startswith("blockc: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_an_unsupported_model_type_names_the_supported(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    edit_config(path, model_type="t5")
    refused(capsys, path, "config.json: model_type 't5' is not supported; supported: gpt2, bert, roberta, "
                          "llama, mistral, qwen2, qwen3")


def test_a_setting_blockc_cannot_express_is_refused_by_its_field(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    edit_config(path, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    refused(capsys, path, "config.json: llama config not supported", "rope_type='yarn'")


def test_a_missing_config(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    (path / "config.json").unlink()
    refused(capsys, path, f"{path} is a directory without config.json")


@pytest.mark.parametrize("text, says", [("{not json", "config.json is not valid JSON: "),
                                        ("[1, 2]", "config.json holds a JSON list, not an object"),
                                        ('{"model_type": "llama", "hidden_size": "big"}',
                                         "config.json: a setting has a value of the wrong kind")])
def test_a_corrupt_config(text, says, hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    (path / "config.json").write_text(text)
    refused(capsys, path, says)


def test_only_a_pickle_is_refused_saying_how_to_convert(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    refused(capsys, path, "holds pytorch_model.bin, a pickle: blockc does not unpickle",
            "save_pretrained(DIR, safe_serialization=True)")


def test_no_weights_at_all(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    (path / "model.safetensors").unlink()
    refused(capsys, path, "has no weights: neither model.safetensors nor model.safetensors.index.json")


def test_a_missing_tensor_is_named(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    rewrite_weights(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    refused(capsys, path, "missing: model.layers.1.mlp.up_proj.weight")


def test_a_misshapen_tensor_is_named_with_its_file(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    rewrite_weights(path, lambda t: t.update({"model.norm.weight": np.ones(63, np.float32)}))
    refused(capsys, path, "shape: model.norm.weight is [63], expected [64] (in ", "model.safetensors)")


def test_a_corrupt_safetensors_file_is_named(hf_dir, tmp_path, capsys):
    path = copy_of(hf_dir, tmp_path)
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{bad")
    refused(capsys, path, f"cannot read weights from '{path / 'model.safetensors'}'")


def test_a_missing_shard_and_a_corrupt_index(hf_dir, tmp_path, capsys):
    path = tmp_path / "sharded"
    shutil.copytree(hf_dir("llama", shard_size="100KB"), path)
    (path / "model-00002-of-00006.safetensors").unlink()
    refused(capsys, path, f"model.safetensors.index.json lists model-00002-of-00006.safetensors, not in {path}")
    index = path / "model.safetensors.index.json"
    for text, says in (('{"metadata": {}}', f"{index} has no field weight_map"),
                       ('{"weight_map": ["a"]}', f"{index}: weight_map is a list, not an object"),
                       ("{bad", f"{index} is not valid JSON: "),
                       ("[]", f"{index} holds a JSON list, not an object of tensors and their shards")):
        index.write_text(text)
        refused(capsys, path, says)


def test_set_takes_only_what_a_directory_leaves_open(hf_dir, capsys):
    refused(capsys, hf_dir("llama"), "--set 'layers' does not apply", "settings: dtype, probs",
            options=("--set", "layers=3"))
    refused(capsys, hf_dir("llama"), "dtype must be float32, float16, bfloat16 or float64",
            options=("--set", "dtype=int8"))


def test_library_errors_are_blockcs_own(hf_dir, tmp_path):
    path = copy_of(hf_dir, tmp_path)
    rewrite_weights(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(WeightsError) as e:
        build_model(str(path))
    assert e.value.problems == ["missing: lm_head.weight"]
    edit_config(path, model_type="bart")
    with pytest.raises(ModelError):
        build_model(str(path))
    assert issubclass(WeightsError, BlockcError)
