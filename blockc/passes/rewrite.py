"""Rewrites written as data: (pattern, check, rewrite) rules and the engine
that applies them.

A pattern reads like the model code it replaces::

    Op("layernorm", Op("add", Var("x"), Var("residual"), name="sum", commutative=True),
       Var("gamma"), Var("beta"), name="root")

The matcher tries every way the pattern can fit (operand orders, ``Or``
alternatives) and, when none does, says why -- the reason from the attempt
that got furthest. A ``check`` may veto a structural match with a reason, and
so may the rewrite itself: it returns ``Decline(reason)`` instead of its
replacements (``None`` declines too, with a generic reason). The engine never
removes an intermediate value that is still used outside the match unless the
rewrite returns a replacement for it (a fused op that also returns the sum,
say); otherwise the site is rejected with that reason. Every reason ends up
on the site's ``Site.reason``: what ``blockc fusions --verbose`` shows.

A rule's pattern is checked when the rule is built: an op name no op is
declared under (a misspelling would otherwise never match) is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..errors import BlockcError
from ..ir.builder import Builder
from ..ir.graph import Graph, Node, Value
from ..ops import registry
from .base import PassResult


# ---- patterns -----------------------------------------------------------------
class Pattern:
    def alternatives(self):
        return [self]


@dataclass(frozen=True, eq=False)
class Var(Pattern):
    """Any value; the same name twice means the same value."""

    name: str

    def __repr__(self):
        return self.name


@dataclass(frozen=True, eq=False)
class Const(Pattern):
    """A value made by a ``constant`` node; binds its array as ``name``."""

    name: str
    scalar: bool = True  # only single-element constants

    def __repr__(self):
        return f"const {self.name}"


@dataclass(frozen=True, eq=False)
class Op(Pattern):
    """A node of ``op`` (a name or a tuple of names) whose inputs match ``inputs``.

    ``attrs`` maps attribute names to required values or predicates.
    ``commutative`` also tries the two inputs swapped. ``consume=False`` marks
    a node the rewrite reads but does not replace (it is left in place).
    ``index`` is which output of the node the value must be.
    """

    op: Any
    inputs: tuple = ()
    name: str | None = None
    attrs: Mapping = field(default_factory=dict)
    commutative: bool = False
    consume: bool = True
    index: int = 0

    def __init__(self, op, *inputs, name=None, attrs=None, commutative=False, consume=True, index=0):
        object.__setattr__(self, "op", (op,) if isinstance(op, str) else tuple(op))
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "attrs", dict(attrs or {}))
        object.__setattr__(self, "commutative", commutative)
        object.__setattr__(self, "consume", consume)
        object.__setattr__(self, "index", index)

    def __repr__(self):
        return f"{'|'.join(self.op)}({', '.join(map(repr, self.inputs))})"


@dataclass(frozen=True, eq=False)
class Or(Pattern):
    """The first alternative that matches (in order); all are tried on backtrack."""

    options: tuple

    def __init__(self, *options):
        object.__setattr__(self, "options", tuple(options))


def optional(wrap: Callable[[Pattern], Pattern], inner: Pattern) -> Or:
    """``wrap(inner)`` or just ``inner``: a step a graph may or may not have."""
    return Or(wrap(inner), inner)


# ---- matching -------------------------------------------------------------------
class Match(dict):
    """Bindings: pattern names to Values, Nodes (``name`` of an Op) and arrays (Const).

    ``consumed`` lists the nodes the rewrite replaces, ``root`` is the anchor
    node, and ``escaping`` (filled in just before the rewrite runs) maps the
    name of each consumed Op whose value is still used outside the match to
    that value: the rewrite must return a replacement for each."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.consumed: list[Node] = []
        self.root: Node | None = None
        self.escaping: dict[str, Value] = {}

    def fork(self) -> "Match":
        m = Match(self)
        m.consumed, m.root, m.escaping = list(self.consumed), self.root, dict(self.escaping)
        return m

    def value(self, name: str) -> Value:
        v = self[name]
        return v.outputs[0] if isinstance(v, Node) else v


class _Failure:
    """Keeps the reason from the attempt that got furthest: a full match that
    a check or the rewrite refused beats any structural miss; among misses,
    the one that matched most nodes wins."""

    def __init__(self):
        self.rank, self.depth, self.reason = (-1, -1), 0, "no match"

    def note(self, depth: int, reason: str, full_match: bool = False) -> None:
        if (full_match, depth) > self.rank:
            self.rank, self.depth, self.reason = (full_match, depth), depth, reason


def _describe(v: Value) -> str:
    return f"{v.producer.op} result" if v.producer is not None else f"{v.kind} {v.name!r}"


def _match(p: Pattern, v: Value, m: Match, fail: _Failure) -> Iterator[Match]:
    """Every way ``p`` fits ``v`` given the bindings ``m``, each a new ``Match``;
    why each other way failed goes to ``fail``."""
    if isinstance(p, Or):
        for option in p.options:
            yield from _match(option, v, m, fail)
    elif isinstance(p, Var):
        yield from _match_var(p, v, m, fail)
    elif isinstance(p, Const):
        yield from _match_const(p, v, m, fail)
    else:
        assert isinstance(p, Op)
        yield from _match_op(p, v, m, fail)


def _match_var(p: Var, v: Value, m: Match, fail: _Failure) -> Iterator[Match]:
    if p.name in m and m[p.name] is not v:
        fail.note(len(m.consumed), f"{p.name} must be the same value in both places")
        return
    yield _bound(m, p.name, v)


def _match_const(p: Const, v: Value, m: Match, fail: _Failure) -> Iterator[Match]:
    depth = len(m.consumed)
    node = v.producer
    if node is None or node.op != "constant":
        fail.note(depth, f"expected a constant for {p.name}, found a {_describe(v)}")
        return
    arr = node.attrs["value"]
    if p.scalar and arr.size != 1:
        fail.note(depth, f"{p.name} must be a single value, found shape {list(arr.shape)}")
        return
    if p.name in m and not np.array_equal(m[p.name], arr):
        fail.note(depth, f"{p.name} must be the same constant in both places")
        return
    yield _bound(m, p.name, arr)


def _bound(m: Match, name: str, x) -> Match:
    """A copy of ``m`` with ``name`` bound to ``x``: ``m`` stays as it was for the other ways to match."""
    m2 = m.fork()
    m2[name] = x
    return m2


def _match_op(p: Op, v: Value, m: Match, fail: _Failure) -> Iterator[Match]:
    depth = len(m.consumed)
    node = v.producer
    if p.name and p.name in m:  # a second mention of a named node: the same node
        if m[p.name] is not node or v.index != p.index:
            fail.note(depth, f"{p.name} must be the same {'/'.join(p.op)} node in both places")
            return
        yield m
        return
    if node is None or node.op not in p.op:
        fail.note(depth, f"expected {' or '.join(p.op)}, found a {_describe(v)}")
        return
    if v.index != p.index:
        fail.note(depth, f"expected output {p.index} of {node.op}")
        return
    if any(node is n for n in m.consumed):
        return
    for key, want in p.attrs.items():
        got = node.attrs.get(key)
        ok = want(got) if callable(want) else got == want
        if not ok:
            fail.note(depth + 1, f"{node.op} has {key}={got!r}")
            return
    if len(node.inputs) < len(p.inputs):
        fail.note(depth, f"{node.op} has {len(node.inputs)} inputs")
        return
    m = m.fork()
    if p.consume:
        m.consumed.append(node)
    if p.name:
        m[p.name] = node
    orders = [list(p.inputs)]
    if p.commutative and len(p.inputs) == 2:
        orders.append(list(reversed(p.inputs)))
    for order in orders:
        yield from _match_inputs(order, node.inputs, m, fail)


def matches(pattern: Pattern, value: Value) -> tuple[list[Match], str]:
    """Every way ``pattern`` fits ``value``, in the order the engine tries
    them, and the reason from the attempt that got furthest (what a site
    reports when the list is empty)."""
    fail = _Failure()
    return list(_match(pattern, value, Match(), fail)), fail.reason


def _match_inputs(pats, values, m, fail) -> Iterator[Match]:
    if not pats:
        yield m
        return
    for m2 in _match(pats[0], values[0], m, fail):
        yield from _match_inputs(pats[1:], values[1:], m2, fail)


# ---- rules and the engine -------------------------------------------------------------
@dataclass(frozen=True)
class Decline:
    """What a rewrite returns, instead of its replacements, to leave a match
    alone; ``reason`` becomes the site's reason. For what only the rewrite
    finds out (a ``check`` is the place for what the match alone shows)::

        def rewrite(b, m):
            scale = fold_scale(m)
            if scale is None:
                return Decline("the scale is not a constant")
            return {"root": b.op("masked_softmax", m["x"], scale=scale)}

    The nodes it built before declining are removed."""

    reason: str


@dataclass
class Rule:
    """``pattern`` rooted at a node; ``check(match)`` returns None or a reason;
    ``rewrite(builder, match)`` returns ``{name: new value}`` for the root
    (``"root"``, or a list for several outputs) and for any matched Op name
    whose value is still used elsewhere (listed in ``match.escaping``).

    The rewrite may refuse the match instead: it returns ``Decline(reason)``,
    or ``None`` ("the <name> rewrite declined the match"). A ``BlockcError``
    from the builder (the fused op's shape rule said no) declines with its
    message. Any other match of the pattern at the same anchor is then tried.

    The pattern is an ``Op``, or an ``Or`` of ``Op``s (one expression in
    several associations, say), each its own way of matching the same anchor.

    Building a rule checks that every op its pattern names is declared."""

    name: str
    pattern: Op | Or
    rewrite: Callable[[Builder, Match], Mapping[str, Any] | Decline | None]
    check: Callable[[Match], str | None] = lambda m: None
    kind: str = ""  # the fusion kind reported (defaults to name)

    def __post_init__(self):
        roots = self.pattern.options if isinstance(self.pattern, Or) else (self.pattern,)
        if not all(isinstance(r, Op) for r in roots) or len({r.index for r in roots}) != 1:
            raise BlockcError(f"rule {self.name!r}: its pattern must be an Op, or an Or of Ops on the same output")
        # What the engine anchors on: the ops a root may be, and which of the node's outputs.
        self.anchor_ops = frozenset(op for r in roots for op in r.op)
        self.anchor_index = roots[0].index
        unknown = sorted(set(_op_names(self.pattern)) - set(registry.OPS))
        if unknown:
            raise BlockcError(f"rule {self.name!r}: its pattern names undeclared "
                              f"op{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")


def _op_names(p: Pattern) -> Iterator[str]:
    if isinstance(p, Op):
        yield from p.op
        for q in p.inputs:
            yield from _op_names(q)
    elif isinstance(p, Or):
        for q in p.options:
            yield from _op_names(q)


@dataclass
class Site:
    """One candidate: a node a rule's pattern is anchored on."""

    rule: str
    kind: str
    anchor: str            # the anchor node's origin label, e.g. "%23"
    anchor_op: str
    fused: bool
    reason: str = ""
    nodes: list = field(default_factory=list)   # the original nodes' labels, each once
    ops: list = field(default_factory=list)     # the ops of the nodes the rewrite replaced
    result: str = ""                             # the op that replaced them
    pass_name: str = ""                          # set by the pass manager
    depth: int = 0     # how many nodes the best attempt matched: 0 = not even close


def _label(node: Node) -> str:
    return node.origin[0] if node.origin else f"<{node.op}>"


def apply_rules(graph: Graph, rules: list[Rule]) -> PassResult:
    """Apply ``rules`` to a copy of ``graph`` at every anchor, in node order;
    the result's ``sites`` are every anchor a rule's root op was found at,
    fused or with the reason it was not.

    When no match passes its check, nothing would change, and the result is
    ``graph`` itself: most rules find nothing in most models (the recompose
    passes on a traced model), and copying a deep graph only to learn that
    cost more than the matching. The sites are the same either way.
    """
    looked: list[Site] = []
    if not _sweep(graph, rules, looked, None):
        return PassResult(graph, False, looked)
    g = graph.copy()
    sites: list[Site] = []
    changed = _sweep(g, rules, sites, _Positions(g))
    if changed:
        g.sort()
    return PassResult(g, changed, sites)


def _sweep(g: Graph, rules: list[Rule], sites: list[Site], positions: "_Positions | None") -> bool:
    """Try the rules at every anchor; whether any rewrite was made. Without
    ``positions`` only look: stop at the first match that passes its check,
    which is then reported as a change to come."""
    changed = False
    removed: set[int] = set()
    for node in list(g.nodes):
        if id(node) in removed:
            continue
        for rule in rules:
            if node.op not in rule.anchor_ops:
                continue
            fail = _Failure()
            site = Site(rule.name, rule.kind or rule.name, _label(node), node.op, False)
            outcome = None
            for m in _match(rule.pattern, node.outputs[rule.anchor_index], Match(), fail):
                m.root = node
                reason = rule.check(m)
                if reason:
                    fail.note(len(m.consumed), reason, full_match=True)
                    continue
                if positions is None:
                    return True
                outcome = _try_rewrite(g, rule, m, site, positions)
                if outcome is not None:
                    break
                fail.note(len(m.consumed) + 1, site.reason, full_match=True)
            if outcome is None:
                site.reason, site.depth = fail.reason, fail.depth
            else:
                removed |= outcome
                changed = True
            sites.append(site)
            if outcome is not None:
                break
    return changed


class _Positions:
    """Where each node stands, kept up to date through one pass's rewrites so
    that no rewrite rescans the node list (one rescan per rewrite made the
    fusions quadratic in depth: GPT-3's 96 layers took 14x the time of 12).

    ``order[node]`` is the node's place in ``graph.nodes``. Anchors are the
    nodes the pass started with, ranked ``(i, 0)``; the k nodes a rewrite adds
    go just before its anchor, ranked ``(i, j - k)``, which is exactly where
    the Builder put them. ``rank()`` is a topological rank: the list order
    while that is one (each pass hands on a graph in that order: the verifier
    checks it on the pipeline's result, and after every pass in tests), or,
    once a rewrite has handed a value to a user that stands before the value's
    new producer, ranks recomputed from the graph when next asked for.
    """

    def __init__(self, g: Graph):
        self.graph = g
        self.order = {n: (i, 0) for i, n in enumerate(g.nodes)}
        self._rank = self.order
        # A graph built by hand need not be in order; then rank it properly.
        self._stale = any(v.producer is not None and self.order.get(v.producer, (i, 0)) >= (i, 0)
                          for i, n in enumerate(g.nodes) for v in n.inputs)

    def add(self, new_nodes: list[Node], anchor: Node) -> None:
        ranks = [self.order] if self._rank is self.order else [self.order, self._rank]
        for table in ranks:
            base = table[anchor][0]
            for j, n in enumerate(new_nodes):
                table[n] = (base, j - len(new_nodes))

    def moved(self, users: list[Node], new: Value) -> None:
        """``users`` now read ``new``: note whether that broke the ranking."""
        if self._stale or new.producer is None:
            return
        rank = self._rank[new.producer]
        if any(self._rank[u] <= rank for u in users):
            self._stale = True

    def rank(self) -> dict:
        if self._stale:
            self._rank, self._stale = _topological_ranks(self.graph), False
        return self._rank


def _topological_ranks(g: Graph) -> dict:
    waiting = {n: len({id(v.producer) for v in n.inputs if v.producer is not None}) for n in g.nodes}
    ready = [n for n, k in waiting.items() if k == 0]
    ranks = {}
    while ready:
        n = ready.pop()
        ranks[n] = (len(ranks), 0)
        for user in {id(u): u for o in n.outputs for u, _ in o.uses}.values():
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return ranks


def _try_rewrite(g: Graph, rule: Rule, m: Match, site: Site, positions: _Positions) -> set[int] | None:
    """Rewrite the match ``m`` in place: the ids of the nodes it removed, or
    None with ``site.reason`` saying why the match was left alone."""
    consumed = {id(n) for n in m.consumed}
    escaping, reason = _escaping_results(g, m, consumed)
    reason = reason or _inputs_outlive(m, consumed, escaping, positions)
    if reason:
        site.reason = reason
        return None
    m.escaping = escaping
    b = Builder(g, before=m.root, loc=m.root.loc)
    repl = _replacements(rule, b, m)
    if isinstance(repl, Decline):
        for n in reversed(b.created):
            g.remove_node(n)
        site.reason = repl.reason
        return None
    _splice(g, m, repl, b.created, positions, site)
    return consumed


def _escaping_results(g: Graph, m: Match, consumed: set[int]) -> tuple[dict[str, Value], str | None]:
    """The results of matched nodes (other than the root) still read outside
    the match, by the name the pattern gave their node; or why one cannot be
    kept (its node has no name, so the rewrite could not return it)."""
    outputs = {id(v) for _, v in g.outputs}
    names = {id(n): k for k, n in m.items() if isinstance(n, Node)}
    escaping = {}
    for n in m.consumed:
        if n is m.root:
            continue
        for o in n.outputs:
            if id(o) in outputs or any(id(u) not in consumed for u, _ in o.uses):
                if id(n) not in names:
                    return {}, f"the {n.op} result ({_label(n)}) inside the pattern is used elsewhere"
                escaping[names[id(n)]] = o
    return escaping, None


def _replacements(rule: Rule, b: Builder, m: Match) -> dict | Decline:
    """What the rule's rewrite builds for the match: ``{name: value}`` for
    the root and every escaping result, each of its old value's type; or
    ``Decline`` saying why not."""
    try:
        repl = rule.rewrite(b, m)
    except BlockcError as e:  # the fused op's own shape rule said no
        repl = Decline(str(e))
    if repl is None:
        repl = Decline(f"the {rule.name} rewrite declined the match")
    if isinstance(repl, Decline):
        return repl
    missing = [k for k in m.escaping if k not in repl]
    if missing:
        return Decline(f"the {m[missing[0]].op} result ({_label(m[missing[0]])}) is used elsewhere and "
                       f"the fused op does not return it")
    # A size-1 constant or a mask can broadcast the pattern's result past the shape the fused op gives.
    for old, new in _replaced_pairs(m, repl):
        if old.type != new.type:
            return Decline(f"the fused op gives {new.type}, the {old.producer.op} it replaces gives {old.type}")
    return repl


def _replaced_pairs(m: Match, repl: Mapping) -> list[tuple[Value, Value]]:
    """(old value, its replacement): the root's results, then each escaping one."""
    root_new = repl["root"]
    root_new = root_new if isinstance(root_new, (list, tuple)) else [root_new]
    return list(zip(m.root.outputs, root_new)) + [(m.escaping[k], repl[k]) for k in m.escaping]


def _splice(g: Graph, m: Match, repl: Mapping, new_nodes: list[Node], positions: _Positions, site: Site) -> None:
    """Point every reader at the replacements, remove the matched nodes, and
    record on ``site`` what was fused into what."""
    consumed = {id(n) for n in m.consumed}
    positions.add(new_nodes, m.root)
    for old, new in _replaced_pairs(m, repl):
        positions.moved([u for u, _ in old.uses if id(u) not in consumed], new)
        g.replace_all_uses(old, new)
    origin = tuple(sorted({o for n in m.consumed for o in n.origin}, key=_origin_key))
    for n in new_nodes:
        n.origin = origin
    # Consumed nodes now have no users left outside the match; remove users first.
    in_order = sorted(m.consumed, key=positions.order.__getitem__)
    for n in reversed(in_order):
        g.remove_node(n)
    site.fused, site.depth = True, len(m.consumed)
    # The original nodes, each once: a fusion built on another's result (fuse_qkv's
    # merged projection, say) consumes nodes that each stand for several.
    site.nodes = list(origin) if origin else [_label(n) for n in in_order]
    site.ops = [n.op for n in in_order]
    site.result = "+".join(n.op for n in new_nodes if n.op != "constant") or "(bypass)"


def _inputs_outlive(m: Match, consumed: set, escaping: dict, positions: _Positions) -> str | None:
    """Why the values the rewrite reads (``Var`` bindings) cannot feed the fused
    op: one is made by a node the rewrite removes, or is computed from a value
    the fused op would return (a cycle). None when they can."""
    producers = [v.producer for v in m.values() if isinstance(v, Value) and v.producer is not None]
    after: set[int] = set()
    outside = [p for p in producers if id(p) not in consumed]
    if escaping and outside:
        # Search forward from the returned values' other users. A path to a
        # producer passes only nodes ranked below it, so the search stops at
        # the highest-ranked producer: it stays within the pattern's
        # neighbourhood instead of walking the rest of the model.
        rank = positions.rank()
        limit = max(rank[p] for p in outside)
        todo = [u for o in escaping.values() for u, _ in o.uses if id(u) not in consumed and rank[u] <= limit]
        while todo:
            n = todo.pop()
            if id(n) not in after:
                after.add(id(n))
                todo += [u for o in n.outputs for u, _ in o.uses if id(u) not in consumed and rank[u] <= limit]
    for name, v in m.items():
        if not isinstance(v, Value) or v.producer is None:
            continue
        if id(v.producer) in consumed:
            return f"the {v.producer.op} result ({_label(v.producer)}) inside the pattern is also an input ({name})"
        if id(v.producer) in after:
            return f"{name} is computed from a result inside the pattern that the fused op would return (a cycle)"
    return None


def _origin_key(label: str):
    digits = "".join(c for c in label if c.isdigit())
    return (int(digits) if digits else -1, label)
