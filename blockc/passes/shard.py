"""Tensor parallelism, Megatron-LM's split: one graph into ``tp`` per-rank graphs.

A projection that reads a whole activation is split by columns (by heads:
Q, K, V, the first feed-forward projection, SwiGLU's gate and up alike); one
that reads a split activation is split by rows, and an ``all_reduce`` makes
its partial sums whole (attention's output projection, the second
feed-forward projection). The token embedding is split by vocabulary rows
(each rank looks up the ids it holds, zeros elsewhere, an ``all_reduce``
adds them) and so is the LM head (its logits are split by vocabulary and an
``all_gather`` joins them where something needs them whole). Before, a
block's attention output and MLP (``tp=2``, 4 heads of 16)::

    %6:f32[batch,seq,64] = matmul %5, @blocks.0.attn.w_q.weight
    %7:f32[batch,seq,4,16] = reshape %6 {shape=[0,0,4,16]}
    ...
    %44:f32[batch,seq,64] = matmul %43, @blocks.0.attn.w_o.weight
    %47:f32[batch,seq,176] = matmul %46, @blocks.0.ffn.gate.weight
    %51:f32[batch,seq,64] = matmul %50, @blocks.0.ffn.down.weight

after, on each rank (its weights are its slices: ``w_q`` [64,32], ``w_o``
[32,64], ``gate`` [64,88], ``down`` [88,64])::

    %6:f32[batch,seq,32] = matmul %5, @blocks.0.attn.w_q.weight
    %7:f32[batch,seq,2,16] = reshape %6 {shape=[0,0,2,16]}
    ...
    %44:f32[batch,seq,64] = matmul %43, @blocks.0.attn.w_o.weight
    %45:f32[batch,seq,64] = all_reduce %44 {world=2}
    %48:f32[batch,seq,88] = matmul %47, @blocks.0.ffn.gate.weight
    %52:f32[batch,seq,64] = matmul %51, @blocks.0.ffn.down.weight
    %53:f32[batch,seq,64] = all_reduce %52 {world=2}

The split is found, not matched: layouts (``shard_layout.py``) flow forward
through the graph, a weight takes its layout where it is first used, and
every op keeps a split it can compute blockwise (elementwise ops, matmul,
reshape by heads, transpose, softmax and norms off the split axis). Any
other op gets its operands whole, so every graph shards correctly, if not
always cheaply. Grouped-query attention with fewer K/V heads than ranks
replicates the K/V projections, as Megatron does. Refused, with the reason:
heads, K/V heads, a feed-forward width or a vocabulary that does not divide
by ``tp``, and a norm over a whole split projection (QK-norm across all
heads, OLMo 2's; QK-norm per head shards). Sharding runs on the unfused
graph; the fusion pipeline then runs on each rank's graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..errors import ShardError, printable
from ..ir.graph import Graph, Value
from ..ir.printer import result_numbers
from ..ops import registry
from .shard_layout import PARTIAL, Split, local_shape, padded_block, rank_index, reshape_layout, split_of


class _Replicate(Exception):
    """Internal: this projection must stay whole (K/V heads fewer than ranks)."""

    def __init__(self, param: str, where: str):
        self.param, self.where = param, where


@dataclass
class Sharded:
    """``shard``'s result: ``graphs[r]`` is rank ``r``'s graph, and
    ``layouts`` each parameter's layout (``()``: every rank holds it whole)."""
    graphs: list
    layouts: dict
    tp: int
    inputs: dict = field(default_factory=dict)    # graph inputs each rank is given split: name -> layout
    outputs: dict = field(default_factory=dict)   # outputs each rank returns split (``keep_split``)

    def rank_feeds(self, feeds: Mapping[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
        """Rank ``rank``'s part of whole feeds (the split inputs cut to its block)."""
        return {k: v[rank_index(v.shape, self.inputs[k], rank)] if k in self.inputs else v for k, v in feeds.items()}

    def index(self, name: str, shape, rank: int) -> tuple:
        """Rank ``rank``'s index (slices) into the whole parameter ``name`` of ``shape``."""
        return rank_index(tuple(shape), self.layouts[name], rank)

    def rank_weights(self, weights: Mapping[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
        """Rank ``rank``'s slice of each weight, one tensor at a time (a lazy
        mapping makes each tensor only when read)."""
        return {name: np.ascontiguousarray(self.read(weights, name, rank)) for name in self.layouts}

    def read(self, weights, name: str, rank: int) -> np.ndarray:
        w = weights[name]
        return self.block(name, w.shape, rank, w.__getitem__)

    def block(self, name: str, shape, rank: int, read) -> np.ndarray:
        """Rank ``rank``'s block of parameter ``name`` of ``shape``, read by
        ``read(index)`` (an array's indexing, a safetensors slice's), padded
        with zeros where the vocabulary was padded."""
        return padded_block(np.asarray(read(self.index(name, shape, rank))), tuple(shape), self.layouts[name])

    def param_bytes(self) -> list[int]:
        """Each rank's parameter bytes (by its graph's declared types)."""
        return [sum(v.type.nbytes({}) for v in g.params.values()) for g in self.graphs]


def shard(graph: Graph, tp: int, *, pad_vocab: bool = False, inputs: Mapping[str, tuple] | None = None,
          keep_split: frozenset | set = frozenset()) -> Sharded:
    """``graph`` split into ``tp`` per-rank graphs (see the module docstring).
    ``pad_vocab``: a vocabulary that does not divide by ``tp`` is split in
    blocks rounded up, the last rank's ending in zero rows (their logits are
    dropped when the logits are gathered), instead of being refused.
    ``inputs``: graph inputs each rank is given as its block (name ->
    layout); ``keep_split``: outputs each rank returns as its block, not
    gathered (a KV cache split by heads: the presents a step returns split
    are the pasts the next step is given; ``Sharded.outputs`` says how)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ShardError(f"--tp must be a positive number of ranks, got {tp!r}")
    if tp == 1:
        return Sharded([graph], {name: () for name in graph.params}, 1)
    io = (dict(inputs or {}), frozenset(keep_split))
    replicate: dict[str, str] = {}
    while True:
        try:
            first = _Rank(graph, tp, 0, replicate, pad_vocab, io).build()
            break
        except _Replicate as again:
            replicate[again.param] = again.where
            _check_replicated(graph, again.param, replicate, tp)
    layouts = dict(first.layouts)
    graphs = [first.g] + [_Rank(graph, tp, r, replicate, pad_vocab, io).build().g for r in range(1, tp)]
    return Sharded(graphs, layouts, tp, {k: v for k, v in io[0].items() if v}, first.kept)


def _check_replicated(graph: Graph, name: str, replicate: dict, tp: int) -> None:
    """A projection is left whole only beside one that splits (K/V heads
    fewer than ranks, beside the query heads); once every projection beside
    it is left whole too, there are fewer heads than ranks."""
    reader = next(n for n in graph.nodes if n.op == "matmul" and n.inputs[1].name == name)
    beside = {n.inputs[1].name for n in reader.inputs[0].users()
              if n.op == "matmul" and n.inputs[1].kind == "param" and n.inputs[0] is reader.inputs[0]}
    if beside <= set(replicate):
        first = next(b for b in replicate if b in beside)
        raise ShardError(f"{replicate[first]}: the heads of {printable(first)} do not split across {tp} ranks "
                         f"(more ranks than heads)")


ELEMENTWISE = {name for name, op in registry.OPS.items()
               if op.cuda == "elementwise" and op.inputs and not op.attrs.keys() - {"to", "approximate"}}


class _Rank:
    """One rank's graph, built by walking the source graph once."""

    def __init__(self, src: Graph, tp: int, rank: int, replicate, pad_vocab: bool = False,
                 io: tuple = ({}, frozenset())):
        self.src, self.tp, self.rank, self.replicate, self.pad_vocab = src, tp, rank, replicate, pad_vocab
        self.given, self.keep = io
        self.kept: dict[str, tuple] = {}
        self.g = Graph(src.name if tp == 1 else f"{src.name}.rank{rank}")
        self.new: dict[int, Value] = {}       # id(source value) -> this rank's value
        self.lay: dict[int, object] = {}      # id(source value) -> layout
        self.origin: dict[int, str] = {}      # id(source value) -> the column-split weight its split came from
        self.layouts: dict[str, tuple] = {}   # parameter name -> layout
        self.whole_of: dict[int, Value] = {}
        self.numbers = result_numbers(src)
        self.vocab = _vocab_table(src)

    def build(self) -> "_Rank":
        for v in self.src.inputs:
            layout = tuple(self.given.get(v.name, ()))
            self.new[id(v)] = self.g.add_input(v.name, v.type.with_shape(local_shape(v.shape, layout)))
            self.lay[id(v)] = layout
        for n in self.src.nodes:
            handler = _HANDLERS.get(n.op) or (_elementwise if n.op in ELEMENTWISE else _whole_op)
            outs = handler(self, n)
            for o, (value, layout) in zip(n.outputs, outs):
                self.new[id(o)], self.lay[id(o)] = value, layout
        self.g.set_outputs([(name, self.kept_split(name, v) if name in self.keep else self.whole(v))
                            for name, v in self.src.outputs])
        self.g.remove_unused_params()
        return self

    def kept_split(self, name: str, v: Value) -> Value:
        """An output returned as this rank's block: as it is, where it is split."""
        layout = self.layout(v) or ()
        if layout == PARTIAL:
            return self.whole(v)
        self.kept[name] = layout
        return self.get(v)

    # -- values in a layout --------------------------------------------------
    def where(self, n) -> str:
        return f"%{self.numbers[id(n)]} ({n.op})"

    def layout(self, v: Value):
        if v.kind == "param" and v.name not in self.layouts:
            return None   # not yet decided
        return self.layouts[v.name] if v.kind == "param" else self.lay[id(v)]

    def decide(self, v: Value, layout) -> None:
        self.layouts[v.name] = tuple(layout)
        self.new[id(v)] = self.g.add_param(v.name, v.type.with_shape(local_shape(v.shape, layout)))
        self.lay[id(v)] = tuple(layout)

    def get(self, v: Value) -> Value:
        if v.kind == "param" and v.name not in self.layouts:
            self.decide(v, ())
        return self.new[id(v)]

    def whole(self, v: Value) -> Value:
        """``v`` whole on this rank: partial sums reduced, splits gathered."""
        x, layout = self.get(v), self.layout(v)
        if not layout:
            return x
        if id(v) not in self.whole_of:
            if layout == PARTIAL:
                x = self.g.op("all_reduce", x, world=self.tp)
            else:
                for s in layout:
                    if (s.parts, s.stride) != (self.tp, 1):
                        raise ShardError(f"{v!r} is split {s.parts} ways across {self.tp} ranks, which an "
                                         f"all_gather cannot join")
                    x = self.g.op("all_gather", x, axis=s.axis, world=self.tp)
                    if s.padded:   # the padding's rows dropped
                        x = self.g.op("slice", x, axis=s.axis, start=0, end=v.shape[s.axis])
            self.whole_of[id(v)] = x
        return self.whole_of[id(v)]

    def to(self, v: Value, layout: tuple) -> Value:
        """``v`` in ``layout``: a weight not yet placed is sliced so; a whole
        value is cut to this rank's block locally, no communication."""
        if self.layout(v) is None:
            self.decide(v, layout)
            return self.new[id(v)]
        if self.layout(v) == tuple(layout):
            return self.new[id(v)]
        if any(s.padded for s in layout):
            raise ShardError(f"{v!r} would need a padded block cut from a computed value")
        x = self.whole(v)
        index = rank_index(v.shape, layout, self.rank)
        for s in layout:
            x = self.g.op("slice", x, axis=s.axis, start=index[s.axis].start, end=index[s.axis].stop)
        return x

    def unify(self, operands) -> dict | None:
        """Operands (value, {axis: key}) brought to one split per key (an
        output axis, or a contracted one); None where they disagree."""
        splits: dict = {}
        for v, keys in operands:
            layout = self.layout(v) or ()
            for s in layout if layout != PARTIAL else ():
                if v.shape[s.axis] == 1:
                    continue
                key = keys[s.axis]
                if splits.setdefault(key, s) != s and (splits[key].parts, splits[key].stride) != (s.parts, s.stride):
                    return None
        values = []
        for v, keys in operands:
            want = tuple(splits[key].at(axis) for axis, key in sorted(keys.items())
                         if key in splits and v.shape[axis] != 1)
            values.append(self.to(v, want))
        return {"splits": {k: s for k, s in splits.items()}, "values": values}

    def emit(self, n, values, layout, **attrs) -> list:
        node = self.g.add_node(n.op, values, {**n.attrs, **attrs})
        return [(o, layout) for o in node.outputs]

    def carry_origin(self, n) -> None:
        for v in n.inputs:
            if id(v) in self.origin:
                for o in n.outputs:
                    self.origin[id(o)] = self.origin[id(v)]
                return


def _vocab_table(graph: Graph) -> str | None:
    """The token embedding: the gathered table of the most rows."""
    tables = [n.inputs[0] for n in graph.nodes if n.op == "gather" and n.inputs[0].kind == "param"
              and n.attrs["axis"] == 0 and n.inputs[0].type.rank == 2]
    return max(tables, key=lambda v: v.shape[0]).name if tables else None


def _whole_op(r: _Rank, n) -> list:
    """Any op the split does not know: its operands whole, its result whole."""
    return r.emit(n, [r.whole(v) for v in n.inputs], ())


def _elementwise(r: _Rank, n) -> list:
    rank = n.outputs[0].type.rank
    operands = [(v, {a: a + rank - v.type.rank for a in range(v.type.rank)}) for v in n.inputs]
    if any(r.layout(v) == PARTIAL for v in n.inputs):
        return _whole_op(r, n)
    made = r.unify(operands)
    if made is None:
        return _whole_op(r, n)
    r.carry_origin(n)
    return r.emit(n, made["values"], tuple(sorted(made["splits"].values(), key=lambda s: s.axis)))


def _matmul(r: _Rank, n) -> list:
    a, b = n.inputs
    if r.layout(b) is None and b.type.rank == 2:
        _place_projection(r, n, a, b)
    rank = n.outputs[0].type.rank
    amap = {i: i + rank - a.type.rank for i in range(a.type.rank - 2)} | {a.type.rank - 2: rank - 2,
                                                                          a.type.rank - 1: "k"}
    bmap = {i: i + rank - b.type.rank for i in range(b.type.rank - 2)} | {b.type.rank - 2: "k",
                                                                          b.type.rank - 1: rank - 1}
    made = r.unify([(a, amap), (b, bmap)]) if PARTIAL not in (r.layout(a), r.layout(b)) else None
    if made is None:
        return _whole_op(r, n)
    splits = made["splits"]
    if "k" in splits:   # a row-split projection: partial sums, made whole at once (before any bias)
        out = r.g.op("matmul", *made["values"])
        return [(r.g.op("all_reduce", out, world=r.tp), ())]
    r.carry_origin(n)
    if b.kind == "param" and split_of(r.layouts.get(b.name, ()), 1):
        r.origin[id(n.outputs[0])] = b.name
    return r.emit(n, made["values"], tuple(sorted((s.at(k) for k, s in splits.items()),
                                                  key=lambda s: s.axis)))


def _place_projection(r: _Rank, n, a: Value, w: Value) -> None:
    """A weight matrix's layout at its first use: rows where its input is
    split along the contraction, columns (heads) where it is whole."""
    k, cols = w.shape
    split = split_of(r.layout(a) or (), a.type.rank - 1)
    if split and (split.parts, split.stride) == (r.tp, 1):
        if k % r.tp:
            raise ShardError(f"{r.where(n)}: the {k} rows of {printable(w.name)} do not divide by {r.tp} ranks")
        r.decide(w, (Split(0, r.tp),))
    elif split or w.name in r.replicate or r.layout(a) == PARTIAL:
        r.decide(w, ())
    else:
        vocab = bool(r.vocab) and cols == r.src.params[r.vocab].shape[0]
        if cols % r.tp and not (vocab and r.pad_vocab):
            raise ShardError(f"{r.where(n)}: the {cols} {'vocabulary' if vocab else 'columns'} of {printable(w.name)} do not "
                             f"divide by {r.tp} ranks" + (" (pad the vocabulary: --pad-vocab)" if vocab else ""))
        r.decide(w, (Split(1, r.tp, padded=bool(cols % r.tp)),))


def _reshape(r: _Rank, n) -> list:
    (x,), layout = n.inputs, r.layout(n.inputs[0]) or ()
    if layout == PARTIAL:
        return _whole_op(r, n)
    made = reshape_layout(x.shape, n.outputs[0].shape, layout)
    if isinstance(made, str):
        if "features" in made and id(x) in r.origin:
            raise _Replicate(r.origin[id(x)], r.where(n))
        raise ShardError(f"{r.where(n)}: {made} (--tp must divide the heads and the K/V heads)")
    r.carry_origin(n)
    out = n.outputs[0].shape
    local = local_shape(out, made)
    shape = []
    for axis, entry in enumerate(n.attrs["shape"]):
        split_here = split_of(made, axis) or (entry == 0 and split_of(layout, axis))
        shape.append(local[axis] if split_here else entry)
    return r.emit(n, [r.get(x)], made, shape=shape)


def _transpose(r: _Rank, n) -> list:
    (x,), layout = n.inputs, r.layout(n.inputs[0]) or ()
    if layout == PARTIAL:
        return _whole_op(r, n)
    perm = n.attrs["perm"]
    r.carry_origin(n)
    moved = tuple(sorted((s.at(perm.index(s.axis)) for s in layout), key=lambda s: s.axis))
    return r.emit(n, [r.get(x)], moved)


def _along_axis(r: _Rank, n) -> list:
    """softmax, slice, split, concat: blockwise unless split along their own axis."""
    rank = n.inputs[0].type.rank
    axis = n.attrs["axis"] % rank
    layouts = [r.layout(v) or () for v in n.inputs]
    if any(lay == PARTIAL or split_of(lay, axis) for lay in layouts):
        return _whole_op(r, n)
    operands = [(v, {a: a for a in range(rank) if a != axis}) for v in n.inputs]
    made = r.unify(operands)
    if made is None:
        return _whole_op(r, n)
    r.carry_origin(n)
    layout = tuple(sorted(made["splits"].values(), key=lambda s: s.axis))
    return r.emit(n, made["values"], layout)


def _norm(r: _Rank, n) -> list:
    x, *params = n.inputs
    layout = r.layout(x) or ()
    if split_of(layout, x.type.rank - 1) and id(x) in r.origin:
        raise ShardError(f"{r.where(n)}: {n.op} over the whole of {printable(r.origin[id(x)])}'s output (QK-norm across "
                         f"all heads) needs the full width on each rank, so it does not split across {r.tp} "
                         f"ranks; QK-norm per head does")
    if layout == PARTIAL or split_of(layout, x.type.rank - 1):
        return _whole_op(r, n)
    r.carry_origin(n)
    return r.emit(n, [r.get(x)] + [r.to(p, ()) for p in params], layout)


def _gather(r: _Rank, n) -> list:
    table, ids = n.inputs
    if table.name != r.vocab or r.layout(table) is not None or r.tp == 1:
        return _whole_op(r, n)
    rows = table.shape[0]
    if rows % r.tp and not r.pad_vocab:
        raise ShardError(f"{r.where(n)}: the vocabulary of {rows} rows of {printable(table.name)} does not divide by "
                         f"{r.tp} ranks (pad it to a multiple of {r.tp}: --pad-vocab)")
    split = Split(0, r.tp, padded=bool(rows % r.tp))
    r.decide(table, (split,))
    return [(_vocab_lookup(r, r.get(table), r.whole(ids), split.size(rows)), ())]


def _vocab_lookup(r: _Rank, table: Value, ids: Value, rows: int) -> Value:
    """Megatron's vocabulary-parallel embedding: look up the ids this rank
    holds (the others read row 0 and are zeroed), then sum over the ranks."""
    g, dtype = r.g, ids.dtype.numpy
    local = g.op("sub", ids, g.op("constant", value=np.array(r.rank * rows, dtype)))
    mine = g.op("logical_and", g.op("greater_equal", local, g.op("constant", value=np.array(0, dtype))),
                g.op("less", local, g.op("constant", value=np.array(rows, dtype))))
    safe = g.op("where", mine, local, g.op("constant", value=np.array(0, dtype)))
    rows_read = g.op("gather", table, safe, axis=0)
    keep = g.op("reshape", mine, shape=[0] * ids.type.rank + [1])
    zero = g.op("constant", value=np.array(0, table.dtype.numpy))
    return g.op("all_reduce", g.op("where", keep, rows_read, zero), world=r.tp)


_HANDLERS = {"matmul": _matmul, "reshape": _reshape, "transpose": _transpose, "softmax": _along_axis,
             "slice": _along_axis, "split": _along_axis, "concat": _along_axis, "layernorm": _norm,
             "rmsnorm": _norm, "gather": _gather, "cache_write": _along_axis}
