"""``blockc generate``'s display: redrawn lines on a terminal, each line once elsewhere."""
import io

import pytest

from blockc.generate.loop import Generation
from blockc.generate.stream import TextLines, TokenLines, format_timings


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_pipe_gets_each_line_once_at_the_end():
    out = io.StringIO()
    lines = TokenLines(2, out)
    lines([[1], [2]])
    lines([[1, 3], [2, 4]])
    assert out.getvalue() == ""
    lines.finish([[1, 3], [2, 4]])
    assert out.getvalue() == "[0] 1 3\n[1] 2 4\n"


def test_a_terminal_is_redrawn_in_place():
    out = Terminal()
    lines = TokenLines(2, out)
    lines([[1], [2]])
    lines([[1, 3], [2, 4]])
    lines.finish([[1, 3], [2, 4]])
    text = out.getvalue()
    assert text.startswith("\x1b[2K[0] 1\n\x1b[2K[1] 2\n\x1b[2F")   # drawn, then back up two lines
    assert text.endswith("\x1b[2F\x1b[2K[0] 1 3\n\x1b[2K[1] 2 4\n")


def test_timings_give_median_p90_and_rate():
    gen = Generation([[1, 2, 3], [4, 5, 6]], 0.010, [0.001, 0.002, 0.003, 0.004], 0.5, "reference")
    text = format_timings(gen)
    assert "time to first token 10.00 ms" in text
    assert "decode step 2.50 ms median, 3.70 ms p90 over 4 steps" in text
    assert "6 tokens at 300.0 tokens/s" in text   # 6 tokens over 20 ms


def test_the_whole_run_is_the_headline_with_the_start_apart():
    gen = Generation([[1, 2]], 0.010, [0.030], 0.5, "reference", load_s=0.25)
    first, second = format_timings(gen).splitlines()[:2]
    assert first == "whole run 0.79 s: start 0.75 s (load 0.25 s, compile 0.50 s), then 0.04 s generating"
    assert second == "time to first token 10.00 ms"
    assert "not counted" not in format_timings(gen)
    got = gen.as_json()
    assert (got["whole_s"], got["start_s"], got["load_s"], got["compile_s"]) == pytest.approx((0.79, 0.75, 0.25, 0.5))


def test_generate_counts_the_callers_load_in_the_start():
    from blockc.frontends import build_model, init_weights
    from blockc.generate import generate
    model = build_model("tiny", {"layers": "1"})
    gen = generate(model, init_weights(model, seed=0), [[1, 2, 3]], 3, backend="reference", load_s=1.5)
    assert gen.load_s == 1.5 and gen.start_s == 1.5 + gen.compile_s > 1.5
    assert gen.whole_s == pytest.approx(gen.start_s + gen.first_token_s + sum(gen.step_s))


# ---- text ---------------------------------------------------------------------------------------
class FakeTokenizer:
    """Ids are bytes: decode is UTF-8 with U+FFFD for what does not decode, as a byte-level BPE's is."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")

    def special_ids(self):
        return frozenset()

    def token(self, id):
        return chr(id)


def steps(rows):
    """The ``tokens`` of each step of a generation of ``rows``: every row one id longer each time."""
    return [[row[:n] for row in rows] for n in range(1, max(map(len, rows)) + 1)]


def test_one_prompts_text_streams_as_it_comes_and_joins_to_decode():
    ids = list("a🚀\x1bb".encode())
    out = io.StringIO()
    lines = TextLines(FakeTokenizer(), 1, out)
    seen = []
    for tokens in steps([ids]):
        lines(tokens)
        seen.append(out.getvalue())
    assert seen == ["a", "a", "a", "a", "a🚀", "a🚀\x1b", "a🚀\x1bb"]   # the rocket only once whole
    assert lines.finish([ids]) == ["a🚀\x1bb"] and out.getvalue() == "a🚀\x1bb\n"   # a pipe gets the text exactly


def test_a_character_left_incomplete_is_shown_at_the_end():
    ids = list("a🚀".encode())[:-1]
    out = io.StringIO()
    lines = TextLines(FakeTokenizer(), 1, out)
    for tokens in steps([ids]):
        lines(tokens)
    assert out.getvalue() == "a"
    assert lines.finish([ids]) == ["a\ufffd"] and out.getvalue() == "a\ufffd\n"


def test_a_terminal_sees_control_characters_escaped():
    out = Terminal()
    lines = TextLines(FakeTokenizer(), 1, out)
    ids = list("a\x1b[31mb\n".encode())
    lines.finish([ids])
    assert out.getvalue() == "a\\x1b[31mb\n\n" and lines.texts == ["a\x1b[31mb\n"]


def test_several_prompts_are_lines_in_a_pipe_and_redrawn_on_a_terminal():
    rows = [list("ab\nc".encode()), list("注".encode())]
    out = io.StringIO()
    lines = TextLines(FakeTokenizer(), 2, out)
    for tokens in steps(rows):
        lines(tokens)
    assert out.getvalue() == ""
    assert lines.finish(rows) == ["ab\nc", "注"] and out.getvalue() == "[0] ab\nc\n[1] 注\n"
    term = Terminal()
    lines = TextLines(FakeTokenizer(), 2, term)
    for tokens in steps(rows):
        lines(tokens)
    lines.finish(rows)
    assert term.getvalue().startswith("\x1b[2K[0] a\n\x1b[2K[1] \n\x1b[2F")
    assert term.getvalue().endswith("\x1b[2F\x1b[2K[0] ab\\nc\n\x1b[2K[1] 注\n")   # one line a prompt
