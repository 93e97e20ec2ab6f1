"""Reading, checking and saving the named arrays of a run (.npz files)."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import blockc
from blockc.errors import BlockcError, InputsError
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.runtime.feeds import check_feeds, load_npz, save_npz


def bert_graph():
    model = blockc.build_model("bert-base", {"layers": "1", "d_model": "32", "heads": "4", "vocab": "50"})
    return model, blockc.trace(model)


def test_good_arrays_bind_the_dims():
    model, graph = bert_graph()
    rng = np.random.default_rng(0)
    arrays = {s.name: s.sample({"batch": 3, "seq": 5}, rng) for s in model.inputs()}
    feeds, bindings = check_feeds(graph, arrays)
    assert bindings == {"batch": 3, "seq": 5}
    assert set(feeds) == set(arrays) and all(np.array_equal(feeds[k], arrays[k]) for k in arrays)


def test_every_mismatch_is_listed_at_once():
    model, graph = bert_graph()
    arrays = {
        "input_ids": np.array([[1, 2, 70], [-1, 4, 5]], dtype=np.int32),   # dtype, and 2 ids out of range
        "token_type_ids": np.zeros((2, 4), np.int64),                       # seq 4 where input_ids says 3
        "attention_mask": np.ones((2, 3, 1), np.int64),                     # rank 3
        "labels": np.zeros(2),                                              # not an input
    }
    with pytest.raises(InputsError) as info:
        check_feeds(graph, arrays, source="x.npz")
    problems = info.value.problems
    assert len(problems) == 5, problems
    text = str(info.value)
    assert text.startswith(f"x.npz do not fit {graph.name}'s inputs (5 problems):")
    for needle in ("unexpected array 'labels'", "input 'input_ids': dtype int32, expected int64",
                   "input 'input_ids': 2 of 6 ids out of range [0, 50) (min -1, max 70; it indexes 'tok.weight'",
                   "input 'attention_mask': rank 3 (shape [2, 3, 1]), expected rank 2",
                   "dimension 'seq' disagrees between inputs: 3 in input_ids axis 1, 4 in token_type_ids axis 1"):
        assert needle in text, text


def test_missing_inputs_limits_and_asked_dims():
    model, graph = bert_graph()
    arrays = {"input_ids": np.zeros((1, 600), np.int64)}
    with pytest.raises(InputsError) as info:
        check_feeds(graph, arrays, dims={"seq": 8, "batch": 1})
    text = str(info.value)
    assert "missing input 'token_type_ids': i64[batch,seq]" in text
    assert "missing input 'attention_mask'" in text
    assert "dimension 'seq' is 600, over the model's maximum of 512 ('pos.weight' has 512 rows)" in text
    assert "dimension 'seq' is 600 in the inputs, but 8 was asked for" in text
    assert len(info.value.problems) == 4


def test_fixed_and_compound_dims():
    g = Graph("g")
    g.add_input("x", TensorType(DType.float32, (parse_dim("batch"), parse_dim("seq"), 4)))
    g.add_input("kv", TensorType(DType.float32, (parse_dim("batch"), parse_dim("past+seq"), 4)))
    g.set_outputs([("y", g.inputs[0])])
    good = {"x": np.zeros((2, 3, 4), np.float32), "kv": np.zeros((2, 5, 4), np.float32)}
    with pytest.raises(InputsError, match="no input determines past"):
        check_feeds(g, good)
    assert check_feeds(g, good, dims={"past": 2})[1] == {"batch": 2, "seq": 3, "past": 2}
    bad = {"x": np.zeros((2, 3, 5), np.float32), "kv": np.zeros((2, 6, 4), np.float32)}
    with pytest.raises(InputsError) as info:
        check_feeds(g, bad, dims={"past": 2})
    assert info.value.problems == ["input 'x': axis 2 is 5, expected 4 (f32[batch,seq,4])",
                                   "input 'kv': axis 1 is 6, expected past+seq = 5"]


def test_bfloat16_survives_the_npz_round_trip(tmp_path):
    # numpy writes bfloat16 as raw 2-byte records; the graph's dtype restores it.
    g = Graph("g")
    g.add_input("x", TensorType(DType.bfloat16, (parse_dim("n"),)))
    g.set_outputs([("y", g.inputs[0])])
    x = np.arange(4).astype(ml_dtypes.bfloat16)
    save_npz(str(tmp_path / "x.npz"), {"x": x})
    feeds, bindings = check_feeds(g, load_npz(str(tmp_path / "x.npz")))
    assert feeds["x"].dtype == ml_dtypes.bfloat16 and np.array_equal(feeds["x"], x) and bindings == {"n": 4}


def test_save_writes_names_numpy_reads_back(tmp_path):
    path = tmp_path / "out.npz"
    arrays = {"logits": np.ones((2, 3), np.float32), "file": np.arange(3), "allow_pickle": np.zeros(1)}
    save_npz(str(path), arrays)
    with np.load(path, allow_pickle=False) as z:
        assert set(z.files) == set(arrays) and all(np.array_equal(z[k], arrays[k]) for k in arrays)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # an ordinary new file, not a private temp
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]


def test_a_failed_save_leaves_no_file(tmp_path):
    path = tmp_path / "out.npz"
    path.write_bytes(b"before")
    with pytest.raises(ValueError):  # an object array cannot be written without pickling
        save_npz(str(path), {"ok": np.zeros(3), "bad": np.array([{}], dtype=object)})
    assert path.read_bytes() == b"before"  # the old file stands, no temp file is left
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]


def test_pickles_are_refused(tmp_path):
    path = tmp_path / "p.npz"
    np.savez(path, ids=np.zeros(3), obj=np.array([{"a": 1}], dtype=object))
    with pytest.raises(BlockcError, match=r"'obj' holds Python objects \(pickled\), which blockc does not load"):
        load_npz(str(path))
    raw = tmp_path / "raw.npz"
    import pickle
    raw.write_bytes(pickle.dumps({"ids": [1, 2]}))
    with pytest.raises(BlockcError, match="a Python pickle, which blockc does not load"):
        load_npz(str(raw))


@pytest.mark.parametrize("make, message", [
    (lambda d: str(d / "none.npz"), "no such file"),
    (lambda d: str(d), "it is a folder"),
    (lambda d: (np.save(d / "a.npy", np.zeros(2)), str(d / "a.npy"))[1], "a single .npy array"),
    (lambda d: ((d / "t.npz").write_text("hello"), str(d / "t.npz"))[1], "not an .npz file"),
    (lambda d: ((d / "c.npz").write_bytes(b"PK\x03\x04broken"), str(d / "c.npz"))[1], "not an .npz file"),
])
def test_unreadable_files_are_one_line_errors(make, message, tmp_path):
    with pytest.raises(BlockcError) as info:
        load_npz(make(tmp_path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unwritable_paths_are_one_line_errors(tmp_path):
    for path, message in [(tmp_path / "no" / "x.npz", "does not exist"), (tmp_path, "it is a folder")]:
        with pytest.raises(BlockcError, match=message):
            save_npz(str(path), {"a": np.zeros(1)})
