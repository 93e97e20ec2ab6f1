"""Row kernels: LayerNorm/RMSNorm (optionally with the residual add and its
sum) and softmax/masked softmax, over the last axis.

Each makes one pass over a row held in registers, one warp per row, with
128-bit loads when the row length allows and a scalar path otherwise; rows
too long for registers go to a block-per-row fallback. When the row length
is static only the variants it can use are generated; for a symbolic row
length (softmax over ``seq``) the launcher picks among register buckets at
run time.
"""
from __future__ import annotations

import math

from ....ir.dims import Dim
from ....ir.dtypes import DType
from ....ir.graph import Node
from ....ops.masking import causal_offset
from ..exprs import CExpr, float_literal
from ..kernel import SHORT, CudaCodegenError, KernelCode, LowerContext, c_comment, ctype, shape_class
from ..templates import render

# Register buckets: a row of up to 32*8 vectors (1024 floats) or 32*16 scalars
# is held in registers; longer rows go to the block-per-row kernels.
MAX_VEC_PACKS, MAX_SCALAR_PACKS = 8, 16


def _buckets(cols: Dim, dtype: DType) -> tuple[list[int], list[int]]:
    vw = 16 // dtype.itemsize
    if isinstance(cols, int):
        vec = [math.ceil(cols / (32 * vw))] if cols % vw == 0 and cols <= 32 * vw * MAX_VEC_PACKS else []
        scalar = [math.ceil(cols / 32)] if cols <= 32 * MAX_SCALAR_PACKS else []
        return vec, scalar
    return [1, 2, 4, 8], [1, 2, 4, 8, 16]


def _float_dtype(node: Node) -> DType:
    dtype = node.outputs[0].dtype
    if dtype not in (DType.float32, DType.float16, DType.bfloat16):
        raise CudaCodegenError(f"{node.op}: the CUDA backend generates float32, float16 and bfloat16, "
                               f"not {dtype.name}")
    return dtype


def emit_row_norm(node: Node, ctx: LowerContext, labels: list[str]) -> KernelCode:
    dtype = _float_dtype(node)
    residual = node.op.startswith("add_")
    beta = node.op.endswith("layernorm")
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
    vec_packs, scalar_packs = _buckets(cols, dtype)
    name = f"{node.op}_{SHORT[dtype]}_{shape_class(x.shape)}" + ("_sum" if with_sum else "")
    title = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "add_layernorm": "residual add + LayerNorm",
             "add_rmsnorm": "residual add + RMSNorm"}[node.op] + (" (also writes the sum)" if with_sum else "")
    source = render("row_norm.cu.j2", name=name, title=title, cols_desc=f"length {cols}", T=ctype(dtype),
                    nodes=c_comment(" ".join(labels)), residual=residual, beta=beta, with_sum=with_sum,
                    vec_packs=vec_packs, scalar_packs=scalar_packs)
    return KernelCode(name, source, f"{name}_launch({', '.join(args)}, stream);", labels, [node.op],
                      [f"{name}_warp", f"{name}_block"])


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


def emit_softmax(node: Node, ctx: LowerContext, labels: list[str]) -> KernelCode:
    dtype = _float_dtype(node)
    x = node.inputs[0]
    shape = tuple(x.shape)
    if node.op == "softmax" and node.attrs["axis"] % len(shape) != len(shape) - 1:
        raise CudaCodegenError(f"softmax over axis {node.attrs['axis']} (not the last) has no CUDA kernel")
    attrs = node.attrs if node.op == "masked_softmax" else {"mask": "none", "causal": False, "scale": 1.0,
                                                               "fill": 0.0}
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
    vec_packs, scalar_packs = _buckets(shape[-1], dtype)
    flavour = "".join(["_causal" if causal else "", "" if mask_kind == "none" else f"_{mask_kind}"])
    name = f"{node.op}{flavour}_{SHORT[dtype]}_{shape_class(shape)}"
    title = "softmax" if node.op == "softmax" else \
        f"scale + {'no mask' if mask_kind == 'none' else mask_kind + ' mask'}{' + causal mask' if causal else ''} + softmax"
    source = render("row_softmax.cu.j2", name=name, title=title, T=ctype(dtype), MT=mask_t,
                    nodes=c_comment(" ".join(labels)), mask=mask_kind, causal=causal,
                    # the last key a row's query sees (ops/masking.py); the query is row % q_len
                    causal_limit=CExpr("row % q_len") + causal_offset(CExpr("q_len"), CExpr("cols")),
                    vec_packs=vec_packs, scalar_packs=scalar_packs)
    return KernelCode(name, source, f"{name}_launch({', '.join(args)}, stream);", labels, [node.op],
                      [f"{name}_warp", f"{name}_block"])
