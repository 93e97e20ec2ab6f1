"""Prepared weights (``frontends/prepared.py``): arrays made once into a
cache file and handed out as views of it, keyed by what ``stat`` says of
their sources; a racy source caches nothing."""
import gc
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from cache_testing import fresh_cache, not_racy  # noqa: F401  (fixtures)

from blockc import files
from blockc.errors import WeightsError
from blockc.frontends import prepared
from blockc.frontends.weights import file_region
from blockc.version import code_version

SOURCES = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
           "b": (np.arange(6, dtype=np.float32) / 3).reshape(2, 3).astype(ml_dtypes.bfloat16)}
SPECS = {name: (a.dtype, a.shape) for name, a in SOURCES.items()}


def entry_of(cache, recipe):
    """The prepared file of arrays made from no file by ``recipe``."""
    return cache / "weights" / files.cache_key("", recipe, code_version()) / "prepared.safetensors"


def made_by(log):
    def make(name):
        log.append(name)
        return SOURCES[name].T.copy().T   # an array made in memory, as a transpose makes one
    return make


def test_a_miss_makes_each_array_once_into_the_file_and_a_hit_makes_none(fresh_cache):
    made = []
    first = prepared.prepared_arrays("k1", SPECS, made_by(made))
    assert sorted(made) == ["b", "w"] and files.CACHE_COUNTS["weights", "miss"] == 1
    second = prepared.prepared_arrays("k1", SPECS, made_by(made))
    assert len(made) == 2 and files.CACHE_COUNTS["weights", "hit"] == 1
    entry = os.path.realpath(entry_of(fresh_cache, "k1"))
    for arrays in (first, second):
        for name, a in arrays.items():
            assert a.dtype == SOURCES[name].dtype and not a.flags.writeable   # bfloat16 round-trips
            np.testing.assert_array_equal(a.view(np.uint8), SOURCES[name].view(np.uint8))
            region = file_region(a)
            assert region is not None and region.path == entry and region.length == a.nbytes


def test_a_damaged_prepared_file_is_made_again(fresh_cache):
    made = []
    prepared.prepared_arrays("k1", SPECS, made_by(made))
    entry = entry_of(fresh_cache, "k1")
    with open(entry, "r+b") as f:
        f.truncate(entry.stat().st_size - 4)
    arrays = prepared.prepared_arrays("k1", SPECS, made_by(made))
    assert len(made) == 4 and files.CACHE_COUNTS["weights", "miss"] == 2
    np.testing.assert_array_equal(arrays["w"], SOURCES["w"])


def test_a_prepared_file_whose_header_does_not_fit_is_made_again(fresh_cache):
    made = []
    prepared.prepared_arrays("k1", {"w": SPECS["w"]}, made_by(made))
    entry = entry_of(fresh_cache, "k1")
    # as a build that recorded a file of other tensors would leave it: intact by stat, not what is asked for
    arrays = prepared.prepared_arrays("k1", SPECS, made_by(made))
    assert made == ["w", "w", "b"]   # float32 before bfloat16: by falling item size
    assert sorted(arrays) == ["b", "w"] and file_region(arrays["b"]).path == os.path.realpath(entry)


def prune_in_another_process() -> int:
    """How many entries ``prune_cache(0)`` (``blockc cache --clear``) removes, run by another process."""
    code = "from blockc.files import prune_cache; print(len(prune_cache(0)))"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              timeout=120).stdout)


def test_an_entry_is_not_pruned_while_its_views_live(fresh_cache):
    arrays = prepared.prepared_arrays("k1", SPECS, made_by([]))
    entry = entry_of(fresh_cache, "k1")
    # ONNX Runtime opens the file by its path for each session made from the views: it must stay
    assert files.prune_cache(0) == [] and prune_in_another_process() == 0 and entry.is_file()
    hit = prepared.prepared_arrays("k1", SPECS, made_by([]))   # a second reader shares the entry
    del arrays
    gc.collect()
    assert files.prune_cache(0) == [] and file_region(hit["w"]).path == os.path.realpath(entry)
    del hit
    gc.collect()   # the last view gone: the entry is an ordinary one again
    assert len(files.prune_cache(0)) == 1 and not entry.exists()


def test_a_prune_of_another_process_just_after_the_build_leaves_the_entry_to_its_reader(fresh_cache,
                                                                                       monkeypatch):
    """The entry is in use from before its build lock is released: a prune
    (``blockc cache --clear`` elsewhere) between the build and the read skips it."""
    real, pruned = files.prune_cache, []

    def prune_then_another(*args, **kwargs):
        removed = real(*args, **kwargs)
        pruned.append(prune_in_another_process())
        return removed
    monkeypatch.setattr(files, "prune_cache", prune_then_another)
    arrays = prepared.prepared_arrays("k1", SPECS, made_by([]))
    entry = entry_of(fresh_cache, "k1")
    assert pruned == [0] and entry.is_file() and files.CACHE_COUNTS["weights", "miss"] == 1
    assert file_region(arrays["w"]).path == os.path.realpath(entry)


def test_an_entry_whose_header_cannot_be_read_falls_back_to_memory(fresh_cache, monkeypatch):
    """Reading the entry's own header is the cache failing, not the caller's mistake."""
    def unreadable(paths):
        raise WeightsError(f"cannot read weights from {paths[0]!r}: OSError: gone")
    monkeypatch.setattr(prepared, "SafetensorsFiles", unreadable)
    arrays = prepared.prepared_arrays("k1", SPECS, made_by([]))
    assert file_region(arrays["w"]) is None
    np.testing.assert_array_equal(arrays["w"], SOURCES["w"])


def test_an_unusable_cache_makes_the_arrays_in_memory(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "file"))
    made = []
    arrays = prepared.prepared_arrays("k1", SPECS, made_by(made))
    assert sorted(made) == ["b", "w"] and all(file_region(a) is None for a in arrays.values())
    np.testing.assert_array_equal(arrays["w"], SOURCES["w"])


def test_arrays_over_half_the_caps_are_made_in_memory_and_not_written(fresh_cache, monkeypatch):
    size = sum(a.nbytes for a in SOURCES.values())
    monkeypatch.setenv("BLOCKC_CACHE_MAX", str(2 * size - 1))
    made = []
    with pytest.warns(prepared.UncachedWeightsWarning, match="over half the cache's cap .*BLOCKC_CACHE_MAX"):
        arrays = prepared.prepared_arrays("k1", SPECS, made_by(made))
    assert sorted(made) == ["b", "w"] and all(file_region(a) is None for a in arrays.values())
    np.testing.assert_array_equal(arrays["w"], SOURCES["w"])
    assert not (fresh_cache / "weights").exists() and not files.CACHE_COUNTS
    monkeypatch.setenv("BLOCKC_CACHE_MAX", str(2 * size))   # exactly half: kept
    arrays = prepared.prepared_arrays("k1", SPECS, made_by(made))
    assert files.CACHE_COUNTS["weights", "miss"] == 1 and file_region(arrays["w"]) is not None


def test_errors_of_make_and_arrays_unlike_their_specs_are_raised(fresh_cache):
    def broken(name):
        raise ValueError("no such tensor")
    with pytest.raises(ValueError, match="no such tensor"):
        prepared.prepared_arrays("k1", SPECS, broken)
    with pytest.raises(WeightsError, match="was made as float64"):
        prepared.prepared_arrays("k2", SPECS, lambda name: SOURCES[name].astype(np.float64))
    assert not list((fresh_cache / "weights").rglob("*.safetensors"))   # and nothing was kept


def test_source_identity_is_what_stat_says_and_none_while_racy(tmp_path, not_racy, monkeypatch):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x" * 16)
    read = {str(path): path.stat()}
    first = prepared.source_identity(read)
    assert first is not None and str(path) in first
    assert prepared.source_identity(read) == first
    st = path.stat()
    path.write_bytes(b"y" * 16)   # rewritten in place: same size, same inode
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))   # the old mtime, as cp -p and rsync --inplace keep it
    assert prepared.source_identity({str(path): path.stat()}) not in (None, first)
    assert prepared.source_identity(read) is None   # the path no longer names the file that was read
    assert prepared.source_identity({**read, str(tmp_path / "missing"): st}) is None
    monkeypatch.undo()   # the real clock: the file was just written
    assert prepared.source_identity({str(path): path.stat()}) is None


@pytest.mark.parametrize("where, exempt", [
    ("cache/weights/KEY/prepared.safetensors", True),   # the cache's own prepared file
    ("cache/weights/KEY/model.safetensors", False),     # beside it, not it
    ("cache/weights/KEY/prepared.safetensors.build.tmp", False),
    ("cache/weights/prepared.safetensors", False),
    ("cache/model/KEY/prepared.safetensors", False),    # another kind of entry
    ("elsewhere/weights/KEY/prepared.safetensors", False),   # another cache root
])
def test_only_the_caches_own_prepared_files_are_exempt_from_the_racy_rule(tmp_path, fresh_cache, where, exempt):
    """A file written just now (the real clock: racy) is refused as a source,
    unless it is a prepared file of this cache (``_own_entry``)."""
    path = tmp_path / where
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 16)
    assert (prepared.source_identity({str(path): path.stat()}) is not None) == exempt


def test_an_entry_whose_sources_change_while_it_is_made_is_not_kept(tmp_path, fresh_cache, not_racy):
    """git re-stats after hashing too: the arrays are what this process read,
    but the key named the file as it was before."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x" * 16)
    read = {str(path): path.stat()}

    def make(name):
        path.write_bytes(b"y" * 16)   # rewritten while the entry is made
        return SOURCES[name]
    got = prepared.prepared_arrays("k1", SPECS, make, read)
    assert not files.CACHE_COUNTS and not list((fresh_cache / "weights").rglob("*.safetensors"))
    for name, a in got.items():
        np.testing.assert_array_equal(a.view(np.uint8), SOURCES[name].view(np.uint8))


@pytest.mark.parametrize("where", ["header", "middle"])
def test_a_rewrite_stat_cannot_see_still_changes_the_identity(tmp_path, not_racy, monkeypatch, where):
    """A filesystem without real ctimes (FUSE object stores, some SMB mounts:
    ctime = mtime) and a same-size file copied over with its mtime kept:
    only the content sample tells."""
    real = prepared.stat_identity
    monkeypatch.setattr(prepared, "stat_identity", lambda f: real(f)._replace(ctime_ns=real(f).mtime_ns))
    path = tmp_path / "model.safetensors"
    data = bytearray((16).to_bytes(8, "little") + b'{"a":1}'.ljust(16) + bytes(4 << 20))
    path.write_bytes(data)
    first = prepared.source_identity({str(path): path.stat()})
    st = path.stat()
    data[10 if where == "header" else len(data) // 2] ^= 1
    with open(path, "r+b") as f:   # in place, the old mtime kept
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prepared.source_identity({str(path): path.stat()}) not in (None, first)
