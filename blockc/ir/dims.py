"""Symbolic tensor dimensions.

A dimension is either a plain ``int`` or a ``Sym``: a polynomial with integer
coefficients over named symbols (``batch``, ``seq``, ``past``). That covers
what transformer shapes need -- ``past+seq``, ``batch*seq``, ``2*seq`` -- and
keeps equality structural: ``seq+past`` and ``past+seq`` are the same dim.
A ``Sym`` that turns out constant is always returned as an ``int``.
"""
from __future__ import annotations

import functools
import re
from typing import Mapping, Union

from ..errors import BlockcError

# A monomial is a sorted tuple of symbol names (with repeats for powers).
Monomial = tuple
Dim = Union[int, "Sym"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Sym:
    """A symbolic dimension: ``sum(coeff * prod(symbols))``. Immutable."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, int]):
        self.terms = {m: c for m, c in sorted(terms.items()) if c != 0}
        self._hash = hash(tuple(self.terms.items()))

    @staticmethod
    def var(name: str) -> "Sym":
        if not _NAME.match(name):
            raise BlockcError(f"invalid dimension name {name!r}: use letters, digits and '_'")
        return Sym({(name,): 1})

    # -- arithmetic -------------------------------------------------------
    @staticmethod
    def _lift(d: Dim) -> "Sym":
        if isinstance(d, Sym):
            return d
        if isinstance(d, int):
            return Sym({(): d})
        raise TypeError(f"not a dimension: {d!r}")

    def __add__(self, other: Dim) -> Dim:
        o = Sym._lift(other)
        terms = dict(self.terms)
        for m, c in o.terms.items():
            terms[m] = terms.get(m, 0) + c
        return _simplify(Sym(terms))

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return _simplify(Sym({m: -c for m, c in self.terms.items()}))

    def __sub__(self, other: Dim) -> Dim:
        return self + (-Sym._lift(other))

    def __rsub__(self, other: Dim) -> Dim:
        return Sym._lift(other) + (-self)

    def __mul__(self, other: Dim) -> Dim:
        o = Sym._lift(other)
        terms: dict = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in o.terms.items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return _simplify(Sym(terms))

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        q = exact_div(self, other)
        if q is None:
            raise BlockcError(f"cannot divide dimension {self} by {other} exactly")
        return q

    # -- comparison / evaluation -----------------------------------------
    def __eq__(self, other) -> bool:
        if isinstance(other, Sym):
            return self.terms == other.terms
        return False

    def __hash__(self) -> int:
        return self._hash

    @property
    def symbols(self) -> set:
        return {s for m in self.terms for s in m}

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        total = 0
        for m, c in self.terms.items():
            v = c
            for s in m:
                if s not in bindings:
                    raise BlockcError(f"dimension '{s}' has no value; bind it (e.g. --dim {s}=128)")
                v *= int(bindings[s])
            total += v
        return total

    def __str__(self) -> str:
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda mc: (not mc[0], mc[1] < 0, -len(mc[0]), mc[0])):
            body = "*".join(m)
            if not body:
                text = str(abs(c))
            elif abs(c) == 1:
                text = body
            else:
                text = f"{abs(c)}*{body}"
            parts.append(("-" if c < 0 else "+", text))
        out = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, text in parts[1:]:
            out += sign + text
        return out

    def __repr__(self) -> str:
        return f"Sym({str(self)!r})"


def _simplify(s: Sym) -> Dim:
    if not s.terms:
        return 0
    if list(s.terms) == [()]:
        return s.terms[()]
    return s


def is_plain_symbol(d) -> bool:
    """Whether ``d`` is one symbol alone (``seq``, not ``seq+1`` or ``2*seq``)."""
    return isinstance(d, Sym) and len(d.terms) == 1 and next(iter(d.terms.values())) == 1 \
        and len(next(iter(d.terms))) == 1


def is_dim(x) -> bool:
    return isinstance(x, Sym) or (isinstance(x, int) and not isinstance(x, bool))


def exact_div(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when it divides exactly as polynomials, else None.

    Only division by a single term (``4``, ``seq``, ``2*heads``) is needed:
    it is what ``reshape`` with a ``-1`` entry asks for.
    """
    a, b = Sym._lift(a), Sym._lift(b)
    if len(b.terms) != 1:
        return _simplify(Sym({(): 1})) if a == b else None
    (bm, bc), = b.terms.items()
    if bc == 0:
        return None
    out = {}
    for m, c in a.terms.items():
        rest = list(m)
        for s in bm:
            if s not in rest:
                return None
            rest.remove(s)
        if c % bc:
            return None
        out[tuple(rest)] = c // bc
    return _simplify(Sym(out))


def evaluate(d: Dim, bindings: Mapping[str, int]) -> int:
    return d.evaluate(bindings) if isinstance(d, Sym) else int(d)


def substitute(d: Dim, values: Mapping[str, Dim]) -> Dim:
    """``d`` with each symbol in ``values`` replaced by its dim (others kept):
    ``past+seq`` with ``{past: d0, seq: d1}`` is ``d0+d1``."""
    if not isinstance(d, Sym):
        return d
    total: Dim = 0
    for m, c in d.terms.items():
        term: Dim = c
        for s in m:
            term = Sym._lift(term) * values.get(s, Sym.var(s))
        total = Sym._lift(total) + term
    return total


def dim_str(d: Dim) -> str:
    return str(d)


# -- parsing -----------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


@functools.lru_cache(maxsize=4096)
def parse_dim(text: str) -> Dim:
    """Parse ``seq``, ``past+seq``, ``2*heads-1``, ``768``. Raises ValueError.
    Remembered (a dim is immutable): a graph read back repeats a few dims
    thousands of times."""
    tokens = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            break
        num, name, op = m.groups()
        if op is not None and op not in "+-*()":
            raise ValueError(f"unexpected {op!r} in dimension {text!r}")
        tokens.append(int(num) if num else (Sym.var(name) if name else op))
        pos = m.end()
    if not tokens:
        raise ValueError("empty dimension")

    i = 0

    def peek():
        return tokens[i] if i < len(tokens) else None

    def atom():
        nonlocal i
        t = peek()
        if t == "(":
            i += 1
            v = expr()
            if peek() != ")":
                raise ValueError(f"missing ')' in dimension {text!r}")
            i += 1
            return v
        if t == "-":
            i += 1
            return -Sym._lift(atom())
        if t is None or isinstance(t, str):
            raise ValueError(f"malformed dimension {text!r}")
        i += 1
        return t

    def term():
        nonlocal i
        v = atom()
        while peek() == "*":
            i += 1
            v = Sym._lift(v) * atom()
        return v

    def expr():
        nonlocal i
        v = term()
        while peek() in ("+", "-"):
            op = tokens[i]
            i += 1
            rhs = term()
            v = Sym._lift(v) + rhs if op == "+" else Sym._lift(v) - rhs
        return v

    v = expr()
    if i != len(tokens):
        raise ValueError(f"malformed dimension {text!r}")
    return _simplify(Sym._lift(v)) if isinstance(v, Sym) else v
