"""Logits processors as Hugging Face's: no-repeat n-gram and min-p against
HF's own processors on random scores and histories, a combined config
against the list HF's ``generate`` builds from the same ``GenerationConfig``
(so the order is HF's), and a new rule as one class, defined here alone and
run through ``generate``. (Repetition penalty, temperature, top-k and top-p
are held against HF in ``test_sampling.py``.)"""
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from test_loop import weights_of  # noqa: E402
from transformers import GenerationConfig  # noqa: E402
from transformers.generation.logits_process import MinPLogitsWarper, NoRepeatNGramLogitsProcessor  # noqa: E402
from transformers.generation.utils import GenerationMixin  # noqa: E402

from blockc.errors import BlockcError  # noqa: E402
from blockc.frontends import build_model
from blockc.generate import generate, greedy
from blockc.generate.generation_config import GenerationDefaults, make_sampler
from blockc.generate.processors import LogitsProcessor, MinP, NoRepeatNGram
from blockc.generate.sampling import Sampler

RNG = np.random.default_rng(0)


def hf_scores(processor, scores: np.ndarray, history) -> np.ndarray:
    """HF's ``processor`` on a rectangular ``history`` and ``scores`` as float64."""
    return processor(torch.tensor(history), torch.tensor(scores, dtype=torch.float64)).numpy()


def probs(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [1, 3, 12, 40])
def test_no_repeat_ngram_as_hf(size, length):
    # a small vocabulary, so histories repeat n-grams often
    history = RNG.integers(0, 5, size=(3, length)).tolist()
    scores = RNG.normal(size=(3, 8))
    np.testing.assert_array_equal(NoRepeatNGram(size)(scores, history),
                                  hf_scores(NoRepeatNGramLogitsProcessor(size), scores, history))


def test_no_repeat_ngram_by_hand():
    # bigram (3, 1) seen: after a last token of 3, token 1 is banned; (1, 3) completes nothing new
    out = NoRepeatNGram(2)(np.zeros((1, 5)), [[3, 1, 3]])
    assert np.isinf(out).tolist() == [[False, True, False, False, False]]


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.2, 0.5, 0.9, 1.0])
def test_min_p_as_hf(min_p):
    scores = RNG.normal(size=(4, 30)) * 3
    np.testing.assert_array_equal(MinP(min_p)(scores, [[]] * 4), hf_scores(MinPLogitsWarper(min_p), scores,
                                                                            [[0]] * 4))


def hf_list(config: GenerationConfig):
    """The processors ``model.generate()`` builds for ``config`` (its own ``_get_logits_processor``)."""
    model = types.SimpleNamespace(config=types.SimpleNamespace(is_encoder_decoder=False))
    model._merge_criteria_processor_list = lambda a, b: GenerationMixin._merge_criteria_processor_list(model, a, b)
    return GenerationMixin._get_logits_processor(model, config, input_ids_seq_length=1, device="cpu",
                                                 model_kwargs={})


@pytest.mark.parametrize("do_sample", [True, False])
def test_a_combined_config_runs_as_hfs_list_in_hfs_order(do_sample):
    settings = dict(temperature=0.7, top_k=12, top_p=0.8, min_p=0.1, repetition_penalty=1.4,
                    no_repeat_ngram_size=2)
    history = RNG.integers(0, 20, size=(3, 15)).tolist()
    scores = RNG.normal(size=(3, 20)) * 2
    ours = make_sampler(GenerationDefaults(do_sample=do_sample, **settings)).process(scores, history)
    theirs = hf_list(GenerationConfig(do_sample=do_sample, **settings))(torch.tensor(history),
                                                                        torch.tensor(scores)).numpy()
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs))
    if do_sample:   # our temperature shifts each row's best to 0 first: the same distribution
        np.testing.assert_allclose(probs(ours), probs(theirs), rtol=1e-12, atol=1e-300)
    else:
        np.testing.assert_array_equal(ours, theirs)
    names = [type(p).__name__ for p in make_sampler(GenerationDefaults(do_sample=True, **settings)).processors]
    assert names == ["RepetitionPenalty", "NoRepeatNGram", "Temperature", "TopK", "TopP", "MinP"]


class BanOddIds(LogitsProcessor):
    """A rule defined in the test alone: odd ids are never picked."""

    def __call__(self, scores, history):
        out = scores.copy()
        out[:, 1::2] = -np.inf
        return out


def test_a_new_rule_is_one_class_and_generation_runs_it():
    model = build_model("tiny")
    weights = weights_of(model)
    plain = generate(model, weights, [[5, 17, 99], [4]], 6, backend="reference").tokens
    assert any(t % 2 for row in plain for t in row), "the test needs an odd id picked without the rule"
    banned = generate(model, weights, [[5, 17, 99], [4]], 6, backend="reference",
                      pick=Sampler(0.0, extra=[BanOddIds()])).tokens
    assert all(t % 2 == 0 for row in banned for t in row)
    # the rule runs where HF merges a user's processors: after the penalties, before the warpers
    names = [type(p).__name__ for p in make_sampler(GenerationDefaults(), temperature=0.5, no_repeat_ngram_size=3,
                                                    extra=[BanOddIds()]).processors]
    assert names == ["NoRepeatNGram", "BanOddIds", "Temperature", "TopK"]


def test_greedy_without_rules_is_the_argmax():
    scores = RNG.normal(size=(2, 9))
    assert Sampler(0.0)(scores, [[], []]).tolist() == greedy(scores).tolist()


@pytest.mark.parametrize("make, words", [
    (lambda: MinP(1.5), "min_p must be in [0, 1], got 1.5"),
    (lambda: NoRepeatNGram(0), "no_repeat_ngram_size must be >= 1"),
    (lambda: Sampler(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be >= 0 (0 means none), got -1"),
    (lambda: Sampler(min_p="x"), "min_p must be a number, got 'x'"),
    (lambda: Sampler(extra=[3]), "a logits processor must be callable as (scores, history) -> scores, got 3"),
    (lambda: make_sampler(GenerationDefaults(), min_p=0.1), "--min-p filter what is sampled"),
])
def test_bad_rules_are_refused_in_one_line(make, words):
    with pytest.raises(BlockcError) as caught:
        make()
    assert words in str(caught.value) and "\n" not in str(caught.value)
