"""A directory's tokenizer read by blockc against transformers' own
``AutoTokenizer``: the same ids for text (special tokens as the file or
``add_bos_token`` says), the same encoder feeds padded, the same chat
rendering wherever the template is stored; and bad directories refused in
blockc's words."""
import json
import shutil

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from blockc.errors import BlockcError  # noqa: E402
from blockc.generate.chat import encode_prompts, render_chat, user_messages  # noqa: E402
from blockc.generate.text import TextTokenizer, text_feeds  # noqa: E402

TEXTS = ["The quick brown fox", "Café déjà vu 注意力 🚀🙂", "  two  spaces\nand a line",
         "<|im_start|>special", "x"]


def copied(hf_dir, family, tmp_path):
    path = tmp_path / family
    shutil.copytree(hf_dir(family), path)
    return path


def edit_json(path, name, **fields):
    file = path / name
    data = json.loads(file.read_text())
    data.update(fields)
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("family, tokenizer", [("gpt2", "bytelevel"), ("llama", "bytelevel"),
                                               ("qwen3", "bytelevel"), ("llama", "sentencepiece")])
def test_text_tokenizes_as_autotokenizer(hf_dir, family, tokenizer):
    path = hf_dir(family, tokenizer)
    hf = transformers.AutoTokenizer.from_pretrained(path)
    ours = TextTokenizer.from_dir(path)
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("bos, eos", [(True, False), (True, True)])
def test_tokenizer_json_decides_the_special_tokens(hf_dir, tmp_path, bos, eos):
    """transformers 5 ignores the config's add_bos_token/add_eos_token where there is a tokenizer.json."""
    path = copied(hf_dir, "llama", tmp_path)
    edit_json(path, "tokenizer_config.json", add_bos_token=bos, add_eos_token=eos)
    hf = transformers.AutoTokenizer.from_pretrained(path)
    ours = TextTokenizer.from_dir(path)
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text


@pytest.mark.parametrize("side", [None, "left"])
def test_encoder_feeds_are_the_tokenizers_padded_batch(hf_dir, tmp_path, side):
    path = copied(hf_dir, "bert", tmp_path)
    if side:
        edit_json(path, "tokenizer_config.json", padding_side=side)
    hf = transformers.AutoTokenizer.from_pretrained(path)
    expected = dict(hf(TEXTS, padding=True, return_tensors="np"))
    # BertModel's default where the tokenizer gives none (this one's model_input_names leave it out)
    expected.setdefault("token_type_ids", np.zeros_like(expected["input_ids"]))
    names = ["input_ids", "token_type_ids", "attention_mask"]
    feeds = text_feeds(TextTokenizer.from_dir(path), TEXTS, names)
    assert list(feeds) == names
    for name in names:
        assert feeds[name].dtype == np.int64
        np.testing.assert_array_equal(feeds[name], expected[name])
    assert list(text_feeds(TextTokenizer.from_dir(path), TEXTS, ["input_ids"])) == ["input_ids"]


def test_encoder_on_text_matches_transformers(hf_dir):
    """``run DIR --text``: the feeds made from text through blockc's encoder give BertModel's output."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    from blockc.frontends import Encoder, bert_config_from_hf, load_hf_bert_state_dict
    from blockc.frontends.module import trace
    from blockc.runtime.backend import make_backend
    path = hf_dir("bert")
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="eager")
    with torch.no_grad():
        expected = hf(**transformers.AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt"))
    model = Encoder(bert_config_from_hf(json.loads((path / "config.json").read_text())))
    weights = load_hf_bert_state_dict(load_file(str(path / "model.safetensors")), model)
    graph = trace(model)
    feeds = text_feeds(TextTokenizer.from_dir(path), TEXTS, [v.name for v in graph.inputs])
    with make_backend("reference").compile(graph, weights) as compiled:
        got = compiled.run(feeds)["last_hidden_state"]
    mask = feeds["attention_mask"].astype(bool)   # the pads' own rows are not compared
    np.testing.assert_allclose(got[mask], expected.last_hidden_state.numpy()[mask], atol=1e-4)


def test_feeds_refuse_what_text_cannot_make(hf_dir):
    ours = TextTokenizer.from_dir(hf_dir("bert"))
    with pytest.raises(BlockcError, match="the graph's input 'pixel_values' cannot be made from text"):
        text_feeds(ours, ["a"], ["input_ids", "pixel_values"])
    with pytest.raises(BlockcError, match="no text: give at least one --text"):
        text_feeds(ours, [], ["input_ids"])
    with pytest.raises(BlockcError, match="the text tokenizes to no tokens"):
        text_feeds(ours, [""], ["input_ids"])


# ---- chat templates ----------------------------------------------------------------------------
CHATS = [user_messages("Café? 注意"), user_messages("a 🚀", system="be brief")]


def hf_rendered(path, messages):
    return transformers.AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)


def test_chat_template_in_tokenizer_config_as_older_transformers_wrote_it(hf_dir, tmp_path):
    path = copied(hf_dir, "llama", tmp_path)
    template = (path / "chat_template.jinja").read_text()
    (path / "chat_template.jinja").unlink()
    edit_json(path, "tokenizer_config.json", chat_template="{{ bos_token }}" + template)
    for messages in CHATS:
        assert render_chat(TextTokenizer.from_dir(path), messages) == hf_rendered(path, messages)
    edit_json(path, "tokenizer_config.json", chat_template=[{"name": "default", "template": template},
                                                           {"name": "tool_use", "template": "tools"}])
    for messages in CHATS:
        assert render_chat(TextTokenizer.from_dir(path), messages) == hf_rendered(path, messages)


def test_chat_template_environment_is_transformers(hf_dir, tmp_path):
    """trim_blocks/lstrip_blocks, tojson keeping non-ASCII, loop controls, {% generation %}, namespace."""
    path = copied(hf_dir, "llama", tmp_path)
    (path / "chat_template.jinja").write_text(
        "{% set ns = namespace(n=0) %}\n"
        "{% for m in messages %}\n"
        "    {% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "    {% set ns.n = ns.n + 1 %}\n"
        "{% generation %}{{ m | tojson }}{% endgeneration %}\n"
        "{% endfor %}\n"
        "{{ ns.n }}{{ eos_token }}{% if add_generation_prompt %}<|im_start|>{% endif %}")
    for messages in CHATS:
        assert render_chat(TextTokenizer.from_dir(path), messages) == hf_rendered(path, messages)
    ids = encode_prompts(TextTokenizer.from_dir(path), ["a 🚀"], chat=True, system="be brief")
    expected = transformers.AutoTokenizer.from_pretrained(path).apply_chat_template(CHATS[1],
                                                                                    add_generation_prompt=True)
    assert ids == [expected["input_ids"] if hasattr(expected, "keys") else expected]


def test_bad_chat_templates_are_refused_in_one_line(hf_dir, tmp_path):
    path = copied(hf_dir, "llama", tmp_path)
    (path / "chat_template.jinja").write_text("{{ raise_exception('Only user and assistant roles') }}")
    with pytest.raises(BlockcError, match="the chat template failed: Only user and assistant roles"):
        render_chat(TextTokenizer.from_dir(path), CHATS[0])
    (path / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(BlockcError, match="the chat template failed: access to attribute '__class__'"):
        render_chat(TextTokenizer.from_dir(path), CHATS[0])
    (path / "chat_template.jinja").write_text("{{ 1 + 'a' }}")
    with pytest.raises(BlockcError, match="the chat template failed: TypeError: unsupported operand"):
        render_chat(TextTokenizer.from_dir(path), CHATS[0])
    (path / "chat_template.jinja").write_bytes(b"\xff{{ x }}")
    with pytest.raises(BlockcError, match="chat_template.jinja: a chat template is UTF-8 text"):
        render_chat(TextTokenizer.from_dir(path), CHATS[0])
    (path / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(BlockcError, match="the chat template failed: "):
        render_chat(TextTokenizer.from_dir(path), CHATS[0])
    (path / "chat_template.jinja").unlink()
    with pytest.raises(BlockcError, match="has no chat template .* give the prompt as it is, without --chat"):
        encode_prompts(TextTokenizer.from_dir(path), ["hi"], chat=True)
    edit_json(path, "tokenizer_config.json", chat_template=[{"name": "a", "template": "x"},
                                                           {"name": "b", "template": "y"}])
    with pytest.raises(BlockcError, match="several chat templates and none named default: a, b"):
        render_chat(TextTokenizer.from_dir(path), CHATS[0])


# ---- bad directories ---------------------------------------------------------------------------
def test_bad_tokenizer_files_are_refused_naming_the_file(hf_dir, tmp_path):
    path = copied(hf_dir, "gpt2", tmp_path)
    (path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(BlockcError, match=r"tokenizer_config.json is not valid JSON: "):
        TextTokenizer.from_dir(path)
    (path / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(BlockcError, match=r"cannot read .*tokenizer.json: "):
        TextTokenizer.from_dir(path)
    (path / "tokenizer.json").unlink()
    with pytest.raises(BlockcError, match="has no tokenizer.json: text needs the directory's Hugging Face "
                                          "tokenizer"):
        TextTokenizer.from_dir(path)


def test_prompts_that_make_no_tokens_are_refused(hf_dir):
    ours = TextTokenizer.from_dir(hf_dir("gpt2"))
    with pytest.raises(BlockcError, match=r"prompt 1 \(''\) tokenizes to no tokens"):
        encode_prompts(ours, ["a", ""])
    with pytest.raises(BlockcError, match="a system message is part of a chat: give --chat with --system"):
        encode_prompts(ours, ["a"], system="be brief")
