"""Nodes computed from parameters alone, folded into parameters of their own.

A fused graph merges weights as it runs: the QKV merge and a Llama's
gate/up merge concatenate three or two parameters in every layer, a tied
head transposes the embedding. ONNX Runtime constant-folds each such node
when a session is created, in each session (a generation has two: prefill
and decode), so every start pays the folding and holds extra copies.
``fold_params`` takes those nodes out of the graph: each becomes a
parameter, and ``FoldedParams.make`` computes its value with the op's own
numpy meaning (``ops/evaluate.py``), once, for whoever stores it
(``ort_runner.OrtSession`` keeps it in the cache as a file that ONNX
Runtime maps, shared by every session).

Before::

    param @w_q: f32[64,64]
    param @w_k: f32[64,32]
    param @w_v: f32[64,32]
    %0:f32[64,128] = concat @w_q, @w_k, @w_v {axis=1}
    %1:f32[batch,seq,128] = matmul %x, %0

After::

    param @"concat(w_q,w_k,w_v){axis=1}": f32[64,128]
    %0:f32[batch,seq,128] = matmul %x, @"concat(w_q,w_k,w_v){axis=1}"

A node is folded when its op moves data alone (the registry's
``moves_data``: ``concat``, ``transpose``, ``split``, ``cast``, ...; numpy
gives the bits ONNX Runtime's kernel would, where arithmetic such as a
scale folded into a weight, ``1 + w`` or a matmul of two parameters could
round otherwise in float16 or bfloat16, and is left to ONNX Runtime), it is
a load-time node (``ir/load_time.py``: fixed
size, no symbolic attribute; ``slice @rope.cos {end=total}`` stays) whose
inputs are all parameters or folded results (a node over constants is
constant folding's: ``passes/constant_fold.py``), and no result of it is a
graph output. Only the folded values that unfolded nodes read become
parameters; a parameter read by nothing else any more leaves the graph.
The new parameter's name is the node written out over its inputs' names
(``op(a,b){attr=value}``), so two graphs folding the same node (a prefill
and a decode step) name it alike and can share one array.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..frontends.prepared import prepared_arrays
from ..frontends.weights import (FileView, SideBySide, contiguous, file_region, file_view, mapped_files,
                                release_pages)
from ..ir.graph import Graph, Node, Value
from ..ir.load_time import load_time_nodes
from ..ir.printer import format_attrs
from ..ops import registry
from ..ops.evaluate import Env, evaluate_node


@dataclass(frozen=True)
class FoldedParams:
    """``graph`` with each folded node's used results as parameters, and what
    each new parameter was made from. ``derived``: ``{name: value}`` where
    the value is the folded result in the *original* graph; ``leaves``:
    ``{name: [the original parameters it is computed from]}``. ``make(name)``
    computes one new parameter's array from the original weights."""

    graph: Graph
    derived: dict[str, Value]
    leaves: dict[str, list[str]]
    make: Callable[[str], np.ndarray]


def foldable_nodes(graph: Graph, only: Callable[[str], bool] = lambda name: True) -> list[Node]:
    """The nodes ``fold_params`` folds, in graph order (see the module
    docstring), of those whose parameters ``only`` accepts by name."""
    static = load_time_nodes(graph)
    outputs = {id(v) for _, v in graph.outputs}
    folded: set[int] = set()
    out = []
    for n in graph.nodes:
        if id(n) in static and n.inputs and registry.get(n.op).moves_data and \
                not any(id(o) in outputs for o in n.outputs) and \
                all(only(v.name) if v.kind == "param" else id(v.producer) in folded for v in n.inputs):
            folded.add(id(n))
            out.append(n)
    return out


def fold_params(graph: Graph, weights: Mapping[str, np.ndarray],
                only: Callable[[str], bool] = lambda name: True) -> FoldedParams | None:
    """``graph`` with its parameter-only nodes folded (see the module
    docstring), those alone whose parameters ``only`` accepts by name, or
    None where it has none. ``graph`` is not changed; the arrays are made
    only when ``make`` is called, from ``weights``."""
    nodes = foldable_nodes(graph, only)
    if not nodes:
        return None
    folded = {id(n) for n in nodes}
    names = _derived_names(nodes)
    derived = {names[id(o)]: o for n in nodes for o in n.outputs
               if any(id(user) not in folded for user, _ in o.uses)}
    if any(name in graph.params for name in derived):
        return None   # a parameter already has a folded one's name: leave the graph as it is
    g = graph.copy()
    copies = dict(zip(map(id, graph.nodes), g.nodes))   # a copy keeps the order of the nodes
    for name, v in derived.items():
        g.replace_all_uses(copies[id(v.producer)].outputs[v.index], g.add_param(name, v.type))
    for n in reversed(nodes):
        g.remove_node(copies[id(n)])
    g.remove_unused_params()
    leaves = {name: list(_leaf_params(v)) for name, v in derived.items()}
    return FoldedParams(g, derived, leaves, lambda name: _evaluate(derived[name], weights, {}))


def _derived_names(nodes: list[Node]) -> dict[int, str]:
    """``{id(result): name}``: ``op(input names){attrs}``, ``#i`` after it for the i-th result of several."""
    names: dict[int, str] = {}
    for n in nodes:
        args = ",".join(v.name if v.kind == "param" else names[id(v)] for v in n.inputs)
        attrs = format_attrs(n.attrs, sep=",") if n.attrs else ""
        for o in n.outputs:
            names[id(o)] = f"{n.op}({args}){attrs}" + (f"#{o.index}" if len(n.outputs) > 1 else "")
    return names


def _leaf_params(v: Value) -> dict[str, None]:
    """The parameters ``v`` is computed from, in the order its inputs name them (a dict as an ordered set)."""
    if v.kind == "param":
        return {v.name: None}
    return {name: None for i in v.producer.inputs for name in _leaf_params(i)}


def _evaluate(v: Value, weights: Mapping[str, np.ndarray], made: dict) -> np.ndarray:
    """``v``'s value, computed from ``weights`` by each node's numpy rule in
    the graph's dtypes; ``made``: ``{id(node): its results}`` so far, so a
    node two inputs share (a split's results concatenated) runs once."""
    if v.kind == "param":
        return np.asarray(weights[v.name])
    n = v.producer
    if id(n) not in made:
        made[id(n)] = evaluate_node(n, [_evaluate(i, weights, made) for i in n.inputs], Env({}, float64=False))
    # contiguous: a transpose's rule gives a view, and whoever stores or binds the array reads it in order
    return contiguous(made[id(n)][v.index])


def folded_over_files(graph: Graph, weights: Mapping[str, np.ndarray]) -> tuple[Graph, dict[str, np.ndarray]]:
    """``graph`` and ``weights`` as ONNX Runtime gets them: each node that
    reads only parameters whose arrays are views of ``.safetensors`` files
    (``weights.file_view``) folded (``fold_params``), and each parameter
    left whose view is out of order (a checkpoint's transposed
    ``nn.Linear`` weight, GPT-2's q/k/v columns: ``hf_common.Take.view``)
    put in order; those arrays made once into one cache file and mapped from
    it on every later start (``prepared.prepared_arrays``: a file view,
    which every session maps and none copies). So each byte is written
    once: a q/k/v merge is made from the checkpoint's own views, never from
    transposed copies of them. Left as they are (ONNX Runtime folds such
    nodes itself, in each session, and gets a copy of each out-of-order
    view) where there is nothing to make, or where a file was written just
    now or replaced since it was mapped (``source_identity`` None). The key
    names the files' identity, each array's recipe (the node chain in its
    name, its type, the views it reads) and this code."""
    views = {name: v for name, a in weights.items() if (v := file_view(a)) is not None}
    folded = fold_params(graph, weights, only=views.__contains__)
    exported = graph if folded is None else folded.graph
    ordered = {name: exported.params[name] for name in exported.params
               if name in views and file_region(weights[name]) is None}
    derived = {} if folded is None else folded.derived
    types = {**{name: v.type for name, v in derived.items()}, **{name: v.type for name, v in ordered.items()}}
    if not types:
        return graph, dict(weights)
    leaves = {**({} if folded is None else folded.leaves), **{name: [name] for name in ordered}}
    sources = mapped_files(weights[p] for names in leaves.values() for p in names)
    ran = []

    def make(name: str) -> np.ndarray | SideBySide:
        ran.append(name)
        # a view out of order as it is, a merge of views not made whole: the file's writer puts each in order
        # a band at a time (``in_order_bands``)
        return weights[name] if name in ordered else _side_by_side(derived[name], weights) or folded.make(name)
    specs = {name: (t.dtype.numpy, tuple(t.shape)) for name, t in types.items()}
    made = prepared_arrays(_recipe(graph, types, leaves, views), specs, make, sources)
    if made is None:
        return graph, dict(weights)
    made = {name: np.asarray(a) for name, a in made.items()}   # a merge made in memory (SideBySide) made whole
    if ran:   # made on a miss, every byte of their sources was read through this process's map: not its memory
        release_pages(weights[p] for names in leaves.values() for p in names)
    return exported, {**{name: weights[name] for name in exported.params if name in weights}, **made}


def _side_by_side(v: Value, weights: Mapping[str, np.ndarray]) -> SideBySide | None:
    """``v`` as parameters side by side, where it is a concat of matrices
    along their columns (a q/k/v or gate/up merge of a checkpoint's views),
    of one dtype; else None (``FoldedParams.make`` makes it)."""
    n = v.producer
    if n.op != "concat" or len(v.shape) != 2 or n.attrs.get("axis") not in (1, -1) \
            or any(i.kind != "param" for i in n.inputs):
        return None
    parts = tuple(np.asarray(weights[i.name]) for i in n.inputs)
    return SideBySide(parts) if all(p.ndim == 2 and p.dtype == v.dtype.numpy for p in parts) else None


def _recipe(graph: Graph, types: Mapping[str, object], leaves: Mapping[str, list[str]],
            views: Mapping[str, FileView]) -> str:
    """What each made array is made from, as one text: its name (the node
    chain, or the parameter put in order), its type, and each parameter it
    reads with its type and its view of its file."""
    return json.dumps([[name, str(t), [[p, str(graph.params[p].type), views[p].path, views[p].offset,
                                         views[p].shape, views[p].strides] for p in leaves[name]]]
                       for name, t in types.items()])
