"""Whole models built from the layer library: a decoder-only LM (GPT-2 or
Llama shaped), a post-norm encoder (BERT shaped), and a single block."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ModelError
from ..ir.dims import Sym
from ..ir.dtypes import DType
from ..ops.activations import ACTIVATIONS
from .layers import (QK_NORMS, Embedding, KVCache, LearnedPositionEmbedding, Linear,
                     SinusoidalPositionEmbedding, TransformerBlock, heads_problem, make_norm)
from .rotary import RotaryEmbedding, rotary_problem
from .module import InputSpec, Model, ModuleList
from .tensor import Tensor

BATCH, SEQ, PAST, TOTAL = Sym.var("batch"), Sym.var("seq"), Sym.var("past"), Sym.var("total")
CACHE_MODES = ("prefill", "decode")


def _check_common(cfg) -> None:
    for key in ("d_model", "layers", "heads"):
        if getattr(cfg, key) <= 0:
            raise ModelError(f"{key} must be positive, got {getattr(cfg, key)}")
    if cfg.d_ff < 0:
        raise ModelError(f"d_ff must be positive, or 0 for 4*d_model, got {cfg.d_ff}")
    if not getattr(cfg, "head_dim", 0) and cfg.d_model % cfg.heads:
        raise ModelError(f"d_model={cfg.d_model} is not divisible by heads={cfg.heads}")
    if cfg.activation not in ACTIVATIONS:
        raise ModelError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {cfg.activation!r}")
    if cfg.norm not in ("layernorm", "rmsnorm"):
        raise ModelError(f"norm must be layernorm or rmsnorm, got {cfg.norm!r}")
    # A zero, negative or non-finite eps makes the norm's sqrt NaN or Inf on some rows: every output wrong.
    if not isinstance(cfg.eps, (int, float)) or not math.isfinite(cfg.eps) or cfg.eps <= 0:
        raise ModelError(f"eps must be a positive finite number (e.g. 1e-5), got {cfg.eps!r}")
    try:
        dtype = DType.parse(cfg.dtype)
    except KeyError:
        dtype = None
    if dtype is None or not dtype.is_float:
        raise ModelError(f"dtype must be float32, float16, bfloat16 or float64, got {cfg.dtype!r}")


def _blocks(cfg, *, norm_first: bool, causal: bool, **options) -> ModuleList:
    """``cfg.layers`` identical blocks (``d_ff=0`` means ``4*d_model``);
    ``options`` go to every ``TransformerBlock``."""
    return ModuleList([
        TransformerBlock(cfg.d_model, cfg.heads, cfg.d_ff or 4 * cfg.d_model, norm_first=norm_first,
                         activation=cfg.activation, causal=causal, eps=cfg.eps, norm=cfg.norm, **options)
        for _ in range(cfg.layers)])


POSITIONS = ("learned", "sinusoidal", "rope")


@dataclass
class DecoderConfig:
    """A decoder-only language model. ``d_ff=0`` means ``4*d_model``.

    GPT-2 is the defaults. The settings of later decoders (Llama, Qwen):
    ``kv_heads`` (0: as many as ``heads``; fewer: grouped-query attention;
    1: multi-query), ``head_dim`` (0: ``d_model/heads``), ``gated_ffn``
    (``down(act(gate(x)) * up(x))``; with ``activation=silu``, SwiGLU),
    ``positions=rope`` with ``rope_form`` (``rotate_half`` or
    ``interleaved``), ``rotary_dim`` (0: the whole head) and ``rope_theta``;
    ``qk_norm`` (``head``: RMSNorm per head, Qwen3; ``full``: over the whole
    projection, OLMo 2); biases on the q/k/v projections (``qkv_bias``), the
    attention output (``out_bias``) and the feed-forward (``ffn_bias``); and
    ``tie_embeddings`` (False: a separate ``lm_head``).
    """

    vocab: int = 50257
    max_positions: int = 1024
    d_model: int = 768
    layers: int = 12
    heads: int = 12
    kv_heads: int = 0
    head_dim: int = 0
    d_ff: int = 0
    norm_first: bool = True
    activation: str = "gelu_tanh"
    gated_ffn: bool = False
    norm: str = "layernorm"
    positions: str = "learned"
    rope_form: str = "rotate_half"
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    qk_norm: str = "none"
    qkv_bias: bool = True
    out_bias: bool = True
    ffn_bias: bool = True
    tie_embeddings: bool = True
    eps: float = 1e-5
    probs: bool = True
    dtype: str = "float32"

    @property
    def head_size(self) -> int:
        return self.head_dim or self.d_model // self.heads

    def check(self) -> None:
        if self.head_dim < 0:
            raise ModelError(f"head_dim must be positive, or 0 for d_model/heads, got {self.head_dim}")
        _check_common(self)
        if self.positions not in POSITIONS:
            raise ModelError(f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        if self.vocab <= 0 or self.max_positions <= 0:
            raise ModelError("vocab and max_positions must be positive")
        if self.kv_heads < 0:
            raise ModelError(f"kv_heads must be positive, or 0 for as many as heads, got {self.kv_heads}")
        problem = heads_problem(self.heads, self.kv_heads or self.heads)
        if problem:
            raise ModelError(problem)
        if self.qk_norm not in QK_NORMS:
            raise ModelError(f"qk_norm must be one of {', '.join(QK_NORMS)}, got {self.qk_norm!r}")
        if self.positions == "rope":
            problem = rotary_problem(self.head_size, self.rotary_dim, self.rope_theta, self.rope_form)
            if problem:
                raise ModelError(problem)
        elif self.rotary_dim:
            raise ModelError(f"rotary_dim={self.rotary_dim} applies to positions=rope, not {self.positions}")


class DecoderLM(Model):
    """Token embeddings; learned or sinusoidal positions added to them, or
    rotary embeddings turning every layer's queries and keys by the
    ``position_ids`` input; L causal blocks; the final norm of pre-norm
    stacks; logits through the tied unembedding ``Eᵀ`` (or a separate
    ``lm_head``); and (with ``probs``) the softmax over the vocabulary.

    ``cache`` traces one step of generation with a key/value cache instead
    of the plain forward (``for_cache`` makes that model from this one; the
    parameters, and so the weight names, are the same):

    * ``"prefill"``: ``input_ids``, ``attention_mask`` (int64, 1 = token,
      0 = left pad) and ``position_ids``, all ``[batch, seq]`` ->
      ``logits [batch, seq, vocab]`` and, per layer ``i``,
      ``present.{i}.key``/``.value`` ``[batch, kv_heads, seq, head_dim]``;
    * ``"decode"``: the same with ``attention_mask [batch, past+seq]`` and
      ``past.{i}.key``/``.value`` ``[batch, kv_heads, past, head_dim]`` ->
      ``logits`` and the presents, ``past+seq`` long;
    * ``"decode"`` with ``cache_len``: the cache preallocated, in place, one
      token a step (``input_ids``, ``position_ids`` ``[batch, 1]``).
      ``attention_mask [batch, total]`` covers the ``total`` tokens so far
      (this step's included); ``past.{i}.*`` and ``present.{i}.*``
      are buffers ``[batch, kv_heads, cache_len, head_dim]`` whose first
      ``total-seq`` rows hold the cache; the step writes its rows after them
      and attends to the first ``total`` (``layers.KVCache``). A runtime
      that binds each present to its past's buffer never copies the cache.

    ``padded=False`` (either step) is for rows without left padding, every
    token so far a real one (one prompt, or prompts of one length): the
    step has no key mask, only the causal one, and ``attention_mask`` gives
    the length (``past+seq``) but its values are not read. That spares a
    step the additive mask every layer's attention would otherwise build and
    apply over every key so far (ONNX Runtime's ``GroupQueryAttention``
    reads it as its ``attention_bias``). ``generate`` picks it where no
    prompt is padded (``generate.loop.padded``).

    Positions come from ``position_ids`` whatever the position kind (learned
    tables are gathered as rotary ones are), from the tables' first
    ``past+seq`` rows: so ``past+seq`` is at most ``max_positions`` and each
    position below ``past+seq``, limits every backend enforces. Keys are
    cached after rotation, with ``kv_heads`` heads (not repeated).
    """

    def __init__(self, cfg: DecoderConfig, name: str = "decoder", cache: str | None = None,
                 cache_len: int | None = None, padded: bool = True):
        super().__init__()
        cfg.check()
        if cache is not None and cache not in CACHE_MODES:
            raise ModelError(f"cache must be one of {', '.join(CACHE_MODES)} or None, got {cache!r}")
        if cache_len is not None and (cache != "decode" or isinstance(cache_len, bool)
                                      or not isinstance(cache_len, int) or cache_len < 1):
            raise ModelError(f"cache_len must be a positive integer, for a decode step; got {cache_len!r} "
                             f"with cache={cache!r}")
        self.cfg, self.name, self.dtype, self.cache = cfg, name, DType.parse(cfg.dtype), cache
        if not isinstance(padded, bool) or (not padded and cache is None):
            raise ModelError(f"padded must be True or False, for a prefill or decode step; got {padded!r} "
                             f"with cache={cache!r}")
        self.cache_len, self.padded = cache_len, padded
        self.tok = Embedding(cfg.vocab, cfg.d_model)
        if cfg.positions == "rope":
            self.rope = RotaryEmbedding(cfg.head_size, cfg.max_positions, cfg.rotary_dim, cfg.rope_theta,
                                        interleaved=cfg.rope_form == "interleaved")
        else:
            pos_cls = LearnedPositionEmbedding if cfg.positions == "learned" else SinusoidalPositionEmbedding
            self.pos = pos_cls(cfg.max_positions, cfg.d_model)
        self.blocks = _blocks(cfg, norm_first=cfg.norm_first, causal=True, kv_heads=cfg.kv_heads or None,
                              head_dim=cfg.head_dim or None, gated_ffn=cfg.gated_ffn, qk_norm=cfg.qk_norm,
                              bias=cfg.qkv_bias, out_bias=cfg.out_bias, ffn_bias=cfg.ffn_bias)
        if cfg.norm_first:
            self.ln_f = make_norm(cfg.norm, cfg.d_model, cfg.eps)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(cfg.d_model, cfg.vocab, bias=False)

    def for_cache(self, mode: str, cache_len: int | None = None, padded: bool = True) -> "DecoderLM":
        """This model's ``"prefill"`` or ``"decode"`` step (see the class
        docstring); a decode step with ``cache_len`` keeps its cache in place;
        ``padded=False``: for rows without left padding, no key mask."""
        suffix = (f"-{cache_len}" if cache_len is not None else "") + ("" if padded else "-unpadded")
        return DecoderLM(self.cfg, f"{self.name}-{mode}{suffix}", cache=mode, cache_len=cache_len, padded=padded)

    @property
    def kv_shape(self) -> tuple:
        """A cached key or value before this step: ``[batch, kv_heads, past, head_dim]``,
        or the buffer ``[batch, kv_heads, cache_len, head_dim]``."""
        return (BATCH, self.cfg.kv_heads or self.cfg.heads, self.cache_len or PAST, self.cfg.head_size)

    def inputs(self) -> list[InputSpec]:
        cfg = self.cfg
        seq = 1 if self.cache_len else SEQ   # an in-place step is one token's: what GroupQueryAttention lowers
        specs = [InputSpec("input_ids", DType.int64, (BATCH, seq), "ids", cfg.vocab)]
        if self.cache is None:
            if cfg.positions == "rope":
                specs.append(InputSpec("position_ids", DType.int64, (BATCH, SEQ), "positions", cfg.max_positions))
            return specs
        total = SEQ if self.cache == "prefill" else TOTAL if self.cache_len else PAST + SEQ
        specs += [InputSpec("attention_mask", DType.int64, (BATCH, total), "mask"),
                  InputSpec("position_ids", DType.int64, (BATCH, seq), "positions", cfg.max_positions)]
        if self.cache == "decode":
            specs += [InputSpec(f"past.{i}.{kv}", self.dtype, self.kv_shape)
                      for i in range(cfg.layers) for kv in ("key", "value")]
        return specs

    def forward(self, input_ids: Tensor, *rest: Tensor):
        if self.cache is not None:
            return self._step(input_ids, *rest)
        position_ids = rest[0] if rest else None
        x, rotary = self.tok(input_ids), None
        if self.cfg.positions == "rope":
            rotary = self.rope.angles(position_ids)
        else:
            x = x + self.pos(input_ids.shape[1])
        for block in self.blocks:
            x = block(x, rotary=rotary)
        logits = self._logits(x)
        return {"logits": logits, "probs": logits.softmax(-1)} if self.cfg.probs else {"logits": logits}

    def _step(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *past: Tensor):
        """A prefill or decode step: the logits and every layer's keys and values so far."""
        total = attention_mask.shape[1]
        x, rotary = self.tok(input_ids), None
        if self.cfg.positions == "rope":
            rotary = self.rope.angles(position_ids, total)
        else:
            x = x + self.pos.lookup(position_ids, total)
        # [batch, past+seq] -> [batch, 1, 1, past+seq]: one key mask for every head and query; the
        # blocks' causal mask, aligned to the last key, adds "no later token" (alone where unpadded).
        mask = attention_mask.cast("bool").reshape(0, 1, 1, -1) if self.padded else None
        written = total if self.cache_len else None
        caches = [KVCache((past[2 * i], past[2 * i + 1]) if past else None, written) for i in range(len(self.blocks))]
        for block, cache in zip(self.blocks, caches):
            x = block(x, mask, rotary=rotary, cache=cache)
        out = {"logits": self._logits(x)}
        for i, cache in enumerate(caches):
            out[f"present.{i}.key"], out[f"present.{i}.value"] = cache.present
        return out

    def _logits(self, x: Tensor) -> Tensor:
        if self.cfg.norm_first:
            x = self.ln_f(x)
        return x @ self.tok.weight.T if self.cfg.tie_embeddings else self.lm_head(x)


@dataclass
class EncoderConfig:
    """A post-norm (BERT-shaped) encoder with a padding mask. ``pooler``
    adds Hugging Face ``BertModel``'s pooler: ``pooler_output`` is
    ``tanh(dense(h[:, 0]))``, the first token's last hidden state.
    ``position_offset``: the position table's first row used (RoBERTa's
    positions start after its padding row, at ``padding_idx + 1``)."""

    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2
    d_model: int = 768
    layers: int = 12
    heads: int = 12
    d_ff: int = 0
    activation: str = "gelu"
    norm: str = "layernorm"
    eps: float = 1e-12
    pooler: bool = False
    position_offset: int = 0
    dtype: str = "float32"

    def check(self) -> None:
        _check_common(self)
        if self.vocab <= 0 or self.max_positions <= 0 or self.type_vocab < 0:
            raise ModelError("vocab and max_positions must be positive, type_vocab non-negative")
        if not 0 <= self.position_offset < self.max_positions:
            raise ModelError(f"position_offset must be in [0, max_positions={self.max_positions}), "
                             f"got {self.position_offset}")


class Encoder(Model):
    """Embeddings (token + position + segment) and their LayerNorm, then L
    post-norm blocks with a padding mask (``attention_mask``: 1 = token, 0 = pad);
    with ``cfg.pooler``, also ``pooler_output`` (see ``EncoderConfig``)."""

    def __init__(self, cfg: EncoderConfig, name: str = "encoder"):
        super().__init__()
        cfg.check()
        self.cfg, self.name, self.dtype = cfg, name, DType.parse(cfg.dtype)
        self.tok = Embedding(cfg.vocab, cfg.d_model)
        self.pos = LearnedPositionEmbedding(cfg.max_positions, cfg.d_model, std=0.02)
        if cfg.type_vocab:
            self.segment = Embedding(cfg.type_vocab, cfg.d_model)
        self.ln_emb = make_norm(cfg.norm, cfg.d_model, cfg.eps)
        self.blocks = _blocks(cfg, norm_first=False, causal=False)
        if cfg.pooler:
            self.pooler = Linear(cfg.d_model, cfg.d_model)

    def inputs(self) -> list[InputSpec]:
        specs = [InputSpec("input_ids", DType.int64, (BATCH, SEQ), "ids", self.cfg.vocab)]
        if self.cfg.type_vocab:
            specs.append(InputSpec("token_type_ids", DType.int64, (BATCH, SEQ), "ids", self.cfg.type_vocab))
        specs.append(InputSpec("attention_mask", DType.int64, (BATCH, SEQ), "mask"))
        return specs

    def forward(self, input_ids: Tensor, *rest: Tensor):
        token_type_ids, attention_mask = rest if self.cfg.type_vocab else (None, rest[0])
        x = self.tok(input_ids) + self.pos(input_ids.shape[1], self.cfg.position_offset)
        if token_type_ids is not None:
            x = x + self.segment(token_type_ids)
        x = self.ln_emb(x)
        # [batch, seq] -> [batch, 1, 1, seq]: one key mask shared by heads and queries.
        mask = attention_mask.cast("bool").reshape(0, 1, 1, -1)
        for block in self.blocks:
            x = block(x, mask)
        if not self.cfg.pooler:
            return {"last_hidden_state": x}
        first = x.slice(1, 0, 1).reshape(0, self.cfg.d_model)   # [batch, d]: the [CLS] token's state
        return {"last_hidden_state": x, "pooler_output": self.pooler(first).tanh()}


@dataclass
class BlockConfig:
    """One transformer block on float inputs ``x: [batch, seq, d_model]``."""

    d_model: int = 768
    heads: int = 12
    d_ff: int = 0
    norm_first: bool = True
    activation: str = "gelu_tanh"
    norm: str = "layernorm"
    causal: bool = True
    eps: float = 1e-5
    layers: int = 1
    dtype: str = "float32"

    def check(self) -> None:
        _check_common(self)


class BlockModel(Model):
    """``layers`` transformer blocks applied to a float tensor."""

    def __init__(self, cfg: BlockConfig, name: str = "block"):
        super().__init__()
        cfg.check()
        self.cfg, self.name, self.dtype = cfg, name, DType.parse(cfg.dtype)
        self.blocks = _blocks(cfg, norm_first=cfg.norm_first, causal=cfg.causal)

    def inputs(self) -> list[InputSpec]:
        return [InputSpec("x", self.dtype, (BATCH, SEQ, self.cfg.d_model))]

    def forward(self, x: Tensor):
        for block in self.blocks:
            x = block(x)
        return {"y": x}
