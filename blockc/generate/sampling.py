"""Choosing the next token from a step's logits.

A generation loop calls ``pick(logits, history) -> ids``: ``logits`` is a
float array ``[batch, vocab]`` (float32, float16, bfloat16 or float64, from
whichever backend ran the model), ``history`` holds each row's prompt and generated ids so far, and
the result is an int64 array ``[batch]``. Everything here runs on the host in
float64, so for the same logits and seed the same ids come out whatever
backend produced the logits.

``Sampler`` applies Hugging Face ``generate``'s processors in its order and
with its meaning:

1. repetition penalty (``RepetitionPenaltyLogitsProcessor``): for each id
   already in the row's history, a score ``> = 0`` is divided by the
   penalty and a negative one multiplied by it;
2. temperature (``TemperatureLogitsWarper``): scores divided by it;
3. top-k (``TopKLogitsWarper``): scores below the k-th largest dropped
   (ties with the k-th are kept, as HF does);
4. top-p (``TopPLogitsWarper``): the smallest set of most likely tokens
   whose probability reaches ``p`` kept, never fewer than one token;

then one token drawn per row from the softmax of what is left.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import BlockcError
from ..frontends.module import check_seed
from ..ir.dtypes import is_float_numpy


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


def repetition_penalty(scores: np.ndarray, history: Sequence[Sequence[int]], penalty: float) -> np.ndarray:
    """HF's repetition penalty: ids seen in a row's history have positive
    scores divided by ``penalty`` and negative ones multiplied by it, once
    per id however often it occurred. Ids beyond the vocabulary are ignored,
    as HF ignores ids the output layer cannot produce."""
    if len(history) != scores.shape[0]:
        raise BlockcError(f"history has {len(history)} rows but logits have {scores.shape[0]}")
    out = scores.copy()
    if penalty == 1.0:
        return out
    vocab = scores.shape[1]
    for row, ids in enumerate(history):
        seen = np.unique(np.asarray(ids, dtype=np.int64))
        if seen.size and seen[0] < 0:
            raise BlockcError(f"history row {row} holds a negative token id ({int(seen[0])})")
        seen = seen[seen < vocab]
        picked = out[row, seen]
        out[row, seen] = np.where(picked < 0, picked * penalty, picked / penalty)
    return out


def top_k_filter(scores: np.ndarray, k: int) -> np.ndarray:
    """HF's top-k: scores below each row's k-th largest become -inf (ties kept); ``k == 0`` keeps all."""
    if k <= 0 or k >= scores.shape[1]:
        return scores.copy()
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]
    return np.where(scores < kth, -np.inf, scores)


def top_p_filter(scores: np.ndarray, p: float) -> np.ndarray:
    """HF's top-p (nucleus): keep the most likely tokens up to and including
    the one whose cumulative probability reaches ``p``; the most likely token
    is always kept. Equal scores are taken lowest id first."""
    if p >= 1.0:
        return scores.copy()
    out = np.full_like(scores, -np.inf)
    for row, s in enumerate(scores):
        order = np.lexsort((np.arange(s.size), -s))  # descending score, then ascending id
        probs = _softmax(s[order])
        before = np.concatenate(([0.0], np.cumsum(probs)[:-1]))  # mass of the tokens ranked above
        keep = order[before < p]
        out[row, keep] = s[keep]
    return out


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - np.max(scores))
    return e / e.sum()


def _finite_number(name: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BlockcError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise BlockcError(f"{name} must be finite, got {value!r}")
    return number


class Sampler:
    """``pick(logits, history) -> ids`` drawing from the processed distribution.

    ``temperature == 0`` picks greedily (after the repetition penalty, as HF's
    ``do_sample=False`` does); ``top_k == 0`` and ``top_p == 1`` switch those
    filters off. Draws come from ``numpy.random.default_rng(seed)``: one
    uniform number per row per call, taken before looking at any logits, so a
    row's token depends on its own logits, its row index and how many calls
    came before, never on the other rows' logits.
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int = 0):
        self.temperature = _finite_number("temperature", temperature)
        if self.temperature < 0:
            raise BlockcError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
            raise BlockcError(f"top_k must be an integer, got {top_k!r}")
        if top_k < 0:
            raise BlockcError(f"top_k must be >= 0 (0 means no top-k), got {top_k}")
        self.top_k = int(top_k)
        self.top_p = _finite_number("top_p", top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise BlockcError(f"top_p must be in (0, 1], got {top_p!r}")
        self.repetition_penalty = _finite_number("repetition_penalty", repetition_penalty)
        if self.repetition_penalty <= 0:
            raise BlockcError(f"repetition_penalty must be > 0, got {repetition_penalty!r}")
        self.seed = check_seed(seed)
        self._rng = np.random.default_rng(self.seed)

    def process(self, logits, history: Sequence[Sequence[int]]) -> np.ndarray:
        """The float64 scores a draw samples from (up to a constant per row): -inf where a filter removed a token."""
        scores = repetition_penalty(_as_scores(logits), history, self.repetition_penalty)
        if self.temperature == 0:
            return scores
        # Shifted so each row's best is 0 first: the softmax is the same, and a
        # tiny temperature cannot overflow a score to +inf.
        scores = (scores - scores.max(axis=1, keepdims=True)) / self.temperature
        return top_p_filter(top_k_filter(scores, self.top_k), self.top_p)

    def __call__(self, logits, history: Sequence[Sequence[int]]) -> np.ndarray:
        scores = self.process(logits, history)
        # Drawn first and always, one per row, so the stream does not depend on the logits.
        uniforms = self._rng.random(scores.shape[0])
        if self.temperature == 0:
            return np.argmax(scores, axis=1).astype(np.int64)
        ids = np.empty(scores.shape[0], dtype=np.int64)
        for row, (s, u) in enumerate(zip(scores, uniforms)):
            cdf = np.cumsum(_softmax(s))
            # side="right" with u < 1 never lands on a token of probability 0
            ids[row] = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), s.size - 1)
        return ids
