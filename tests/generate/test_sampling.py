"""Token pickers on hand-made logits: each processor against hand-computed
numbers and against Hugging Face's own processor on the same tensor, the
seeded draws, and the values refused."""
import math

import numpy as np
import pytest

from blockc.errors import BlockcError
from blockc.ir.dtypes import DType
from blockc.generate import Sampler, greedy
from blockc.generate.processors import RepetitionPenalty, TopK, TopP

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor,  # noqa: E402
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

LOGITS = np.array([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0],
                   [0.0, 4.0, -3.0, 1.5, 2.5, -0.5]])
HISTORY = [[0, 1, 1, 4], [2, 3, 3]]


def hf(processor, scores: np.ndarray, history=HISTORY) -> np.ndarray:
    """``processor`` run on ``scores`` as torch float64, back as numpy."""
    width = max(len(h) for h in history)
    # HF takes a rectangular id tensor; repeating a row's first id pads it without changing the set
    ids = torch.tensor([h + [h[0]] * (width - len(h)) for h in history])
    return processor(ids, torch.tensor(scores, dtype=torch.float64)).numpy()


def probs(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_greedy_takes_the_argmax_and_the_lowest_id_on_ties():
    assert greedy(LOGITS, HISTORY).tolist() == [3, 1]
    assert greedy(np.array([[1.0, 5.0, 5.0]], dtype=np.float16), [[]]).tolist() == [1]
    assert greedy(LOGITS, HISTORY).dtype == np.int64


def test_repetition_penalty_by_hand_and_as_hf():
    out = RepetitionPenalty(2.0)(LOGITS, HISTORY)
    # row 0 saw ids 0 (2.0 -> 1.0), 1 (-1.0 -> -2.0, once though seen twice), 4 (-2.0 -> -4.0)
    assert out[0].tolist() == [1.0, -2.0, 0.5, 3.0, -4.0, 1.0]
    # row 1 saw ids 2 (-3.0 -> -6.0) and 3 (1.5 -> 0.75)
    assert out[1].tolist() == [0.0, 4.0, -6.0, 0.75, 2.5, -0.5]
    np.testing.assert_array_equal(out, hf(RepetitionPenaltyLogitsProcessor(2.0), LOGITS))
    np.testing.assert_array_equal(RepetitionPenalty(0.5)(LOGITS, HISTORY),
                                  hf(RepetitionPenaltyLogitsProcessor(0.5), LOGITS))


def test_repetition_penalty_ignores_ids_beyond_the_vocabulary_as_hf():
    history = [[0, 99], [5, 6]]
    np.testing.assert_array_equal(RepetitionPenalty(1.5)(LOGITS, history),
                                  hf(RepetitionPenaltyLogitsProcessor(1.5), LOGITS, history))


def test_temperature_divides_as_hf():
    # process() shifts each row's best to 0 first; the distribution is HF's
    s = Sampler(temperature=0.7).process(LOGITS, HISTORY)
    np.testing.assert_allclose(s[0], (LOGITS[0] - 3.0) / 0.7)
    np.testing.assert_allclose(probs(s), probs(hf(TemperatureLogitsWarper(0.7), LOGITS)), rtol=1e-12)


def test_top_k_by_hand_and_as_hf():
    out = TopK(2)(LOGITS, HISTORY)
    assert np.isfinite(out).sum(axis=1).tolist() == [2, 2]
    assert np.flatnonzero(np.isfinite(out[0])).tolist() == [0, 3]
    assert np.flatnonzero(np.isfinite(out[1])).tolist() == [1, 4]
    for k in (1, 2, 3, 6, 10):
        np.testing.assert_array_equal(TopK(k)(LOGITS, HISTORY), hf(TopKLogitsWarper(k), LOGITS))
    # ties with the k-th score are kept, as HF keeps them
    tied = np.array([[1.0, 3.0, 1.0, 0.0]])
    assert np.isfinite(TopK(2)(tied, HISTORY)).tolist() == [[True, True, True, False]]
    np.testing.assert_array_equal(TopK(2)(tied, HISTORY), hf(TopKLogitsWarper(2), tied, [[0]]))


def test_top_p_by_hand_and_as_hf():
    # probabilities 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1)
    scores = np.log(np.array([[0.3, 0.05, 0.5, 0.15]]))
    kept = lambda p: np.flatnonzero(np.isfinite(TopP(p)(scores, HISTORY))).tolist()
    assert kept(0.4) == [2]            # 0.5 alone reaches 0.4
    assert kept(0.5) == [2]            # reaching p exactly is enough
    assert kept(0.6) == [0, 2]         # 0.5 + 0.3
    assert kept(0.9) == [0, 2, 3]      # 0.95
    assert kept(0.99) == [0, 1, 2, 3]
    assert kept(1e-9) == [2]           # never fewer than one token
    for p in (0.05, 0.3, 0.6, 0.7, 0.9, 0.97, 1.0):
        np.testing.assert_array_equal(TopP(p)(LOGITS, HISTORY), hf(TopPLogitsWarper(p), LOGITS))


def test_sampler_applies_hf_order_penalty_temperature_top_k_top_p():
    sampler = Sampler(temperature=0.8, top_k=4, top_p=0.8, repetition_penalty=1.3)
    ours = sampler.process(LOGITS, HISTORY)
    theirs = LOGITS
    for processor in (RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.8),
                      TopKLogitsWarper(4), TopPLogitsWarper(0.8)):
        theirs = hf(processor, theirs)
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs))
    np.testing.assert_allclose(probs(ours), probs(theirs), rtol=1e-12, atol=0)


def test_draws_follow_the_distribution():
    scores = np.log(np.array([[0.6, 0.1, 0.3]]))
    sampler = Sampler(seed=7)
    counts = np.bincount([sampler(scores, [[]])[0] for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.6, 0.1, 0.3], atol=0.03)


def test_removed_tokens_are_never_drawn():
    sampler = Sampler(top_k=2, seed=3)
    drawn = {int(i) for _ in range(300) for i in sampler(LOGITS, HISTORY)}
    assert drawn <= {0, 3, 1, 4}


def test_same_seed_same_ids_and_different_seeds_differ():
    logits = np.random.default_rng(0).normal(size=(4, 50)).astype(np.float32)
    history = [[1, 2], [3], [], [4, 4]]

    def stream(seed):
        sampler = Sampler(temperature=1.5, seed=seed)
        return np.concatenate([sampler(logits, history) for _ in range(20)])

    np.testing.assert_array_equal(stream(11), stream(11))
    assert not np.array_equal(stream(11), stream(12))


def test_a_rows_draw_does_not_depend_on_the_other_rows():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 40))
    other = logits.copy()
    other[[0, 2]] = rng.normal(size=(2, 40)) * 5
    a, b = Sampler(seed=5), Sampler(seed=5)
    for _ in range(10):
        assert a(logits, [[]] * 3)[1] == b(other, [[]] * 3)[1]


def test_logits_of_every_float_dtype_give_the_same_ids_as_float64():
    # every float a backend may return, bfloat16 too (numpy's issubdtype calls it no float)
    logits = np.random.default_rng(2).normal(size=(2, 30)).astype(DType.bfloat16.numpy)
    wide = logits.astype(np.float64)
    for dtype in (d.numpy for d in DType if d.is_float):
        for make in (lambda: greedy, lambda: Sampler(top_p=0.9, seed=4)):   # a fresh draw for each
            ids = make()(logits.astype(dtype), [[], []])
            assert ids.tolist() == make()(wide, [[], []]).tolist(), dtype
            assert ids.dtype == np.int64 and ids.shape == (2,)


def test_logits_that_are_not_floats_are_refused():
    with pytest.raises(BlockcError, match="logits must be a float array, got int64"):
        greedy(np.zeros((1, 3), np.int64))


def test_top_k_one_and_temperature_zero_are_greedy():
    logits = np.random.default_rng(3).normal(size=(5, 64))
    history = [[]] * 5
    for seed in range(5):
        assert Sampler(top_k=1, seed=seed)(logits, history).tolist() == greedy(logits, history).tolist()
        assert Sampler(temperature=0.0, seed=seed)(logits, history).tolist() == greedy(logits, history).tolist()


def test_temperature_zero_still_applies_the_repetition_penalty_as_hf_greedy_does():
    logits = np.array([[3.0, 2.0, 1.0]])
    assert Sampler(temperature=0, repetition_penalty=2.0)(logits, [[0]]).tolist() == [1]


def test_a_tiny_temperature_does_not_overflow():
    logits = np.array([[1000.0, 999.0, 0.0]])
    assert Sampler(temperature=1e-300, seed=0)(logits, [[]]).tolist() == [0]


@pytest.mark.parametrize("options, words", [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"temperature": math.nan}, "temperature must be finite"),
    ({"temperature": math.inf}, "temperature must be finite"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"top_p": math.nan}, "top_p must be finite"),
    ({"top_k": -1}, "top_k must be >= 0"),
    ({"top_k": 2.5}, "top_k must be an integer"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
    ({"repetition_penalty": -1.0}, "repetition_penalty must be > 0"),
    ({"repetition_penalty": math.inf}, "repetition_penalty must be finite"),
    ({"seed": -1}, "seed must be a non-negative integer, got -1"),   # numpy's ValueError once
    ({"seed": 1.5}, "seed must be a non-negative integer, got 1.5"),
])
def test_bad_settings_are_refused_in_one_line(options, words):
    with pytest.raises(BlockcError) as caught:
        Sampler(**options)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_logits_that_are_not_finite_are_refused_naming_the_row(bad):
    logits = LOGITS.copy()
    logits[1, 2] = bad
    for pick in (greedy, Sampler()):
        with pytest.raises(BlockcError, match=r"logits row 1 is not finite \(token 2"):
            pick(logits, HISTORY)


def test_logits_and_history_of_the_wrong_shape_are_refused():
    with pytest.raises(BlockcError, match=r"\[batch, vocab\]"):
        Sampler()(np.zeros(5), [[]])
    with pytest.raises(BlockcError, match="history has 1 rows but logits have 2"):
        Sampler()(LOGITS, [[]])
    with pytest.raises(BlockcError, match="negative token id"):
        Sampler(repetition_penalty=1.2)(LOGITS, [[-1], []])
