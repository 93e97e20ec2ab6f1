"""Attention as one flash-style kernel: softmax(mask(q kᵀ * scale)) v with
the scores never written, Q, K, V, the mask and the output read and written
through strides (``codegen/cuda/views.py`` folds the split, reshape and
transpose nodes around the op into them), grouped-query attention through
broadcast batch strides, and the causal key tiles past a query tile skipped.

Two variants share the per-row finish: a float32 SIMT kernel for any storage
type and head size up to ``MAX_HEAD_DIM`` (what the emulator runs), and for
float16/bfloat16 with head size 64 or 128 an ``mma.sync`` tensor-core kernel
the launcher picks on sm_80+ when every operand row is 16-byte aligned and
the model's ``BLOCKC_CUDA_TENSOR_CORES`` allows (the emulator runs it too,
through ``blockc_cuda.h``'s emulated ``mma.sync``, when that switch is 1).

A decode step (at most ``SIMT_ROWS`` query rows against a long key axis)
is split over the keys instead, as flash-decoding does: one block per batch
entry and run of key tiles keeps its rows' running sum, max and total in a
scratch buffer of the arena (``attention_scratch``), and a combine kernel
merges the runs and finishes each row. The launcher takes that path at run
time, where the rows fit one tile and the keys make at least two runs of two
tiles, so one graph serves its prefill and its decode shapes.
"""
from __future__ import annotations

from ....ir.dtypes import DType
from ....ir.graph import Node, Value
from ....ir.types import TensorType
from ....ops.masking import allowed_keys, apply_masks, causal_allowed, causal_offset
from ..dtypes import FLOATS
from ..exprs import CExpr, float_literal
from ..family import KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, LowerContext, ctype, suffix
from ..views import View, contiguous

# Head sizes the SIMT kernel takes (its K/V tile shrinks to fit 48 KiB of
# static shared memory), and those the tensor-core kernel is generated for.
MAX_HEAD_DIM = 256
MMA_HEAD_DIMS = {64: 64, 128: 32}   # head size -> keys per tile (Q, K, V tiles within 48 KiB)
SHARED_BYTES = 48 * 1024
SIMT_ROWS = 16       # the SIMT kernel's query tile (4 warps of 4 rows): a decode step's rows must fit one
MAX_SPLITS = 32      # runs of key tiles a decode step is cut into, at most (the scratch holds this many)


def _simt_key_tile(dk: int, dv: int) -> int:
    for bk in (32, 16, 8):
        if 4 * (16 * dk + bk * (dk + 1) + bk * dv + 4 * bk) <= SHARED_BYTES:
            return bk
    raise AssertionError("MAX_HEAD_DIM keeps the tiles in shared memory")


def _may_split(q_len, k_len, bk: int) -> bool:
    """Whether some run of this attention may take the split (decode) path:
    its rows may fit one query tile and its keys make four tiles or more."""
    return (not isinstance(q_len, int) or q_len <= SIMT_ROWS) and (not isinstance(k_len, int) or k_len > 3 * bk)


def attention_scratch(node: Node) -> TensorType | None:
    """The arena scratch a decode-split run of ``node`` writes its partial
    rows to (``[batch dims..., MAX_SPLITS, SIMT_ROWS, dv + _part_tail]`` float32:
    each row's unnormalised sum, max and total, and for a guard its flag),
    or None where no run can split."""
    q, k, v = node.inputs[:3]
    dk, dv = q.shape[-1], v.shape[-1]
    if not (isinstance(dk, int) and isinstance(dv, int) and 0 < dk <= MAX_HEAD_DIM and 0 < dv <= MAX_HEAD_DIM):
        return None   # emit_attention refuses it by name
    if not _may_split(q.shape[-2], k.shape[-2], _simt_key_tile(dk, dv)):
        return None
    width = dv + _part_tail(_allowed(node.attrs))
    return TensorType(DType.float32, tuple(node.outputs[0].shape[:-2]) + (MAX_SPLITS, SIMT_ROWS, width))


def _part_tail(allowed: str | None) -> int:
    """Floats a split run keeps per row after its sum over the values: max
    and total, and where a guard reads the mask, whether the row saw an allowed key."""
    return 2 + (allowed is not None)


def _mask_loads(attrs) -> list[CExpr]:
    loads = {"additive": "blockc_to_compute(mrow[key * m_col])", "bool": "mrow[key * m_col]"}
    return [CExpr(loads[attrs["mask"]])] if attrs["mask"] in loads else []


def _causal() -> CExpr:
    return causal_allowed(CExpr("row"), CExpr("key"), CExpr("q_len"), CExpr("k_len"))


def _score(attrs) -> str:
    """The C expression of one masked score, from the one rule every target uses."""
    # The scale is a run-time argument: layers that differ only in scale share a kernel.
    return str(apply_masks(CExpr("s"), _mask_loads(attrs), attrs, mul=lambda x, _: CExpr(f"({x} * scale)"),
                           add=lambda x, m: CExpr(f"({x} + {m})"), where=lambda c, x, f: CExpr(f"({c} ? {x} : {f})"),
                           fill=CExpr("fill"), causal=_causal))


def _allowed(attrs) -> str | None:
    """The C test of whether query ``row`` may attend ``key``, which a guarded
    kernel's guard reads (the rule of ``masking.guard_rows``), or None where
    nothing is guarded: not ``guarded``, or no key forbidden."""
    if not attrs["guarded"]:
        return None
    allowed = allowed_keys(_mask_loads(attrs), attrs, logical_and=lambda a, b: CExpr(f"({a} && {b})"),
                           causal=_causal)
    return None if allowed is None else str(allowed)


def _batch_strides(view: View, value: Value, batch: int) -> list:
    """Per batch dim of the output (padded to 4): the operand's stride, or 0 where it broadcasts."""
    shape = (1,) * (batch - (len(value.shape) - 2)) + tuple(value.shape[:-2])
    strides = (0,) * (batch - (len(view.strides) - 2)) + tuple(view.strides[:-2])
    return [0] * (4 - batch) + [0 if d == 1 else s for d, s in zip(shape, strides)]


def emit_attention(step: KernelStep) -> list[KernelCode]:
    node, ctx, labels = step.node, step.ctx, step.labels
    q, k, v = node.inputs[:3]
    out = node.outputs[0]
    dtype = out.dtype
    dk, dv = q.shape[-1], v.shape[-1]
    if not (isinstance(dk, int) and isinstance(dv, int) and 0 < dk <= MAX_HEAD_DIM and 0 < dv <= MAX_HEAD_DIM):
        raise CudaCodegenError(f"attention: head size {dk} (q, k) / {dv} (v): the CUDA attention kernel takes fixed "
                               f"head sizes up to {MAX_HEAD_DIM}")
    batch = len(out.shape) - 2
    if batch > 4:
        raise CudaCodegenError(f"attention: {batch} batch dims; the CUDA attention kernel takes at most 4")
    views = {id(x): ctx.view(x) or contiguous(x) for x in (q, k, v, out)}
    dims = ["1LL"] * (4 - batch) + [ctx.dim(d) for d in out.shape[:-2]]
    fields = {"dims": dims}
    for key, x in zip("qkvo", (q, k, v, out)):
        fields[key] = [ctx.dim(s) for s in _batch_strides(views[id(x)], x, batch)]
    rows = [ctx.dim(views[id(x)].strides[-2]) for x in (q, k, v, out)]
    attrs = node.attrs
    mask_kind = attrs["mask"]
    mask_t, mask_args = "bool", []
    if mask_kind != "none":
        m = node.inputs[3]
        mview = ctx.view(m) or contiguous(m)
        mshape = (1,) * (len(out.shape) - len(m.shape)) + tuple(m.shape)
        mstrides = (0,) * (len(out.shape) - len(m.shape)) + tuple(mview.strides)
        fields["m"] = [ctx.dim(s) for s in _batch_strides(View(m, 0, mshape, mstrides), m, batch)]
        rows += [ctx.dim(0 if d == 1 else s) for d, s in zip(mshape[-2:], mstrides[-2:])]
        mask_t = ctype(m.dtype)
        mask_args = [_pointer(ctx, mview)]
    else:
        fields["m"] = ["0LL"] * 4
        rows += ["0LL", "0LL"]
    mma = dtype != DType.float32 and dk == dv and dk in MMA_HEAD_DIMS
    part = ctx.scratch(node)
    flavour = "".join(["_causal" if attrs["causal"] else "", "" if mask_kind == "none" else f"_{mask_kind}",
                       "_guarded" if attrs["guarded"] else ""])
    # "_decode": this one also has the split (decode) path, so a different body
    name = f"attention{flavour}_{suffix(dtype)}_{dk}" + ("" if dv == dk else f"_{dv}") + ("_decode" if part else "")
    title = (f"attention, scale + {'no mask' if mask_kind == 'none' else mask_kind + ' mask'}"
             f"{' + causal mask' if attrs['causal'] else ''}{', rows with no key zero' if attrs['guarded'] else ''}"
             f", head size {dk}")
    allowed = _allowed(attrs)
    params = dict(title=title, T=ctype(dtype), MT=mask_t, mask=mask_kind, causal=attrs["causal"],
                  allowed=allowed, part_tail=_part_tail(allowed), dk=dk, dv=dv,
                  nv=(dv + 31) // 32, simt_bk=_simt_key_tile(dk, dv), mma=mma, mma_bk=MMA_HEAD_DIMS.get(dk),
                  bq=SIMT_ROWS, split=part is not None, max_splits=MAX_SPLITS,
                  score=_score(attrs),
                  causal_end=CExpr("last") + causal_offset(CExpr("q_len"), CExpr("k_len")) + 1)
    layout = (f"_layout{{{{{', '.join(fields['dims'])}}}, "
              + ", ".join("{" + ", ".join(fields[key]) + "}" for key in "qkvom")
              + f", {', '.join(rows)}}}")
    args = [_pointer(ctx, views[id(x)]) for x in (q, k, v)] + mask_args + [
        _pointer(ctx, views[id(out)]), ctx.dim(q.shape[-2]), ctx.dim(k.shape[-2]),
        float_literal(attrs["scale"]), float_literal(attrs["fill"])]

    def launch(name: str) -> str:
        # the model's BLOCKC_CUDA_TENSOR_CORES switch (host.cu.j2) picks the variant at run time
        return f"{name}_launch({', '.join(args + [name + layout, part or 'nullptr'])}, m->tensor_cores, stream);"

    return [KernelCode(name, "attention.cu.j2", params, launch, labels, [node.op],
                       ("_simt",) + (("_mma",) if mma else ()) + (("_split", "_combine") if part is not None else ()))]


ATTENTION = register(KernelFamily("attention", "attention", emit_attention, FLOATS, fused=True,
                                  scratch=attention_scratch))


def _pointer(ctx: LowerContext, view: View) -> str:
    base = ctx.ptr(view.base)
    return base if view.offset == 0 else f"({base} + {ctx.dim(view.offset)})"
