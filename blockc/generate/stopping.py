"""When a row stops: stopping criteria as objects, with Hugging Face's meaning.

A criterion is called after every pick as ``criterion(history, new) ->
bool[batch]``: ``history`` each row's prompt and generated ids, ``new`` the
generated ids alone; True marks a row that has finished (its last token is
kept, as HF keeps the eos id or the tokens that made a stop string). A
finished row stays finished: the loop adds no token to it and stops when
every row has. ``begin()`` is called once as the prefill starts (a clock
starts there). ``StoppingCriteriaList`` holds them and finishes a row when
any finishes it, as HF's ``StoppingCriteriaList``.

    MaxNewTokens(n)         HF's max_new_tokens (``MaxLengthCriteria``)
    EosIds(ids)             HF's ``EosTokenCriteria``: one id or several
    StopStrings(strs, dec)  HF's ``StopStringCriteria``
    MaxTime(seconds)        HF's ``MaxTimeCriteria``: the whole batch stops
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..errors import BlockcError

History = Sequence[Sequence[int]]


class StoppingCriterion:
    """One rule for finishing rows (see the module)."""

    def begin(self) -> None:
        """Called once as generation starts; most rules need nothing."""

    def __call__(self, history: History, new: History) -> np.ndarray:
        raise NotImplementedError


class StoppingCriteriaList(list):
    """Criteria together: a row is finished when any of them finishes it."""

    def begin(self) -> None:
        for criterion in self:
            criterion.begin()

    def __call__(self, history: History, new: History) -> np.ndarray:
        done = np.zeros(len(history), bool)
        for criterion in self:
            done |= np.asarray(criterion(history, new), bool)
        return done


class MaxNewTokens(StoppingCriterion):
    """A row finishes once it has ``count`` new tokens."""

    def __init__(self, count: int):
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise BlockcError(f"max_new must be a positive integer, got {count!r}")
        self.count = int(count)

    def __call__(self, history, new):
        return np.array([len(ids) >= self.count for ids in new], bool)


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


class EosIds(StoppingCriterion):
    """A row finishes after any of ``ids`` (checked by ``stop_ids``)."""

    def __init__(self, ids: int | Iterable[int], vocab: int):
        self.ids = stop_ids(ids, vocab)

    def __call__(self, history, new):
        return np.array([bool(ids) and ids[-1] in self.ids for ids in new], bool)


class StopStrings(StoppingCriterion):
    """HF's ``StopStringCriteria``: a row finishes when a stop string ends in
    the text of its last token, the string's start possibly tokens earlier
    (the prompt's included). ``decode(ids) -> str`` is the tokenizer's
    (``TextTokenizer.decode``); only the last tokens are decoded, enough
    that the text before the last one holds the longest stop string."""

    def __init__(self, strings: str | Iterable[str], decode: Callable[[Sequence[int]], str]):
        strings = [strings] if isinstance(strings, str) else list(strings)
        bad = [s for s in strings if not isinstance(s, str) or not s]
        if not strings or bad:
            raise BlockcError(f"a stop string must be a non-empty string, got {bad[0] if bad else strings!r}")
        self.strings = tuple(strings)
        self.decode = decode

    def _ends_in_last(self, ids: Sequence[int]) -> bool:
        longest = max(len(s) for s in self.strings)
        take = 2
        while True:   # widen until the text before the last token covers the longest string
            tail = list(ids[-take:])
            before, text = self.decode(tail[:-1]), self.decode(tail)
            if len(before) >= longest or take >= len(ids):
                break
            take *= 2
        return any(text.rfind(s) + len(s) > len(before) for s in self.strings if s in text)

    def __call__(self, history, new):
        return np.array([bool(n) and self._ends_in_last(h) for h, n in zip(history, new)], bool)


class MaxTime(StoppingCriterion):
    """HF's ``MaxTimeCriteria``: every row finishes once more than ``seconds``
    have passed since generation began (the prefill's start), on ``clock``
    (``time.perf_counter`` unless given: a test hands a fake one)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter):
        try:
            self.seconds = float(seconds)
        except (TypeError, ValueError):
            raise BlockcError(f"max_time must be a number of seconds, got {seconds!r}") from None
        if not self.seconds > 0:
            raise BlockcError(f"max_time must be > 0 seconds, got {seconds!r}")
        self.clock = clock
        self.start = clock()

    def begin(self) -> None:
        self.start = self.clock()

    def __call__(self, history, new):
        return np.full(len(history), self.clock() - self.start > self.seconds, bool)


def user_criteria(*, stop: Sequence[str] | None = None, max_time: float | None = None,
                  decode: Callable[[Sequence[int]], str] | None = None) -> list[StoppingCriterion]:
    """The criteria the CLI's ``--stop`` (repeatable) and ``--max-time`` ask
    for; ``decode``: the model's tokenizer's, which stop strings need."""
    criteria: list[StoppingCriterion] = []
    if stop:
        if decode is None:
            raise BlockcError("--stop needs the model's tokenizer to read the text: generate from a Hugging Face "
                              "directory with a tokenizer.json, or stop on ids with --stop-id")
        criteria.append(StopStrings(stop, decode))
    if max_time is not None:
        criteria.append(MaxTime(max_time))
    return criteria
