"""The DSL's layer library: Linear, embeddings, norms, attention, FFN, blocks.

Conventions (documented in the README): ``Linear.weight`` is ``[in, out]``
and computes ``x @ W + b``, the form the transformer equations are written
in; boolean masks are ``True`` where attention is allowed (PyTorch's
``scaled_dot_product_attention`` convention); additive masks are added to the
scaled scores.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError, ShapeError, at_user_line
from ..ir.dims import Dim
from ..ir.dtypes import DType
from ..ops._rules import broadcast_shapes, fmt
from .module import Module, Parameter
from .tensor import Tensor, causal_mask, constant, gather, layer_norm, rms_norm, where

ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


class Linear(Module):
    """``y = x @ weight + bias`` with ``weight: [d_in, d_out]``."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, std: float = 0.02):
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        self.weight = Parameter((d_in, d_out), "normal", std)
        self.bias = Parameter((d_out,), "zeros") if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y


class Embedding(Module):
    """A lookup table ``weight: [num, dim]``; ``forward(ids)`` gathers rows."""

    def __init__(self, num: int, dim: int, std: float = 0.02):
        super().__init__()
        self.num, self.dim = num, dim
        self.weight = Parameter((num, dim), "normal", std)

    def forward(self, ids: Tensor) -> Tensor:
        return gather(self.weight, ids)


class LearnedPositionEmbedding(Module):
    """Learned absolute positions: rows ``[offset, offset+length)`` of a table."""

    def __init__(self, max_positions: int, dim: int, std: float = 0.01):
        super().__init__()
        self.max_positions = max_positions
        self.weight = Parameter((max_positions, dim), "normal", std)

    def forward(self, length: Dim, offset: Dim = 0) -> Tensor:
        return self.weight.slice(0, offset, offset + length)


def sinusoid_table(shape: tuple, rng=None) -> np.ndarray:
    """The fixed table of "Attention Is All You Need": sin on even, cos on odd columns."""
    positions, dim = shape
    pos = np.arange(positions, dtype=np.float64)[:, None]
    freq = np.exp(-math.log(10000.0) * (np.arange(0, dim, 2, dtype=np.float64) / dim))
    table = np.zeros(shape)
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq[: dim // 2])
    return table


class SinusoidalPositionEmbedding(LearnedPositionEmbedding):
    """Fixed sinusoidal positions; the table is a (non-random) parameter."""

    def __init__(self, max_positions: int, dim: int):
        Module.__init__(self)
        self.max_positions = max_positions
        self.weight = Parameter((max_positions, dim), sinusoid_table)


class LayerNorm(Module):
    """``gamma * (x - mean) / sqrt(var + eps) + beta`` over the last axis."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = Parameter((dim,), "ones")
        self.bias = Parameter((dim,), "zeros")

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    """``gamma * x / sqrt(mean(x^2) + eps)`` over the last axis."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = Parameter((dim,), "ones")

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def make_norm(kind: str, dim: int, eps: float) -> Module:
    if kind == "layernorm":
        return LayerNorm(dim, eps)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    raise ModelError(at_user_line(f"unknown norm {kind!r}: use layernorm or rmsnorm"))


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 causal: bool = False) -> Tensor:
    """``softmax(mask(q kᵀ / sqrt(d_k))) v`` over the last two axes.

    ``mask`` is boolean (True = may attend) or additive (added to the scaled
    scores); it must broadcast to the scores' shape ``[..., q_len, k_len]``.
    ``causal`` hides later keys; with ``k_len > q_len`` (a KV cache) query i
    sees keys ``j <= i + k_len - q_len``.
    """
    d_k = q.shape[-1]
    if not isinstance(d_k, int):
        raise ModelError(at_user_line(f"attention head size must be a static int, got {d_k}"))
    scores = (q @ k.T) * constant(1.0 / math.sqrt(d_k), q.dtype)
    if mask is not None:
        try:
            fits = broadcast_shapes("attention mask", mask.shape, scores.shape) == scores.shape
        except ShapeError:
            fits = False
        if not fits:
            raise ModelError(at_user_line(f"attention mask of shape {fmt(mask.shape)} does not broadcast to the "
                                          f"attention scores {fmt(scores.shape)}"))
        if mask.dtype == DType.bool:
            scores = where(mask, scores, q.dtype.lowest)
        elif mask.dtype == scores.dtype:
            scores = scores + mask
        else:
            raise ModelError(at_user_line(f"attention mask must be bool or {scores.dtype.name}, "
                                          f"got {mask.dtype.name}"))
    if causal:
        # The most negative finite value, not -inf: a fully masked row then
        # gives a uniform distribution instead of NaN.
        scores = where(causal_mask(q.shape[-2], k.shape[-2]), scores, q.dtype.lowest)
    return scores.softmax(-1) @ v


class MultiHeadAttention(Module):
    """``h`` heads of size ``d_k`` (queries/keys) and ``d_v`` (values), then ``W_O``."""

    def __init__(self, d_model: int, heads: int, d_k: int | None = None, d_v: int | None = None,
                 bias: bool = True, causal: bool = False):
        super().__init__()
        if heads <= 0 or (d_k is None and d_model % heads):
            raise ModelError(at_user_line(f"d_model={d_model} is not divisible by heads={heads}"))
        self.heads, self.causal = heads, causal
        self.d_k = d_k or d_model // heads
        self.d_v = d_v or self.d_k
        self.w_q = Linear(d_model, heads * self.d_k, bias)
        self.w_k = Linear(d_model, heads * self.d_k, bias)
        self.w_v = Linear(d_model, heads * self.d_v, bias)
        self.w_o = Linear(heads * self.d_v, d_model, bias)

    def split_heads(self, x: Tensor, size: int) -> Tensor:
        """``[b, s, h*size] -> [b, h, s, size]``."""
        return x.reshape(0, 0, self.heads, size).permute(0, 2, 1, 3)

    def forward(self, x: Tensor, mask: Tensor | None = None, memory: Tensor | None = None) -> Tensor:
        kv = x if memory is None else memory
        q = self.split_heads(self.w_q(x), self.d_k)
        k = self.split_heads(self.w_k(kv), self.d_k)
        v = self.split_heads(self.w_v(kv), self.d_v)
        o = scaled_dot_product_attention(q, k, v, mask, self.causal)
        o = o.permute(0, 2, 1, 3).reshape(0, 0, self.heads * self.d_v)
        return self.w_o(o)


class FeedForward(Module):
    """``act(x W1 + b1) W2 + b2``; act is relu, gelu (erf) or gelu_tanh."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ModelError(at_user_line(f"unknown activation {activation!r}: use {', '.join(ACTIVATIONS)}"))
        self.activation = activation
        self.fc1 = Linear(d_model, d_ff)
        self.fc2 = Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        if self.activation == "relu":
            h = h.relu()
        else:
            h = h.gelu("tanh" if self.activation == "gelu_tanh" else "none")
        return self.fc2(h)


class TransformerBlock(Module):
    """One transformer layer.

    post-norm: ``O = LN(X + MHA(X))``, ``H = LN(O + FFN(O))``;
    pre-norm:  ``O = X + MHA(LN(X))``, ``H = O + FFN(LN(O))``.
    """

    def __init__(self, d_model: int, heads: int, d_ff: int | None = None, *, norm_first: bool = False,
                 activation: str = "relu", causal: bool = False, eps: float = 1e-5, norm: str = "layernorm",
                 bias: bool = True):
        super().__init__()
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(d_model, heads, bias=bias, causal=causal)
        self.ln1 = make_norm(norm, d_model, eps)
        self.ffn = FeedForward(d_model, d_ff or 4 * d_model, activation)
        self.ln2 = make_norm(norm, d_model, eps)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.norm_first:
            o = x + self.attn(self.ln1(x), mask)
            return o + self.ffn(self.ln2(o))
        o = self.ln1(x + self.attn(x, mask))
        return self.ln2(o + self.ffn(o))
