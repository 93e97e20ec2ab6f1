"""Running sums along one axis in one kernel (the ``cumsum`` op).

Hugging Face's masking code finds packed sequences with a cumsum over the
positions, so every export without an attention mask holds one. Decomposed,
it is a ``[n, n]`` triangle and a ``reduce_sum``: O(n^2) work and a
reduction the CUDA backend has no kernel for. Here one thread walks one
line along the axis (every other axis fixed), keeping the sum so far in the
dtype's compute type (``dtypes.py``: float for the floats, 64-bit for the
integers), in the order and with the exclusion the op's attributes say.
The lines are the masks' short integer rows, so a thread each is enough.
"""
from __future__ import annotations

from ....ir.dtypes import DType
from ....ops._rules import norm_axis
from ..dtypes import ALL
from ..family import KernelFamily, KernelStep, register
from ..kernel import KernelCode, ctype, cuda_dtype, shape_class, suffix


def emit_scan(step: KernelStep) -> list[KernelCode]:
    node, ctx = step.node, step.ctx
    x, y = node.inputs[0], node.outputs[0]
    axis = norm_axis(node.op, node.attrs["axis"], len(x.shape))
    exclusive, reverse = node.attrs["exclusive"], node.attrs["reverse"]
    flags = ("_excl" if exclusive else "") + ("_rev" if reverse else "")
    name = f"cumsum{flags}_{suffix(y.dtype)}_{shape_class(x.shape)}"
    params = dict(T=ctype(y.dtype), C=cuda_dtype(y.dtype).compute, exclusive=exclusive, reverse=reverse,
                  title="running sum" + (", each before its own" if exclusive else "")
                  + (", from the end" if reverse else ""))
    args = [ctx.ptr(x), ctx.ptr(y), ctx.numel(x.shape[:axis]), ctx.dim(x.shape[axis]), ctx.numel(x.shape[axis + 1:])]
    return [KernelCode(name, "scan.cu.j2", params, lambda n: f"{n}_launch({', '.join(args)}, stream);", step.labels,
                       [node.op], ("",))]


SCAN = register(KernelFamily("scan", "running sum", emit_scan, ALL - {DType.bool}))
