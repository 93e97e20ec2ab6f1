"""A Hugging Face directory's copied weights (a Llama's transposed ``nn.Linear``
matrices, GPT-2's q/k/v columns) come from one prepared cache file
(``hf_dir.Checkpoint``, ``prepared.py``): made on the first load, file views
on the next, never stale (a rewritten checkpoint gets a new key), never
cached from a checkpoint written just now. Values are checked against the
safetensors tensors mapped in memory by the loaders' own state-dict path,
and generation against Hugging Face's ``generate``."""
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("transformers")

from cache_testing import fresh_cache, not_racy  # noqa: E402,F401  (fixtures)
from hf_dirs import hf_dir  # noqa: E402,F401  (the shared random directories)
from safetensors.numpy import load_file, save, save_file  # noqa: E402

from blockc import files, optimize, trace  # noqa: E402
from blockc.frontends import build_model, init_weights  # noqa: E402
from blockc.frontends.hf_gpt2 import load_hf_gpt2_state_dict  # noqa: E402
from blockc.frontends.hf_llama import load_hf_llama_state_dict  # noqa: E402
from blockc.frontends import prepared  # noqa: E402
from blockc.frontends.prepared import UncachedWeightsWarning  # noqa: E402
from blockc.frontends.weights import file_region  # noqa: E402
from blockc.runtime.ort_runner import OrtSession  # noqa: E402

FROM_STATE_DICT = {"llama": load_hf_llama_state_dict, "gpt2": load_hf_gpt2_state_dict}


@pytest.fixture
def copy_of(hf_dir, tmp_path):
    return lambda family: shutil.copytree(hf_dir(family), tmp_path / family)


def load(path):
    model = build_model(str(path), {})
    return model, dict(init_weights(model, seed=0))


def want(family, path, model):
    """The weights the state-dict path makes from the checkpoint's tensors, in memory."""
    return FROM_STATE_DICT[family](load_file(os.path.join(path, "model.safetensors")), model)


def regions(weights):
    """Each weight's file: 'prepared', 'checkpoint', or None (made in memory)."""
    where = {}
    for name, a in weights.items():
        r = file_region(a)
        where[name] = None if r is None else "prepared" if r.path.endswith("prepared.safetensors") else "checkpoint"
    return where


def assert_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for name, a in expected.items():
        assert got[name].dtype == a.dtype, name
        np.testing.assert_array_equal(got[name], a, err_msg=name)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_second_load_makes_no_copy(copy_of, fresh_cache, not_racy, family):
    path = copy_of(family)
    model, first = load(path)
    assert files.CACHE_COUNTS["weights", "miss"] == 1
    model, second = load(path)
    assert files.CACHE_COUNTS["weights", "hit"] == 1 and files.CACHE_COUNTS["weights", "miss"] == 1
    expected = want(family, path, model)
    assert_equal(first, expected)
    assert_equal(second, expected)
    where = regions(second)
    prepared_ones = {n for n, w in where.items() if w == "prepared"}
    if family == "llama":   # every nn.Linear weight is stored [out, in]
        assert "blocks.0.attn.w_q.weight" in prepared_ones and "blocks.0.ffn.down.weight" in prepared_ones
    else:                   # c_attn's columns; its bias's slices are views of the checkpoint itself
        assert "blocks.0.attn.w_q.weight" in prepared_ones and where["blocks.0.attn.w_q.bias"] == "checkpoint"
    assert where["tok.weight"] == "checkpoint"
    assert {n for n, w in where.items() if w is None} <= {"rope.cos", "rope.sin"}   # tables the model makes


def test_the_checkpoints_identity_is_sampled_once_a_load_and_again_after_a_miss(copy_of, fresh_cache, not_racy,
                                                                                   monkeypatch):
    """``source_identity`` reads a content sample of every file: taken once for
    the key (a hit), and once more after a miss, to see the sources did not
    change while the entry was made."""
    path = copy_of("llama")
    calls = []
    real = prepared.source_identity
    monkeypatch.setattr(prepared, "source_identity", lambda sources: calls.append(1) or real(sources))
    load(path)
    assert files.CACHE_COUNTS["weights", "miss"] == 1 and len(calls) == 2
    calls.clear()
    load(path)
    assert files.CACHE_COUNTS["weights", "hit"] == 1 and len(calls) == 1


def test_merges_over_copies_made_just_now_are_kept_by_the_same_run(copy_of, fresh_cache, monkeypatch):
    """The checkpoint's copies were written seconds ago (racy), but a prepared
    file's bytes follow from its key: the QKV and gate/up merges folded over
    it are kept by this run, not left to each session and to the next run."""
    path = copy_of("llama")
    checkpoint = os.stat(path / "model.safetensors").st_ino
    # the checkpoint as on a second run (written long ago), every file written since as just now
    monkeypatch.setattr(prepared, "racy", lambda identity: identity.ino != checkpoint)
    model, weights = load(path)
    assert files.CACHE_COUNTS["weights", "miss"] == 1
    with OrtSession(optimize(trace(model)).graph, weights) as session:
        assert files.CACHE_COUNTS["weights", "miss"] == 2   # the merges, over the copies just made
        assert {tuple(v.shape()) for v in session._weight_values} == {weights["rope.cos"].shape}


def test_a_rewritten_checkpoint_is_read_afresh(copy_of, fresh_cache, not_racy):
    path = copy_of("llama")
    load(path)
    weights = path / "model.safetensors"
    st = weights.stat()
    rng = np.random.default_rng(7)
    changed = {k: rng.standard_normal(a.shape).astype(a.dtype) for k, a in load_file(weights).items()}
    with open(weights, "r+b") as f:   # in place: same size, same inode (save_file would make a new file)
        f.write(save(changed, metadata={"format": "pt"}))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))   # the old mtime, as cp -p and rsync --inplace keep it
    assert (weights.stat().st_size, weights.stat().st_ino) == (st.st_size, st.st_ino)   # only ctime tells
    model, got = load(path)
    assert files.CACHE_COUNTS["weights", "miss"] == 2 and files.CACHE_COUNTS["weights", "hit"] == 0
    assert_equal(got, FROM_STATE_DICT["llama"](changed, model))


def test_a_checkpoint_written_just_now_caches_nothing(copy_of, fresh_cache):
    path = copy_of("llama")   # copied this second: racy
    model, got = load(path)
    assert not files.CACHE_COUNTS and not (fresh_cache / "weights").exists()
    assert "prepared" not in regions(got).values()
    assert_equal(got, want("llama", path, model))


def test_a_damaged_prepared_file_is_rebuilt(copy_of, fresh_cache, not_racy):
    path = copy_of("llama")
    load(path)
    (entry,) = (fresh_cache / "weights").glob("*/prepared.safetensors")
    with open(entry, "r+b") as f:
        f.truncate(entry.stat().st_size // 2)
    model, got = load(path)
    assert files.CACHE_COUNTS["weights", "miss"] == 2
    assert_equal(got, want("llama", path, model))


def test_an_unusable_cache_loads_as_without_one(copy_of, tmp_path, monkeypatch, not_racy):
    path = copy_of("llama")
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "afile"))
    model, got = load(path)
    assert "prepared" not in regions(got).values()
    assert_equal(got, want("llama", path, model))


def hf_tokens(path, prompt, new):
    """Hugging Face's greedy continuation of ``prompt`` (one row) by the checkpoint at ``path``."""
    import torch
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    ids = torch.tensor(prompt)
    with torch.no_grad():
        return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)[0, len(prompt[0]):].tolist()


def test_generation_from_prepared_weights_is_hugging_faces(copy_of, fresh_cache, not_racy):
    from blockc.generate import generate
    path = copy_of("llama")
    prompt, new = [[5, 9, 13, 2, 7]], 4
    expected = hf_tokens(path, prompt, new)
    for warm in (False, True):   # cold, then warm from the prepared file
        hits = files.CACHE_COUNTS["weights", "hit"]
        model, weights = load(path)
        assert files.CACHE_COUNTS["weights", "hit"] == hits + warm
        assert generate(model, weights, prompt, new).tokens == [expected]
    # each made once: the checkpoint's copies (the load) and the QKV and gate/up merges folded over them
    # (runtime/folded_params.py: the prefill's session makes them, the decode's and the warm run's find them)
    assert (files.CACHE_COUNTS["weights", "miss"], files.CACHE_COUNTS["weights", "hit"]) == (2, 4)
    with OrtSession(trace(model), weights) as session:   # ONNX Runtime maps them: none is handed over to copy
        assert {tuple(v.shape()) for v in session._weight_values} == {weights["rope.cos"].shape}


def test_generation_under_a_cap_smaller_than_its_prepared_weights_is_hugging_faces(copy_of, fresh_cache,
                                                                                  not_racy, monkeypatch):
    from blockc.generate import generate
    path = copy_of("llama")
    prompt, new = [[5, 9, 13, 2, 7]], 3
    # room for the checkpoint's copies or for the merges folded over them, not both: making one must not
    # prune the other while its views are in use (ONNX Runtime opens them by path for each session); the
    # copies, over half the cap, are not cached at all
    monkeypatch.setenv("BLOCKC_CACHE_MAX", str(int(os.path.getsize(path / "model.safetensors") * 1.2)))
    expected = hf_tokens(path, prompt, new)
    for run in range(2):
        with pytest.warns(UncachedWeightsWarning, match="BLOCKC_CACHE_MAX"):
            model, weights = load(path)
        assert "prepared" not in regions(weights).values()
        assert generate(model, weights, prompt, new).tokens == [expected], run
