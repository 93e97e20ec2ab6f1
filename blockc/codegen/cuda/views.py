"""Strided views: kernels that read or write a tensor through the split,
reshape and transpose nodes around it, so those nodes need no kernel.

The attention kernel reads Q, K and V where the packed projection wrote them
and writes its output in the layout the next GEMM reads. ``qkv_attention``
legalizes to (and a traced or imported model often holds)::

    %1, %2, %3 = split %0 {axis=-1, sizes=[768,768,768]}   # %0: [b, s, 2304]
    %4 = reshape %1 {shape=[0,0,12,64]}
    %5 = transpose %4 {perm=[0,2,1,3]}                     # q: [b, 12, s, 64]
    ...
    %10 = attention %5, %7, %9 {...}                        # [b, 12, s, 64]
    %11 = transpose %10 {perm=[0,2,1,3]}
    %12 = reshape %11 {shape=[0,0,768]}                     # [b, s, 768]

``fold_attention_views`` finds those chains and drops their nodes: attention
reads q as ``%0`` at offset 0 with strides ``[s*2304, 64, 2304, 1]`` and
writes ``%10`` so that its buffer *is* ``%12``. A chain is folded only where
nothing else reads its intermediate values, and a reshape only where it
splits or merges axes a strided layout can express; anything else keeps its
copy kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.dims import Dim
from ...ir.graph import Graph, Node, Value
from .exprs import is_inline

VIEW_OPS = ("transpose", "reshape", "split", "slice")


@dataclass(frozen=True)
class View:
    """``base``'s buffer read as a tensor of ``shape``: element ``idx`` is at
    ``offset + sum(idx[a] * strides[a])`` (in elements)."""

    base: Value
    offset: Dim
    shape: tuple
    strides: tuple


def contiguous(v: Value, shape=None) -> View:
    shape = tuple(v.shape if shape is None else shape)
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step = step * d
    return View(v, 0, shape, tuple(reversed(strides)))


def transposed(view: View, perm) -> View:
    """The view of ``transpose(view, perm)``."""
    return View(view.base, view.offset, tuple(view.shape[p] for p in perm), tuple(view.strides[p] for p in perm))


def untransposed(view: View, perm) -> View:
    """The view ``x`` such that ``transpose(x, perm)`` is ``view``."""
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return transposed(view, inv)


def sliced(view: View, axis: int, start: Dim, size: Dim) -> View:
    shape = list(view.shape)
    shape[axis] = size
    return View(view.base, view.offset + start * view.strides[axis], tuple(shape), view.strides)


def reshaped(view: View, shape) -> View | None:
    """``view`` read as ``shape`` (same element count), or None when a
    strided layout cannot express it (merging axes that are not adjacent in
    memory). Axes are matched left to right; a group of axes whose sizes are
    static ints is split or merged when the products agree; size-1 axes come
    and go freely."""
    ins = [(d, s) for d, s in zip(view.shape, view.strides) if d != 1]
    outs = list(shape)
    strides: list = [0] * len(outs)
    i = 0
    j = 0
    while j < len(outs):
        if outs[j] == 1:
            j += 1
            continue
        if i >= len(ins):
            return None
        group_in, group_out = [ins[i]], [j]
        pin, pout = ins[i][0], outs[j]
        while pin != pout:
            if not (isinstance(pin, int) and isinstance(pout, int)):
                return None
            if pin < pout:
                i += 1
                if i >= len(ins):
                    return None
                group_in.append(ins[i])
                pin = pin * ins[i][0]
            else:
                j += 1
                while j < len(outs) and outs[j] == 1:
                    j += 1
                if j >= len(outs):
                    return None
                group_out.append(j)
                pout = pout * outs[j]
        # The group's input axes must be one block of memory: each axis's
        # stride is the next one's stride times its size.
        for (d0, s0), (d1, s1) in zip(group_in, group_in[1:]):
            if s0 != s1 * d1:
                return None
        step = group_in[-1][1]
        for k in reversed(group_out):
            strides[k] = step
            step = step * outs[k]
        i += 1
        j += 1
    if i != len(ins):
        return None
    return View(view.base, view.offset, tuple(outs), tuple(strides))


def _step_back(node: Node, v: Value, view: View) -> View | None:
    """The view of ``v`` (an output of view op ``node``) given the view of ``node``'s input."""
    if node.op == "transpose":
        return transposed(view, node.attrs["perm"])
    if node.op == "reshape":
        return reshaped(view, v.shape)
    axis = node.attrs["axis"] % node.inputs[0].type.rank
    if node.op == "slice":
        return sliced(view, axis, node.attrs["start"], v.shape[axis])
    start = 0
    for size, out in zip(node.attrs["sizes"], node.outputs):
        if out is v:
            return sliced(view, axis, start, v.shape[axis])
        start = start + size
    return None


@dataclass
class FoldedViews:
    """What ``fold_attention_views`` decided: the nodes left to run, the
    values that now share another's buffer (``alias``: value id -> value),
    and each kernel operand's ``View`` (value id -> View)."""

    runtime: list
    alias: dict
    views: dict


def fold_attention_views(g: Graph, runtime: list[Node], materialised, kernel_ops) -> FoldedViews:
    """Fold the view chains around every node whose op is in ``kernel_ops``.
    ``materialised(v)`` says whether ``v`` already has a buffer no kernel
    here writes (an input, a weight, a load-time result)."""
    outputs = {id(v) for _, v in g.outputs}
    running = {id(n) for n in runtime}
    folded: set[int] = set()          # ids of values never materialised
    alias: dict[int, Value] = {}
    views: dict[int, View] = {}

    def foldable(v: Value, user: Node) -> bool:
        p = v.producer
        return (p is not None and p.op in VIEW_OPS and id(p) in running and not materialised(v)
                and len(v.uses) == 1 and v.uses[0][0] is user and id(v) not in outputs)

    def read_view(v: Value, user: Node) -> tuple[View, list]:
        values = [v]   # the operand, then each value it is a view of; the last is the base
        while foldable(values[-1], user) and not is_inline(values[-1].producer.inputs[0]):
            user = values[-1].producer
            values.append(user.inputs[0])
        while True:
            view, k = contiguous(values[-1]), len(values) - 2
            while k >= 0 and (view := _step_back(values[k].producer, values[k], view)) is not None:
                k -= 1
            if k < 0 and view.strides[-1] == 1:   # kernels read rows of unit stride
                return view, values[:-1]
            if k < 0:
                return contiguous(v), []
            values = values[:k + 1]   # a stride cannot say values[k]: it keeps its kernel and is the base

    for n in runtime:
        if n.op not in kernel_ops:
            continue
        for v in n.inputs:
            view, chain = read_view(v, n)
            if chain:
                folded.update(id(w) for w in chain)
                alias[id(v)] = view.base
            views[id(v)] = view
        # The output: forward through transposes and reshapes to the value the next kernel reads.
        out = n.outputs[0]
        chain, v = [], out
        while id(v) not in outputs and len(v.uses) == 1 and v.uses[0][0].op in ("transpose", "reshape") \
                and id(v.uses[0][0]) in running:
            v = v.uses[0][0].outputs[0]
            chain.append(v)
        view = contiguous(out)
        if chain:
            back = contiguous(out, chain[-1].shape)
            for w in reversed(chain):
                src = w.producer.inputs[0]
                back = untransposed(back, w.producer.attrs["perm"]) if w.producer.op == "transpose" \
                    else reshaped(back, src.shape)
                if back is None:
                    break
            if back is not None and back.strides[-1] == 1:
                view = back
                folded.update(id(w) for w in chain)
                alias[id(chain[-1])] = out
        views[id(out)] = view
    keep = [n for n in runtime if not (n.op in VIEW_OPS and all(id(o) in folded for o in n.outputs))]
    return FoldedViews(keep, alias, views)

