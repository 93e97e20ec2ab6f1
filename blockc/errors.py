"""blockc's own exceptions.

Every mistake a user can make ends in a ``BlockcError`` (or a subclass) with
a message that names the problem; the CLI prints the message, not a traceback.
"""
from __future__ import annotations

import functools
import os
import re
import sys
import traceback


class BlockcError(Exception):
    """Base class of every error blockc reports to a user."""


class ShapeError(BlockcError):
    """Operand shapes or dtypes that an op cannot accept."""


class ParseError(BlockcError):
    """IR text that does not parse; carries the line and column."""

    def __init__(self, message: str, line: int, column: int, source_line: str = ""):
        self.line, self.column = line, column
        text = f"line {line}, column {column}: {message}"
        if source_line:
            text += f"\n  {source_line}\n  {' ' * (column - 1)}^"
        super().__init__(text)


class VerifyError(BlockcError):
    """A graph that breaks an IR invariant (SSA, types, ordering)."""


class ModelError(BlockcError):
    """A model declaration that cannot be built (bad config, bad DSL use)."""


class WeightsError(BlockcError):
    """Weights whose names, shapes or dtypes do not match the model."""


class OnnxFileError(BlockcError):
    """An ONNX file that blockc refuses to read or import: malformed,
    reaching outside its folder, claiming data it does not hold, or using
    operators blockc does not import."""


class ShardError(BlockcError):
    """A graph that does not split over the tensor-parallel ranks asked for
    (heads, K/V heads, a width or a vocabulary that does not divide; a norm
    over a whole split projection)."""


class LaunchError(BlockcError):
    """A tensor-parallel run that could not start (a port in use) or did not
    finish (a rank that failed or died, the time limit)."""


class InputsError(BlockcError):
    """Input arrays that do not fit a graph's inputs; ``problems`` lists every mismatch."""

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems or [])
        super().__init__(message)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_frame() -> tuple[str, int] | None:
    """The innermost stack frame outside blockc itself: the user's source line.

    DSL errors point here, so a user sees the line of *their* model file that
    made the bad call, not a line inside blockc. Where blockc's command line
    is reached first (a built-in model built by ``blockc``), there is no user
    line: the frames further out are the ``blockc`` script or ``runpy``, not
    the user's (``--set d_ff=-5`` was once blamed on ``venv/bin/blockc:8``).
    """
    # the frames themselves, not traceback.extract_stack: that reads every
    # frame's source line, and tracing calls this once per node (96 layers of
    # GPT-3: 2 of the trace's 2.7 CPU-s)
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        where = _whose_absolute(filename) if os.path.isabs(filename) else _whose(filename)
        if where == "cli":
            return None
        if where == "user":
            return filename, frame.f_lineno or 0
        frame = frame.f_back
    return None


def _whose(filename: str) -> str:
    """``cli`` (blockc's command line), ``blockc`` (the rest of it, or code
    with no file such as ``<string>``) or ``user``."""
    path = os.path.abspath(filename)
    if path.startswith(os.path.join(_PACKAGE_DIR, "cli") + os.sep):
        return "cli"
    if not path.startswith(_PACKAGE_DIR + os.sep) and not filename.startswith("<"):
        return "user"
    return "blockc"


# only absolute names are remembered: what a relative one means depends on the working folder
_whose_absolute = functools.lru_cache(maxsize=None)(_whose)


def raised_at(e: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``e``'s traceback outside blockc
    (the user's line that raised it), or None."""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_PACKAGE_DIR + os.sep) and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno}"
    return None


def at_user_line(message: str) -> str:
    """``message`` prefixed with the user's file and line when one is found."""
    where = user_frame()
    return f"{where[0]}:{where[1]}: {message}" if where else message


# Control characters (C0, DEL, C1) and the invisible bidirectional overrides
# that reorder what a terminal shows.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``,
    ``\\n``) instead of sent to the terminal.

    Names from weight files and models are labels anyone can write; printed
    raw, ``"\\x1b[31m"`` would turn the terminal red and a newline would forge
    a line of blockc's output. ``keep_newlines`` keeps line breaks (a whole
    message of several lines, its names already escaped)."""
    def shown(m: re.Match) -> str:
        ch = m.group()
        if keep_newlines and ch == "\n":
            return ch
        return ch.encode("unicode_escape").decode("ascii") if ch != "\t" else "\\t"
    return _UNPRINTABLE.sub(shown, str(text))
