"""Neural-network ops with a ``decompose`` rule into primitive math:
softmax, gelu, layernorm, rmsnorm, plus causal_mask."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from ..ir.dtypes import DType
from ..ir.types import TensorType
from ._rules import elementwise, fmt, norm_axis
from .masking import causal_mask_array, causal_offset
from .registry import DIM, FLOAT, INT, REQUIRED, STR, define

# ---- softmax -----------------------------------------------------------------
softmax = define("softmax", ("x",), attrs={"axis": (INT, -1)}, doc="exp(x - max) / sum(exp(x - max)) along axis",
                 cuda="softmax", flops=5)


@softmax.infer
def _(types, attrs):
    norm_axis("softmax", attrs["axis"], types[0].rank)
    return elementwise("softmax", types, floats=True)


@softmax.numpy
def _(xs, attrs, env):
    x = xs[0]
    e = np.exp(x - x.max(axis=attrs["axis"], keepdims=True))
    return e / e.sum(axis=attrs["axis"], keepdims=True)


softmax.onnx(lambda e, node, ins: [e.emit("Softmax", ins, axis=node.attrs["axis"])])
softmax.torch(lambda b, node, xs: b.call(b.torch.softmax, xs[0], node.attrs["axis"]))


@softmax.decompose
def _(b, node, ins):
    (x,), axes = ins, [node.attrs["axis"]]
    m = b.op("reduce_max", x, axes=axes)
    ex = b.op("exp", b.op("sub", x, m))
    return [b.op("div", ex, b.op("reduce_sum", ex, axes=axes))]


# ---- gelu --------------------------------------------------------------------
gelu = define("gelu", ("x",), attrs={"approximate": (STR, "none")},
              doc="x * Phi(x); approximate='tanh' is GPT-2's form", cuda="elementwise", flops=8,
              cuda_expr=lambda attrs, args, dtype: (f"blockc_gelu_tanh({args[0]})" if attrs["approximate"] == "tanh"
                                                    else f"blockc_gelu_erf({args[0]})"))


@gelu.infer
def _(types, attrs):
    if attrs["approximate"] not in ("none", "tanh"):
        raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', got {attrs['approximate']!r}")
    return elementwise("gelu", types, floats=True)


_K_TANH = math.sqrt(2.0 / math.pi)


@gelu.numpy
def _(xs, attrs, env):
    x = xs[0]
    one, half = np.ones((), x.dtype), np.array(0.5, x.dtype)
    if attrs["approximate"] == "tanh":
        inner = np.array(_K_TANH, x.dtype) * (x + np.array(0.044715, x.dtype) * x * x * x)
        return half * x * (one + np.tanh(inner))
    import scipy.special   # here, not at the top: importing it was a third of every command's start
    return half * x * (one + scipy.special.erf(x / np.array(math.sqrt(2.0), x.dtype)))


gelu.onnx(lambda e, node, ins: [e.emit("Gelu", ins, approximate=node.attrs["approximate"])])
gelu.torch(lambda b, node, xs: b.call(b.F.gelu, xs[0], approximate=node.attrs["approximate"]))


@gelu.decompose
def _(b, node, ins):
    (x,) = ins
    c = lambda v: b.const(v, x.dtype)  # noqa: E731
    if node.attrs["approximate"] == "tanh":
        cube = b.op("mul", b.op("mul", x, x), x)
        inner = b.op("mul", c(_K_TANH), b.op("add", x, b.op("mul", c(0.044715), cube)))
        phi2 = b.op("add", c(1.0), b.op("tanh", inner))
    else:
        phi2 = b.op("add", c(1.0), b.op("erf", b.op("div", x, c(math.sqrt(2.0)))))
    return [b.op("mul", b.op("mul", c(0.5), x), phi2)]


# ---- layernorm / rmsnorm --------------------------------------------------------
def _norm_infer(name, types):
    x, params = types[0], types[1:]
    if not x.dtype.is_float:
        raise ShapeError(f"{name}: needs a floating-point tensor, got {x.dtype.name}")
    for p in params:
        if p.dtype != x.dtype or p.shape != x.shape[-1:]:
            raise ShapeError(f"{name}: scale/bias must be {x.dtype.short}{fmt(x.shape[-1:])} "
                             f"for input {x}, got {p}")
    return x


layernorm = define("layernorm", ("x", "gamma", "beta"), attrs={"eps": (FLOAT, 1e-5)},
                   doc="gamma * (x - mean) / sqrt(var + eps) + beta over the last axis", cuda="row_norm", flops=7)
layernorm.infer(lambda types, attrs: _norm_infer("layernorm", types))


def layernorm_numpy(x, g, b, eps: float):
    """LayerNorm over the last axis, in ``x``'s dtype: the meaning ``add_layernorm`` shares."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / np.sqrt(var + np.array(eps, x.dtype)) * g + b


layernorm.numpy(lambda xs, attrs, env: layernorm_numpy(*xs, attrs["eps"]))


layernorm.onnx(lambda e, node, ins: [e.emit("LayerNormalization", ins, axis=-1, epsilon=node.attrs["eps"])])


def torch_layernorm(b, node, xs):
    x, gamma, beta = xs
    return b.call(b.F.layer_norm, x, (b.dim(node.inputs[0].shape[-1]),), gamma, beta, node.attrs["eps"])


layernorm.torch(torch_layernorm)


@layernorm.decompose
def _(b, node, ins):
    x, gamma, beta = ins
    mu = b.op("reduce_mean", x, axes=[-1])
    xc = b.op("sub", x, mu)
    var = b.op("reduce_mean", b.op("mul", xc, xc), axes=[-1])
    sigma = b.op("sqrt", b.op("add", var, b.const(node.attrs["eps"], x.dtype)))
    return [b.op("add", b.op("mul", b.op("div", xc, sigma), gamma), beta)]


rmsnorm = define("rmsnorm", ("x", "gamma"), attrs={"eps": (FLOAT, 1e-6)},
                 doc="gamma * x / sqrt(mean(x^2) + eps) over the last axis", cuda="row_norm", flops=4)
rmsnorm.infer(lambda types, attrs: _norm_infer("rmsnorm", types))


def rmsnorm_numpy(x, g, eps: float):
    """RMSNorm over the last axis, in ``x``'s dtype: the meaning ``add_rmsnorm`` shares."""
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x / np.sqrt(ms + np.array(eps, x.dtype)) * g


rmsnorm.numpy(lambda xs, attrs, env: rmsnorm_numpy(*xs, attrs["eps"]))


def torch_rmsnorm(b, node, xs):
    x, gamma = xs
    return b.call(b.F.rms_norm, x, (b.dim(node.inputs[0].shape[-1]),), gamma, node.attrs["eps"])


rmsnorm.torch(torch_rmsnorm)


# No onnx rule below opset 23: the exporter lowers rmsnorm through this.
@rmsnorm.decompose
def _(b, node, ins):
    x, gamma = ins
    ms = b.op("reduce_mean", b.op("mul", x, x), axes=[-1])
    rms = b.op("sqrt", b.op("add", ms, b.const(node.attrs["eps"], x.dtype)))
    return [b.op("mul", b.op("div", x, rms), gamma)]


# ---- causal mask -----------------------------------------------------------------
causal_mask = define("causal_mask", (), attrs={"rows": (DIM, REQUIRED), "cols": (DIM, REQUIRED)},
                     doc="bool[rows,cols], true where key j may be seen by query i: j <= i + (cols - rows)",
                     cuda="inline", flops=0)


@causal_mask.infer
def _(types, attrs):
    return TensorType(DType.bool, (attrs["rows"], attrs["cols"]))


@causal_mask.numpy
def _(xs, attrs, env):
    return causal_mask_array(*env.eval_dims([attrs["rows"], attrs["cols"]]))


def emit_causal_mask(e, rows, cols) -> str:
    """The ONNX nodes of ``causal_mask`` for dims ``rows``, ``cols`` (also used
    by the fused attention forms that fold the causal mask into a bias)."""
    # Range/compare rather than Trilu: ONNX Runtime's CPU Trilu has no bool kernel.
    offset = e.scalar_dim(causal_offset(rows, cols))
    zero, one = e.const(np.array(0, np.int64)), e.const(np.array(1, np.int64))
    i = e.emit("Unsqueeze", [e.emit("Range", [zero, e.scalar_dim(rows), one]), e.const(np.array([1], np.int64))])
    j = e.emit("Range", [zero, e.scalar_dim(cols), one])
    return e.emit("LessOrEqual", [j, e.emit("Add", [i, offset])])


causal_mask.onnx(lambda e, node, ins: [emit_causal_mask(e, node.attrs["rows"], node.attrs["cols"])])


def torch_causal_mask(b, rows, cols):
    """bool[rows, cols] in PyTorch: the lower triangle at the causal offset."""
    ones = b.call(b.torch.ones, b.dim(rows), b.dim(cols), dtype=b.torch.bool)
    return b.method("tril", ones, b.dim(causal_offset(rows, cols)))


causal_mask.torch(lambda b, node, xs: torch_causal_mask(b, node.attrs["rows"], node.attrs["cols"]))
