"""Stopping criteria as objects: stop strings against Hugging Face's own
``StopStringCriteria`` on a real tokenizer (strings across token
boundaries), eos ids, max new tokens and a time limit on a fake clock, each
through ``generate`` too."""
import itertools

import numpy as np
import pytest

from blockc.errors import BlockcError
from blockc.frontends import build_model
from blockc.generate import generate
from blockc.generate.stopping import (EosIds, MaxNewTokens, MaxTime, StoppingCriteriaList, StopStrings,
                                      user_criteria)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
from test_loop import PROMPTS, weights_of  # noqa: E402
from transformers.generation.stopping_criteria import StopStringCriteria  # noqa: E402

from blockc.generate.text import TextTokenizer  # noqa: E402

TEXT = "the stopping point is here; stop. Unstoppable weather, worldwide!"
STOPS = ["stop", "point is", "e; s", "ld", "!", "xyz"]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_stop_strings_end_where_hfs_do_across_token_boundaries(hf_dir, family):
    path = hf_dir(family)
    ours = TextTokenizer.from_dir(path)
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    ids = theirs.encode(TEXT, add_special_tokens=False)
    prompt = 3
    for stops in [[s] for s in STOPS] + [STOPS]:
        criterion = StopStrings(stops, ours.decode)
        hf = StopStringCriteria(theirs, stops)
        got = [criterion([ids[:end]], [ids[prompt:end]])[0] for end in range(prompt + 1, len(ids) + 1)]
        want = [bool(hf(torch.tensor([ids[:end]]), None)[0])
                for end in range(prompt + 1, len(ids) + 1)]
        assert got == want, stops
    assert any(got), "some stop string must end inside the text"


LETTERS = lambda ids: "".join(chr(ord("a") + t % 26) for t in ids)   # a decode: one letter a token


def test_stop_strings_in_generate_stop_each_row_where_its_text_first_holds_one():
    model = build_model("tiny")
    weights = weights_of(model)
    full = generate(model, weights, PROMPTS, 10, backend="reference").tokens
    stop = LETTERS(full[0][3:5])   # spans two tokens of row 0
    got = generate(model, weights, PROMPTS, 10, backend="reference", stopping=[StopStrings(stop, LETTERS)]).tokens
    for prompt, row, whole in zip(PROMPTS, got, full):
        # one letter a token: the string ends in the last token exactly when the text ends with it
        ends = [n for n in range(1, len(whole) + 1) if LETTERS(prompt + whole[:n]).endswith(stop)]
        assert row == whole[:ends[0] if ends else len(whole)]
    assert len(got[0]) <= 5


def test_max_time_stops_every_row_on_its_clock():
    ticks = itertools.count()
    clock = lambda: float(next(ticks))   # a fake clock: one second a reading
    criterion = MaxTime(2.5, clock)
    criterion.begin()                    # read at t = 1 (made at t = 0)
    assert [criterion([[1], [2]], [[1], [2]]).tolist() for _ in range(3)] == \
        [[False, False], [False, False], [True, True]]   # read at 2, 3, 4: 1 s, 2 s, then 3 s > 2.5 s
    model = build_model("tiny")
    ticks = itertools.count()
    got = generate(model, weights_of(model), PROMPTS, 10, backend="reference",
                   stopping=[MaxTime(2.5, lambda: float(next(ticks)))]).tokens
    assert [len(row) for row in got] == [3, 3]   # the same readings: the third pick finishes both rows


def test_eos_ids_and_max_new_tokens():
    criteria = StoppingCriteriaList([MaxNewTokens(2), EosIds([7, 9], vocab=10)])
    assert criteria([[0, 7], [0, 1], [0, 1, 2]], [[7], [1], [1, 2]]).tolist() == [True, False, True]
    assert EosIds(None, vocab=10)([[1]], [[1]]).tolist() == [False]


@pytest.mark.parametrize("make, words", [
    (lambda: StopStrings("", LETTERS), "a stop string must be a non-empty string, got ''"),
    (lambda: StopStrings([], LETTERS), "a stop string must be a non-empty string, got []"),
    (lambda: MaxTime(0), "max_time must be > 0 seconds, got 0"),
    (lambda: MaxTime("soon"), "max_time must be a number of seconds, got 'soon'"),
    (lambda: MaxNewTokens(0), "max_new must be a positive integer, got 0"),
])
def test_bad_criteria_are_refused_in_one_line(make, words):
    with pytest.raises(BlockcError) as caught:
        make()
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_finished_row_gets_no_more_tokens():
    class FinishRowZero:   # a criterion of the test's own: row 0 finishes at once
        def begin(self):
            pass

        def __call__(self, history, new):
            return np.array([True] + [False] * (len(new) - 1))

    model = build_model("tiny")
    got = generate(model, weights_of(model), PROMPTS, 4, backend="reference", stopping=[FinishRowZero()]).tokens
    assert [len(row) for row in got] == [1, 4]


def test_the_clis_stop_and_max_time_become_criteria():
    assert user_criteria() == []
    made = user_criteria(stop=["ab", "c"], max_time=3, decode=LETTERS)
    assert [type(c).__name__ for c in made] == ["StopStrings", "MaxTime"]
    assert made[0].strings == ("ab", "c") and made[1].seconds == 3.0
    with pytest.raises(BlockcError, match="--stop needs the model's tokenizer"):
        user_criteria(stop=["ab"])
