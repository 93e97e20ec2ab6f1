"""A Hugging Face directory's weights are views of its checkpoint, copied by
no load (``hf_dir.Checkpoint``): a Llama's transposed ``nn.Linear`` matrices
and GPT-2's q/k/v columns are views out of order. The first ONNX Runtime
session puts them in order once, with the QKV and gate/up merges folded
over them, into one prepared cache file (``runtime/folded_params.py``,
``prepared.py``), so each byte is written once; later sessions and runs map
it; never stale (a rewritten checkpoint gets a new key), never cached from
a checkpoint written just now. A cast (``--set dtype=``) is still a copy,
made at load into a prepared file of its own. Values are checked against
the safetensors tensors mapped in memory by the loaders' own state-dict
path, and generation against Hugging Face's ``generate``."""
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
from blockc.frontends.weights import file_region, file_view  # noqa: E402
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
    """Each weight's file: 'prepared', 'checkpoint' (in order or not), or None (made in memory)."""
    where = {}
    for name, a in weights.items():
        r = file_view(a)
        where[name] = None if r is None else "prepared" if r.path.endswith("prepared.safetensors") else "checkpoint"
    return where


def assert_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for name, a in expected.items():
        assert got[name].dtype == a.dtype, name
        np.testing.assert_array_equal(got[name], a, err_msg=name)


def logits(model, weights):
    """ONNX Runtime's logits of the fused graph for one short prompt, and the session's weights."""
    with OrtSession(optimize(trace(model)).graph, weights) as session:
        feeds = {name: np.array([[5, 9, 13, 2, 7]] if name == "input_ids" else [range(5)], np.int64)
                 for name in (v.name for v in session.graph.inputs)}
        return next(iter(session.run(feeds).values())), dict(session.weights)


def in_memory(weights):
    """The same values as arrays in memory: a session makes nothing of them (no cache)."""
    return {name: np.array(a) for name, a in weights.items()}


def entry_bytes(cache):
    return sum(f.stat().st_size for f in (cache / "weights").glob("*/prepared.safetensors"))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_load_makes_no_copy(copy_of, fresh_cache, not_racy, family):
    path = copy_of(family)
    model, got = load(path)
    assert not files.CACHE_COUNTS and not (fresh_cache / "weights").exists()
    assert_equal(got, want(family, path, model))
    where = regions(got)
    assert {n for n, w in where.items() if w != "checkpoint"} <= {"rope.cos", "rope.sin"}   # tables the model makes
    assert file_region(got["tok.weight"]) is not None       # in order: ONNX Runtime maps it as it is
    assert file_region(got["blocks.0.attn.w_q.weight"]) is None   # transposed (llama), columns (gpt2)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_session_writes_each_byte_once(copy_of, fresh_cache, not_racy, family):
    """The merges are made from the checkpoint's own views: no transposed copy of
    q/k/v or gate/up is written beside them, and the prepared file holds no
    more bytes than the weights it is made from."""
    path = copy_of(family)
    model, weights = load(path)
    got, used = logits(model, weights)
    assert (files.CACHE_COUNTS["weights", "miss"], files.CACHE_COUNTS["weights", "hit"]) == (1, 0)
    (entry,) = (fresh_cache / "weights").glob("*/prepared.safetensors")
    names = list(load_file(entry))
    assert not any(n.startswith("blocks.0.attn.w_q") for n in names)    # only inside a merge
    assert any(n.startswith("concat(blocks.0.attn.w_q.weight,") for n in names)
    assert set(names) == {n for n, w in regions(used).items() if w == "prepared"}   # all made are used
    if family == "llama":   # (GPT-2's tied head is a transpose of an array in order, made here too)
        out_of_order = sum(a.nbytes for n, a in weights.items() if regions(weights)[n] and file_region(a) is None)
        assert entry_bytes(fresh_cache) < out_of_order + (1 << 16)    # each byte once, and a header
    assert {n for n, a in used.items() if file_region(a) is None} <= {"rope.cos", "rope.sin"}   # all mapped
    expected, _ = logits(model, in_memory(weights))
    np.testing.assert_array_equal(got, expected)
    logits(model, weights)   # the decode's session, a later run: mapped
    assert (files.CACHE_COUNTS["weights", "miss"], files.CACHE_COUNTS["weights", "hit"]) == (1, 1)


def test_the_checkpoints_identity_is_sampled_once_a_session_and_again_after_a_miss(copy_of, fresh_cache, not_racy,
                                                                                     monkeypatch):
    """``source_identity`` reads a content sample of every file: taken once for
    the key (a hit), and once more after a miss, to see the sources did not
    change while the entry was made."""
    path = copy_of("llama")
    calls = []
    real = prepared.source_identity
    monkeypatch.setattr(prepared, "source_identity", lambda sources: calls.append(1) or real(sources))
    model, weights = load(path)
    logits(model, weights)
    assert files.CACHE_COUNTS["weights", "miss"] == 1 and len(calls) == 2
    calls.clear()
    logits(*load(path))
    assert files.CACHE_COUNTS["weights", "hit"] == 1 and len(calls) == 1


def test_merges_over_casts_made_just_now_are_kept_by_the_same_run(copy_of, fresh_cache, monkeypatch):
    """A cast (``--set dtype=float16``) is copied at load into a prepared file
    written seconds ago (racy), but a prepared file's bytes follow from its
    key: the merges folded over it are kept by this run, not left to each
    session and to the next run."""
    path = copy_of("llama")
    checkpoint = os.stat(path / "model.safetensors").st_ino
    # the checkpoint as on a second run (written long ago), every file written since as just now
    monkeypatch.setattr(prepared, "racy", lambda identity: identity.ino != checkpoint)
    model = build_model(str(path), {"dtype": "float16"})
    weights = dict(init_weights(model, seed=0))
    assert files.CACHE_COUNTS["weights", "miss"] == 1 and regions(weights)["blocks.0.attn.w_q.weight"] == "prepared"
    with OrtSession(optimize(trace(model)).graph, weights) as session:
        assert files.CACHE_COUNTS["weights", "miss"] == 2   # the merges, over the casts just made
        assert {tuple(v.shape()) for v in session._weight_values} == {weights["rope.cos"].shape}


def test_a_rewritten_checkpoint_is_read_afresh(copy_of, fresh_cache, not_racy):
    path = copy_of("llama")
    logits(*load(path))
    weights = path / "model.safetensors"
    st = weights.stat()
    rng = np.random.default_rng(7)
    changed = {k: rng.standard_normal(a.shape).astype(a.dtype) for k, a in load_file(weights).items()}
    with open(weights, "r+b") as f:   # in place: same size, same inode (save_file would make a new file)
        f.write(save(changed, metadata={"format": "pt"}))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))   # the old mtime, as cp -p and rsync --inplace keep it
    assert (weights.stat().st_size, weights.stat().st_ino) == (st.st_size, st.st_ino)   # only ctime tells
    model, got = load(path)
    assert_equal(got, FROM_STATE_DICT["llama"](changed, model))
    out, _ = logits(model, got)
    assert files.CACHE_COUNTS["weights", "miss"] == 2 and files.CACHE_COUNTS["weights", "hit"] == 0
    np.testing.assert_array_equal(out, logits(model, in_memory(got))[0])


def test_a_checkpoint_written_just_now_caches_nothing(copy_of, fresh_cache):
    path = copy_of("llama")   # copied this second: racy
    model, got = load(path)
    out, used = logits(model, got)
    assert not [k for k in files.CACHE_COUNTS if k[0] == "weights"] and not (fresh_cache / "weights").exists()
    assert "prepared" not in regions(used).values()
    assert_equal(got, want("llama", path, model))
    np.testing.assert_array_equal(out, logits(model, in_memory(got))[0])


def test_a_damaged_prepared_file_is_rebuilt(copy_of, fresh_cache, not_racy):
    path = copy_of("llama")
    logits(*load(path))
    (entry,) = (fresh_cache / "weights").glob("*/prepared.safetensors")
    with open(entry, "r+b") as f:
        f.truncate(entry.stat().st_size // 2)
    model, got = load(path)
    out, _ = logits(model, got)
    assert files.CACHE_COUNTS["weights", "miss"] == 2
    np.testing.assert_array_equal(out, logits(model, in_memory(got))[0])


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
        model, weights = load(path)
        assert generate(model, weights, prompt, new).tokens == [expected]
    # made once, by the prefill's session: the QKV and gate/up merges and the other weights put in order
    # (runtime/folded_params.py); the decode's session and the warm run's two find them
    assert (files.CACHE_COUNTS["weights", "miss"], files.CACHE_COUNTS["weights", "hit"]) == (1, 3)
    with OrtSession(trace(model), weights) as session:   # ONNX Runtime maps them: none is handed over to copy
        assert {tuple(v.shape()) for v in session._weight_values} == {weights["rope.cos"].shape}


def test_generation_under_a_cap_smaller_than_its_prepared_weights_is_hugging_faces(copy_of, fresh_cache,
                                                                                  not_racy, monkeypatch):
    from blockc.generate import generate
    path = copy_of("llama")
    prompt, new = [[5, 9, 13, 2, 7]], 3
    # the weights put in order, over half the cap, are not cached at all, but made in memory for each session
    monkeypatch.setenv("BLOCKC_CACHE_MAX", str(int(os.path.getsize(path / "model.safetensors") * 1.2)))
    expected = hf_tokens(path, prompt, new)
    for run in range(2):
        model, weights = load(path)
        with pytest.warns(UncachedWeightsWarning, match="BLOCKC_CACHE_MAX"):
            assert generate(model, weights, prompt, new).tokens == [expected], run


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_other_backends_take_the_checkpoints_views_in_order(copy_of, fresh_cache, not_racy, family):
    """torch's tensors and the generated CUDA's weights blob of a checkpoint's
    out-of-order views hold the values the state-dict path makes in memory."""
    from blockc.codegen.cuda.build import weights_blob
    from blockc.ir.dtypes import DType
    from blockc.runtime.torch_tensors import to_torch
    path = copy_of(family)
    model, got = load(path)
    expected = want(family, path, model)
    views = [name for name, a in got.items() if not a.flags.c_contiguous]
    assert views   # the point: transposed (llama) or cut to columns (gpt2)
    for name in views:
        np.testing.assert_array_equal(to_torch(got[name], DType.from_numpy(got[name].dtype), copy=False).numpy(),
                                      expected[name], err_msg=name)
    assert weights_blob([(n, got[n]) for n in views]) == weights_blob([(n, expected[n]) for n in views])
