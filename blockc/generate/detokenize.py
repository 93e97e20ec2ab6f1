"""Decoding new ids into text as they come, exactly.

A token is not a piece of text: a byte-level BPE token may hold half of a
multi-byte UTF-8 character (an emoji or a CJK character is often split
across two or three tokens), and a decoder may treat a sequence's first
token differently (SentencePiece's leading space). So the text of each new
token is found the way the serving engines do it (the "prefix offset"
technique of Hugging Face's text-generation-inference and vLLM): decode a
window from ``prefix`` to the end and from ``prefix`` to ``read``, and emit
what the longer one adds, but only when it does not end in U+FFFD (an
incomplete character, held back until the next token completes it). The
window then slides to start where the emitted text ended.

SentencePiece-style tokenizers (Llama 2, Mistral) spell a character outside
their vocabulary as byte tokens ``<0xE4><0xB8><0xAD>``, and their
``ByteFallback`` decoder decodes a run of byte tokens together: valid
UTF-8, or one U+FFFD per byte if the run is not, so a byte that decodes
alone (``<0x12>``) turns into U+FFFD when an invalid byte follows it. Text
is therefore also held back while the last token is a byte token: a run is
final only when a token that is not a byte ends it.

``finish()`` emits whatever is still held back (a character that never
completed decodes to U+FFFD, as it does in the whole). The pieces joined are
``tokenizer.decode(ids)`` exactly; ``tests/generate/test_detokenize.py``
holds them to that on random and adversarial id sequences.
"""
from __future__ import annotations

import re
from typing import Sequence

from .text import TextTokenizer

INCOMPLETE = "\ufffd"
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")   # a SentencePiece byte-fallback token


class IncrementalDecoder:
    """``push(ids) -> text`` for the ids that came since the last push."""

    def __init__(self, tokenizer: TextTokenizer, *, skip_special_tokens: bool = False):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = self.read = 0   # the window: ids[prefix:read] is already emitted
        self.emitted: list[str] = []
        self.specials = tokenizer.special_ids()

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, ids: Sequence[int]) -> str:
        """The text ``ids`` complete (``""`` while a character is incomplete)."""
        self.ids.extend(int(i) for i in ids)
        if len(self.ids) == self.read:
            return ""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith(INCOMPLETE) or not after.startswith(before) \
                or self._in_byte_run():
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        self.emitted.append(after[len(before):])
        return self.emitted[-1]

    def _in_byte_run(self) -> bool:
        """The last token the decoder sees is a byte token: its run may still
        turn to U+FFFD. Skipped special tokens are not seen, so do not end a run."""
        for i in reversed(self.ids):
            if self.skip and i in self.specials:
                continue
            token = self.tokenizer.token(i)
            return token is not None and BYTE_TOKEN.fullmatch(token) is not None
        return False

    def finish(self) -> str:
        """What is still held back (an incomplete character's U+FFFD, as
        ``decode`` gives it): the whole decoded past what was emitted."""
        whole, shown = self._decode(self.ids), "".join(self.emitted)
        rest = whole[len(shown):] if whole.startswith(shown) else ""
        self.prefix = self.read = len(self.ids)
        self.emitted = [shown + rest]
        return rest
