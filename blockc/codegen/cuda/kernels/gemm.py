"""MatMul (and MatMul + bias + activation) as a tiled shared-memory GEMM.

The portable tiled kernel is what emulation runs and is selectable
everywhere (``--gemm tiled``). Operands whose batch dims are all 1 or
absent are shared by every batch (stride 0); a right operand that is a plain
matrix lets the left one's batch dims fold into M, one GEMM instead of many.
"""
from __future__ import annotations

from ....ir.dtypes import DType
from ....ir.graph import Node
from ....ops.fused import ACTIVATIONS
from ..exprs import expr
from ..kernel import SHORT, CudaCodegenError, KernelCode, LowerContext, c_comment, ctype, shape_class
from ..templates import render



def _activation(activation: str, dtype: DType) -> str:
    """The epilogue statement applying ``activation`` to ``v``: its op's own C expression."""
    if activation == "none":
        return ""
    op, attrs = ACTIVATIONS[activation]
    return f"v = {expr(op, attrs, ['v'], dtype)};"


CUDA_TYPES = {DType.float32: "CUDA_R_32F", DType.float16: "CUDA_R_16F", DType.bfloat16: "CUDA_R_16BF"}


def _cublas_batch(a, b, out, ctx):
    """(batches, a_stride, b_stride) when one cuBLAS strided batch covers the
    product, else None (a broadcast pattern one stride cannot express)."""
    ab, bb, ob = list(a.shape[:-2]), list(b.shape[:-2]), list(out.shape[:-2])
    if not bb:
        return "1LL", "0LL", "0LL"  # folded: B is a matrix, A's batch is in M
    batches = ctx.numel(ob)
    a_stride = "0LL" if all(d == 1 for d in ab) else (ctx.numel(a.shape[-2:]) if ab == ob else None)
    b_stride = "0LL" if all(d == 1 for d in bb) else (ctx.numel(b.shape[-2:]) if bb == ob else None)
    if a_stride is None or b_stride is None:
        return None
    return batches, a_stride, b_stride


def emit_gemm(node: Node, ctx: LowerContext, labels: list[str], gemm: str = "tiled") -> KernelCode:
    a, b = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    dtype = out.dtype
    if dtype not in (DType.float32, DType.float16, DType.bfloat16):
        raise CudaCodegenError(f"{node.op}: the CUDA backend generates float32, float16 and bfloat16, "
                               f"not {dtype.name}")
    bias = node.op == "matmul_bias_act"
    activation = node.attrs.get("activation", "none") if bias else "none"
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    out_batch = list(out.shape[:-2])
    if len(b.shape) == 2 and len(a.shape) > 2:
        # [.., M, K] @ [K, N]: fold the batch into M.
        M_expr = ctx.numel(a.shape[:-1])
        dims, a_strides, b_strides = ["1LL"] * 4, ["0LL"] * 4, ["0LL"] * 4
    else:
        if len(out_batch) > 4:
            raise CudaCodegenError(f"{node.op}: more than 4 batch dims")
        M_expr = ctx.dim(M)

        def strides(v):
            batch = list(v.shape[:-2])
            batch = [1] * (len(out_batch) - len(batch)) + batch
            step = ctx.numel(v.shape[-2:])
            out_s = []
            for d in reversed(batch):
                out_s.append("0LL" if d == 1 else step)
                step = f"{step} * {ctx.dim(d)}"
            return ["0LL"] * (4 - len(batch)) + list(reversed(out_s))

        dims = ["1LL"] * (4 - len(out_batch)) + [ctx.dim(d) for d in out_batch]
        a_strides, b_strides = strides(a), strides(b)
    name = f"{'gemm_bias_' + activation if bias else 'gemm'}_{SHORT[dtype]}_{shape_class(b.shape)}"
    epilogue = {"none": "the product", "relu": "ReLU(+bias)", "gelu": "GELU(+bias)",
                "gelu_tanh": "tanh-GELU(+bias)"}[activation] if bias else "the product"
    if gemm == "cublas" and _cublas_batch(a, b, out, ctx) is not None:
        batches, a_stride, b_stride = _cublas_batch(a, b, out, ctx)
        name = name.replace("gemm", "cublas_gemm", 1)
        source = render("gemm_cublas.cu.j2", name=name, T=ctype(dtype), nodes=c_comment(" ".join(labels)),
                        bias=bias, activation=_activation(activation, dtype), epilogue_desc=epilogue,
                        cuda_type=CUDA_TYPES[dtype])
        args = [ctx.ptr(a), ctx.ptr(b)] + ([ctx.ptr(node.inputs[2])] if bias else []) + \
            [ctx.ptr(out), M_expr, ctx.dim(N), ctx.dim(K), batches, a_stride, b_stride]
        return KernelCode(name, source, f"if ({name}_launch({', '.join(args)}, stream)) return 1;", labels,
                          [node.op], [f"{name}_epilogue"] if bias else [])
    source = render("gemm_tiled.cu.j2", name=name, T=ctype(dtype), nodes=c_comment(" ".join(labels)),
                    bias=bias, activation=_activation(activation, dtype), epilogue_desc=epilogue)
    batch = (f"{name}_batch{{{{{', '.join(dims)}}}, {{{', '.join(a_strides)}}}, "
             f"{{{', '.join(b_strides)}}}}}")
    args = [ctx.ptr(a), ctx.ptr(b)] + ([ctx.ptr(node.inputs[2])] if bias else []) + \
        [ctx.ptr(out), M_expr, ctx.dim(N), ctx.dim(K), batch]
    return KernelCode(name, source, f"{name}_launch({', '.join(args)}, stream);", labels, [node.op],
                      [f"{name}_kernel"])
