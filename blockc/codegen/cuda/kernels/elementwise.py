"""Chains of elementwise ops become one kernel.

A group is a connected set of elementwise nodes whose intermediate results
are used only inside the group and have the group's output shape; scalar
constants and ``causal_mask`` are computed inline (the causal mask from the
element's indices, never read from memory). Each external input is loaded
once per element, at its broadcast offset.
"""
from __future__ import annotations

from ....ir.graph import Value
from ....ops.masking import causal_allowed
from ..exprs import CExpr, expr, is_inline, literal
from ..family import INLINE, KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, ctype, cuda_dtype, index_lines, shape_class, suffix


def emit_elementwise(step: KernelStep) -> list[KernelCode]:
    """One kernel computing the step's nodes (in order); the last node's output is stored."""
    nodes, ctx = step.nodes, step.ctx
    out = nodes[-1].outputs[0]
    shape = out.shape
    operands = _Operands(ctx, shape)
    body = []
    for j, n in enumerate(nodes):
        if is_inline(n.outputs[0]):
            continue
        args_c = [operands.read(v) for v in n.inputs]
        o = n.outputs[0]
        operands.names[id(o)] = f"t{j}"
        # `i` is this node's own linear index too: a chain's members all have its output's shape.
        body.append(f"const {cuda_dtype(o.dtype).compute} t{j} = "
                    f"{expr(n.op, n.attrs, args_c, o.dtype, index='i', dim=ctx.dim)};")
    result = operands.read(out)
    decompose = []
    if operands.need_index:
        decompose = index_lines(shape, ctx, " ".join(body + list(operands.loads.values()) + [result]))
        # none when every broadcast input is a single element (offset 0): then no `rest`, which nvcc would flag
        decompose = ["long long rest = i;"] + decompose if decompose else []
    out_t = ctype(out.dtype)
    store = f"blockc_from_compute<{out_t}>({result})"
    ops = [n.op for n in nodes if n.op not in ("constant",)]
    name = f"ew_{'_'.join(dict.fromkeys(ops))}_{suffix(out.dtype)}_{shape_class(shape)}"
    symbols = ctx.symbols
    template = dict(params=operands.params, out_t=out_t, index_lines=decompose, body=body, store=store,
                    symbols=symbols)
    launch_args = ", ".join(operands.args + [ctx.ptr(out), ctx.numel(shape)] + [f"dim_{s}" for s in symbols])
    return [KernelCode(name, "elementwise.cu.j2", template, lambda n: f"{n}_launch({launch_args}, stream);",
                       step.labels, ops, ("",))]


class _Operands:
    """How the kernel reads each value its nodes take: a result computed
    earlier in the kernel by its local name (``names``), a scalar constant or
    a causal mask written inline, anything else loaded once per element from
    a kernel parameter. Collects the parameters, their launch arguments, and
    whether some read needs the element's multi-index (``idx0``, ...)."""

    def __init__(self, ctx, shape):
        self.ctx, self.shape = ctx, shape
        self.params: list[str] = []
        self.args: list[str] = []
        self.loads: dict[int, str] = {}
        self.names: dict[int, str] = {}
        self.need_index = False

    def read(self, v: Value) -> str:
        """The C expression of ``v``'s value at this element, in the compute type."""
        if id(v) in self.names:
            return self.names[id(v)]
        p = v.producer
        if p is not None and p.op == "constant" and p.attrs["value"].size == 1:
            return literal(p.attrs["value"], v.dtype)
        if p is not None and p.op == "causal_mask":
            return self._causal_mask(v)
        return self._load(v)

    def _causal_mask(self, v: Value) -> str:
        # mask[q, k] right-aligned on the output: true where k <= q + (cols - rows)
        rank, p = len(self.shape), v.producer
        if rank < 2 or tuple(v.shape) != tuple(self.shape[-2:]):
            raise CudaCodegenError(f"causal_mask {list(map(str, v.shape))} must match the last two dims "
                                   f"of {list(map(str, self.shape))}")
        self.need_index = True
        return causal_allowed(CExpr(f"idx{rank - 2}"), CExpr(f"idx{rank - 1}"), CExpr(self.ctx.dim(p.attrs["rows"])),
                              CExpr(self.ctx.dim(p.attrs["cols"])))

    def _load(self, v: Value) -> str:
        """``v`` read from a new parameter, once per element, at its broadcast offset."""
        if id(v) in self.loads:
            return self.loads[id(v)]
        k = len(self.params)
        self.params.append(f"const {ctype(v.dtype)}* __restrict__ in{k}")
        self.args.append(self.ctx.ptr(v))
        if tuple(v.shape) == tuple(self.shape):
            offset = "i"
        else:
            self.need_index = True
            offset = _broadcast_offset(v.shape, len(self.shape), self.ctx.dim)
        self.loads[id(v)] = f"blockc_to_compute(in{k}[{offset}])"
        return self.loads[id(v)]


def _broadcast_offset(shape, out_rank: int, dim) -> str:
    """The offset, in an input of ``shape``, of the output element at
    ``idx0, idx1, ...``: numpy's broadcasting, the shapes right-aligned, an
    axis of 1 read at 0."""
    terms, stride = [], "1LL"
    for axis in range(len(shape) - 1, -1, -1):
        d = shape[axis]
        if d != 1:
            terms.append(f"idx{out_rank - len(shape) + axis} * {stride}")
        stride = f"{stride} * {dim(d)}" if stride != "1LL" else dim(d)
    return " + ".join(terms) or "0"


# Any op declaring a C expression (``cuda_expr``): chains of them are one kernel.
ELEMENTWISE = register(KernelFamily("elementwise", "elementwise", emit_elementwise))

# Scalar constants and the causal mask: written into the elementwise kernels that read them.
INLINED = register(KernelFamily("inline", "inline", placement=INLINE))
