"""Reductions over axes (``reduce_sum``, ``reduce_max``, ``reduce_mean``) in
one kernel each.

The reduced axes must be one run of adjacent axes (one axis, or ``[-2, -1]``):
the input is then ``[outer, n, inner]`` with the run as ``n``, and the output
``[outer, inner]`` whether the axes are kept (as 1s) or not. Values are
accumulated in the dtype's compute type (``dtypes.py``: float for the floats,
64-bit for the integers) and narrowed once, at the store.

* The run is last (``inner`` is 1): each output is a contiguous row of n.
  A warp a row (``_warp``: lanes read consecutive elements, so loads are
  coalesced, then shuffles), or a block a row where rows are long
  (``_block``: shuffles in each warp, shared memory across them).
* Otherwise (``_strided``): a block of 32 x 8 threads takes 32 adjacent
  outputs of one outer index; a row of the block reads 32 adjacent elements
  (coalesced along ``inner``), its 8 rows split the run, and a tree in
  shared memory joins them.

Axes that are not adjacent (``[0, 2]``) are refused at lowering.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....ir.dtypes import DType
from ....ops._rules import norm_axis
from ..dtypes import ALL
from ..family import KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, ctype, cuda_dtype, shape_class, static_int, suffix

# The smallest long long, written so that no header has to define LLONG_MIN.
_LOWEST_INTEGER = "(-0x7fffffffffffffffLL - 1)"


@dataclass(frozen=True)
class Reduction:
    """A reduction op's kernel: how two partial results join (a functor of
    blockc_cuda.h), the result of nothing, and the result from the
    accumulator (``{acc}``) and the run's length ``n``."""

    title: str
    combine: str
    float_identity: str
    integer_identity: str
    finish: str = "{acc}"


def reduced_run(step: KernelStep) -> tuple[int, int]:
    """The first and last of the node's axes, which must be adjacent: the
    kernel reads ``[outer, n, inner]``."""
    node = step.node
    shape = node.inputs[0].shape
    run = sorted({norm_axis(node.op, a, len(shape)) for a in node.attrs["axes"]})
    if run != list(range(run[0], run[-1] + 1)):
        raise CudaCodegenError(f"node {' '.join(step.labels)} ({node.op}): axes {list(node.attrs['axes'])} of a "
                               f"[{', '.join(map(str, shape))}] tensor are not adjacent; the CUDA backend "
                               f"reduces one run of adjacent axes")
    return run[0], run[-1]


def emit_reduce(step: KernelStep) -> list[KernelCode]:
    node, ctx = step.node, step.ctx
    x, y = node.inputs[0], node.outputs[0]
    reduction = REDUCE.entry(node.op)
    first, last = reduced_run(step)
    contiguous = all(static_int(d) == 1 for d in x.shape[last + 1:])
    compute = cuda_dtype(y.dtype).compute
    identity = reduction.float_identity if y.dtype.is_float else reduction.integer_identity
    layout = "last" if contiguous else "strided"
    name = f"{node.op}_{layout}_{suffix(y.dtype)}_{shape_class(x.shape)}"
    params = dict(title=f"{reduction.title} over {'the last axes' if contiguous else 'middle axes'}",
                  T=ctype(y.dtype), C=compute, op=reduction.combine, identity=f"({compute}){identity}",
                  result=reduction.finish.format(acc="acc"), contiguous=contiguous)
    sizes = [ctx.numel(x.shape[:first]), ctx.numel(x.shape[first:last + 1])]
    args = [ctx.ptr(x), ctx.ptr(y)] + sizes + ([] if contiguous else [ctx.numel(x.shape[last + 1:])])
    functions = ("_warp", "_block") if contiguous else ("_strided",)
    return [KernelCode(name, "reduce.cu.j2", params, lambda n: f"{n}_launch({', '.join(args)}, stream);",
                       step.labels, [node.op], functions)]


REDUCE = register(KernelFamily(
    "reduce", "reduction", emit_reduce, ALL - {DType.bool},
    entries={"reduce_sum": Reduction("sum", "BlockcSum", "0", "0"),
             "reduce_max": Reduction("max", "BlockcNanMax", "-INFINITY", _LOWEST_INTEGER),
             "reduce_mean": Reduction("mean", "BlockcSum", "0", "0", "{acc} / (float)n")}))
