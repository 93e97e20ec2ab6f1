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

``finish()`` emits whatever is still held back (a character that never
completed decodes to U+FFFD, as it does in the whole). The pieces joined are
``tokenizer.decode(ids)`` exactly; ``tests/generate/test_detokenize.py``
holds them to that on random and adversarial id sequences.
"""
from __future__ import annotations

from typing import Sequence

from .text import TextTokenizer

INCOMPLETE = "\ufffd"


class IncrementalDecoder:
    """``push(ids) -> text`` for the ids that came since the last push."""

    def __init__(self, tokenizer: TextTokenizer, *, skip_special_tokens: bool = False):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = self.read = 0   # the window: ids[prefix:read] is already emitted
        self.emitted: list[str] = []

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, ids: Sequence[int]) -> str:
        """The text ``ids`` complete (``""`` while a character is incomplete)."""
        self.ids.extend(int(i) for i in ids)
        if len(self.ids) == self.read:
            return ""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith(INCOMPLETE) or not after.startswith(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        self.emitted.append(after[len(before):])
        return self.emitted[-1]

    def finish(self) -> str:
        """What is still held back (an incomplete character's U+FFFD, as
        ``decode`` gives it): the whole decoded past what was emitted."""
        whole, shown = self._decode(self.ids), "".join(self.emitted)
        rest = whole[len(shown):] if whole.startswith(shown) else ""
        self.prefix = self.read = len(self.ids)
        self.emitted = [shown + rest]
        return rest
