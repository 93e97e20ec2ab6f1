"""blockc's own exceptions.

Every mistake a user can make ends in a ``BlockcError`` (or a subclass) with
a message that names the problem; the CLI prints the message, not a traceback.
"""
from __future__ import annotations

import os
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


class InputsError(BlockcError):
    """Input arrays that do not fit a graph's inputs; ``problems`` lists every mismatch."""

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems or [])
        super().__init__(message)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_frame() -> tuple[str, int] | None:
    """The innermost stack frame outside blockc itself: the user's source line.

    DSL errors point here, so a user sees the line of *their* model file that
    made the bad call, not a line inside blockc.
    """
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_PACKAGE_DIR + os.sep):
            return frame.filename, frame.lineno or 0
    return None


def at_user_line(message: str) -> str:
    """``message`` prefixed with the user's file and line when one is found."""
    where = user_frame()
    return f"{where[0]}:{where[1]}: {message}" if where else message
