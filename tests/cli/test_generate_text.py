"""``blockc generate DIR --prompt`` and ``blockc run DIR --text`` on random
Hugging Face directories (``hf_dirs.save_hf_dir``): the text printed and the
ids written are Hugging Face's own ``generate`` + ``decode`` (greedy, the
directory's eos), with a chat, with stop strings, and on an encoder
``AutoModel``'s outputs; and the refusals of text without a directory."""
import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_text_generate import NEW, PROMPT, hf_text  # noqa: E402

from blockc.cli import main  # noqa: E402


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def generated(capsys, tmp_path, path, *flags):
    """What ``blockc generate`` prints and writes to --json."""
    out = cli(capsys, "generate", path, "--max-new", NEW, "--json", tmp_path / "g.json", *flags)
    return out, json.loads((tmp_path / "g.json").read_text())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_prompt_prints_what_transformers_generates(hf_dir, tmp_path, capsys, family):
    path = hf_dir(family)
    prompt = transformers.AutoTokenizer.from_pretrained(path)(PROMPT)["input_ids"]
    (ids, text), = hf_text(path, [prompt])
    out, got = generated(capsys, tmp_path, path, "--prompt", PROMPT)
    assert out.startswith(text + "\n")
    assert got["prompts"] == [prompt] and got["tokens"] == [ids]
    assert got["text"] == [text] and got["prompt_text"] == [PROMPT]


def test_chat_prompts_as_transformers_renders_them(hf_dir, tmp_path, capsys):
    path = hf_dir("llama")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    prompts = []
    for messages in ([{"role": "user", "content": "Café?"}],
                     [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a feed-forward"}]):
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        prompts.append(ids["input_ids"] if hasattr(ids, "keys") else ids)
    expected = hf_text(path, prompts)
    _, first = generated(capsys, tmp_path, path, "--chat", "--prompt", "Café?")
    _, second = generated(capsys, tmp_path, path, "--chat", "--system", "be brief", "--prompt", "a feed-forward")
    assert first["prompts"] + second["prompts"] == prompts
    assert first["tokens"] + second["tokens"] == [ids for ids, _ in expected]
    assert first["text"] + second["text"] == [text for _, text in expected]


def stop_point(tok, ids):
    """``(k, stop)``: the first k from 3 on at which the text of ``ids[:k]`` ends in
    two new characters, whole ones (a character split over tokens shows as U+FFFD
    in decode's text, which Hugging Face's stop strings never match)."""
    for k in range(3, len(ids)):
        text = tok.decode(ids[:k])
        if "\ufffd" not in text[-2:] and text[-2:] not in tok.decode(ids[:k - 1]):
            return k, text[-2:]
    pytest.fail(f"no stop string in {tok.decode(ids)!r}")


def test_stop_strings_stop_where_transformers_stops(hf_dir, tmp_path, capsys):
    path = hf_dir("gpt2")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    prompt = tok(PROMPT)["input_ids"]
    (free, _), = hf_text(path, [prompt])
    k, stop = stop_point(tok, free)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    ids = torch.tensor([prompt])
    with torch.no_grad():
        seq = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                          stop_strings=[stop], tokenizer=tok)
    expected = seq[0, len(prompt):].tolist()
    _, got = generated(capsys, tmp_path, path, "--prompt", PROMPT, "--stop", stop)
    assert expected == free[:k] and got["tokens"] == [expected]
    assert got["text"][0].endswith(stop)


def test_eos_of_generation_config_stops(hf_dir, tmp_path, capsys):
    path = tmp_path / "llama"
    shutil.copytree(hf_dir("llama"), path)
    prompt = transformers.AutoTokenizer.from_pretrained(path)(PROMPT)["input_ids"]
    config_file = path / "generation_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = None
    config_file.write_text(json.dumps(config))
    (free, _), = hf_text(path, [prompt])
    assert free[5] not in free[:5]
    config["eos_token_id"] = [free[5]]
    config_file.write_text(json.dumps(config))
    _, got = generated(capsys, tmp_path, path, "--prompt", PROMPT)
    assert got["tokens"] == [free[:6]]
    _, given = generated(capsys, tmp_path, path, "--prompt", PROMPT, "--stop-id", free[2], "--stop-id", free[3])
    assert given["tokens"] == [free[:3]]   # --stop-id replaces the directory's eos


def test_run_text_on_an_encoder_matches_transformers(hf_dir, tmp_path, capsys):
    path = hf_dir("bert")
    texts = ["The quick brown fox", "Café déjà vu 注意力 🚀🙂"]
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="eager")
    encoded = transformers.AutoTokenizer.from_pretrained(path)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**encoded).last_hidden_state.numpy()
    cli(capsys, "run", path, "--backend", "reference", "--text", texts[0], "--text", texts[1],
        "--save", tmp_path / "out.npz")
    got = np.load(tmp_path / "out.npz")["last_hidden_state"]
    mask = encoded["attention_mask"].numpy().astype(bool)   # the pads' own rows are not compared
    np.testing.assert_allclose(got[mask], expected[mask], atol=1e-4)


def refused(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("blockc: error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_text_without_a_directory_is_refused(hf_dir, tmp_path, capsys):
    # made before the refusals are read: the first test of a process (an xdist
    # worker) to ask for it saves it, and saving draws a progress bar on stderr
    bert = hf_dir("bert")
    capsys.readouterr()
    assert "--prompt needs a Hugging Face directory as MODEL" in refused(
        capsys, "generate", "tiny", "--prompt", "hi")
    assert "--chat and --system render text prompts: give --prompt TEXT, not --prompt-ids" in refused(
        capsys, "generate", "tiny", "--chat", "--prompt-ids", "1,2")
    assert "--text needs a Hugging Face directory as MODEL" in refused(capsys, "run", "bert-base", "--text", "hi")
    np.savez(tmp_path / "in.npz", input_ids=np.zeros((1, 2), np.int64))
    assert "--text and --inputs both give the inputs" in refused(
        capsys, "run", bert, "--text", "hi", "--inputs", tmp_path / "in.npz")
    assert "--stop needs the model's tokenizer" in refused(capsys, "generate", "tiny", "--prompt-ids", "1",
                                                           "--stop", "x")


def test_cache_pairs_refusals(capsys):
    assert "--cache-pairs names an ONNX decoder file's cache inputs and outputs: 'tiny' is not an .onnx file" in (
        refused(capsys, "generate", "tiny", "--prompt-ids", "1", "--cache-pairs", "a=b"))
    assert "malformed --cache-pairs item 'a': expected PAST=PRESENT" in refused(
        capsys, "generate", "m.onnx", "--prompt-ids", "1", "--cache-pairs", "x=y,a")
