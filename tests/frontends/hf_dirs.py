"""Random Hugging Face checkpoint directories, made offline, as users have
them: ``config.json``, ``model.safetensors`` (or shards with their index),
``tokenizer.json`` with ``tokenizer_config.json`` and its chat template, and
``generation_config.json``.

    from hf_dirs import save_hf_dir
    path = save_hf_dir("llama", tmp_path / "llama", seed=0)

The tokenizer is a byte-level BPE trained by ``tokenizers`` on ``TEXT``
(accents, CJK and an emoji, so multi-byte UTF-8 crosses token boundaries),
and the model's vocabulary is the tokenizer's size. Every parameter is random
(``hf_testing.randomise``): HF's initial norms and biases would hide a wrong
mapping. The tests, ``bench/generate_e2e.py`` and ONNX Runtime GenAI's model
builder all read the same directories.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_testing import randomise

TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "A transformer block: attention, a residual, a norm, a feed-forward. ",
    "Café, naïve, déjà vu, Straße, smörgåsbord. ",
    "注意力就是你所需要的。变压器模型。",
    "Emoji crosses bytes: 🚀🙂 and numbers 1234567890. ",
    "def f(x):\n    return x * 2  # code too\n",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
# ChatML, the template Qwen ships, rendered by jinja2 as HF does
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

FAMILIES = ("gpt2", "bert", "roberta", "llama", "mistral", "qwen2", "qwen3")
DECODERS = ("gpt2", "llama", "mistral", "qwen2", "qwen3")


TOKENIZERS = ("bytelevel", "sentencepiece")


def train_tokenizer(vocab_size: int = 400, kind: str = "bytelevel"):
    """A BPE ``PreTrainedTokenizerFast`` trained on ``TEXT``: byte-level (GPT-2,
    Llama 3, Qwen), or ``sentencepiece`` as Llama 2 and Mistral convert theirs
    (``▁`` for a space, a BOS added, byte fallback ``<0xNN>`` tokens for
    characters outside the vocabulary, a decoder that strips the first space)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    if kind not in TOKENIZERS:
        raise ValueError(f"no tokenizer {kind!r}; kinds: {', '.join(TOKENIZERS)}")
    tok = Tokenizer(models.BPE())
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=alphabet)
    tok.train_from_iterator(TEXT, trainer=trainer)
    (_bytelevel if kind == "bytelevel" else _sentencepiece)(tok)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", pad_token="<pad>", chat_template=CHAT_TEMPLATE)


def _bytelevel(tok):
    from tokenizers import decoders, processors
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)


def _sentencepiece(tok):
    """Llama 2's layout: byte tokens appended to the trained vocabulary, byte fallback on, BOS added."""
    import json as _json

    from tokenizers import decoders, models, processors
    trained = _json.loads(tok.to_str())["model"]
    vocab = dict(trained["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok.model = models.BPE(vocab, merges, unk_token="<|endoftext|>", byte_fallback=True, fuse_unk=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", pair="<|endoftext|> $A $B",
                                                       special_tokens=[("<|endoftext|>", 0)])


def hf_config(family: str, vocab_size: int, tokenizer, **kw):
    """A small config of ``family`` whose ids are the tokenizer's."""
    import transformers
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if family == "gpt2":
        base = dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=eos, eos_token_id=eos)
        return transformers.GPT2Config(vocab_size=vocab_size, **{**base, **kw})
    if family in ("bert", "roberta"):
        base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                    max_position_embeddings=130, pad_token_id=pad)
        cls = transformers.BertConfig if family == "bert" else transformers.RobertaConfig
        return cls(vocab_size=vocab_size, **{**base, **kw})
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, max_position_embeddings=256, bos_token_id=eos, eos_token_id=eos,
                tie_word_embeddings=False)
    if family == "qwen3":
        base["head_dim"] = 16
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[family]
    return cls(vocab_size=vocab_size, **{**base, **kw})


def hf_model(family: str, config):
    import transformers
    cls = {"gpt2": transformers.GPT2LMHeadModel, "bert": transformers.BertModel,
           "roberta": transformers.RobertaModel, "llama": transformers.LlamaForCausalLM,
           "mistral": transformers.MistralForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "qwen3": transformers.Qwen3ForCausalLM}[family]
    return cls(config)


def save_hf_dir(family: str, path, *, seed: int = 0, dtype: str = "float32", shard_size: str | None = None,
                tokenizer: str = "bytelevel", **config) -> Path:
    """Save a random ``family`` model with its tokenizer to ``path`` and return
    it. ``shard_size`` (e.g. ``"200KB"``) writes shards and their index;
    ``dtype`` is the checkpoint's (``float16``, ``bfloat16``); ``tokenizer``
    is ``bytelevel`` or ``sentencepiece`` (``train_tokenizer``); ``config``
    overrides the config's fields (``vocab_size`` too)."""
    import torch
    if family not in FAMILIES:
        raise ValueError(f"no fixture for {family!r}; families: {', '.join(FAMILIES)}")
    path = Path(path)
    tokenizer = train_tokenizer(kind=tokenizer)
    # a vocab_size given widens the model past the tokenizer's ids (a bench's 32000)
    cfg = hf_config(family, config.pop("vocab_size", len(tokenizer)), tokenizer, **config)
    torch.manual_seed(seed)
    model = randomise(hf_model(family, cfg), torch).to(getattr(torch, dtype))
    if family in DECODERS:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    kw = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kw)
    tokenizer.save_pretrained(path)
    return path


def read_config(path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """``hf_dir(family, tokenizer="bytelevel")``: a random Hugging Face
    directory of ``family`` (``save_hf_dir``, seed 0), made once per session.
    A conftest shares it with ``from hf_dirs import hf_dir``."""
    pytest.importorskip("transformers")
    made = {}

    def make(family: str, tokenizer: str = "bytelevel"):
        if (family, tokenizer) not in made:
            made[family, tokenizer] = save_hf_dir(family, tmp_path_factory.mktemp(family) / family, seed=0,
                                                  tokenizer=tokenizer)
        return made[family, tokenizer]
    return make
