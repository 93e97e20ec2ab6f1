"""No function longer than 60 lines of code (docstrings, comments and blank
lines not counted): a longer one holds more than one step and reads as a
wall. Applied to every module of blockc/."""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

import blockc

LIMIT = 60
ROOT = Path(blockc.__file__).parent


def code_lines(source: str) -> set[int]:
    """The lines of ``source`` that hold code: not blank, not only a comment."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def long_functions(source: str, limit: int = LIMIT) -> list[str]:
    """``name (n lines)`` for each function of ``source`` with more than ``limit`` lines of code."""
    code = code_lines(source)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        lines = set(range(node.lineno, node.end_lineno + 1)) & code
        doc = node.body[0]
        if ast.get_docstring(node) is not None:
            lines -= set(range(doc.lineno, doc.end_lineno + 1))
        if len(lines) > limit:
            found.append(f"{node.name} ({len(lines)} lines, line {node.lineno})")
    return found


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_is_longer_than_the_limit(path):
    assert not long_functions(path.read_text()), f"{path.relative_to(ROOT)}: split it"


def test_the_count_leaves_out_docstrings_comments_and_blank_lines():
    body = [f"    x{i} = {i}\n" for i in range(LIMIT)]
    padding = '    """A docstring\n\n    of lines."""\n    # a comment\n\n'
    assert not long_functions(f"def f():\n{padding}{''.join(body[1:])}")   # the def and 59 lines: 60
    assert long_functions(f"def f():\n{padding}{''.join(body)}    return 0\n") == [f"f ({LIMIT + 2} lines, line 1)"]
