"""The IR's text form: one line per node, SSA, types visible.

    graph tiny(%input_ids: i64[batch,seq]) {
      param @wte: f32[256,64]
      %0:f32[batch,seq,64] = gather @wte, %input_ids {axis=0}
      ...
      return logits=%41
    }

Intermediate values are numbered when printing; graph inputs keep their
labels. ``parser.parse_graph`` reads this back into an identical graph.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np

from .dims import Sym
from .dtypes import DType

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PARAM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")


def quote_if_needed(name: str, pattern=_IDENT) -> str:
    return name if pattern.match(name) else json.dumps(name)


def format_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def format_attr(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, Sym):
        return str(v)
    if isinstance(v, tuple):
        return "[" + ",".join(format_attr(x) for x in v) + "]"
    if isinstance(v, np.ndarray):
        return format_dense(v)
    raise TypeError(f"cannot print attribute {v!r}")


def format_attrs(attrs: dict, sep: str = ", ") -> str:
    """A node's attributes as the printed IR writes them, ``{k=v, ...}``;
    ``sep``: what goes between them (folded parameters' names join them
    with a bare comma)."""
    return "{" + sep.join(f"{k}={format_attr(a)}" for k, a in attrs.items()) + "}"


def format_dense(a: np.ndarray) -> str:
    dtype = DType.from_numpy(a.dtype)
    flat = a.reshape(-1)
    if dtype == DType.bool:
        items = ["true" if x else "false" for x in flat]
    elif dtype.is_float:
        items = [format_float(float(x)) for x in flat]
    else:
        items = [str(int(x)) for x in flat]
    shape = ",".join(str(d) for d in a.shape)
    return f"dense<{dtype.short}[{shape}]: [{', '.join(items)}]>"


def result_numbers(g) -> dict[int, int]:
    """``id(node) -> N``: the node's first result prints as ``%N`` (its others
    follow it). The one numbering rule, shared by the printer, the fusion
    report's node labels and error messages that name a node."""
    numbers, counter = {}, 0
    for n in g.nodes:
        numbers[id(n)] = counter
        counter += len(n.outputs)
    return numbers


def print_graph(g) -> str:
    names: dict[int, str] = {}
    used = set()
    for v in g.inputs:
        label = v.name if _IDENT.match(v.name) and v.name not in used else None
        if label is None:
            label = json.dumps(v.name)
        used.add(v.name)
        names[id(v)] = "%" + label
    for name, v in g.params.items():
        names[id(v)] = "@" + quote_if_needed(name, _PARAM)
    lines = []
    header = ", ".join(f"{names[id(v)]}: {v.type}" for v in g.inputs)
    lines.append(f"graph {quote_if_needed(g.name)}({header}) {{")
    for name, v in g.params.items():
        lines.append(f"  param {names[id(v)]}: {v.type}")
    numbers = result_numbers(g)
    for n in g.nodes:
        results = []
        for i, o in enumerate(n.outputs):
            names[id(o)] = f"%{numbers[id(n)] + i}"
            results.append(f"{names[id(o)]}:{o.type}")
        text = f"  {', '.join(results)} = {n.op}"
        if n.inputs:
            text += " " + ", ".join(names[id(v)] for v in n.inputs)
        if n.attrs:
            text += " " + format_attrs(n.attrs)
        lines.append(text)
    outs = ", ".join(f"{quote_if_needed(name)}={names[id(v)]}" for name, v in g.outputs)
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines) + "\n"
