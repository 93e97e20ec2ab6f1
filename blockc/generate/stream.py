"""Showing generation as it happens, and its timings, for ``blockc generate``.

Ids (``TokenLines``): on a terminal the prompts' lines are redrawn after
every step (one line a prompt, the ids so far); anywhere else (a pipe, a
file, a test) they are printed once, at the end, so a log holds each line
once.

Text (``TextLines``, where the model has a tokenizer): one prompt's text is
written as it comes, piece by piece (``detokenize.IncrementalDecoder``), to
a terminal or a pipe alike, so what is written, joined, is
``tokenizer.decode(new_ids)``; on a terminal control characters are shown
escaped (``errors.printable``), since a model's text is anyone's. Several
prompts are lines redrawn on a terminal (``[k]`` and the end of each text,
on one line) and each prompt's whole text, ``[k] text``, at the end elsewhere.
"""
from __future__ import annotations

import shutil
import sys
from typing import TextIO

from ..errors import printable
from .detokenize import IncrementalDecoder
from .loop import Generation
from .text import TextTokenizer


def ids_line(k: int, ids: list[int]) -> str:
    return f"[{k}] " + " ".join(map(str, ids))


class TokenLines:
    """An ``on_token`` callback that keeps one line per prompt on ``stream``."""

    def __init__(self, count: int, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self.count, self.drawn, self.last = count, False, [[] for _ in range(count)]

    def __call__(self, tokens: list[list[int]]) -> None:
        self.last = [list(t) for t in tokens]
        if not self.live:
            return
        if self.drawn:   # back to the first line, to write over all of them
            self.stream.write(f"\x1b[{self.count}F")
        for k, ids in enumerate(self.last):
            self.stream.write("\x1b[2K" + ids_line(k, ids) + "\n")
        self.stream.flush()
        self.drawn = True

    def finish(self, tokens: list[list[int]]) -> None:
        """The final lines: drawn once more live, or printed for the first time."""
        self.live = self.live and self.drawn
        if not self.live:
            for k, ids in enumerate(tokens):
                self.stream.write(ids_line(k, ids) + "\n")
        else:
            self(tokens)


class TextLines:
    """An ``on_token`` callback that shows each prompt's new text on ``stream`` (see the module)."""

    def __init__(self, tokenizer: TextTokenizer, count: int, stream: TextIO | None = None, *,
                 skip_special_tokens: bool = False):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self.decoders = [IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
                         for _ in range(count)]
        self.drawn = False

    @property
    def texts(self) -> list[str]:
        """Each prompt's text so far."""
        return ["".join(d.emitted) for d in self.decoders]

    def _shown(self, text: str) -> str:
        return printable(text, keep_newlines=True) if self.live else text

    def __call__(self, tokens: list[list[int]]) -> None:
        pieces = [d.push(ids[len(d.ids):]) for d, ids in zip(self.decoders, tokens)]
        if len(self.decoders) == 1:
            if pieces[0]:
                self.stream.write(self._shown(pieces[0]))
                self.stream.flush()
        elif self.live:
            self._redraw()

    def _redraw(self) -> None:
        width = shutil.get_terminal_size().columns - 6
        if self.drawn:   # back to the first line, to write over all of them
            self.stream.write(f"\x1b[{len(self.decoders)}F")
        for k, text in enumerate(self.texts):
            self.stream.write(f"\x1b[2K[{k}] " + printable(text)[-width:] + "\n")
        self.stream.flush()
        self.drawn = True

    def finish(self, tokens: list[list[int]]) -> list[str]:
        """The text held back (an incomplete character at the end) shown, and each prompt's whole text."""
        self(tokens)
        rest = [d.finish() for d in self.decoders]
        if len(self.decoders) == 1:
            self.stream.write(self._shown(rest[0]) + "\n")
        elif self.live:
            self._redraw()
        else:
            for k, text in enumerate(self.texts):
                self.stream.write(f"[{k}] {text}\n")
        self.stream.flush()
        return self.texts


def format_timings(gen: Generation) -> str:
    """The whole run first, then its parts: the start (loading the weights,
    compiling), the time to first token, each decode step's median and p90,
    tokens per second while generating."""
    lines = [f"whole run {gen.whole_s:.2f} s: start {gen.start_s:.2f} s (load {gen.load_s:.2f} s, compile "
             f"{gen.compile_s:.2f} s), then {gen.whole_s - gen.start_s:.2f} s generating",
             f"time to first token {gen.first_token_s * 1e3:.2f} ms"]
    if gen.step_s:
        lines.append(f"decode step {gen.step_median_s * 1e3:.2f} ms median, {gen.step_p90_s * 1e3:.2f} ms p90 "
                     f"over {len(gen.step_s)} steps")
    total = sum(len(t) for t in gen.tokens)
    prompts = f"{len(gen.tokens)} prompt{'' if len(gen.tokens) == 1 else 's'}"
    lines.append(f"{total} tokens at {gen.tokens_per_s:.1f} tokens/s ({prompts} batched, on {gen.backend}"
                 + (f", {gen.form} graphs)" if gen.form else ")"))
    return "\n".join(lines)
