"""Logits processors: each sampling rule one class, with Hugging Face's meaning.

A processor is called as ``processor(scores, history) -> scores``: ``scores``
float64 ``[batch, vocab]`` (-inf where an earlier rule removed a token),
``history`` each row's prompt and generated ids so far. It returns new
scores and never changes the ones it was given. (Hugging Face's
``LogitsProcessor`` takes ``(input_ids, scores)``; ours takes the scores
first, as ``pick(logits, history)`` does, and ragged rows, since our rows
are not padded.)

``LogitsProcessorList`` applies its processors in order. ``hf_processors``
builds the list ``model.generate()`` builds, in its order
(``GenerationMixin._get_logits_processor``)::

    repetition penalty, no-repeat n-gram, <the user's own processors>,
    and when sampling: temperature, top-k, top-p, min-p

A new rule is one class: subclass ``LogitsProcessor``, write ``__call__``,
and hand an instance to ``Sampler(processors=[...])``
(``tests/generate/test_processors.py`` defines one in the test alone).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import BlockcError

History = Sequence[Sequence[int]]


def finite_number(name: str, value) -> float:
    """``value`` as a finite float, else a ``BlockcError`` naming ``name``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BlockcError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise BlockcError(f"{name} must be finite, got {value!r}")
    return number


def whole_number(name: str, value, least: int, meaning: str) -> int:
    """``value`` as an int ``>= least``, else a ``BlockcError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BlockcError(f"{name} must be an integer, got {value!r}")
    if value < least:
        raise BlockcError(f"{name} must be >= {least} ({meaning}), got {value}")
    return int(value)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``[batch, vocab]`` (or one row); -inf becomes 0."""
    e = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class LogitsProcessor:
    """One sampling rule: ``__call__(scores, history) -> scores`` (see the module)."""

    def __call__(self, scores: np.ndarray, history: History) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class LogitsProcessorList(list):
    """Processors applied one after another, as HF's ``LogitsProcessorList``."""

    def __call__(self, scores: np.ndarray, history: History) -> np.ndarray:
        for processor in self:
            scores = processor(scores, history)
        return scores


class RepetitionPenalty(LogitsProcessor):
    """HF's ``RepetitionPenaltyLogitsProcessor``: ids seen in a row's history
    have positive scores divided by ``penalty`` and negative ones multiplied
    by it, once per id however often it occurred. Ids beyond the vocabulary
    are ignored, as HF ignores ids the output layer cannot produce."""

    def __init__(self, penalty: float):
        self.penalty = finite_number("repetition_penalty", penalty)
        if self.penalty <= 0:
            raise BlockcError(f"repetition_penalty must be > 0, got {penalty!r}")

    def __call__(self, scores, history):
        out = scores.copy()
        vocab = scores.shape[1]
        for row, ids in enumerate(history):
            seen = np.unique(np.asarray(ids, dtype=np.int64))
            if seen.size and seen[0] < 0:
                raise BlockcError(f"history row {row} holds a negative token id ({int(seen[0])})")
            seen = seen[seen < vocab]
            picked = out[row, seen]
            out[row, seen] = np.where(picked < 0, picked * self.penalty, picked / self.penalty)
        return out


class NoRepeatNGram(LogitsProcessor):
    """HF's ``NoRepeatNGramLogitsProcessor``: no n-gram of ``size`` ids occurs
    twice in a row's history. The ids that would complete an n-gram already
    seen (its first ``size - 1`` ids being the row's last ones) are removed.
    The prompt counts, as it does for HF's decoder-only models."""

    def __init__(self, size: int):
        self.size = whole_number("no_repeat_ngram_size", size, 1, "the n-gram length")

    def __call__(self, scores, history):
        out = scores.copy()
        n = self.size
        for row, ids in enumerate(history):
            ids = list(ids)
            if len(ids) < n:
                continue   # no complete n-gram yet
            tail = ids[len(ids) - n + 1:]
            banned = [ids[i + n - 1] for i in range(len(ids) - n + 1) if ids[i:i + n - 1] == tail]
            banned = [t for t in banned if 0 <= t < scores.shape[1]]
            out[row, banned] = -np.inf
        return out


class Temperature(LogitsProcessor):
    """HF's ``TemperatureLogitsWarper``: scores divided by ``temperature``
    (> 0). Each row is shifted so its best is 0 first: the distribution is
    HF's, and a tiny temperature cannot overflow a score to +inf."""

    def __init__(self, temperature: float):
        self.temperature = finite_number("temperature", temperature)
        if self.temperature <= 0:
            raise BlockcError(f"temperature must be > 0 to divide by, got {temperature!r}")

    def __call__(self, scores, history):
        return (scores - scores.max(axis=1, keepdims=True)) / self.temperature


class TopK(LogitsProcessor):
    """HF's ``TopKLogitsWarper``: scores below each row's k-th largest become
    -inf (ties with the k-th are kept, as HF keeps them); ``k == 0`` keeps all."""

    def __init__(self, k: int):
        self.k = whole_number("top_k", k, 0, "0 means no top-k")

    def __call__(self, scores, history):
        if self.k == 0 or self.k >= scores.shape[1]:
            return scores.copy()
        kth = -np.partition(-scores, self.k - 1, axis=1)[:, self.k - 1:self.k]
        return np.where(scores < kth, -np.inf, scores)


class TopP(LogitsProcessor):
    """HF's ``TopPLogitsWarper`` (nucleus): keep the most likely tokens up to
    and including the one whose cumulative probability reaches ``p``; the most
    likely token is always kept. Equal scores are taken lowest id first."""

    def __init__(self, p: float):
        self.p = finite_number("top_p", p)
        if not 0.0 < self.p <= 1.0:
            raise BlockcError(f"top_p must be in (0, 1], got {p!r}")

    def __call__(self, scores, history):
        if self.p >= 1.0:
            return scores.copy()
        out = np.full_like(scores, -np.inf)
        for row, s in enumerate(scores):
            order = np.lexsort((np.arange(s.size), -s))  # descending score, then ascending id
            before = np.concatenate(([0.0], np.cumsum(softmax(s[order]))[:-1]))  # mass ranked above
            keep = order[before < self.p]
            out[row, keep] = s[keep]
        return out


class MinP(LogitsProcessor):
    """HF's ``MinPLogitsWarper``: tokens less likely than ``p`` times the
    row's most likely one are removed (the most likely always stays)."""

    def __init__(self, p: float):
        self.p = finite_number("min_p", p)
        if not 0.0 <= self.p <= 1.0:
            raise BlockcError(f"min_p must be in [0, 1], got {p!r}")

    def __call__(self, scores, history):
        probs = softmax(scores)
        remove = probs < self.p * probs.max(axis=1, keepdims=True)
        remove[np.arange(len(scores)), np.argmax(probs, axis=1)] = False
        return np.where(remove, -np.inf, scores)


def hf_processors(*, sample: bool, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  min_p: float | None = None, repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
                  custom: Sequence[LogitsProcessor] = ()) -> LogitsProcessorList:
    """The processors ``model.generate()`` builds from these settings, in its
    order, each left out where HF leaves it out (a penalty of 1, a top-k of 0,
    a top-p of 1, a temperature of 1); ``custom`` goes where HF merges a
    user's ``logits_processor``. Without ``sample`` the warpers (temperature
    to min-p) are left out, as HF's ``do_sample=False``."""
    # each setting checked whether or not it turns its rule on, so a bad one is refused either way
    procs = LogitsProcessorList()
    penalty, ngram = RepetitionPenalty(repetition_penalty), whole_number(
        "no_repeat_ngram_size", no_repeat_ngram_size, 0, "0 means none")
    top_k, top_p = TopK(top_k), TopP(top_p)
    procs += [penalty] if penalty.penalty != 1.0 else []
    procs += [NoRepeatNGram(ngram)] if ngram else []
    procs += custom
    if not sample:
        return procs
    procs += [Temperature(temperature)] if temperature != 1.0 else []
    procs += [top_k] if top_k.k else []
    procs += [top_p] if top_p.p < 1.0 else []
    procs += [MinP(min_p)] if min_p is not None else []
    return procs
