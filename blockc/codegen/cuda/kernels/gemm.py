"""MatMul (and MatMul + bias + activation + residual) as one GEMM launch.

Two implementations, chosen per build (``GemmChoice``):

* ``cublas`` -- cuBLASLt (``cublasLtMatmul``), the default on a GPU: fp16 and
  bf16 on tensor cores with float32 accumulation, float32 in plain float32
  (TF32 tensor cores only with ``tf32=True``); the bias and the
  activations cuBLASLt has (``Activation.epilogue``) in its epilogue, others
  in one pass over the output after it, a residual through ``beta = 1``,
  batches as strided batches. Each call site keeps its own plan (layouts, algorithm) in the
  model object, remade when the shape changes.
* ``tiled`` -- a portable shared-memory SIMT kernel with the same epilogue;
  what emulation runs, and the fallback where one strided batch cannot
  express an operand's broadcasting.

Operands whose batch dims are all 1 or absent are shared by every batch
(stride 0); a right operand that is a plain matrix lets the left one's batch
dims fold into M, one GEMM instead of many.

``epilogue_nodes`` is the rule by which the lowering lets a GEMM absorb what
follows it (a bias ``[N]`` and an activation, or a residual of the output's
shape), so no separate bias kernel is launched.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....ir.dtypes import DType
from ....ir.graph import Node, Value
from ....ops.activations import ACTIVATIONS, activation_of
from ..dtypes import CUDA_DTYPES
from ..exprs import expr, is_inline
from ..family import KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, ctype, shape_class, suffix
from ..templates import render

GEMMS = ("cublas", "tiled")
GPU_GEMM = "cublas"      # what a GPU build uses unless told otherwise
EMULATED_GEMM = "tiled"  # the only one the emulator can run (it has no cuBLAS)


@dataclass(frozen=True)
class GemmChoice:
    """How a build computes its GEMMs: ``kind`` (``GEMMS``) and, for cuBLAS,
    whether float32 GEMMs may use TF32 tensor cores."""

    kind: str = EMULATED_GEMM
    tf32: bool = False

    def __post_init__(self):
        if self.kind not in GEMMS:
            raise CudaCodegenError(f"unknown gemm {self.kind!r}: use {' or '.join(GEMMS)}")
        if self.tf32 and self.kind != "cublas":
            raise CudaCodegenError("tf32 needs --gemm cublas: the tiled kernel computes in float32")


@dataclass(frozen=True)
class Gemm:
    """A GEMM op's kernel: ``bias`` when the op carries its bias and
    activation (``matmul_bias_act``: inputs a, b, bias; attribute ``activation``)."""

    bias: bool


@dataclass
class Epilogue:
    """What a GEMM step computes after the product: ``act(A B + bias) + residual``."""

    bias: Value | None = None
    activation: str = "none"
    residual: Value | None = None

    def describe(self) -> str:
        text = "A B" + (" + bias" if self.bias is not None else "")
        if self.activation != "none":
            text = f"{ACTIVATIONS[self.activation].title}({text})"
        return text + (" + residual" if self.residual is not None else "")


def _operand(v: Value, other: Value, gemm_out: Value) -> Value | None:
    """The add's other operand when it can be read from memory by the GEMM."""
    if v is other or other.dtype != gemm_out.dtype or is_inline(other):
        return None
    return other


def epilogue_nodes(gemm: Node, runtime: set[int], outputs: set[int]) -> list[Node]:
    """The nodes after ``gemm`` that its launch can compute, in order: a bias
    add (a ``[N]`` vector) where it has none, then an activation
    (``ACTIVATIONS``) on the biased sum, or a residual add (a tensor of the
    output's shape) where nothing is applied after the sum -- what both the
    tiled kernel and cuBLASLt (``act(A B + C + bias)``) compute. Each absorbed
    value must have the next node as its only use and be no graph output (it
    is never written). ``runtime``: the ids of the nodes run at run time."""
    out = gemm.outputs[0]
    has_bias = GEMM.entry(gemm.op).bias
    activation = gemm.attrs.get("activation", "none") if has_bias else "none"
    has_residual, v, nodes = False, out, []
    while len(v.uses) == 1 and id(v) not in outputs and activation == "none":
        user = v.uses[0][0]
        if id(user) not in runtime or user.outputs[0].shape != out.shape or user.outputs[0].dtype != out.dtype:
            break
        if user.op == "add":
            other = _operand(v, user.inputs[1] if user.inputs[0] is v else user.inputs[0], out)
            if other is None:
                break
            if not has_bias and tuple(other.shape) == (out.shape[-1],):
                has_bias = True
            elif not has_residual and other.shape == out.shape:
                has_residual = True
            else:
                break
        elif has_bias and not has_residual and activation_of(user):
            activation = activation_of(user).name
        else:
            break
        nodes.append(user)
        v = user.outputs[0]
    return nodes


def _epilogue(nodes: list[Node]) -> Epilogue:
    gemm = nodes[0]
    ep = Epilogue()
    if GEMM.entry(gemm.op).bias:
        ep.bias, ep.activation = gemm.inputs[2], gemm.attrs.get("activation", "none")
    v = gemm.outputs[0]
    for m in nodes[1:]:
        if m.op != "add":
            ep.activation = activation_of(m).name
        else:
            other = m.inputs[1] if m.inputs[0] is v else m.inputs[0]
            if ep.bias is None and tuple(other.shape) == (gemm.outputs[0].shape[-1],):
                ep.bias = other
            else:
                ep.residual = other
        v = m.outputs[0]
    return ep


def _activation(activation: str, dtype: DType) -> str:
    """The epilogue statement applying ``activation`` to ``v``: its op's own C expression."""
    if activation == "none":
        return ""
    act = ACTIVATIONS[activation]
    return f"v = {expr(act.op, dict(act.attrs), ['v'], dtype)};"


def _lt_epilogue(ep: Epilogue, dtype: DType) -> tuple[str, str]:
    """cuBLASLt's epilogue for ``ep``, and the statement of the pass over the
    output after it: for an activation cuBLASLt lacks (erf-GELU: its GELU
    epilogue is the tanh form), the bias epilogue, then the activation."""
    if ep.bias is None:
        return "CUBLASLT_EPILOGUE_DEFAULT", ""
    act = ACTIVATIONS.get(ep.activation)
    if act is None or act.epilogue is None:
        return "CUBLASLT_EPILOGUE_BIAS", _activation(ep.activation, dtype)
    return act.epilogue, ""


def _cublas_batch(a, b, out, ctx):
    """(batches, a_stride, b_stride) when one strided batch covers the
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


def gemm_runtime(choice: GemmChoice, sites: int) -> str:
    """What the host code needs once for ``sites`` cuBLASLt call sites (the
    per-model state and the one matmul helper), or nothing."""
    if choice.kind != "cublas" or not sites:
        return ""
    return render("gemm_cublaslt_runtime.cu.j2", sites=sites)


def emit_gemm(step: KernelStep) -> list[KernelCode]:
    """One GEMM step: ``nodes[0]`` a ``matmul``/``matmul_bias_act``, then the
    adds ``epilogue_nodes`` let it absorb."""
    nodes, ctx, labels, choice = step.nodes, step.ctx, step.labels, step.gemm
    node = nodes[0]
    a, b = node.inputs[0], node.inputs[1]
    out = nodes[-1].outputs[0]
    dtype = out.dtype
    ep = _epilogue(nodes)
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
    parts = ["gemm"] + (["bias"] if ep.bias is not None else []) + \
        ([ep.activation] if ep.activation != "none" else []) + (["res"] if ep.residual is not None else [])
    name = f"{'_'.join(parts)}_{suffix(dtype)}_{shape_class(b.shape)}"
    T = ctype(dtype)
    operands = [ctx.ptr(a), ctx.ptr(b)] + ([ctx.ptr(ep.bias)] if ep.bias is not None else []) + \
        ([ctx.ptr(ep.residual)] if ep.residual is not None else []) + [ctx.ptr(out)]
    common = dict(T=T, bias=ep.bias is not None, residual=ep.residual is not None, epilogue_desc=ep.describe())
    ops = [m.op for m in nodes]
    batch = _cublas_batch(a, b, out, ctx) if choice.kind == "cublas" else None
    if batch is not None:
        batches, a_stride, b_stride = batch
        name = "cublaslt_" + name + ("_tf32" if choice.tf32 and dtype == DType.float32 else "")
        compute = "CUBLAS_COMPUTE_32F_FAST_TF32" if choice.tf32 and dtype == DType.float32 else "CUBLAS_COMPUTE_32F"
        epilogue, after = _lt_epilogue(ep, dtype)
        params = dict(**common, cuda_type=CUDA_DTYPES[dtype].library, compute=compute, epilogue=epilogue,
                      after=after)
        args = ["&m->gemm", str(ctx.gemm_site())] + operands + [M_expr, ctx.dim(N), ctx.dim(K), batches,
                                                                 a_stride, b_stride]
        return [KernelCode(name, "gemm_cublaslt.cu.j2", params,
                           lambda n: f"if ({n}_launch({', '.join(args)}, stream)) return 1;", labels, ops,
                           ("_after",) if after else ())]
    params = dict(**common, activation=_activation(ep.activation, dtype))
    batch_arg = (f"_batch{{{{{', '.join(dims)}}}, {{{', '.join(a_strides)}}}, "
                 f"{{{', '.join(b_strides)}}}}}")
    args = operands + [M_expr, ctx.dim(N), ctx.dim(K)]
    return [KernelCode(name, "gemm_tiled.cu.j2", params,
                       lambda n: f"{n}_launch({', '.join(args + [n + batch_arg])}, stream);", labels, ops,
                       ("_kernel",))]


# float32, float16 and bfloat16: the dtypes cuBLASLt is given a cudaDataType for (the tiled kernel's too).
GEMM = register(KernelFamily("gemm", "GEMM", emit_gemm, frozenset(d for d, t in CUDA_DTYPES.items() if t.library),
                             entries={"matmul": Gemm(bias=False), "matmul_bias_act": Gemm(bias=True)}))
