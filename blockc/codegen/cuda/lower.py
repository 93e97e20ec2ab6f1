"""From an IR graph to one CUDA source file: kernel steps, the memory plan
and the host code with its C API.

Checks come first: an op or dtype the backend cannot generate is an error
naming the op and the node before anything is rendered or written.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ...ir.dtypes import DType
from ...ir.graph import Graph, Node, Value
from ...ops import registry
from ...passes.dce import dce
from ...passes.decompose import decompose
from ...runtime.reference import Env
from .exprs import ELEMENTWISE
from .kernel import CudaCodegenError, KernelCode, LowerContext, c_comment
from .kernels.copy import emit_copy
from .kernels.elementwise import emit_elementwise
from .kernels.gemm import emit_gemm
from .kernels.rows import emit_row_norm, emit_softmax
from .memory_plan import MemoryPlan, plan_memory
from .templates import render

ROW_NORM = {"layernorm", "rmsnorm", "add_layernorm", "add_rmsnorm"}
SOFTMAX = {"softmax", "masked_softmax"}
GEMM = {"matmul", "matmul_bias_act"}
COPY = {"transpose", "slice", "split", "concat", "gather"}
ALIAS = {"reshape"}
# Fused ops with no kernel of their own yet: lowered to ops that have one.
DECOMPOSED_FIRST = ("qkv_attention", "attention")
SUPPORTED = ELEMENTWISE | ROW_NORM | SOFTMAX | GEMM | COPY | ALIAS
DTYPES = {DType.float32, DType.float16, DType.bfloat16, DType.int64, DType.int32, DType.bool}


@dataclass
class CudaModel:
    """Everything ``blockc cuda`` writes, before it is written."""

    source: str
    graph: Graph
    params: list                 # (label, array) in the order of the weights file
    steps: list[KernelCode]
    plan: MemoryPlan
    symbols: list[str]
    inputs: list                 # (name, Value)
    outputs: list                # (name, Value)
    kernels: dict = field(default_factory=dict)   # kernel name -> KernelCode of its first use
    gemm: str = "tiled"


def _labels(n: Node, index: int) -> list[str]:
    return list(n.origin) if n.origin else [f"#{index}"]


def check_supported(graph: Graph) -> None:
    for i, n in enumerate(graph.nodes):
        where = f"node {' '.join(_labels(n, i))} ({n.op})"
        if n.op not in SUPPORTED:
            raise CudaCodegenError(f"{where}: the CUDA backend has no kernel for {n.op}")
        for v in list(n.inputs) + list(n.outputs):
            if v.dtype not in DTYPES:
                raise CudaCodegenError(f"{where}: the CUDA backend does not generate {v.dtype.name} tensors "
                                       f"(use float32, float16 or bfloat16)")


def _load_time(graph: Graph) -> set[int]:
    """Nodes computed from parameters and constants alone: run once, at generation."""
    static: set[int] = set()
    for n in graph.nodes:
        if n.op in ("constant", "causal_mask"):
            continue
        if n.inputs and all(v.kind == "param" or (v.producer is not None and (
                id(v.producer) in static or v.producer.op == "constant")) for v in n.inputs) \
                and all(isinstance(d, int) for o in n.outputs for d in o.shape):
            static.add(id(n))
    return static


def _inline(v: Value) -> bool:
    p = v.producer
    return p is not None and (p.op == "causal_mask" or (p.op == "constant" and p.attrs["value"].size == 1))


def generate(graph: Graph, weights: Mapping[str, np.ndarray], *, form: str = "fused", version: str = "",
             gemm: str = "tiled") -> CudaModel:
    """``graph`` as CUDA. ``gemm``: ``tiled`` (portable, emulatable) or
    ``cublas`` (cuBLAS on a GPU; the tiled kernel where one strided batch
    cannot express an operand's broadcasting)."""
    if gemm not in ("tiled", "cublas"):
        raise CudaCodegenError(f"unknown gemm {gemm!r}: use tiled or cublas")
    g = dce(decompose(graph, ops=DECOMPOSED_FIRST).graph).graph
    check_supported(g)
    symbols = g.symbols()
    static = _load_time(g)
    index_of = {id(n): i for i, n in enumerate(g.nodes)}

    # -- values that live in the weights file: parameters, load-time results, array constants
    params: list = []
    param_index: dict[int, int] = {}
    for name, v in g.params.items():
        param_index[id(v)] = len(params)
        params.append((name, np.asarray(weights[name])))
    env = Env({}, float64=False)
    computed: dict[int, np.ndarray] = {}

    def value_of(v: Value) -> np.ndarray:
        if v.kind == "param":
            return params[param_index[id(v)]][1]
        if v.producer.op == "constant":
            return v.producer.attrs["value"]
        return computed[id(v)]

    for n in g.nodes:
        if id(n) in static:
            outs = registry.get(n.op).numpy_fn([value_of(v) for v in n.inputs], n.attrs, env)
            for o, r in zip(n.outputs, outs if isinstance(outs, (list, tuple)) else [outs]):
                computed[id(o)] = np.asarray(r).astype(o.dtype.numpy)

    def needs_storage(v: Value, user: Node) -> bool:
        if v.kind != "node" or id(v) in param_index:
            return False
        if id(v.producer) in static:
            return True
        return v.producer.op == "constant" and not (_inline(v) and user.op in ELEMENTWISE)

    runtime = [n for n in g.nodes if id(n) not in static and n.op not in ("constant", "causal_mask")]
    for n in runtime:
        for v in n.inputs:
            if needs_storage(v, n) and id(v) not in param_index:
                param_index[id(v)] = len(params)
                params.append((f"derived:{' '.join(_labels(v.producer, index_of[id(v.producer)]))}",
                               value_of(v).astype(v.dtype.numpy)))
            if v.producer is not None and v.producer.op == "causal_mask" and n.op not in ELEMENTWISE:
                raise CudaCodegenError(f"causal_mask used by {n.op}: only elementwise ops read it")

    # -- aliases (reshape) and elementwise groups
    alias: dict[int, Value] = {}

    def root(v: Value) -> Value:
        while id(v) in alias:
            v = alias[id(v)]
        return v

    for n in runtime:
        if n.op in ALIAS:
            alias[id(n.outputs[0])] = n.inputs[0]
    outputs = {id(v) for _, v in g.outputs}
    group_of: dict[int, list[Node]] = {}
    for n in runtime:
        if n.op not in ELEMENTWISE:
            continue
        members: list[Node] = []
        for v in n.inputs:
            p = v.producer
            if p is not None and id(p) in group_of and group_of[id(p)][-1] is p and len(v.uses) == 1 \
                    and id(v) not in outputs and v.shape == n.outputs[0].shape and p.op in ELEMENTWISE:
                members += [m for m in group_of.pop(id(p)) if m not in members]
        group_of[id(n)] = members + [n]
    steps_nodes: list[list[Node]] = []
    for n in runtime:
        if n.op in ALIAS:
            continue
        if n.op in ELEMENTWISE:
            if id(n) in group_of:
                steps_nodes.append(group_of[id(n)])
        else:
            steps_nodes.append([n])

    # -- liveness and the memory plan
    defined_at, last_use = {}, {}
    for step, nodes in enumerate(steps_nodes):
        inside = {id(m) for m in nodes}
        for m in nodes:
            for v in m.inputs:
                r = root(v)
                if r.kind == "node" and id(r) not in param_index and not _inline(r):
                    last_use[id(r)] = step
        for o in (nodes[-1].outputs if nodes[-1].op in ELEMENTWISE else [o for m in nodes for o in m.outputs]):
            defined_at.setdefault(id(o), step)
    for _, v in g.outputs:
        last_use[id(root(v))] = len(steps_nodes)
    out_root: dict[int, int] = {}
    for k, (name, v) in enumerate(g.outputs):
        r = root(v)
        if r.kind != "node" or id(r) in param_index or _inline(r) or id(r) not in defined_at:
            raise CudaCodegenError(f"output {name!r} is an input, a parameter or a constant; the CUDA backend "
                                   f"needs outputs computed by a kernel")
        if id(r) in out_root:
            raise CudaCodegenError(f"outputs {g.outputs[out_root[id(r)]][0]!r} and {name!r} share one buffer")
        out_root[id(r)] = k
    buffers = [o for nodes in steps_nodes for m in nodes for o in m.outputs
               if id(o) in defined_at and id(o) not in out_root]
    plan = plan_memory(buffers, defined_at, last_use)

    # -- render
    ctx = LowerContext(symbols)
    for k, v in enumerate(g.inputs):
        ctx.bind(v, f"inputs[{k}]")
    for v in list(g.params.values()):
        ctx.bind(v, f"params[{param_index[id(v)]}]")
    for n in g.nodes:
        for o in n.outputs:
            if id(o) in param_index:
                ctx.bind(o, f"params[{param_index[id(o)]}]")
    for nodes in steps_nodes:
        for m in nodes:
            for o in m.outputs:
                if id(o) in out_root:
                    ctx.bind(o, f"outputs[{out_root[id(o)]}]")
                elif id(o) in plan.slot_of:
                    ctx.bind(o, f"(arena + off[{plan.slot_of[id(o)]}])")
    for n in runtime:
        if n.op in ALIAS:
            ctx.alias(n.outputs[0], root(n.outputs[0]))

    steps: list[KernelCode] = []
    for nodes in steps_nodes:
        labels = [lab for m in nodes for lab in _labels(m, index_of[id(m)])]
        labels = list(dict.fromkeys(labels))
        head = nodes[-1]
        if head.op in ELEMENTWISE:
            steps.append(emit_elementwise(nodes, ctx, labels))
        elif head.op in ROW_NORM:
            steps.append(emit_row_norm(head, ctx, labels))
        elif head.op in SOFTMAX:
            steps.append(emit_softmax(head, ctx, labels))
        elif head.op in GEMM:
            steps.append(emit_gemm(head, ctx, labels, gemm))
        else:
            steps.extend(emit_copy(head, ctx, labels))

    # One definition per distinct kernel: identical code used by many layers is
    # emitted once, its comment listing every IR node it computes.
    kernels: dict[str, KernelCode] = {}
    uses: dict[str, list[str]] = {}
    for code in steps:
        while code.name in kernels and _body(kernels[code.name].source) != _body(code.source):
            _rename(code, f"{code.name}_v{sum(1 for k in kernels if k.startswith(code.name))}")
        if code.name not in kernels:
            kernels[code.name] = code
        uses.setdefault(code.name, []).extend(code.nodes)
    sources = [_with_nodes(k.source, uses[name]) for name, k in kernels.items()]
    slots = [{"comment": c_comment(", ".join(f"{b.producer.op} {b.type}" for b in s.buffers))[:200],
              "sizes": sorted({f"{ctx.numel(b.shape)} * {b.dtype.itemsize}LL" for b in s.buffers})}
             for s in plan.slots]
    source = render("host.cu.j2", model_name=c_comment(g.name), version=version, form=form,
                    dtype=c_comment(",".join(sorted({o.dtype.name for _, o in g.outputs}))),
                    sources=sources, steps=[{"comment": c_comment(f"{' '.join(c.nodes)}: {'+'.join(c.ops)}"),
                                             "call": c.call} for c in steps],
                    slots=slots, symbols=symbols, cublas=gemm == "cublas", num_inputs=len(g.inputs), num_outputs=len(g.outputs),
                    param_bytes=[f"{int(a.nbytes)}ULL" for _, a in params])
    return CudaModel(source, g, params, steps, plan, symbols, [(v.name, v) for v in g.inputs], list(g.outputs),
                     kernels, gemm)


_NODES_LINE = re.compile(r"^// IR nodes:.*\n", re.M)


def _body(source: str) -> str:
    return _NODES_LINE.sub("", source)


def _with_nodes(source: str, labels: list[str]) -> str:
    words, lines, line = list(dict.fromkeys(labels)), [], "// IR nodes:"
    for w in words:
        if len(line) + len(w) > 110:
            lines.append(line)
            line = "//  "
        line += " " + w
    lines.append(line)
    return _NODES_LINE.sub(lambda m: "\n".join(lines) + "\n", source, count=1)


def _rename(code: KernelCode, new: str) -> None:
    pattern = re.compile(rf"\b{re.escape(code.name)}(?=\b|_)")
    code.source = pattern.sub(new, code.source)
    code.call = pattern.sub(new, code.call)
    code.kernels = [pattern.sub(new, k) for k in code.kernels]
    code.name = new
