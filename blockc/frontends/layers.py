"""The DSL's layer library: Linear, embeddings, norms, attention, FFN, blocks.

Conventions (documented in docs/DSL.md): ``Linear.weight`` is ``[in, out]``
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
from ..ops.activations import ACTIVATIONS
from ..ops.fused import group_heads, ungroup_heads
from .module import Module, Parameter
from .rotary import Rotary
from .tensor import Tensor, apply, cache_write, causal_mask, concat, constant, gather, layer_norm, rms_norm, where

QK_NORMS = ("none", "head", "full")


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

    def lookup(self, position_ids: Tensor, rows: Dim) -> Tensor:
        """The rows ``position_ids`` name, from the first ``rows`` of the
        table (a left-padded row, a decode step). The slice bounds ``rows`` by
        the table and the ids by ``rows`` (``ops/limits.py``)."""
        return gather(self.weight.slice(0, 0, rows), position_ids)


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
    """``gamma * x / sqrt(mean(x^2) + eps)`` over the last axis.

    The same as Hugging Face's ``LlamaRMSNorm`` (and Qwen's, OLMo's,
    Mistral's): eps inside the square root, the weight multiplying the
    normalised value and starting at 1 (not Gemma's ``1 + weight``). Llama
    normalises in float32 whatever the model's dtype, then casts back before
    the weight; blockc's reference interpreter and CUDA kernels also widen
    float16/bfloat16 rows to float32, while ONNX Runtime runs the op in the
    model's dtype.
    """

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
                                 causal: bool = False, scale: float | None = None) -> Tensor:
    """``softmax(mask(q kᵀ * scale)) v`` over the last two axes; ``scale``
    is ``1 / sqrt(d_k)`` unless given.

    ``mask`` is boolean (True = may attend) or additive (added to the scaled
    scores); it must broadcast to the scores' shape ``[..., q_len, k_len]``.
    ``causal`` hides later keys; with ``k_len > q_len`` (a KV cache) query i
    sees keys ``j <= i + k_len - q_len``.
    """
    d_k = q.shape[-1]
    if scale is None:
        if not isinstance(d_k, int):
            raise ModelError(at_user_line(f"attention head size must be a static int, got {d_k}"))
        scale = 1.0 / math.sqrt(d_k)
    scores = (q @ k.T) * constant(scale, q.dtype)
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


def split_heads(x: Tensor, heads: int, size: Dim) -> Tensor:
    """``[b, s, heads*size] -> [b, heads, s, size]``."""
    return x.reshape(0, 0, heads, size).permute(0, 2, 1, 3)


def join_heads(x: Tensor) -> Tensor:
    """``[b, heads, s, size] -> [b, s, heads*size]``: ``split_heads`` undone."""
    return x.permute(0, 2, 1, 3).reshape(0, 0, x.shape[1] * x.shape[3])


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
                      scale: float | None = None) -> Tensor:
    """``scaled_dot_product_attention`` of ``q`` ``[b, heads, s, d_k]`` over
    ``k``, ``v`` ``[b, kv_heads, t, d]`` (``mask`` over ``[..., heads, s, t]``).

    ``kv_heads`` below ``heads`` is grouped-query attention: query head ``h``
    reads key/value head ``h // (heads // kv_heads)`` (``kv_heads=1`` is
    multi-query). The heads are grouped, not copied (``ops.fused.group_heads``):
    queries are viewed as ``[b, kv_heads, group, s, d_k]`` and keys as
    ``[b, kv_heads, 1, t, d_k]``, and the batched product broadcasts.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == heads:
        return scaled_dot_product_attention(q, k, v, mask, causal, scale)
    if not (isinstance(heads, int) and isinstance(kv_heads, int)):
        raise ModelError(at_user_line(f"grouped-query attention needs fixed head counts, got {heads} query "
                                      f"and {kv_heads} key/value heads"))
    problem = heads_problem(heads, kv_heads)
    if problem:
        raise ModelError(at_user_line(problem))
    try:
        q, k, v, mask = group_heads(q, k, v, mask, kv_heads, _reshape)
    except ShapeError as e:   # a mask whose heads are neither 1 nor the attention's
        raise ModelError(at_user_line(str(e))) from None
    return ungroup_heads(scaled_dot_product_attention(q, k, v, mask, causal, scale), _reshape)


def _reshape(x: Tensor, dims) -> Tensor:
    return x.reshape(*dims)


class KVCache:
    """One layer's key/value cache for a traced generation step: ``past``
    holds the keys and values of the tokens before (None in a prefill graph);
    attention appends this step's (rotated, normalised) keys and values and
    leaves the whole in ``present``.

    Two layouts. Without ``total``, ``past`` is ``[batch, kv_heads, past,
    head_dim]`` and the present is the concatenation, ``past+seq`` long: a
    step copies the whole cache. With ``total`` (the tokens so far, this
    step's included), ``past`` is a preallocated buffer ``[batch, kv_heads,
    cache_len, head_dim]``: the step writes its rows at ``[total-seq,
    total)`` (``cache_write``), the present is the whole buffer, and
    attention reads its first ``total`` rows -- so a runtime that binds the
    present to the past's buffer updates the cache in place."""

    def __init__(self, past: tuple[Tensor, Tensor] | None = None, total: Dim | None = None):
        self.past, self.total, self.present = past, total, None

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.past is None:
            self.present = (k, v)
            return k, v
        if self.total is None:
            self.present = (concat([self.past[0], k], 2), concat([self.past[1], v], 2))
            return self.present
        start = self.total - k.shape[2]
        self.present = (cache_write(self.past[0], k, 2, start), cache_write(self.past[1], v, 2, start))
        return tuple(buffer.slice(2, 0, self.total) for buffer in self.present)


def heads_problem(heads: int, kv_heads: int) -> str | None:
    """Why ``heads`` query heads cannot share ``kv_heads`` key/value heads, or None."""
    if heads <= 0 or kv_heads <= 0:
        return f"heads={heads} and kv_heads={kv_heads} must be positive"
    if heads % kv_heads:
        return f"heads={heads} is not divisible by kv_heads={kv_heads}: each key/value head serves a whole group"
    return None


class MultiHeadAttention(Module):
    """``h`` heads of size ``d_k`` (queries/keys) and ``d_v`` (values), then ``W_O``.

    ``kv_heads`` below ``heads`` is grouped-query attention
    (``grouped_attention``): query head ``h`` reads key/value head
    ``h // (heads // kv_heads)`` (``kv_heads=1`` is multi-query).

    ``bias`` puts biases on the q, k and v projections and, unless
    ``out_bias`` says otherwise, on ``W_O`` (Llama: none; Qwen2: q, k, v
    only). ``qk_norm`` normalises queries and keys with an RMSNorm before
    the rotation: ``"head"`` over each head's ``d_k`` values (Qwen3),
    ``"full"`` over the whole projection (OLMo 2). ``forward``'s ``rotary``
    (from ``RotaryEmbedding.angles``) turns queries and keys by their positions;
    its ``cache`` (a ``KVCache``) puts the cached keys and values before this
    step's, unrepeated (``kv_heads`` heads), and the causal mask then lets
    query ``i`` see the whole past (``ops/masking.py``).
    """

    def __init__(self, d_model: int, heads: int, d_k: int | None = None, d_v: int | None = None,
                 bias: bool = True, causal: bool = False, *, kv_heads: int | None = None,
                 out_bias: bool | None = None, qk_norm: str = "none", eps: float = 1e-6):
        super().__init__()
        if heads <= 0 or (d_k is None and d_model % heads):
            raise ModelError(at_user_line(f"d_model={d_model} is not divisible by heads={heads}"))
        problem = heads_problem(heads, heads if kv_heads is None else kv_heads)
        if problem:
            raise ModelError(at_user_line(problem))
        if qk_norm not in QK_NORMS:
            raise ModelError(at_user_line(f"unknown qk_norm {qk_norm!r}: use {', '.join(QK_NORMS)}"))
        self.heads, self.causal, self.qk_norm = heads, causal, qk_norm
        self.kv_heads = kv_heads or heads
        self.d_k = d_k or d_model // heads
        self.d_v = d_v or self.d_k
        self.w_q = Linear(d_model, heads * self.d_k, bias)
        self.w_k = Linear(d_model, self.kv_heads * self.d_k, bias)
        self.w_v = Linear(d_model, self.kv_heads * self.d_v, bias)
        self.w_o = Linear(heads * self.d_v, d_model, bias if out_bias is None else out_bias)
        if qk_norm != "none":
            self.q_norm = RMSNorm(self.d_k if qk_norm == "head" else heads * self.d_k, eps)
            self.k_norm = RMSNorm(self.d_k if qk_norm == "head" else self.kv_heads * self.d_k, eps)

    def split_heads(self, x: Tensor, size: int, heads: int | None = None) -> Tensor:
        """``[b, s, h*size] -> [b, h, s, size]``."""
        return split_heads(x, heads or self.heads, size)

    def forward(self, x: Tensor, mask: Tensor | None = None, memory: Tensor | None = None,
                rotary: Rotary | None = None, cache: KVCache | None = None) -> Tensor:
        if rotary is not None and memory is not None:
            raise ModelError(at_user_line("rotary embeddings turn self-attention; keys from memory have no "
                                          "positions of this sequence"))
        kv = x if memory is None else memory
        q = self._heads(self.w_q(x), "q_norm", self.heads)
        k = self._heads(self.w_k(kv), "k_norm", self.kv_heads)
        v = self.split_heads(self.w_v(kv), self.d_v, self.kv_heads)
        if rotary is not None:
            q, k = rotary.rotate(q), rotary.rotate(k)
        if cache is not None:
            k, v = cache.extend(k, v)
        return self.w_o(join_heads(grouped_attention(q, k, v, mask, self.causal)))

    def _heads(self, y: Tensor, norm: str, heads: int) -> Tensor:
        """Queries or keys ``[b, s, heads*d_k]`` as ``[b, heads, s, d_k]``, normalised as ``qk_norm`` says."""
        if self.qk_norm == "full":
            y = getattr(self, norm)(y)
        y = self.split_heads(y, self.d_k, heads)
        return getattr(self, norm)(y) if self.qk_norm == "head" else y


class FeedForward(Module):
    """``act(x W1 + b1) W2 + b2``; act one of ``ops/activations.py``'s
    (relu, gelu (erf), gelu_tanh, silu).

    ``gated=True`` is the gated form ``down(act(gate(x)) * up(x))``: with
    silu, the SwiGLU of Llama, Qwen and Mistral (Shazeer 2020, "GLU Variants
    Improve Transformer"). ``bias=False`` leaves the biases out (Llama's
    feed-forward has none).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", *, gated: bool = False,
                 bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ModelError(at_user_line(f"unknown activation {activation!r}: use {', '.join(ACTIVATIONS)}"))
        self.activation, self.gated = activation, gated
        if gated:
            self.gate = Linear(d_model, d_ff, bias)
            self.up = Linear(d_model, d_ff, bias)
            self.down = Linear(d_ff, d_model, bias)
        else:
            self.fc1 = Linear(d_model, d_ff, bias)
            self.fc2 = Linear(d_ff, d_model, bias)

    def act(self, h: Tensor) -> Tensor:
        act = ACTIVATIONS[self.activation]
        return apply(act.op, h, **act.attrs)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.fc2(self.act(self.fc1(x)))


class TransformerBlock(Module):
    """One transformer layer.

    post-norm: ``O = LN(X + MHA(X))``, ``H = LN(O + FFN(O))``;
    pre-norm:  ``O = X + MHA(LN(X))``, ``H = O + FFN(LN(O))``.

    ``bias``, ``out_bias``, ``kv_heads``, ``head_dim`` (the attention's
    ``d_k``) and ``qk_norm`` go to ``MultiHeadAttention``; ``gated_ffn`` and
    ``ffn_bias`` to ``FeedForward``. A Llama layer is
    ``TransformerBlock(d, h, d_ff, norm_first=True, norm="rmsnorm",
    activation="silu", gated_ffn=True, bias=False, ffn_bias=False,
    kv_heads=..., causal=True)`` called with the model's ``rotary``.
    """

    def __init__(self, d_model: int, heads: int, d_ff: int | None = None, *, norm_first: bool = False,
                 activation: str = "relu", causal: bool = False, eps: float = 1e-5, norm: str = "layernorm",
                 bias: bool = True, out_bias: bool | None = None, ffn_bias: bool = True, gated_ffn: bool = False,
                 kv_heads: int | None = None, head_dim: int | None = None, qk_norm: str = "none"):
        super().__init__()
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(d_model, heads, head_dim, bias=bias, causal=causal, kv_heads=kv_heads,
                                       out_bias=out_bias, qk_norm=qk_norm, eps=eps)
        self.ln1 = make_norm(norm, d_model, eps)
        self.ffn = FeedForward(d_model, d_ff or 4 * d_model, activation, gated=gated_ffn, bias=ffn_bias)
        self.ln2 = make_norm(norm, d_model, eps)

    def forward(self, x: Tensor, mask: Tensor | None = None, rotary: Rotary | None = None,
                cache: KVCache | None = None) -> Tensor:
        if self.norm_first:
            o = x + self.attn(self.ln1(x), mask, rotary=rotary, cache=cache)
            return o + self.ffn(self.ln2(o))
        o = self.ln1(x + self.attn(x, mask, rotary=rotary, cache=cache))
        return self.ln2(o + self.ffn(o))
