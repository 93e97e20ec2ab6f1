"""Text in, text out, against Hugging Face: on random gpt2, llama, mistral,
qwen2 and qwen3 directories (``hf_dirs.save_hf_dir``; llama with a SentencePiece-style
tokenizer too), the prompt tokenized by blockc from
``tokenizer.json``, generated greedily by blockc's loop and streamed through
``TextLines``, is exactly ``AutoTokenizer`` + ``model.generate`` +
``tokenizer.decode``: the same prompt ids, the same new ids, the same text;
with the chat template too; and the directory's eos ids (one, or a list)
stop both at the same token."""
import io
import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from blockc.frontends.hf_gpt2 import gpt2_config_from_hf, load_hf_gpt2_state_dict  # noqa: E402
from blockc.frontends.hf_llama import llama_config_from_hf, load_hf_llama_state_dict  # noqa: E402
from blockc.frontends.models import DecoderLM  # noqa: E402
from blockc.generate import generate  # noqa: E402
from blockc.generate.chat import chat_ids, user_messages  # noqa: E402
from blockc.generate.generation_config import make_sampler, read_generation_config  # noqa: E402
from blockc.generate.stream import TextLines  # noqa: E402
from blockc.generate.text import TextTokenizer  # noqa: E402

NEW = 24
PROMPT = "The quick brown fox 注意力 🚀"
LOADERS = {"gpt2": (gpt2_config_from_hf, load_hf_gpt2_state_dict),
           "llama": (llama_config_from_hf, load_hf_llama_state_dict),
           "mistral": (llama_config_from_hf, load_hf_llama_state_dict),
           "qwen2": (llama_config_from_hf, load_hf_llama_state_dict),
           "qwen3": (llama_config_from_hf, load_hf_llama_state_dict)}


def blockc_model(path, family):
    """blockc's model and weights of the directory, through the existing loaders."""
    from safetensors.numpy import load_file
    config_from_hf, load = LOADERS[family]
    model = DecoderLM(config_from_hf(json.loads((path / "config.json").read_text())))
    return model, load(load_file(str(path / "model.safetensors")), model)


def hf_text(path, prompts):
    """Hugging Face's new ids and decoded text for each prompt, each alone, greedy, the directory's eos."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    out = []
    for ids in prompts:
        ids = torch.tensor([ids])
        with torch.no_grad():
            seq = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
        new = seq[0, ids.shape[1]:].tolist()
        out.append((new, tok.decode(new)))
    return out


def blockc_text(path, family, prompts):
    """blockc's new ids, its streamed output and its texts, with the directory's defaults."""
    model, weights = blockc_model(path, family)
    defaults = read_generation_config(path)
    stream = io.StringIO()
    lines = TextLines(TextTokenizer.from_dir(path), len(prompts), stream)
    got = generate(model, weights, prompts, NEW, pick=make_sampler(defaults), stop_id=defaults.eos_ids,
                   on_token=lines)
    texts = lines.finish(got.tokens)
    return got.tokens, stream.getvalue(), texts


CASES = [("gpt2", "bytelevel"), ("llama", "bytelevel"), ("mistral", "bytelevel"), ("qwen2", "bytelevel"),
         ("qwen3", "bytelevel"), ("llama", "sentencepiece")]


@pytest.mark.parametrize("family, tokenizer", CASES)
def test_text_prompt_generates_as_transformers(hf_dir, family, tokenizer):
    path = hf_dir(family, tokenizer)
    prompt = TextTokenizer.from_dir(path).encode(PROMPT)
    assert prompt == transformers.AutoTokenizer.from_pretrained(path)(PROMPT)["input_ids"]
    (expected_ids, expected_text), = hf_text(path, [prompt])
    tokens, shown, texts = blockc_text(path, family, [prompt])
    assert tokens == [expected_ids]
    assert texts == [expected_text] and shown == expected_text + "\n"   # streamed, joined: decode's text


@pytest.mark.parametrize("family, tokenizer", CASES)
def test_chat_prompts_generate_as_transformers(hf_dir, family, tokenizer):
    path = hf_dir(family, tokenizer)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    chats = [user_messages("Café? 注意"), user_messages("a feed-forward 🙂", system="be brief")]
    prompts = [chat_ids(TextTokenizer.from_dir(path), m) for m in chats]
    for ids, messages in zip(prompts, chats):
        expected = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert ids == (expected["input_ids"] if hasattr(expected, "keys") else expected)
    expected = hf_text(path, prompts)
    tokens, shown, texts = blockc_text(path, family, prompts)
    assert tokens == [ids for ids, _ in expected]
    assert texts == [text for _, text in expected]
    assert shown == "".join(f"[{k}] {text}\n" for k, text in enumerate(texts))   # a batch in a pipe: once each


@pytest.mark.parametrize("as_list", [False, True])
def test_eos_of_generation_config_stops_both(hf_dir, tmp_path, as_list):
    """The eos is set to the token greedy picks 6th, so generation must stop there."""
    path = tmp_path / "llama"
    shutil.copytree(hf_dir("llama"), path)
    prompt = TextTokenizer.from_dir(path).encode(PROMPT)
    config_file = path / "generation_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = None
    config_file.write_text(json.dumps(config))
    (free, _), = hf_text(path, [prompt])
    stop = free[5]
    assert stop not in free[:5]
    config["eos_token_id"] = [stop, 399] if as_list else stop
    config_file.write_text(json.dumps(config))
    assert read_generation_config(path).eos_ids == ((stop, 399) if as_list else (stop,))
    (expected_ids, expected_text), = hf_text(path, [prompt])
    assert expected_ids == free[:6]
    tokens, _, texts = blockc_text(path, "llama", [prompt])
    assert tokens == [expected_ids] and texts == [expected_text]


def test_text_generation_needs_neither_torch_nor_transformers(hf_dir):
    """The whole text path (tokenizer, chat template, loop, stream) in a Python where importing torch or
    transformers fails, giving Hugging Face's text."""
    import subprocess
    import sys
    path = hf_dir("llama")
    prompt = chat_ids(TextTokenizer.from_dir(path), user_messages(PROMPT))
    (_, expected), = hf_text(path, [prompt])
    script = f"""
import sys
sys.modules["torch"] = sys.modules["transformers"] = None   # import torch: ImportError
import json, pathlib
from safetensors.numpy import load_file
from blockc.frontends.hf_llama import llama_config_from_hf, load_hf_llama_state_dict
from blockc.frontends.models import DecoderLM
from blockc.generate import generate
from blockc.generate.chat import encode_prompts
from blockc.generate.generation_config import make_sampler, read_generation_config
from blockc.generate.stream import TextLines
from blockc.generate.text import TextTokenizer
path = pathlib.Path({str(path)!r})
model = DecoderLM(llama_config_from_hf(json.loads((path / "config.json").read_text())))
weights = load_hf_llama_state_dict(load_file(str(path / "model.safetensors")), model)
tokenizer = TextTokenizer.from_dir(path)
prompts = encode_prompts(tokenizer, [{PROMPT!r}], chat=True)
defaults = read_generation_config(path)
lines = TextLines(tokenizer, 1)
got = generate(model, weights, prompts, {NEW}, pick=make_sampler(defaults), stop_id=defaults.eos_ids,
               on_token=lines)
lines.finish(got.tokens)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"
