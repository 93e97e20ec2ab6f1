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

The cache kinds are ``cache.CacheKind``. Tokens are chosen by ``pick(logits
[batch, vocab], history) -> int64 [batch]``, ``history`` holding each row's
prompt and the tokens picked so far: ``sampling.greedy`` and
``sampling.Sampler`` (a list of ``processors``). Rows finish by
``stopping``'s criteria: max new tokens, the stop ids, and any given
(stop strings, a time limit). ``DecodeLoop`` holds one generation's state.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import BlockcError
from ..frontends.models import DecoderLM
from ..frontends.module import trace
from ..frontends.trace_key import trace_key
from ..ir.graph import Graph
from ..passes.forms import form_of, to_form
from ..passes.shard import shard
from ..runtime.backend import CompileHints, make_backend
from .agreement import RankDecisions
from .cache import CacheKind, cache_length, cache_names, into_cache
from .decoder import as_decoder
from .sampling import greedy
from .stopping import EosIds, MaxNewTokens, StoppingCriteriaList, StoppingCriterion

if TYPE_CHECKING:   # imported for an ONNX decoder alone (``decoder.as_decoder``)
    from ..frontends.onnx.decoder import OnnxDecoder

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
        # numpy's percentile (its default, linear) is statistics' inclusive method; numpy's would import
        # numpy.ma, 0.05-0.2 s of the run's end
        if len(self.step_s) < 2:
            return self.step_s[0] if self.step_s else None
        return statistics.quantiles(self.step_s, n=10, method="inclusive")[-1]

    @property
    def tokens_per_s(self) -> float:
        """New tokens of every row over the time from the prefill to the last pick."""
        total = self.first_token_s + sum(self.step_s)
        return sum(len(t) for t in self.tokens) / total if total > 0 else 0.0

    @classmethod
    def from_json(cls, d: dict) -> "Generation":
        """The ``Generation`` that ``as_json`` wrote (a tensor-parallel rank's, read by its launcher)."""
        return cls(d["tokens"], d["first_token_s"], d["step_s"], d["compile_s"], d["backend"], d["form"],
                   d["load_s"])

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


def generate(model: DecoderLM, weights: Mapping[str, np.ndarray], prompts: Sequence[Sequence[int]], max_new: int,
             *, backend: str = "ort-cpu", pick: Pick = greedy, stop_id: int | Iterable[int] | None = None,
             stopping: Sequence[StoppingCriterion] = (), on_token: OnToken | None = None, form: str = "fused",
             cache: CacheKind | str = CacheKind.INPLACE, cache_len: int | None = None,
             rank_of: tuple[int, int] | None = None, pad_vocab: bool = False, load_s: float = 0.0,
             **backend_options) -> Generation:
    """Up to ``max_new`` new tokens after each of ``prompts`` (lists of ids),
    batched. A row stops after ``stop_id`` (an id, or several: ``stop_ids``)
    or when any of ``stopping`` (``stopping.py``: stop strings, a time limit,
    your own) finishes it; all stop when every row has.
    ``backend``: any registered backend, built with ``backend_options``;
    ``form``: the graph form compiled (by default ``fused``: through the
    optimizer, the graphs ``docs/PERFORMANCE.md`` measures);
    ``cache``: a ``CacheKind`` or its name, ``inplace`` (a buffer of
    ``cache_len`` positions, by default just enough) or ``concat`` (see the
    module docstring). ``prompts``: see ``as_prompts`` (a 2-D integer array
    is one prompt a row); ``load_s``: the seconds the caller took to load
    ``weights``, reported in the start time (``Generation.start_s``) with
    the compile.
    ``rank_of=(rank, world)``: this process is one rank of a tensor-parallel
    group (``parallel/launch.generate_tp``): both graphs are sharded
    (``passes/shard.py``, ``pad_vocab`` passed on) before the form is
    applied, and this rank's graph runs on its slice of the weights; the
    logits are gathered, rank 0 picks and decides which rows are done, and
    the other ranks take its decisions (``agreement.py``), so every rank
    runs the same steps: ``pick`` and ``stopping`` run on rank 0 alone."""
    model = as_decoder(model)
    prompts = check_request(model, prompts, max_new)
    criteria = StoppingCriteriaList([MaxNewTokens(max_new), EosIds(stop_id, model.cfg.vocab), *stopping])
    length = cache_length(model, prompts, max_new, cache, cache_len)
    target = make_backend(backend, **backend_options)
    target.require()
    t0 = time.perf_counter()
    weights = dict(weights)   # made once (seeded weights are made on access) for both graphs
    steps, names = _steps(model, prompts, length, max_new > 1)
    (prefill_graph, prefill_weights), (decode_graph, decode_weights) = \
        _graphs(steps, weights, form, names.pairs, rank_of, pad_vocab)
    # the prefill runs once; each decode step multiplies one row a prompt by every weight: a backend may use
    # that, or not
    with target.compile_hinted(prefill_graph, prefill_weights, CompileHints(runs=1)) as prefill:
        decode = target.compile_hinted(decode_graph, decode_weights, CompileHints(rows=len(prompts))) \
            if decode_graph is not None else None
        try:
            compile_s = time.perf_counter() - t0
            loop = DecodeLoop(model.cfg.vocab, names, pick, criteria, on_token, prompts, length,
                              ranks=RankDecisions(rank_of[0]) if rank_of is not None and rank_of[1] > 1 else None)
            return replace(loop.run(prefill, decode), compile_s=compile_s, backend=target.name, form=form,
                           load_s=load_s)
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


@dataclass(frozen=True)
class Step:
    """A step graph not yet traced: ``trace()`` makes it; ``source`` says
    what it depends on, before tracing (``frontends.trace_key``; None where
    only the trace can tell), so a compile-cache hit need not trace."""

    source: str | None
    trace: Callable[[], Graph]


def _steps(model, prompts, length: int | None, decodes: bool) -> tuple[list, StepNames]:
    """The prefill's and the decode step's graphs, to be traced (no decode
    graph where one token is asked for: None), and the names they take."""
    if not isinstance(model, DecoderLM):   # an OnnxDecoder (as_decoder's other kind): the file's own step, with a past of 0 rows for the prefill
        c = model.cache
        names = StepNames(list(c.pairs), c.input_ids, c.attention_mask, model.position_ids,
                          model.empty_past(len(prompts), model.model.dtype.numpy))
        return [_file_step(model, None), _file_step(model, length) if decodes else None], names
    pads = padded(prompts)   # none: the unpadded graphs, no key mask to build and apply
    prefill = model.for_cache("prefill", padded=pads)
    decode = model.for_cache("decode", cache_len=length, padded=pads) if decodes else None
    return [Step(trace_key(m), lambda m=m: trace(m)) if m is not None else None for m in (prefill, decode)], \
        StepNames(cache_names(model.cfg.layers))


def _file_step(model: OnnxDecoder, cache_len: int | None) -> Step:
    """An ONNX decoder file's step: its own graph, a buffer past of ``cache_len`` rows or none."""
    step = model.step_model(cache_len)
    return Step(trace_key(step), lambda: model.traced(step, cache_len))


def _graphs(steps: list, weights: dict, form: str, pairs: list, rank_of, pad_vocab: bool) -> list:
    """Each step's graph in ``form`` and the weights it runs on (``(None,
    None)`` for a step not taken): from the compile cache without tracing
    where it can be (``passes.forms.form_of``), or this rank's part of it
    (``_rank_part``), sharded after tracing and before the form."""
    if rank_of is None:
        return [(form_of(s.source, s.trace, form), weights) if s is not None else (None, None) for s in steps]
    out, split = [], None
    for step in steps:
        if step is None:
            out.append((None, None))
            continue
        graph, part, made = _rank_part(step.trace(), weights, rank_of, pad_vocab, pairs, split)
        split = made if split is None else split
        out.append((to_form(graph, form), part))
    return out


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


@dataclass
class DecodeLoop:
    """One generation's steps and everything they carry: what it was asked
    (``pick``, ``criteria``, ``on_token``, the cache length: None for the
    concat cache) and what it has so far (each row's ``history`` and ``new``
    ids, which rows are ``done``, the mask and positions fed, the last ids
    ``chosen``, the timings). ``run`` drives the prefill, then the decode
    steps until every row is done. ``ranks``: this process is one rank of a
    tensor-parallel group, where rank 0 picks and decides for all
    (``agreement.py``)."""

    vocab: int
    names: StepNames
    pick: Pick
    criteria: StoppingCriteriaList
    on_token: OnToken | None
    prompts: list[list[int]]
    cache_len: int | None
    history: list[list[int]] = field(init=False)
    new: list[list[int]] = field(init=False)
    done: np.ndarray = field(init=False)
    mask: np.ndarray = field(init=False)
    positions: np.ndarray = field(init=False)
    chosen: np.ndarray = field(init=False)
    ranks: RankDecisions | None = None
    first_token_s: float = 0.0
    step_s: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.history = [list(p) for p in self.prompts]
        self.new = [[] for _ in self.prompts]
        self.done = np.zeros(len(self.prompts), bool)

    def take(self, logits: np.ndarray, start: float) -> float:
        """Pick from ``logits``, add each unfinished row's id, ask the
        criteria which rows are done (a rank that follows takes rank 0's
        picks and done rows instead: ``agreement.py``); the seconds since ``start``."""
        if self.ranks is None or self.ranks.leads:
            self._add(_picked(self.pick, logits, self.history, self.vocab))
            done = self.criteria(self.history, self.new)
            if self.ranks is not None:
                self.ranks.send(self.chosen, done)
        else:
            chosen, done = self.ranks.receive(len(self.prompts))
            self._add(chosen)
        self.done |= done
        seconds = time.perf_counter() - start
        if self.on_token is not None:
            self.on_token(self.new)
        return seconds

    def _add(self, chosen: np.ndarray) -> None:
        """``chosen`` taken as the step's ids: each unfinished row's appended."""
        self.chosen = chosen
        for row, token in enumerate(chosen):
            if not self.done[row]:
                self.new[row].append(int(token))
                self.history[row].append(int(token))

    def run(self, prefill, decode) -> Generation:
        self.criteria.begin()
        start = time.perf_counter()
        ids, self.mask, self.positions = left_pad(self.prompts)
        out = prefill.run({**self.names.feeds(ids, self.mask, self.positions), **self.names.first_past})
        self.first_token_s = self.take(out["logits"][:, -1], start)
        if decode is not None and not self.done.all():
            self._decode(decode, out)
        return Generation(self.new, self.first_token_s, self.step_s)

    def _decode(self, decode, out) -> None:
        pairs = self.names.pairs
        state = {past: out[present] if self.cache_len is None else into_cache(out[present], self.cache_len)
                 for past, present in pairs}
        self.positions = self.positions[:, -1:]
        with decode.cached({present: past for past, present in pairs}, state) as step:
            while not self.done.all():
                start = time.perf_counter()
                self.mask = np.concatenate([self.mask, np.ones((len(self.prompts), 1), np.int64)], axis=1)
                self.positions = self.positions + 1
                out = step.run(self.names.feeds(self.chosen[:, None], self.mask, self.positions))
                self.step_s.append(self.take(out["logits"][:, -1], start))
