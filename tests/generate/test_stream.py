"""``blockc generate``'s display: redrawn lines on a terminal, each line once elsewhere."""
import io

from blockc.generate.loop import Generation
from blockc.generate.stream import TokenLines, format_timings


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
