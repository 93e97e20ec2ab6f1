"""Text in and out through a Hugging Face directory's tokenizer.

``TextTokenizer.from_dir(path)`` reads ``tokenizer.json`` with Hugging
Face's ``tokenizers`` library (no torch, no transformers) and
``tokenizer_config.json`` beside it, and encodes and decodes as
``AutoTokenizer.from_pretrained(path)`` does:

* special tokens (a BOS, an EOS) are added by the file's post-processor
  alone: transformers 5 drops ``tokenizer_config.json``'s ``add_bos_token``
  and ``add_eos_token`` wherever there is a ``tokenizer.json``;
* padding and truncation stored in ``tokenizer.json`` are off, as a call
  without ``padding=``/``truncation=`` has them;
* ``decode`` keeps special tokens unless asked (``tokenizer.decode(ids)``).
  transformers 5 skips ``clean_up_tokenization_spaces`` for BPE models, the
  kind every decoder here uses, so no clean-up is applied.

``text_feeds`` makes an encoder's ``input_ids``, ``attention_mask`` and
``token_type_ids`` from a batch of texts, padded as ``tokenizer(texts,
padding=True)`` pads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import BlockcError
from ..frontends.json_files import read_json

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
# the named special tokens a chat template sees (transformers' SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or
    an added token's dict with its ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class TextTokenizer:
    """A directory's tokenizer: ``backend`` (a ``tokenizers.Tokenizer``) and
    ``config`` (``tokenizer_config.json``, ``{}`` where there is none)."""

    backend: Any
    config: dict
    path: Path

    @classmethod
    def from_dir(cls, path) -> "TextTokenizer":
        path = Path(path)
        file = path / TOKENIZER_FILE
        if not file.is_file():
            raise BlockcError(f"{path} has no {TOKENIZER_FILE}: text needs the directory's Hugging Face tokenizer "
                              f"(give token ids with --prompt-ids instead)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise BlockcError("text needs Hugging Face's tokenizers library: pip install tokenizers") from None
        try:
            backend = Tokenizer.from_file(str(file))
        except Exception as e:   # the Rust library raises plain Exceptions
            raise BlockcError(f"cannot read {file}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
                from None
        config_file = path / CONFIG_FILE
        config = read_json(config_file, "tokenizer settings") if config_file.is_file() else {}
        backend.no_padding()
        backend.no_truncation()
        return cls(backend, config, path)

    def special_token(self, name: str) -> str | None:
        """The text of a named special token (``bos_token``, ``eos_token``, ...), or None."""
        return token_text(self.config.get(name))

    def special_tokens(self) -> dict[str, str]:
        """The named special tokens that are set, as a chat template sees them."""
        named = {name: self.special_token(name) for name in SPECIAL_NAMES}
        return {name: token for name, token in named.items() if token is not None}

    def token_id(self, token: str, what: str = "token") -> int:
        found = self.backend.token_to_id(token)
        if found is None:
            raise BlockcError(f"{self.path / CONFIG_FILE}: {what} {token!r} is not in {TOKENIZER_FILE}'s vocabulary")
        return int(found)

    def token(self, id: int) -> str | None:
        """The vocabulary's string for ``id`` (None outside it)."""
        return self.backend.id_to_token(int(id))

    def special_ids(self) -> frozenset[int]:
        """The ids of the special added tokens: what ``skip_special_tokens`` leaves out."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """``tokenizer(text, add_special_tokens=...)["input_ids"]``."""
        return list(self._encoding(text, add_special_tokens).ids)

    def _encoding(self, text: str, add_special_tokens: bool = True):
        if not isinstance(text, str):
            raise BlockcError(f"text to tokenize must be a string, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """``tokenizer.decode(ids, skip_special_tokens=...)``."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def padding(self) -> tuple[int, str]:
        """``(pad id, side)``: the config's ``pad_token`` (id 0 where none) and ``padding_side`` (right)."""
        side = self.config.get("padding_side", "right")
        if side not in ("left", "right"):
            raise BlockcError(f"{self.path / CONFIG_FILE}: padding_side must be 'left' or 'right', got {side!r}")
        token = self.special_token("pad_token")
        return (self.token_id(token, "pad_token") if token is not None else 0), side


FEEDS = ("input_ids", "attention_mask", "token_type_ids")


def text_feeds(tokenizer: TextTokenizer, texts: Iterable[str], inputs: Sequence[str]) -> dict[str, np.ndarray]:
    """An encoder's feeds for ``texts``, one row each, int64 ``[batch, longest]``:
    what ``tokenizer(texts, padding=True, return_tensors="np")`` returns, for
    the ``inputs`` a graph takes. An input it cannot make is refused by name."""
    texts = list(texts)
    if not texts:
        raise BlockcError("no text: give at least one --text")
    unknown = [name for name in inputs if name not in FEEDS]
    if unknown:
        raise BlockcError(f"the graph's input {unknown[0]!r} cannot be made from text (text makes "
                          f"{', '.join(FEEDS)}); give --inputs instead")
    encodings = [tokenizer._encoding(t) for t in texts]
    longest = max(len(e.ids) for e in encodings)
    if longest == 0:
        raise BlockcError("the text tokenizes to no tokens: give some text")
    pad_id, side = tokenizer.padding()
    rows = {name: np.zeros((len(texts), longest), np.int64) for name in FEEDS}
    rows["input_ids"][:] = pad_id
    for row, e in enumerate(encodings):
        cols = slice(longest - len(e.ids), longest) if side == "left" else slice(0, len(e.ids))
        for name, values in zip(FEEDS, (e.ids, e.attention_mask, e.type_ids)):
            rows[name][row, cols] = values
    return {name: rows[name] for name in inputs}
