"""Chains of elementwise ops become one kernel.

A group is a connected set of elementwise nodes whose intermediate results
are used only inside the group and have the group's output shape; scalar
constants and ``causal_mask`` are computed inline (the causal mask from the
element's indices, never read from memory). Each external input is loaded
once per element, at its broadcast offset.
"""
from __future__ import annotations

from ....ir.dims import Dim
from ....ir.graph import Value
from ....ops.masking import causal_allowed
from ..exprs import CExpr, expr, is_inline, literal
from ..family import INLINE, KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, ctype, cuda_dtype, index_lines, shape_class, suffix


def emit_elementwise(step: KernelStep) -> list[KernelCode]:
    """One kernel computing the step's nodes (in order); the last node's output is stored."""
    nodes, ctx, labels = step.nodes, step.ctx, step.labels
    root = nodes[-1]
    out = root.outputs[0]
    shape = out.shape
    rank = len(shape)
    inside = {id(n) for n in nodes}
    params, args, loads = [], [], {}
    need_index = False

    def dim(d: Dim) -> str:
        return ctx.dim(d)

    def load(v: Value) -> str:
        nonlocal need_index
        if id(v) in loads:
            return loads[id(v)]
        k = len(params)
        params.append(f"const {ctype(v.dtype)}* __restrict__ in{k}")
        args.append(ctx.ptr(v))
        if tuple(v.shape) == tuple(shape):
            offset = "i"
        else:
            need_index = True
            terms, stride = [], "1LL"
            for axis in range(len(v.shape) - 1, -1, -1):
                d = v.shape[axis]
                out_axis = rank - len(v.shape) + axis
                if d != 1:
                    terms.append(f"idx{out_axis} * {stride}")
                stride = f"{stride} * {dim(d)}" if stride != "1LL" else dim(d)
            offset = " + ".join(terms) or "0"
        value = f"in{k}[{offset}]"
        loads[id(v)] = f"blockc_to_compute({value})"
        return loads[id(v)]

    names: dict[int, str] = {}
    body: list[str] = []

    def operand(v: Value) -> str:
        nonlocal need_index
        if id(v) in names:
            return names[id(v)]
        p = v.producer
        if p is not None and p.op == "constant" and p.attrs["value"].size == 1:
            return literal(p.attrs["value"], v.dtype)
        if p is not None and p.op == "causal_mask":
            # mask[q, k] right-aligned on the output: true where k <= q + (cols - rows)
            if rank < 2 or tuple(v.shape) != tuple(shape[-2:]):
                raise CudaCodegenError(f"causal_mask {list(map(str, v.shape))} must match the last two dims "
                                       f"of {list(map(str, shape))}")
            need_index = True
            return causal_allowed(CExpr(f"idx{rank - 2}"), CExpr(f"idx{rank - 1}"), CExpr(dim(p.attrs["rows"])),
                                  CExpr(dim(p.attrs["cols"])))
        return load(v)

    for j, n in enumerate(nodes):
        if is_inline(n.outputs[0]):
            continue
        args_c = [operand(v) for v in n.inputs]
        o = n.outputs[0]
        names[id(o)] = f"t{j}"
        # `i` is this node's own linear index too: a chain's members all have its output's shape.
        body.append(f"const {cuda_dtype(o.dtype).compute} t{j} = {expr(n.op, n.attrs, args_c, o.dtype, index='i', dim=dim)};")
    result = names.get(id(out)) or operand(out)
    decompose: list[str] = []
    if need_index:
        decompose = index_lines(shape, ctx, " ".join(body + list(loads.values()) + [result]))
        # none when every broadcast input is a single element (offset 0): then no `rest`, which nvcc would flag
        decompose = ["long long rest = i;"] + decompose if decompose else []
    out_t = ctype(out.dtype)
    store = f"blockc_from_compute<{out_t}>({result})"
    ops = [n.op for n in nodes if n.op not in ("constant",)]
    name = f"ew_{'_'.join(dict.fromkeys(ops))}_{suffix(out.dtype)}_{shape_class(shape)}"
    symbols = ctx.symbols
    template = dict(params=params, out_t=out_t, index_lines=decompose, body=body, store=store, symbols=symbols)
    launch_args = ", ".join(args + [ctx.ptr(out), ctx.numel(shape)] + [f"dim_{s}" for s in symbols])
    return [KernelCode(name, "elementwise.cu.j2", template, lambda n: f"{n}_launch({launch_args}, stream);", labels,
                       ops, ("",))]


# Any op declaring a C expression (``cuda_expr``): chains of them are one kernel.
ELEMENTWISE = register(KernelFamily("elementwise", "elementwise", emit_elementwise))

# Scalar constants and the causal mask: written into the elementwise kernels that read them.
INLINED = register(KernelFamily("inline", "inline", placement=INLINE))
