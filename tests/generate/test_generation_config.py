"""``generation_config.json`` as ``model.generate()`` reads it: its eos ids
(one or a list) and sampling defaults, the user's choices over them, and
malformed files refused naming the file."""
import json

import pytest

from blockc.errors import BlockcError
from blockc.generate.generation_config import GenerationDefaults, make_sampler, read_generation_config
from blockc.generate.stopping import stop_ids


def write(path, name, **fields):
    path.mkdir(exist_ok=True)
    (path / name).write_text(json.dumps(fields))
    return path


def test_eos_ids_one_or_a_list(tmp_path):
    assert read_generation_config(write(tmp_path / "a", "generation_config.json", eos_token_id=2)).eos_ids == (2,)
    assert read_generation_config(write(tmp_path / "b", "generation_config.json",
                                        eos_token_id=[2, 7])).eos_ids == (2, 7)
    assert read_generation_config(write(tmp_path / "c", "generation_config.json")).eos_ids == ()
    # no generation_config.json: the model config's fields, as transformers' from_model_config
    assert read_generation_config(write(tmp_path / "d", "config.json", eos_token_id=5)).eos_ids == (5,)
    assert read_generation_config(tmp_path / "e") == GenerationDefaults()


def test_defaults_are_transformers_where_unset(tmp_path):
    """transformers' global defaults: greedy, temperature 1, top-k 50, top-p 1, no penalty."""
    transformers = pytest.importorskip("transformers")
    defaults = read_generation_config(write(tmp_path / "a", "generation_config.json", do_sample=True))
    hf = transformers.GenerationConfig._get_default_generation_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.repetition_penalty) == \
        (hf["temperature"], hf["top_k"], hf["top_p"], hf["repetition_penalty"])
    assert hf["do_sample"] is GenerationDefaults().do_sample is False


def rules(sampler):
    """A sampler's processors as (class, setting) pairs, in the order they run."""
    return [(type(p).__name__, *vars(p).values()) for p in sampler.processors]


def test_the_users_choices_override_the_file():
    sampled = GenerationDefaults(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1)
    assert rules(make_sampler(sampled)) == [("RepetitionPenalty", 1.1), ("Temperature", 0.7), ("TopK", 20),
                                            ("TopP", 0.9)]
    s = make_sampler(sampled, temperature=1.5, top_k=0, repetition_penalty=1.0)
    assert rules(s) == [("Temperature", 1.5), ("TopP", 0.9)]
    for greedy in (make_sampler(sampled, greedy=True), make_sampler(sampled, temperature=0)):
        assert greedy.temperature == 0 and rules(greedy) == [("RepetitionPenalty", 1.1)]   # HF applies it greedy too
    s = make_sampler(GenerationDefaults(), temperature=0.5)
    assert rules(s) == [("Temperature", 0.5), ("TopK", 50)]   # sampling by flag takes HF's top-k of 50
    assert make_sampler(GenerationDefaults()).temperature == 0
    with pytest.raises(BlockcError, match="--top-k, --top-p and --min-p filter what is sampled"):
        make_sampler(GenerationDefaults(), top_k=5)


def test_malformed_generation_configs_are_refused(tmp_path):
    with pytest.raises(BlockcError, match=r"generation_config.json: eos_token_id must be a token id or a list "
                                          r"of them, got 'x'"):
        read_generation_config(write(tmp_path / "a", "generation_config.json", eos_token_id="x"))
    with pytest.raises(BlockcError, match=r"generation_config.json: temperature must be a float, got 'hot'"):
        read_generation_config(write(tmp_path / "b", "generation_config.json", temperature="hot"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(BlockcError, match="generation_config.json holds a JSON list, not an object of generation settings"):
        read_generation_config(tmp_path / "c")


def test_stop_ids_are_one_place_for_one_or_many():
    assert stop_ids(None, 10) == frozenset() and stop_ids(3, 10) == {3} and stop_ids((3, 4), 10) == {3, 4}
    with pytest.raises(BlockcError, match=r"stop id 12 is outside the vocabulary \[0, 10\)"):
        stop_ids([3, 12], 10)
    with pytest.raises(BlockcError, match="stop id 1.5 is not an integer token id"):
        stop_ids([1.5], 10)
