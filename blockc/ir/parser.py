"""Reads the text printed by ``printer.print_graph`` back into a ``Graph``.

One statement per line. Errors are ``ParseError`` with line and column.
"""
from __future__ import annotations

import json
import re

import numpy as np

from ..errors import BlockcError, ParseError
from .dims import Sym, parse_dim
from .dtypes import DType
from .graph import Graph
from .types import TensorType

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<value>%(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+|"(?:[^"\\]|\\.)*"))
  | (?P<param>@(?:[A-Za-z0-9_][A-Za-z0-9_.]*|"(?:[^"\\]|\\.)*"))
  | (?P<number>-?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|[0-9]+))
  | (?P<ident>-?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[:,={}\[\]()<>+*-])
  | (?P<bad>.)
""", re.VERBOSE)


class _Line:
    """Tokens of one line with a cursor; errors point at the current token."""

    def __init__(self, text: str, lineno: int):
        self.text, self.lineno, self.toks, self.i = text, lineno, [], 0
        # one scan of the line (a cached graph is read back on every warm start): ``bad`` takes any
        # character no token starts with, so the matches tile the line
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            if kind == "bad":
                raise ParseError(f"unexpected character {m.group()!r}", lineno, m.start() + 1, text)
            if kind != "ws":
                self.toks.append((kind, m.group(), m.start() + 1))

    def error(self, message: str) -> ParseError:
        col = self.toks[self.i][2] if self.i < len(self.toks) else len(self.text) + 1
        return ParseError(message, self.lineno, col, self.text)

    def peek(self, offset: int = 0):
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else (None, None, len(self.text) + 1)

    def at(self, text: str) -> bool:
        return self.peek()[1] == text

    def take(self, kind: str | None = None, text: str | None = None) -> str:
        k, t, _ = self.peek()
        if k is None or (kind and k != kind) or (text and t != text):
            want = repr(text) if text else (kind or "a token")
            got = repr(t) if t is not None else "end of line"
            raise self.error(f"expected {want}, found {got}")
        self.i += 1
        return t

    def done(self) -> bool:
        return self.i >= len(self.toks)

    def end(self) -> None:
        if not self.done():
            raise self.error(f"unexpected {self.peek()[1]!r}")


def _unquote(text: str) -> str:
    return json.loads(text) if text.startswith('"') else text


def _items(line: _Line, read, close: str) -> list:
    """``read(line)`` for each item of a comma-separated list, up to and
    including ``close`` (its opening bracket already taken)."""
    items = []
    while not line.at(close):
        items.append(read(line))
        if not line.at(close):
            line.take(text=",")
    line.take(text=close)
    return items


def _dim_text(line: _Line, stops: set) -> str:
    """Raw text of a dimension expression, up to a stop token at depth 0."""
    parts, depth = [], 0
    while not line.done():
        t = line.peek()[1]
        if depth == 0 and t in stops:
            break
        depth += (t == "(") - (t == ")")
        parts.append(t)
        line.i += 1
    if not parts:
        raise line.error("expected a dimension")
    return " ".join(parts)


def _dim(line: _Line, stops: set):
    start = line.i
    text = _dim_text(line, stops)
    try:
        return parse_dim(text.replace(" ", ""))
    except (ValueError, BlockcError) as e:
        line.i = start
        raise line.error(f"bad dimension {text!r}: {e}") from None


# Types read so far, by their text: a graph repeats a few types hundreds of times, and a type is
# immutable. Bounded: cleared when full.
_TYPES: dict[str, TensorType] = {}


def _type(line: _Line) -> TensorType:
    """``f32[batch,seq,768]``: a type seen before is taken whole, its tokens
    skipped; a new one is read token by token (errors point into it)."""
    start, close = line.i, line.i + 2
    while close < len(line.toks) and line.toks[close][1] != "]":
        close += 1
    if close < len(line.toks) and line.toks[start + 1][1] == "[":
        text = line.text[line.toks[start][2] - 1:line.toks[close][2]]
        if text in _TYPES:
            line.i = close + 1
            return _TYPES[text]
        t = _read_type(line)
        if len(_TYPES) >= 4096:
            _TYPES.clear()
        _TYPES[text] = t
        return t
    return _read_type(line)


def _read_type(line: _Line) -> TensorType:
    name = line.take("ident")
    try:
        dtype = DType.parse(name)
    except KeyError:
        line.i -= 1
        raise line.error(f"unknown dtype {name!r}") from None
    line.take(text="[")
    shape = _items(line, lambda line: _dim(line, {",", "]"}), "]")
    return TensorType(dtype, tuple(shape))


def _scalar(line: _Line, dtype: DType | None = None):
    kind, text, _ = line.peek()
    if kind == "number":
        line.i += 1
        return float(text) if any(c in text for c in ".eE") else int(text)
    if kind == "ident" and text in ("inf", "-inf", "nan"):
        line.i += 1
        return float(text)
    if kind == "ident" and text in ("true", "false"):
        line.i += 1
        return text == "true"
    raise line.error(f"expected a number, found {text!r}")


def _attr_value(line: _Line):
    kind, text, _ = line.peek()
    if kind == "string":
        line.i += 1
        return json.loads(text)
    if text == "[":
        line.i += 1
        return tuple(_items(line, _list_item, "]"))
    if text == "dense" and line.peek(1)[1] == "<":
        return _dense(line)
    if kind == "number" or text in ("inf", "-inf", "nan", "true", "false"):
        if kind == "number" and line.peek(1)[1] in ("+", "-", "*"):
            return _dim(line, {",", "}"})
        return _scalar(line)
    if kind == "ident" or text in ("(", "-"):
        return _dim(line, {",", "}"})
    raise line.error(f"expected an attribute value, found {text!r}")


def _attr(line: _Line) -> tuple:
    """``key=value`` in a node's ``{...}``."""
    key = line.take("ident")
    line.take(text="=")
    return key, _attr_value(line)


def _list_item(line: _Line):
    kind, text, _ = line.peek()
    if kind == "number" and line.peek(1)[1] not in ("+", "-", "*"):
        return _scalar(line)
    return _dim(line, {",", "]"})


def _dense(line: _Line) -> np.ndarray:
    line.take(text="dense")
    line.take(text="<")
    start = line.i
    t = _type(line)
    line.take(text=":")
    line.take(text="[")
    items = _items(line, _scalar, "]")
    line.take(text=">")
    shape = tuple(t.shape)
    if not all(isinstance(d, int) for d in shape):
        line.i = start
        raise line.error("a dense constant needs a static shape")
    if int(np.prod(shape, dtype=np.int64)) != len(items):
        line.i = start
        raise line.error(f"dense constant of shape {list(shape)} has {len(items)} values")
    return np.array(items, dtype=np.float64 if t.dtype.is_float else None).astype(t.dtype.numpy).reshape(shape)


def parse_graph(text: str) -> Graph:
    """Parse printed IR. Raises ``ParseError`` naming line and column."""
    lines = text.splitlines()
    values: dict[str, object] = {}
    g: Graph | None = None
    finished = False
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        line = _Line(raw, lineno)
        if finished:
            raise line.error("text after the end of the graph")
        if g is None:
            g = _header(line, values)
            continue
        first = line.peek()[1]
        if first == "}":
            line.take(text="}")
            line.end()
            finished = True
        elif first == "param":
            _param(line, g, values)
        elif first == "return":
            _return(line, g, values)
        else:
            _node(line, g, values)
    if g is None:
        raise ParseError("empty text: expected 'graph NAME(...) {'", 1, 1)
    if not finished:
        raise ParseError("missing closing '}'", len(lines), 1, lines[-1] if lines else "")
    return g


def _header(line: _Line, values: dict) -> Graph:
    """``graph NAME(%x: f32[...], ...) {``: the graph, its inputs defined in ``values``."""
    line.take(text="graph")
    kind, name, _ = line.peek()
    if kind not in ("ident", "string"):
        raise line.error("expected the graph's name")
    line.i += 1
    g = Graph(_unquote(name))
    line.take(text="(")

    def graph_input(line: _Line) -> None:
        vname = line.take("value")
        line.take(text=":")
        if vname in values:
            line.i -= 3
            raise line.error(f"input {vname} declared twice")
        values[vname] = g.add_input(_unquote(vname[1:]), _type(line))
    _items(line, graph_input, ")")
    line.take(text="{")
    line.end()
    return g


def _param(line: _Line, g: Graph, values: dict) -> None:
    """``param @name: f32[...]``"""
    line.take(text="param")
    pname = line.take("param")
    line.take(text=":")
    values[pname] = g.add_param(_unquote(pname[1:]), _type(line))
    line.end()


def _return(line: _Line, g: Graph, values: dict) -> None:
    """``return name = %v, ...``: the graph's outputs."""
    line.take(text="return")
    outs = []
    while not line.done():
        kind, oname, _ = line.peek()
        if kind not in ("ident", "string"):
            raise line.error("expected an output name")
        line.i += 1
        line.take(text="=")
        outs.append((_unquote(oname), _ref(line, values)))
        if not line.done():
            line.take(text=",")
    g.set_outputs(outs)


def _ref(line: _Line, values: dict):
    """The value a ``%name`` token refers to, which must be defined above."""
    ref = line.take()
    if ref not in values:
        line.i -= 1
        raise line.error(f"undefined value {ref}")
    return values[ref]


def _node(line: _Line, g: Graph, values: dict) -> None:
    results = []
    while True:
        name = line.take("value")
        if name in values:
            line.i -= 1
            raise line.error(f"value {name} is defined twice")
        line.take(text=":")
        results.append((name, _type(line), line.i))
        if line.at("="):
            break
        line.take(text=",")
    line.take(text="=")
    op_start = line.i
    op = line.take("ident")
    inputs = []
    if not line.done() and not line.at("{"):
        while True:
            inputs.append(_ref(line, values))
            if not line.at(","):
                break
            line.take(text=",")
    attrs = {}
    if line.at("{"):
        line.take(text="{")
        attrs = dict(_items(line, _attr, "}"))
    line.end()
    try:
        node = g.add_node(op, inputs, attrs)
    except BlockcError as e:
        line.i = op_start
        raise line.error(str(e)) from None
    if len(node.outputs) != len(results):
        line.i = op_start
        raise line.error(f"{op} has {len(node.outputs)} results, the text names {len(results)}")
    for (name, declared, _), out in zip(results, node.outputs):
        if declared != out.type:
            line.i = op_start
            raise line.error(f"{name} is declared {declared} but {op} gives {out.type}")
        values[name] = out
