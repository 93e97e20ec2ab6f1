"""Row kernels: LayerNorm/RMSNorm (optionally with the residual add and its
sum) and softmax/masked softmax, over the last axis.

Each op has up to three tiers, and its launcher takes the first that holds
the row (``register_tiers`` says which are generated):

* registers (``_warp<G, PACKS>``): G lanes a row, 32 / G rows a warp, so rows
  of a few elements share a warp; each lane holds PACKS 128-bit vectors of
  the row, up to 32 x 8 of them (1024 floats, 2048 halves);
* shared memory (``_smem``): a block a row reads the row once into shared
  memory as float (``blockc_row_cache``), as far as the device's opt-in
  limit, which the launcher requests;
* a block a row (``_block``) reads longer rows from global memory again for
  each pass.

The first two read every length with vectors. A row of a length that is not
a multiple of the vector starts part-way into one, so no single choice of
columns is aligned in every row; taking vectors only where every row starts
aligned would leave all such lengths to scalar accesses. Instead each row is
cut where its own address says (``BlockcRowSplit`` in blockc_cuda.h) into a
scalar head, a vector body and a scalar tail: under two vectors' worth of
scalar accesses a row. x decides the cut; an operand whose row lies at
another phase (a residual that repeats, gamma and beta, which start at
column 0, an output elsewhere) is moved by scalar accesses for that row, the
rest still by vectors. Gamma and beta are read by every row, so their scalar
reads come from cache.

A causal softmax never loads a score (or mask entry) its query cannot see
(``ops/masking.causal_offset``): those columns are ``fill`` without a load,
and the vector its last visible key cuts is read by scalars up to that key.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....ir.dims import Dim
from ....ir.dtypes import DType
from ....ops.masking import causal_offset
from ..dtypes import FLOATS
from ..exprs import CExpr, float_literal
from ..family import KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, ctype, shape_class, suffix

# Register tiers, (lanes a row, vectors a lane), smallest first: groups below a
# warp with one vector a lane, then a warp with more.
REGISTER_TIERS = [(g, 1) for g in (1, 2, 4, 8, 16, 32)] + [(32, p) for p in (2, 4, 8)]


def register_tiers(cols: Dim, dtype: DType) -> tuple[list[tuple[int, int]], bool]:
    """The register tiers a row of ``cols`` elements can use, and whether it
    can need the block-a-row tiers: for a static length the one smallest tier
    that holds it, or none; for a symbolic length all of them. A tier of G
    lanes and PACKS vectors a lane holds rows of up to G * PACKS vectors in
    their body (``cols // vector width`` at most, however the row lies); the
    head and tail, under two vectors between them, go to each lane's edge
    registers. The launcher tests the same, ``cols / BlockcVec<T>::N <= G * PACKS``, in
    the same order."""
    if not isinstance(cols, int):
        return list(REGISTER_TIERS), True
    vw = 16 // dtype.itemsize
    fits = [(g, p) for g, p in REGISTER_TIERS if cols // vw <= g * p]
    return fits[:1], not fits


def _functions(warp_tiers: list, row_tiers: bool) -> tuple[str, ...]:
    return (("_warp",) if warp_tiers else ()) + (("_smem", "_block") if row_tiers else ())


def _launch(args: list[str]):
    return lambda name: f"{name}_launch({', '.join(args)}, stream);"


@dataclass(frozen=True)
class RowNorm:
    """A norm op's kernel: whether it adds a residual first (its second
    input), whether it centres the row and adds ``beta`` (LayerNorm) or not
    (RMSNorm), and its title in the kernel's comment."""

    residual: bool
    beta: bool
    title: str


def emit_row_norm(step: KernelStep) -> list[KernelCode]:
    node, ctx, labels = step.node, step.ctx, step.labels
    dtype = node.outputs[0].dtype
    norm = ROW_NORM.entry(node.op)
    residual, beta = norm.residual, norm.beta
    with_sum = bool(node.attrs.get("with_sum"))
    x = node.inputs[0]
    cols = x.shape[-1]
    args = [ctx.ptr(x)]
    if residual:
        r = node.inputs[1]
        core = list(r.shape)
        while core and core[0] == 1 and len(core) > 1:
            core.pop(0)
        if tuple(x.shape[len(x.shape) - len(core):]) != tuple(core):
            raise CudaCodegenError(f"{node.op}: residual {list(map(str, r.shape))} must be a trailing block of "
                                   f"the input {list(map(str, x.shape))}")
        args += [ctx.ptr(r), ctx.numel(core[:-1])]
        params = node.inputs[2:]
    else:
        params = node.inputs[1:]
    args += [ctx.ptr(p) for p in params]
    args += [ctx.ptr(o) for o in node.outputs]
    args += [ctx.numel(x.shape[:-1]), f"(int){ctx.dim(cols)}", float_literal(node.attrs["eps"])]
    warp_tiers, row_tiers = register_tiers(cols, dtype)
    name = f"{node.op}_{suffix(dtype)}_{shape_class(x.shape)}" + ("_sum" if with_sum else "")
    title = norm.title + (" (also writes the sum)" if with_sum else "")
    params = dict(title=title, cols_desc=f"length {cols}", T=ctype(dtype), residual=residual, beta=beta,
                  with_sum=with_sum, warp_tiers=warp_tiers, row_tiers=row_tiers)
    return [KernelCode(name, "row_norm.cu.j2", params, _launch(args), labels, [node.op],
                       _functions(warp_tiers, row_tiers))]


ROW_NORM = register(KernelFamily(
    "row_norm", "row norm", emit_row_norm, FLOATS, fused=True,
    entries={"layernorm": RowNorm(residual=False, beta=True, title="LayerNorm"),
             "rmsnorm": RowNorm(residual=False, beta=False, title="RMSNorm"),
             "add_layernorm": RowNorm(residual=True, beta=True, title="residual add + LayerNorm"),
             "add_rmsnorm": RowNorm(residual=True, beta=False, title="residual add + RMSNorm")}))


def _fold_batch_dims(shape: tuple, mshape: tuple) -> tuple[tuple, tuple]:
    """Scores ``shape`` and their mask's (same rank) with adjacent batch dims
    merged where the mask spans both or broadcasts over both: grouped-query
    attention's ``[b, kv_heads, group, q, k]`` with a ``[b, 1, 1, q, k]``
    mask is ``[b, kv_heads*group, q, k]`` with ``[b, 1, q, k]``."""
    if len(shape) < 4:
        return tuple(shape), tuple(mshape)
    dims, mdims = [shape[0]], [mshape[0]]
    for d, md in zip(shape[1:-2], mshape[1:-2]):
        if d == 1 or dims[-1] == 1 or (md == 1) == (mdims[-1] == 1):
            dims[-1], mdims[-1] = dims[-1] * d, mdims[-1] * md
        else:
            dims.append(d)
            mdims.append(md)
    return tuple(dims) + tuple(shape[-2:]), tuple(mdims) + tuple(mshape[-2:])


@dataclass(frozen=True)
class Softmax:
    """A softmax op's kernel: ``masked`` takes its scale, mask, causal flag
    and fill from the node (``masked_softmax``); a plain one (``softmax``)
    is over the axis its ``axis`` names, which must be the last."""

    masked: bool


PLAIN_SOFTMAX = {"mask": "none", "causal": False, "scale": 1.0, "fill": 0.0}


def emit_softmax(step: KernelStep) -> list[KernelCode]:
    node, ctx, labels = step.node, step.ctx, step.labels
    dtype = node.outputs[0].dtype
    masked = SOFTMAX.entry(node.op).masked
    x = node.inputs[0]
    shape = tuple(x.shape)
    if not masked and node.attrs["axis"] % len(shape) != len(shape) - 1:
        raise CudaCodegenError(f"{node.op} over axis {node.attrs['axis']} (not the last) has no CUDA kernel")
    attrs = node.attrs if masked else PLAIN_SOFTMAX
    mask_kind, causal = attrs["mask"], attrs["causal"]
    args = [ctx.ptr(x)]
    mask_t = "bool"
    if mask_kind != "none":
        # Only a mask needs the batch dims apart (it is indexed by them); rows are rows otherwise.
        m = node.inputs[1]
        mask_t = ctype(m.dtype)
        padded, mshape = _fold_batch_dims(shape, (1,) * (len(shape) - len(m.shape)) + tuple(m.shape))
        if len(padded) > 4:
            raise CudaCodegenError(f"{node.op}: rank {len(shape)} scores with a mask over {len(padded) - 2} "
                                   f"separate batch dims; the kernel takes at most 2")
        padded = (1,) * (4 - len(padded)) + padded
        mshape = (1,) * (4 - len(mshape)) + mshape
        strides, stride = [], "1LL"
        for d in reversed(mshape):
            strides.append("0LL" if d == 1 else stride)
            stride = ctx.dim(d) if stride == "1LL" else f"{stride} * {ctx.dim(d)}"
        strides.reverse()
        args += [ctx.ptr(m)] + [ctx.dim(d) for d in padded[:3]] + strides
    args += [ctx.ptr(node.outputs[0]), ctx.numel(shape[:-1]), f"(int){ctx.dim(shape[-1])}",
             ctx.dim(shape[-2]) if len(shape) >= 2 else "1LL",
             float_literal(attrs["scale"]), float_literal(attrs["fill"])]
    warp_tiers, row_tiers = register_tiers(shape[-1], dtype)
    flavour = "".join(["_causal" if causal else "", "" if mask_kind == "none" else f"_{mask_kind}"])
    name = f"{node.op}{flavour}_{suffix(dtype)}_{shape_class(shape)}"
    title = "softmax" if not masked else \
        f"scale + {'no mask' if mask_kind == 'none' else mask_kind + ' mask'}{' + causal mask' if causal else ''} + softmax"
    params = dict(title=title, T=ctype(dtype), MT=mask_t, mask=mask_kind, causal=causal,
                  # the last key a row's query sees (ops/masking.py); the query is row % q_len
                  causal_limit=CExpr("row % q_len") + causal_offset(CExpr("q_len"), CExpr("cols")),
                  warp_tiers=warp_tiers, row_tiers=row_tiers)
    return [KernelCode(name, "row_softmax.cu.j2", params, _launch(args), labels, [node.op],
                       _functions(warp_tiers, row_tiers))]


SOFTMAX = register(KernelFamily("softmax", "softmax", emit_softmax, FLOATS, fused=True,
                                entries={"softmax": Softmax(masked=False), "masked_softmax": Softmax(masked=True)}))
