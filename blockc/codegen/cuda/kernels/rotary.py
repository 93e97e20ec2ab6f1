"""Rotary position embeddings in one kernel (the ``rotary`` op).

Decomposed, a rotary is two gathers of the tables' rows, a split, a
negation, a concat and a multiply-add: six launches for each of q and k in
every layer of a decode step, each a round trip of the head through memory.
Here one thread makes one output element: the element and its partner (the
other half of the rotated dims, or the other of its pair in the interleaved
form) times the table rows at its position; dims past ``rotary_dim`` are
copied. A position outside the tables is reported to ``blockc_run`` as a
gather's id is (``kernels/copy.py``), and its elements are NaN.

One launch, where the decomposition made six: llama-tiny's decode step
goes from 60 launches to 40."""
from __future__ import annotations

from ..dtypes import FLOATS
from ..family import KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, ctype, index_lines, suffix
from .copy import id_check


def emit_rotary(step: KernelStep) -> list[KernelCode]:
    node, ctx, labels = step.node, step.ctx, step.labels
    x, cos, sin, pos = node.inputs
    out = node.outputs[0]
    rd, head = cos.shape[1], x.shape[3]
    if not isinstance(rd, int) or not isinstance(head, int):
        raise CudaCodegenError(f"rotary: the CUDA backend needs a fixed head size and rotary_dim, got {x}, {cos}")
    positions = id_check(ctx, node, pos, "given", ctx.dim(cos.shape[0]))   # as a gather's ids
    if positions.flag is None:
        raise CudaCodegenError("rotary: its positions have no slot to report a bad one in")
    # [batch, seq] positions: the row of (idx0, idx2); [seq]: of idx2 alone
    pos_offset = f"idx0 * {ctx.dim(pos.shape[1])} + idx2" if pos.type.rank == 2 else "idx2"
    form = "pairs" if node.attrs["interleaved"] else "halves"
    name = f"rotary_{form}_rd{rd}_h{head}_p{pos.type.rank}_{suffix(out.dtype)}"
    params = dict(T=ctype(out.dtype), index_t=ctype(pos.dtype),
                  title=f"rotary embedding of {rd} of {head} dims, turned in {form}",
                  index_lines=index_lines(out.shape, ctx, f"idx3 {pos_offset}"), pos_offset=pos_offset,
                  ids=positions, rd=rd, interleaved=node.attrs["interleaved"], symbols=ctx.symbols)
    args = [ctx.ptr(x), ctx.ptr(cos), ctx.ptr(sin), ctx.ptr(pos), positions.flag, ctx.ptr(out),
            ctx.numel(out.shape)] + [f"dim_{s}" for s in ctx.symbols]
    return [KernelCode(name, "rotary.cu.j2", params, lambda n: f"{n}_launch({', '.join(args)}, stream);", labels,
                       [node.op], ("",))]


ROTARY = register(KernelFamily("rotary", "rotary", emit_rotary, FLOATS))
