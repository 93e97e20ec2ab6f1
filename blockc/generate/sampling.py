"""Choosing the next token from a step's logits.

A generation loop calls ``pick(logits, history) -> ids``: ``logits`` is a
float array ``[batch, vocab]`` (float32, float16, bfloat16 or float64, from
whichever backend ran the model), ``history`` holds each row's prompt and generated ids so far, and
the result is an int64 array ``[batch]``. Everything here runs on the host in
float64, so for the same logits and seed the same ids come out whatever
backend produced the logits.

``Sampler`` runs a list of logits processors (``processors.py``: repetition
penalty, no-repeat n-gram, temperature, top-k, top-p, min-p, each one class
with Hugging Face's meaning, in ``generate``'s order) and then picks: the
best id greedily, or one drawn per row from the softmax of what is left.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import BlockcError
from ..frontends.module import check_seed
from ..ir.dtypes import is_float_numpy
from .processors import LogitsProcessor, LogitsProcessorList, finite_number, hf_processors, softmax


def _as_scores(logits) -> np.ndarray:
    """``logits`` as float64 ``[batch, vocab]``, refused if not finite."""
    scores = np.asarray(logits)
    if scores.ndim != 2 or scores.shape[1] == 0:
        raise BlockcError(f"logits must be [batch, vocab] with vocab > 0, got shape {list(scores.shape)}")
    if not is_float_numpy(scores.dtype):
        raise BlockcError(f"logits must be a float array, got {scores.dtype}")
    scores = scores.astype(np.float64)
    bad = ~np.isfinite(scores)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise BlockcError(f"logits row {row} is not finite (token {col} is {scores[row, col]})")
    return scores


def greedy(logits, history: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """The most likely id of each row; ties go to the lowest id (``np.argmax``'s first)."""
    return np.argmax(_as_scores(logits), axis=1).astype(np.int64)


class Sampler:
    """``pick(logits, history) -> ids``: the processors, then a pick.

    The settings are HF's ``GenerationConfig`` fields; ``processors`` holds
    the list they make (``hf_processors``), with ``extra`` (the user's own
    ``LogitsProcessor``s) where HF puts a user's ``logits_processor``.
    ``temperature == 0`` picks greedily (after the repetition penalty and the
    n-gram ban, as HF's ``do_sample=False`` does); ``top_k == 0``,
    ``top_p == 1`` and ``min_p`` None switch those filters off. Draws come
    from ``numpy.random.default_rng(seed)``: one uniform number per row per
    call, taken before looking at any logits, so a row's token depends on its
    own logits, its row index and how many calls came before, never on the
    other rows' logits.
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int = 0, *, min_p: float | None = None,
                 no_repeat_ngram_size: int = 0, extra: Sequence[LogitsProcessor] = ()):
        self.temperature = finite_number("temperature", temperature)
        if self.temperature < 0:
            raise BlockcError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
        bad = [p for p in extra if not callable(p)]
        if bad:
            raise BlockcError(f"a logits processor must be callable as (scores, history) -> scores, got {bad[0]!r}")
        self.processors: LogitsProcessorList = hf_processors(
            sample=self.temperature > 0, temperature=self.temperature or 1.0, top_k=top_k, top_p=top_p,
            min_p=min_p, repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            custom=extra)
        self.seed = check_seed(seed)
        self._rng = np.random.default_rng(self.seed)

    def process(self, logits, history: Sequence[Sequence[int]]) -> np.ndarray:
        """The float64 scores a draw samples from (up to a constant per row): -inf where a filter removed a token."""
        scores = _as_scores(logits)
        if len(history) != scores.shape[0]:
            raise BlockcError(f"history has {len(history)} rows but logits have {scores.shape[0]}")
        return self.processors(scores, history)

    def __call__(self, logits, history: Sequence[Sequence[int]]) -> np.ndarray:
        scores = self.process(logits, history)
        # Drawn first and always, one per row, so the stream does not depend on the logits.
        uniforms = self._rng.random(scores.shape[0])
        if self.temperature == 0:
            return np.argmax(scores, axis=1).astype(np.int64)
        ids = np.empty(scores.shape[0], dtype=np.int64)
        for row, (s, u) in enumerate(zip(scores, uniforms)):
            cdf = np.cumsum(softmax(s))
            # side="right" with u < 1 never lands on a token of probability 0
            ids[row] = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), s.size - 1)
        return ids
