"""The generation loop: prefill once, then one decode step per new token.

A batch of prompts of different lengths is left-padded (Hugging Face's
convention): ``attention_mask`` is 0 on the pads, and each row's positions
count its own tokens, ``cumsum(mask) - 1`` with the pads' clamped to 0, so a
padded row generates what it would alone. The prefill graph
(``DecoderLM.for_cache("prefill")``) returns the logits and every layer's
keys and values; each decode step feeds the last picked tokens, the mask
one column longer and the next positions, and reads the cache that the
step before left. Both graphs are compiled once, through the ``Backend``
interface, so every backend generates. Where no prompt is padded (one
prompt, or prompts of one length) the graphs are the unpadded ones
(``for_cache(..., padded=False)``): no key mask, only the causal one.

The cache. By default (``cache="inplace"``) the decode graph takes each
layer's cache as a buffer preallocated to ``cache_len`` positions (the
longest prompt and the new tokens, unless given) and writes each step's
keys and values into it (``for_cache("decode", cache_len=...)``); the
prefill's keys and values are copied into the buffers once. The buffers are
carried from step to step by the compiled graph itself
(``Compiled.cached``): on ONNX Runtime they are OrtValues bound as both the
past input and the present output (IO binding), so a step neither copies
the cache nor brings it back to numpy, and its cost grows with the past only
by attention's reads. ``cache="concat"`` is the plain decode graph, whose
present is the past with the step's rows appended (a new, longer cache
every step).

Tokens are chosen by ``pick(logits [batch, vocab], history) -> int64
[batch]``, ``history`` holding each row's prompt and the tokens picked so
far: ``sampling.greedy`` and ``sampling.Sampler``.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import BlockcError
from ..frontends.models import DecoderLM
from ..frontends.module import trace
from ..frontends.onnx.decoder import OnnxDecoder
from ..frontends.onnx.model import OnnxModel
from ..passes.forms import to_form
from ..passes.shard import shard
from ..runtime.backend import make_backend
from .sampling import greedy

Pick = Callable[[np.ndarray, list[list[int]]], np.ndarray]
# on_token(tokens): each prompt's new ids so far, after every step
OnToken = Callable[[list[list[int]]], None]


@dataclass
class Generation:
    """What ``generate`` made: each prompt's new ids (up to and including
    a stop id where one came), and how long it took. ``first_token_s``: from
    the prefill's start to the first tokens picked; ``step_s``: each decode
    step, feeds to picked tokens; ``compile_s``: tracing and compiling both
    graphs, once, before any of it; ``load_s``: loading the weights, as the
    caller measured it (``generate(..., load_s=)``); ``form``: the graph
    form that ran. What a user waits for is ``whole_s``: the start
    (``start_s``: loading and compiling) and the generation."""

    tokens: list[list[int]]
    first_token_s: float
    step_s: list[float] = field(default_factory=list)
    compile_s: float = 0.0
    backend: str = ""
    form: str = ""
    load_s: float = 0.0

    @property
    def start_s(self) -> float:
        """Loading the weights and compiling both graphs: before the first token is asked for."""
        return self.load_s + self.compile_s

    @property
    def whole_s(self) -> float:
        """The start, the first token and every decode step: the whole run."""
        return self.start_s + self.first_token_s + sum(self.step_s)

    @property
    def step_median_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None

    @property
    def step_p90_s(self) -> float | None:
        return float(np.percentile(self.step_s, 90)) if self.step_s else None

    @property
    def tokens_per_s(self) -> float:
        """New tokens of every row over the time from the prefill to the last pick."""
        total = self.first_token_s + sum(self.step_s)
        return sum(len(t) for t in self.tokens) / total if total > 0 else 0.0

    def as_json(self) -> dict:
        return {"backend": self.backend, "form": self.form, "tokens": self.tokens, "whole_s": self.whole_s,
                "start_s": self.start_s, "load_s": self.load_s, "compile_s": self.compile_s,
                "first_token_s": self.first_token_s, "step_s": self.step_s,
                "step_median_s": self.step_median_s, "step_p90_s": self.step_p90_s,
                "tokens_per_s": self.tokens_per_s}


def as_prompts(prompts) -> list[list[int]]:
    """``prompts`` as lists of int ids. Taken: a sequence of prompts, each a
    sequence or 1-D array of integers (Python's or numpy's, any width), or a
    2-D integer array, one prompt a row. A float or a bool is refused as
    what it is, never read as an id (``1.0`` is not token 1)."""
    if isinstance(prompts, np.ndarray) and prompts.ndim != 2:
        raise BlockcError(f"prompts must be a 2-D array of token ids, one prompt a row, got shape "
                          f"{list(prompts.shape)}")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (Sequence, np.ndarray)):
        raise BlockcError(f"prompts must be a list of prompts, each a sequence of token ids, got "
                          f"{type(prompts).__name__}")
    return [_prompt_ids(k, prompt) for k, prompt in enumerate(prompts)]


def _prompt_ids(k: int, prompt) -> list[int]:
    """One prompt's ids as ints (see ``as_prompts``)."""
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (Sequence, np.ndarray)) or np.ndim(prompt) != 1:
        raise BlockcError(f"prompt {k} must be a sequence of token ids, got {prompt!r}"
                          + (" (prompts is a list of prompts: wrap one in a list, [[1, 2, 3]])"
                             if isinstance(prompt, (int, np.integer)) else ""))
    for t in prompt:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            shown = t.item() if isinstance(t, np.generic) else t
            kind = "a float" if isinstance(shown, float) else f"a {type(shown).__name__}"
            raise BlockcError(f"prompt {k}: token id {shown!r} is {kind}; token ids are integers")
    return [int(t) for t in prompt]


def as_decoder(model):
    """``model`` as what ``generate`` drives: a ``DecoderLM``, or an ONNX
    file that carries its cache as an ``OnnxDecoder`` (its cache found by
    ``genai_config.json`` or by name); else a ``BlockcError``."""
    if isinstance(model, OnnxModel):
        return OnnxDecoder(model.file.path)
    if not isinstance(model, (DecoderLM, OnnxDecoder)):
        raise BlockcError(f"generate needs a decoder language model (a DecoderLM such as gpt2, tiny, llama-tiny, "
                          f"or an ONNX decoder file with its cache), "
                          f"not {getattr(model, 'name', type(model).__name__)!r}")
    return model


def check_request(model, prompts, max_new: int) -> list[list[int]]:
    """Refuse, in one line, what ``generate`` cannot do with ``model``; the
    prompts as lists of ints (``as_prompts``)."""
    model = as_decoder(model)
    if isinstance(max_new, bool) or not isinstance(max_new, (int, np.integer)) or max_new < 1:
        raise BlockcError(f"max_new must be a positive integer, got {max_new!r}")
    prompts = as_prompts(prompts)
    if not prompts:
        raise BlockcError("no prompts: give at least one prompt of token ids")
    vocab, limit = model.cfg.vocab, model.cfg.max_positions
    for k, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise BlockcError(f"prompt {k} is empty: a prompt needs at least one token id")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise BlockcError(f"prompt {k}: token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
    if getattr(model, "one_length", False) and padded(prompts):
        raise BlockcError(f"{model.name} reads every row's length off its attention mask as one length for all "
                          f"(GroupQueryAttention's seqlens_k): give prompts of one length")
    longest = max(len(p) for p in prompts)
    if longest + max_new > limit:
        raise BlockcError(f"a prompt of {longest} tokens and {max_new} new ones make {longest + max_new} positions, "
                          f"over the model's maximum of {limit} (max_positions)")
    return prompts


def cache_names(layers: int) -> list[tuple[str, str]]:
    """``(past input, present output)`` of every layer's keys and values, as
    ``DecoderLM.for_cache`` names them: what one step hands the next."""
    return [(f"past.{i}.{kv}", f"present.{i}.{kv}") for i in range(layers) for kv in ("key", "value")]


def padded(prompts: Sequence[Sequence[int]]) -> bool:
    """Whether ``left_pad`` pads any of ``prompts``: they differ in length."""
    return len({len(p) for p in prompts}) > 1


def left_pad(prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask, position_ids)``, each int64 ``[batch, longest]``,
    the prompts aligned to the right (pads: id 0, mask 0, position 0)."""
    longest = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), longest), np.int64)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt):] = prompt
        mask[row, longest - len(prompt):] = 1
    return ids, mask, np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def _picked(pick: Pick, logits: np.ndarray, history: list[list[int]], vocab: int) -> np.ndarray:
    chosen = np.asarray(pick(logits, history))
    if chosen.shape != (len(history),) or chosen.dtype.kind not in "iu":
        raise BlockcError(f"pick returned {chosen.dtype}{list(chosen.shape)}; it must return one integer id per "
                          f"prompt, int64[{len(history)}]")
    if chosen.min() < 0 or chosen.max() >= vocab:
        raise BlockcError(f"pick returned id {int(chosen.max() if chosen.max() >= vocab else chosen.min())}, "
                          f"outside the vocabulary [0, {vocab})")
    return chosen.astype(np.int64)


CACHES = ("inplace", "concat")


CACHE_BUCKET = 64   # the smallest default in-place cache, in positions


def bucketed(needed: int, most: int) -> int:
    """The default in-place cache for ``needed`` positions: the next power of
    two from ``CACHE_BUCKET`` on, at most ``most``. Each length is a decode
    graph and so a build: ``--max-new 5`` and ``6`` share one, and a run
    builds at most log2(max_positions) of them."""
    length = CACHE_BUCKET
    while length < needed:
        length *= 2
    return max(needed, min(length, most))


def cache_length(model: DecoderLM, prompts: Sequence[Sequence[int]], max_new: int, cache: str,
                 cache_len: int | None) -> int | None:
    """The positions an in-place cache holds: the longest prompt and every
    new token but the last (which no step reads back), ``bucketed``; ``cache_len``
    if it is given, holds them and fits the model's positions (a longer
    buffer could never be filled), else a ``BlockcError``. None for the
    concat cache, which has no buffer to size."""
    model = as_decoder(model)
    if cache not in CACHES:
        raise BlockcError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
    if cache != "inplace":
        if cache_len is not None:
            raise BlockcError(f"cache_len sizes the in-place cache; the {cache} cache has no buffer to size")
        return None
    longest = max(len(p) for p in prompts)
    needed = longest + max_new - 1
    if cache_len is None:
        return bucketed(needed, model.cfg.max_positions)
    if isinstance(cache_len, bool) or not isinstance(cache_len, (int, np.integer)) or cache_len < 1:
        raise BlockcError(f"cache_len must be a positive integer, got {cache_len!r}")
    if needed > cache_len:
        raise BlockcError(f"a prompt of {longest} tokens and {max_new} new ones need a cache of {needed} positions, "
                          f"over the preallocated cache_len={cache_len}")
    if cache_len > model.cfg.max_positions:
        raise BlockcError(f"cache_len={cache_len} is over the model's maximum of {model.cfg.max_positions} "
                          f"positions (max_positions): the buffer could never be filled")
    return int(cache_len)


def into_cache(present: np.ndarray, cache_len: int) -> np.ndarray:
    """A prefill's keys or values ``[batch, kv_heads, seq, head_dim]`` at the
    start of a zeroed buffer of ``cache_len`` positions."""
    batch, heads, seq, size = present.shape
    buffer = np.zeros((batch, heads, cache_len, size), present.dtype)
    buffer[:, :, :seq] = present
    return buffer


def stop_ids(stop_id: int | Iterable[int] | None, vocab: int) -> frozenset[int]:
    """The ids a row stops after: none, one, or several (a generation
    config's ``eos_token_id`` may be a list), each inside the vocabulary."""
    if stop_id is None:
        return frozenset()
    ids = [stop_id] if isinstance(stop_id, (int, np.integer)) else list(stop_id)
    for t in ids:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise BlockcError(f"stop id {t!r} is not an integer token id")
        if not 0 <= t < vocab:
            raise BlockcError(f"stop id {t} is outside the vocabulary [0, {vocab})")
    return frozenset(int(t) for t in ids)


def generate(model: DecoderLM, weights: Mapping[str, np.ndarray], prompts: Sequence[Sequence[int]], max_new: int,
             *, backend: str = "ort-cpu", pick: Pick = greedy, stop_id: int | Iterable[int] | None = None,
             on_token: OnToken | None = None, form: str = "fused", cache: str = "inplace",
             cache_len: int | None = None, rank_of: tuple[int, int] | None = None, pad_vocab: bool = False,
             load_s: float = 0.0, **backend_options) -> Generation:
    """Up to ``max_new`` new tokens after each of ``prompts`` (lists of ids),
    batched. A row stops after ``stop_id`` (an id, or several: ``stop_ids``);
    all stop when every row has.
    ``backend``: any registered backend, built with ``backend_options``;
    ``form``: the graph form compiled (by default ``fused``: through the
    optimizer, the graphs ``docs/PERFORMANCE.md`` measures);
    ``cache``: ``inplace`` (a buffer of ``cache_len`` positions, by default
    just enough) or ``concat`` (see the module docstring). ``prompts``: see
    ``as_prompts`` (a 2-D integer array is one prompt a row); ``load_s``:
    the seconds the caller took to load ``weights``, reported in the start
    time (``Generation.start_s``) with the compile.
    ``rank_of=(rank, world)``: this process is one rank of a tensor-parallel
    group (``parallel/launch.generate_tp``): both graphs are sharded
    (``passes/shard.py``, ``pad_vocab`` passed on) before the form is
    applied, and this rank's graph runs on its slice of the weights; the
    logits are gathered, so every rank picks the same tokens."""
    model = as_decoder(model)
    prompts = check_request(model, prompts, max_new)
    stops = stop_ids(stop_id, model.cfg.vocab)
    length = cache_length(model, prompts, max_new, cache, cache_len)
    target = make_backend(backend, **backend_options)
    target.require()
    t0 = time.perf_counter()
    weights = dict(weights)   # made once (seeded weights are made on access) for both graphs
    prefill_graph, decode_graph, names = _step_graphs(model, prompts, length, max_new > 1)
    prefill_graph, prefill_weights, split = _rank_part(prefill_graph, weights, rank_of, pad_vocab, names.pairs)
    decode_graph, decode_weights, _ = _rank_part(decode_graph, weights, rank_of, pad_vocab, names.pairs, split) \
        if decode_graph is not None else (None, None, None)
    with target.compile(to_form(prefill_graph, form), prefill_weights) as prefill:
        decode = target.compile(to_form(decode_graph, form), decode_weights) if decode_graph is not None else None
        try:
            compile_s = time.perf_counter() - t0
            return replace(_loop(model.cfg.vocab, names, prefill, decode, length, prompts, max_new, pick, stops,
                                 on_token, compile_s, target.name), form=form, load_s=load_s)
        finally:
            if decode is not None:
                decode.close()


def _rank_part(graph, weights: dict, rank_of, pad_vocab: bool, names: list, split: dict | None = None):
    """The graph and weights this process runs: all of them, or its rank's,
    and how its presents are split. The KV cache stays split by heads: the
    prefill's presents as they are, and each decode step given its pasts in
    the same layout (``split``) and returning its presents so."""
    if rank_of is None:
        return graph, weights, {}
    rank, world = rank_of
    sharded = shard(graph, world, pad_vocab=pad_vocab, keep_split={present for _, present in names},
                    inputs={past: split.get(present, ()) for past, present in names} if split is not None else None)
    if split is not None and sharded.outputs != split:
        raise BlockcError("the decode step's caches would be split unlike the prefill's: the step cannot carry them")
    return sharded.graphs[rank], sharded.rank_weights(weights, rank), sharded.outputs


def _step_graphs(model, prompts, length: int | None, decodes: bool):
    """The prefill's and the decode step's graphs, traced (no decode graph
    where one token is asked for), and the names they take."""
    if isinstance(model, OnnxDecoder):   # the file's own step, with a past of 0 rows for the prefill
        c = model.cache
        names = StepNames(list(c.pairs), c.input_ids, c.attention_mask, model.position_ids,
                          model.empty_past(len(prompts), model.model.dtype.numpy))
        decode = model.step(length) if decodes else None
        return model.step(), decode, names
    pads = padded(prompts)   # none: the unpadded graphs, no key mask to build and apply
    names = StepNames(cache_names(model.cfg.layers))
    prefill = model.for_cache("prefill", padded=pads)
    decode = model.for_cache("decode", cache_len=length, padded=pads) if decodes else None
    return trace(prefill), trace(decode) if decode is not None else None, names


@dataclass(frozen=True)
class StepNames:
    """What a step graph calls its inputs and outputs: ``pairs`` (past input,
    present output); ``position_ids`` None where the graph takes none (it
    derives positions from the mask, as ONNX Runtime GenAI's does);
    ``first_past``: what the prefill reads as the past (a file's pasts of 0
    rows; none for ``DecoderLM.for_cache("prefill")``, which takes none)."""

    pairs: list
    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    position_ids: str | None = "position_ids"
    first_past: dict = field(default_factory=dict)

    def feeds(self, ids, mask, positions) -> dict:
        out = {self.input_ids: ids, self.attention_mask: mask}
        if self.position_ids is not None:
            out[self.position_ids] = positions
        return out


def _loop(vocab: int, names: StepNames, prefill, decode, cache_len, prompts, max_new, pick, stops, on_token,
          compile_s, backend) -> Generation:
    ids, mask, positions = left_pad(prompts)
    history = [list(map(int, p)) for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(len(prompts), bool)

    def take(out, start) -> tuple[np.ndarray, float]:
        chosen = _picked(pick, out["logits"][:, -1], history, vocab)
        for row, token in enumerate(chosen):
            if not done[row]:
                new[row].append(int(token))
                history[row].append(int(token))
        done[:] |= np.isin(chosen, list(stops))
        seconds = time.perf_counter() - start
        if on_token is not None:
            on_token(new)
        return chosen, seconds

    start = time.perf_counter()
    out = prefill.run({**names.feeds(ids, mask, positions), **names.first_past})
    chosen, first_s = take(out, start)
    steps: list[float] = []
    if decode is None:
        return Generation(new, first_s, steps, compile_s, backend)
    state = {past: out[present] if cache_len is None else into_cache(out[present], cache_len)
             for past, present in names.pairs}
    position = positions[:, -1:]
    with decode.cached({present: past for past, present in names.pairs}, state) as step:
        for _ in range(max_new - 1):
            if done.all():
                break
            start = time.perf_counter()
            mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
            position = position + 1
            out = step.run(names.feeds(chosen[:, None], mask, position))
            chosen, seconds = take(out, start)
            steps.append(seconds)
    return Generation(new, first_s, steps, compile_s, backend)
