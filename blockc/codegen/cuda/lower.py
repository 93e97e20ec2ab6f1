"""From an IR graph to one CUDA source file, in named phases:

1. ``legalize_for_cuda``  -- ops without a kernel family decomposed (keeping
   each node's origin), dead code dropped, then every op and dtype checked:
   an op or dtype the backend cannot generate is an error naming the op and
   the node before anything is rendered or written;
2. ``fold_load_time``     -- nodes computed from weights and constants alone
   run once, now, and their results join the weights file;
3. ``fold_attention_views`` -- the split, reshape and transpose nodes around
   an attention become strides its kernel reads and writes through (no copy
   kernels), then ``fuse_elementwise``: a GEMM absorbs the bias add,
   activation or residual add after it (``kernels/gemm.epilogue_nodes``), and
   chains of elementwise ops become one kernel step (``describe`` lists each
   chain, and ``blockc cuda`` shows them);
4. ``plan_buffers``       -- liveness, and the static memory plan of the arena;
5. ``emit_kernels``       -- one kernel (or a few) per step, from its op's
   kernel family (the op's ``cuda`` in the registry names a ``KernelFamily``,
   ``family.py``, declared beside its module in ``kernels/``);
6. ``render_host``        -- one definition per distinct kernel (what it is
   rendered from: its family, template and parameters), the launches in
   order and the C API.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...ir.load_time import load_time_nodes
from ...ops import registry
from ...ops.evaluate import Env, evaluate_node
from ...ops.limits import graph_limits
from ...passes.dce import dce
from ...passes.legalize import legalize
from ...passes.manager import label_origins
from .dtypes import CUDA_DTYPES, spelled
from .exprs import is_inline
from .family import ALIAS, INLINE, KERNEL, KernelFamily
from .kernel import CudaCodegenError, KernelCode, LowerContext, c_comment, c_string, ctype
from .kernels import KernelStep, family_of, lowers
from .kernels.attention import ATTENTION
from .kernels.copy import own_indices
from .kernels.elementwise import ELEMENTWISE
from .kernels.gemm import EMULATED_GEMM, GEMM, GemmChoice, epilogue_nodes, gemm_runtime
from .memory_plan import MemoryPlan, plan_memory
from .templates import render
from .views import fold_attention_views


def ops_of(family: KernelFamily) -> frozenset:
    """Every op ``family`` computes."""
    return frozenset(name for name, d in registry.OPS.items() if d.cuda == family.name)


def _placed(op: str, placement: str) -> bool:
    f = family_of(op)
    return f is not None and f.placement == placement


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
    gemm: GemmChoice = field(default_factory=GemmChoice)


def _labels(n: Node, index: int) -> list[str]:
    return list(n.origin) if n.origin else [f"#{index}"]


def check_supported(graph: Graph) -> None:
    for i, n in enumerate(graph.nodes):
        where = f"node {' '.join(_labels(n, i))} ({n.op})"
        f = family_of(n.op)
        if f is None:
            raise CudaCodegenError(f"{where}: the CUDA backend has no kernel for {n.op}")
        for v in list(n.inputs) + list(n.outputs):
            if v.dtype not in CUDA_DTYPES:
                raise CudaCodegenError(f"{where}: the CUDA backend does not generate {v.dtype.name} tensors "
                                       f"(use float32, float16 or bfloat16)")
        for v in n.outputs:
            if v.dtype not in f.dtypes:
                raise CudaCodegenError(f"{where}: the CUDA {f.title} kernel generates {spelled(f.dtypes)}, "
                                       f"not {v.dtype.name}")


def generate(graph: Graph, weights: Mapping[str, np.ndarray], *, form: str = "fused", version: str = "",
             gemm: str = EMULATED_GEMM, tf32: bool = False) -> CudaModel:
    """``graph`` as CUDA. ``gemm``: ``tiled`` (portable, emulatable; the
    default here, so that what is generated runs everywhere) or ``cublas``
    (cuBLASLt on a GPU, what GPU builds default to; the tiled kernel where
    one strided batch cannot express an operand's broadcasting). ``tf32``:
    float32 GEMMs on TF32 tensor cores (cuBLAS only)."""
    choice = GemmChoice(gemm, tf32)
    g, stored, folded, steps_nodes, alias = _steps(graph, weights)
    buffers = plan_buffers(g, steps_nodes, alias, stored)
    ctx = bind_values(g, steps_nodes, alias, stored, buffers)
    ctx.set_views(folded.views)
    steps = emit_kernels(g, steps_nodes, ctx, choice)
    source, kernels = render_host(g, steps, ctx, stored, buffers.plan, form=form, version=version, gemm=choice)
    return CudaModel(source, g, stored.params, steps, buffers.plan, g.symbols(), [(v.name, v) for v in g.inputs],
                     list(g.outputs), kernels, choice)


def _steps(graph: Graph, weights: Mapping[str, np.ndarray]):
    """Phases 1 to 3: the legalized graph, what is stored with the weights,
    the folded views, the launch steps' nodes and the aliases."""
    g = legalize_for_cuda(graph)
    stored, runtime = fold_load_time(g, weights)
    folded = fold_attention_views(g, runtime, lambda v: v.kind != "node" or id(v) in stored.index,
                                  ops_of(ATTENTION))
    steps_nodes, alias = fuse_elementwise(g, folded.runtime)
    alias.update(folded.alias)
    return g, stored, folded, steps_nodes, alias


def kernel_steps(graph: Graph, weights: Mapping[str, np.ndarray]) -> tuple[Graph, list[list[Node]]]:
    """The legalized graph and, per launch step of the generated code, the IR
    nodes it computes (a GEMM with its epilogue, an elementwise chain, one
    node): what the traffic model counts for the CUDA backend
    (``report.traffic.step_traffic``) without rendering any code."""
    g, _, _, steps_nodes, _ = _steps(graph, weights)
    return g, steps_nodes


# ---- 1. legalize ----------------------------------------------------------------------
def legalize_for_cuda(graph: Graph) -> Graph:
    # Every kernel's comment and the summary name the IR nodes it computes: as
    # `blockc show` numbers them, or the original nodes a fused op came from.
    g = dce(legalize(label_origins(graph, keep=True), lowers).graph).graph
    check_supported(g)
    return g


# ---- 2. load-time values ----------------------------------------------------------------
@dataclass
class Stored:
    """What the weights file holds, in order: parameters, load-time results,
    array constants; ``index`` maps ``id(value)`` to its position."""

    params: list = field(default_factory=list)    # (label, array)
    index: dict = field(default_factory=dict)

    def add(self, v: Value, label: str, array: np.ndarray) -> None:
        self.index[id(v)] = len(self.params)
        self.params.append((label, array))


def fold_load_time(g: Graph, weights: Mapping[str, np.ndarray]) -> tuple[Stored, list[Node]]:
    """The values stored with the weights, and the nodes left to run."""
    index_of = {id(n): i for i, n in enumerate(g.nodes)}
    stored = Stored()
    for name, v in g.params.items():
        stored.add(v, name, np.asarray(weights[name]))
    load_time = load_time_nodes(g)
    env = Env({}, float64=False)
    computed: dict[int, np.ndarray] = {}

    def value_of(v: Value) -> np.ndarray:
        if v.kind == "param":
            return stored.params[stored.index[id(v)]][1]
        return v.producer.attrs["value"] if v.producer.op == "constant" else computed[id(v)]

    for n in g.nodes:
        if id(n) in load_time and n.op != "constant":
            for o, r in zip(n.outputs, evaluate_node(n, [value_of(v) for v in n.inputs], env)):
                computed[id(o)] = r
    # Inline ops (constants, causal masks) stay inline where an elementwise kernel reads them.
    static = {id(n) for n in g.nodes if id(n) in load_time and not _placed(n.op, INLINE)}
    runtime = [n for n in g.nodes if id(n) not in static and not _placed(n.op, INLINE)]
    for n in runtime:
        for v in n.inputs:
            p = v.producer
            if p is None or id(v) in stored.index:
                continue
            if p.op == "causal_mask" and family_of(n.op) is not ELEMENTWISE:
                raise CudaCodegenError(f"causal_mask used by {n.op}: only elementwise ops read it")
            if id(p) in static or (p.op == "constant" and not (is_inline(v) and family_of(n.op) is ELEMENTWISE)):
                stored.add(v, f"derived:{' '.join(_labels(p, index_of[id(p)]))}", value_of(v).astype(v.dtype.numpy))
    return stored, runtime


# ---- 3. elementwise chains ----------------------------------------------------------------
def fuse_elementwise(g: Graph, runtime: list[Node]) -> tuple[list[list[Node]], dict]:
    """The kernel steps, each a list of nodes (a GEMM and what its epilogue
    computes, a chain of elementwise ops, or one node), and the
    aliases (a reshape's result is its input's buffer)."""
    alias: dict[int, Value] = {id(n.outputs[0]): n.inputs[0] for n in runtime if _placed(n.op, ALIAS)}
    outputs = {id(v) for _, v in g.outputs}
    running = {id(n) for n in runtime}
    # A GEMM step runs where its last absorbed node was: every operand is ready by then.
    gemm_at: dict[int, list[Node]] = {}
    absorbed: set[int] = set()
    for n in runtime:
        if family_of(n.op) is GEMM:
            tail = epilogue_nodes(n, running, outputs)
            gemm_at[id((tail or [n])[-1])] = [n] + tail
            absorbed |= {id(m) for m in [n] + tail}
    group_of: dict[int, list[Node]] = {}
    for n in runtime:
        if family_of(n.op) is not ELEMENTWISE or id(n) in absorbed:
            continue
        members: list[Node] = []
        for v in n.inputs:
            p = v.producer
            # A producer joins its only user's kernel when the shapes agree and nothing else reads it.
            if p is not None and id(p) in group_of and group_of[id(p)][-1] is p and len(v.uses) == 1 \
                    and id(v) not in outputs and v.shape == n.outputs[0].shape:
                members += [m for m in group_of.pop(id(p)) if m not in members]
        group_of[id(n)] = members + [n]
    steps: list[list[Node]] = []
    for n in runtime:
        if id(n) in gemm_at:
            steps.append(gemm_at[id(n)])
        elif id(n) in absorbed:
            continue
        elif family_of(n.op) is ELEMENTWISE:
            if id(n) in group_of:
                steps.append(group_of[id(n)])
        elif family_of(n.op).placement == KERNEL:
            steps.append([n])
    return steps, alias


def _root(v: Value, alias: dict) -> Value:
    while id(v) in alias:
        v = alias[id(v)]
    return v


# ---- 4. memory plan ----------------------------------------------------------------------
@dataclass
class Buffers:
    plan: MemoryPlan
    out_root: dict      # id(value) -> which graph output it is written to
    scratch: dict = field(default_factory=dict)   # id(node) -> its scratch Value (not in the graph)


def plan_buffers(g: Graph, steps_nodes: list[list[Node]], alias: dict, stored: Stored) -> Buffers:
    defined_at, last_use = {}, {}
    for step, nodes in enumerate(steps_nodes):
        for m in nodes:
            for v in m.inputs:
                r = _root(v, alias)
                if r.kind == "node" and id(r) not in stored.index and not is_inline(r):
                    last_use[id(r)] = step
        # A chain's (or a GEMM epilogue's) inner values stay in registers.
        for o in (nodes[-1].outputs if len(nodes) > 1 else nodes[0].outputs):
            defined_at.setdefault(id(o), step)
    for _, v in g.outputs:
        last_use[id(_root(v, alias))] = len(steps_nodes)
    # blockc_run reads a bad computed index back after the launches (_id_limits):
    # its buffer is not reused before then.
    for nodes in steps_nodes:
        for m in nodes:
            ids = own_indices(m)
            if ids is not None and id(_root(ids, alias)) in last_use:
                last_use[id(_root(ids, alias))] = len(steps_nodes)
    out_root: dict[int, int] = {}
    for k, (name, v) in enumerate(g.outputs):
        r = _root(v, alias)
        if r.kind != "node" or id(r) in stored.index or is_inline(r) or id(r) not in defined_at:
            raise CudaCodegenError(f"output {name!r} is an input, a parameter or a constant; the CUDA backend "
                                   f"needs outputs computed by a kernel")
        if id(r) in out_root:
            raise CudaCodegenError(f"outputs {g.outputs[out_root[id(r)]][0]!r} and {name!r} share one buffer")
        out_root[id(r)] = k
    buffers = [o for nodes in steps_nodes for m in nodes for o in m.outputs
               if id(o) in defined_at and id(o) not in out_root]
    scratch: dict[int, Value] = {}
    for step, nodes in enumerate(steps_nodes):
        # the arena scratch a family's kernel needs during its own launch: a slot of the plan like any buffer's
        rule = family_of(nodes[0].op).scratch
        t = rule(nodes[-1]) if rule else None
        if t is not None:
            v = Value(t, "node", "scratch", producer=nodes[-1], index=len(nodes[-1].outputs))
            scratch[id(nodes[-1])] = v
            defined_at[id(v)] = last_use[id(v)] = step
            buffers.append(v)
    return Buffers(plan_memory(buffers, defined_at, last_use), out_root, scratch)


def bind_values(g: Graph, steps_nodes, alias: dict, stored: Stored, buffers: Buffers) -> LowerContext:
    """Where every value lives, as the C expression kernels are given."""
    ctx = LowerContext(g.symbols())
    ids = graph_limits(g).ids
    for k, v in enumerate(g.inputs):
        ctx.bind(v, f"inputs[{k}]")
        if v.name in ids:
            ctx.check_ids(v)   # its gathers report a bad id to blockc_run
    for v in list(g.params.values()) + [o for n in g.nodes for o in n.outputs]:
        if id(v) in stored.index:
            ctx.bind(v, f"params[{stored.index[id(v)]}]")
    for nodes in steps_nodes:
        for m in nodes:
            for o in m.outputs:
                if id(o) in buffers.out_root:
                    ctx.bind(o, f"outputs[{buffers.out_root[id(o)]}]")
                elif id(o) in buffers.plan.slot_of:
                    ctx.bind(o, f"(arena + off[{buffers.plan.slot_of[id(o)]}])")
    for n in g.nodes:
        if id(n.outputs[0]) in alias:
            ctx.alias(n.outputs[0], _root(n.outputs[0], alias))
        if id(n) in buffers.scratch:
            ctx.bind_scratch(n, f"(arena + off[{buffers.plan.slot_of[id(buffers.scratch[id(n)])]}])")
    for nodes in steps_nodes:
        for m in nodes:
            if own_indices(m) is not None:
                ctx.check_ids(m)   # computed indices: each gather reports its own to blockc_run
    return ctx


# ---- 5. kernels ----------------------------------------------------------------------------
def emit_kernels(g: Graph, steps_nodes: list[list[Node]], ctx: LowerContext, gemm: GemmChoice) -> list[KernelCode]:
    """Each step's launches, from the kernel family of its first node."""
    index_of = {id(n): i for i, n in enumerate(g.nodes)}
    steps: list[KernelCode] = []
    for nodes in steps_nodes:
        labels = list(dict.fromkeys(lab for m in nodes for lab in _labels(m, index_of[id(m)])))
        f = family_of(nodes[0].op)
        for code in f.emit(KernelStep(nodes, ctx, labels, gemm)):
            code.family = f
            steps.append(code)
    return steps


# ---- 6. host code --------------------------------------------------------------------------
def render_host(g: Graph, steps: list[KernelCode], ctx: LowerContext, stored: Stored, plan: MemoryPlan, *,
                form: str, version: str, gemm: GemmChoice) -> tuple[str, dict]:
    # One definition per distinct kernel: identical code used by many layers is
    # emitted once, its comment listing every IR node it computes.
    kernels, uses = _definitions(steps)
    sources = [k.render(uses[name]) for name, k in kernels.items()]
    scratch = lambda b: " scratch" if b.index >= len(b.producer.outputs) else ""   # noqa: E731 (plan_buffers')
    slots = [{"comment": c_comment(", ".join(f"{b.producer.op}{scratch(b)} {b.type}" for b in s.buffers))[:200],
              "sizes": sorted({f"{ctx.numel(b.shape)} * {b.dtype.itemsize}LL" for b in s.buffers})}
             for s in plan.slots]
    source = render("host.cu.j2", model_name=c_comment(g.name), version=version, form=form,
                    dtype=c_comment(",".join(sorted({o.dtype.name for _, o in g.outputs}))),
                    sources=sources, steps=[{"what": c_string(_launch_name(c)), "call": c.call} for c in steps],
                    slots=slots, symbols=g.symbols(), dim_limits=_dim_limits(g, ctx), id_limits=_id_limits(g, ctx),
                    gemm_runtime=gemm_runtime(gemm, ctx.gemm_sites), num_inputs=len(g.inputs),
                    num_outputs=len(g.outputs), param_bytes=[f"{int(a.nbytes)}ULL" for _, a in stored.params])
    return source, kernels


def _definitions(steps: list[KernelCode]) -> tuple[dict, dict]:
    """Each kernel definition by name, and the IR nodes each computes. Steps
    emitted under one name share a definition where they are rendered from
    the same family, template and parameters; each other variant of the name
    is the next ``_vN``, in order of first use. Steps are given their
    definition's name."""
    variants: dict[str, list] = {}        # emitted name -> what each of its definitions is rendered from
    kernels: dict[str, KernelCode] = {}
    uses: dict[str, list[str]] = {}
    for code in steps:
        made = variants.setdefault(code.name, [])
        if code.rendered_from not in made:
            made.append(code.rendered_from)
        k = made.index(code.rendered_from)
        code.name = code.name if k == 0 else f"{code.name}_v{k}"
        kernels.setdefault(code.name, code)
        uses.setdefault(code.name, []).extend(code.nodes)
    return kernels, uses


def _launch_name(code: KernelCode, room: int = 200) -> str:
    """How an error names a launch: its kernel and the IR nodes it computes
    (the first of them, where a long chain would crowd out the error itself)."""
    nodes = " ".join(code.nodes)
    if len(nodes) > room:
        nodes = nodes[:room].rsplit(" ", 1)[0] + " ..."
    return f"kernel {code.name} (IR nodes {nodes}: {'+'.join(code.ops)})"


def _dim_limits(g: Graph, ctx: LowerContext) -> list[dict]:
    # blockc_run refuses dims over what the fixed-size tables hold (ops/limits.py,
    # the rule every Python backend applies too) instead of reading past them.
    return [{"expr": ctx.dim(d.dim), "limit": d.limit, "why": c_comment(d.why), "name": c_string(str(d.dim))}
            for d in graph_limits(g).dims]


def _id_limits(g: Graph, ctx: LowerContext) -> list[dict]:
    # ...and ids outside the table they index, which the gathers flag
    # (kernels/copy.py): an id input's, or a gather's computed indices. The
    # error names the first bad one, read back from the buffer the gather read.
    ids = graph_limits(g).ids
    index_of = {id(n): i for i, n in enumerate(g.nodes)}
    limits = []
    for key in ctx.checked_ids:
        if isinstance(key, Node):
            v, table, _ = registry.get(key.op).indexes(key)[0]
            limits.append({"ids": ctx.ptr(v), "ctype": ctype(v.dtype), "rows": ctx.dim(table.shape[0]),
                           "node": c_string(f"{key.op} {' '.join(_labels(key, index_of[id(key)]))}")})
        else:
            limits.append({"ids": ctx.ptr(key), "ctype": ctype(key.dtype), "input": c_string(key.name),
                           "high": str(ids[key.name][0]), "why": c_string(ids[key.name][1])})
    return limits
