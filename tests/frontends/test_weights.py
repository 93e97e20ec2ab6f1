"""Weights files (.safetensors, .npz) and checking weights against a model."""
import os
import weakref

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from blockc import build_model, init_weights, trace
from blockc.errors import WeightsError
from blockc.frontends import weights
from blockc.frontends.weights import (SafetensorsFiles, check_weights, load_weights, materialize, save_weights,
                                     write_safetensors)
from blockc.ir.dtypes import DType

FORMATS = [".safetensors", ".npz"]


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny")


def test_materialize_makes_a_plain_dict(tiny):
    lazy = init_weights(tiny, seed=3)
    real = materialize(lazy)
    assert type(real) is dict and list(real) == list(lazy)
    assert all(isinstance(a, np.ndarray) for a in real.values())
    np.testing.assert_array_equal(real["tok.weight"], lazy["tok.weight"])


@pytest.mark.parametrize("ext", FORMATS)
def test_round_trip(tmp_path, tiny, ext):
    weights = materialize(init_weights(tiny, seed=1))
    weights["step"] = np.array(7, dtype=np.int64)  # a scalar and an int survive too
    path = tmp_path / f"w{ext}"
    save_weights(path, weights)
    loaded = load_weights(path)
    assert type(loaded) is dict and sorted(loaded) == sorted(weights)
    for name, a in weights.items():
        assert loaded[name].dtype == a.dtype and loaded[name].shape == a.shape, name
        np.testing.assert_array_equal(loaded[name], a)
    assert os.listdir(tmp_path) == [path.name]  # no temp files left behind


@pytest.mark.parametrize("ext", FORMATS)
def test_saves_a_lazy_mapping(tmp_path, tiny, ext):
    lazy = init_weights(tiny, seed=2)
    save_weights(tmp_path / f"w{ext}", lazy)
    loaded = load_weights(str(tmp_path / f"w{ext}"))
    check_weights(tiny, loaded)
    np.testing.assert_array_equal(loaded["blocks.1.attn.w_v.weight"], lazy["blocks.1.attn.w_v.weight"])


@pytest.mark.parametrize("ext", FORMATS)
def test_bfloat16_round_trip(tmp_path, ext):
    rng = np.random.default_rng(0)
    weights = {"a": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal(4).astype(np.float16), "c": np.arange(3, dtype=np.float32)}
    save_weights(tmp_path / f"w{ext}", weights)
    loaded = load_weights(tmp_path / f"w{ext}")
    for name, a in weights.items():
        assert loaded[name].dtype == a.dtype, name
        np.testing.assert_array_equal(loaded[name].view(np.uint8), a.view(np.uint8))


def test_safetensors_file_is_standard(tmp_path):
    # Readable by the safetensors library directly, bfloat16 tagged as such.
    save_weights(tmp_path / "w.safetensors", {"x": np.ones((2, 2), ml_dtypes.bfloat16)})
    with open(tmp_path / "w.safetensors", "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        assert b'"BF16"' in f.read(header_len)
    assert safetensors.numpy.load_file(str(tmp_path / "w.safetensors"))["x"].dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("ext", FORMATS)
def test_save_is_atomic(tmp_path, monkeypatch, ext):
    path = tmp_path / f"w{ext}"
    save_weights(path, {"old": np.zeros(3, np.float32)})
    before = path.read_bytes()

    def write_half_then_fail(*args, **kwargs):
        # whatever file the writer was given gets a partial write, then the write fails
        with open(args[0], "wb") if not hasattr(args[0], "write") else args[0] as f:
            f.write(b"partial")
        raise OSError("disk full")

    def make_then_fail(path, specs, make):
        # the real writer, its disk full after the header and the first tensor
        made, real = [], write_safetensors

        def failing(name):
            if made:
                raise OSError("disk full")
            made.append(name)
            return make(name)
        real(path, specs, failing)

    monkeypatch.setattr(weights, "write_safetensors", make_then_fail)
    monkeypatch.setattr(np, "savez", write_half_then_fail)
    new = {"new": np.ones(3, np.float32), "more": np.ones(3, np.float32)}
    with pytest.raises(WeightsError, match="disk full"):
        save_weights(path, new)
    assert path.read_bytes() == before  # the old file is intact
    assert os.listdir(tmp_path) == [path.name]  # and no temp file is left
    with pytest.raises(WeightsError):
        save_weights(tmp_path / f"fresh{ext}", new)
    assert os.listdir(tmp_path) == [path.name]  # no partial new file either


def test_the_writer_streams_one_tensor_at_a_time_into_a_standard_file(tmp_path):
    arrays = {"h": np.arange(3, dtype=np.float16), "b": np.ones((2, 3), ml_dtypes.bfloat16),
              "f": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.array(7, np.int64), "z": np.ones((0, 4))}
    alive = []

    def make(name):
        assert all(ref() is None for ref in alive)   # the tensor made before is no longer held
        a = arrays[name].copy()
        alive.append(weakref.ref(a))
        return a
    write_safetensors(tmp_path / "w.safetensors", {n: (a.dtype, a.shape) for n, a in arrays.items()}, make)
    loaded = safetensors.numpy.load_file(str(tmp_path / "w.safetensors"))   # the library's own reader
    assert sorted(loaded) == sorted(arrays) and len(alive) == len(arrays)
    for name, a in arrays.items():
        assert loaded[name].dtype == a.dtype and loaded[name].shape == a.shape, name
        np.testing.assert_array_equal(loaded[name].reshape(-1).view(np.uint8), a.reshape(-1).view(np.uint8))
    files = SafetensorsFiles([tmp_path / "w.safetensors"])
    for name in arrays:   # each tensor starts aligned to its item size, so its view is aligned
        assert files[name].size == 0 or files[name].ctypes.data % files[name].itemsize == 0, name


def written_alone(path, made):
    """``made`` written as the one tensor ``"t"`` of a new file at ``path``:
    what the file holds, and the most memory numpy held meanwhile."""
    import tracemalloc
    tracemalloc.start()
    try:
        write_safetensors(path, {"t": (made.dtype, made.shape)}, lambda name: made)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return safetensors.numpy.load_file(str(path))["t"], peak


def test_the_writer_puts_a_transpose_in_order_a_band_at_a_time(tmp_path):
    """A made array out of order (a checkpoint's transposed weight) is written
    in C order without a copy of its size held: in a new process each page
    of one is a fault to take (``weights.in_order_bands``)."""
    view = np.arange(512 * 2048, dtype=np.float32).reshape(512, 2048).T   # [2048, 512], 4 MiB, out of order
    got, peak = written_alone(tmp_path / "t.safetensors", view)
    assert peak < view.nbytes // 4, peak   # a band of 256 rows, 512 KiB: not the whole 4 MiB
    np.testing.assert_array_equal(got, view)


def test_matrices_side_by_side_are_written_a_band_at_a_time_and_made_whole_for_numpy(tmp_path):
    """A merge of a checkpoint's transposed views (``SideBySide``: a q/k/v
    concat along the columns) is written as the concat would be, without a
    copy of its size held; numpy gets it made whole."""
    from blockc.frontends.weights import SideBySide
    rng = np.random.default_rng(0)
    parts = tuple(rng.standard_normal((n, 2048), dtype=np.float32).T for n in (1024, 256, 256))   # [2048, n] views
    merge = SideBySide(parts)
    whole = np.concatenate(parts, axis=1)
    assert merge.shape == whole.shape and merge.dtype == whole.dtype
    np.testing.assert_array_equal(np.asarray(merge), whole)
    got, peak = written_alone(tmp_path / "m.safetensors", merge)
    assert peak < whole.nbytes // 4, peak   # a band of 256 rows, 1.5 MiB: not the whole 12 MiB
    np.testing.assert_array_equal(got, whole)


def test_the_writer_starts_each_tensors_writeback_as_it_is_written_and_still_syncs_the_file(tmp_path, monkeypatch):
    """Each tensor's bytes are handed to the disk as soon as they are written
    (``files.start_writeback``), and the whole file is still ``fsync``ed
    after the last: a cache entry is renamed in only once it is durable."""
    arrays = {"a": np.arange(6, dtype=np.float32), "b": np.ones((2, 3), np.float16)}
    calls = []
    real_start = weights.start_writeback
    monkeypatch.setattr(weights, "start_writeback", lambda f, start, n: calls.append(("start", start, n))
                        or real_start(f, start, n))
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync",)) or real_fsync(fd))
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {n: (a.dtype, a.shape) for n, a in arrays.items()}, arrays.__getitem__)
    data = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    assert calls == [("start", data, 24), ("start", data + 24, 12), ("fsync",)]
    loaded = safetensors.numpy.load_file(str(path))
    assert all(np.array_equal(loaded[n], a) for n, a in arrays.items())


def test_the_writer_refuses_a_made_array_unlike_its_spec(tmp_path):
    with pytest.raises(WeightsError, match=r"'?w'? was made as float64\[2\], but the file's header says "
                                           r"float32\[2\]"):
        write_safetensors(tmp_path / "w.safetensors", {"w": (np.float32, (2,))}, lambda name: np.ones(2))


def test_shards_are_read_from_their_headers_and_one_tensor_at_a_time(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    safetensors.numpy.save_file({"a": a}, str(tmp_path / "1.safetensors"))
    safetensors.numpy.save_file({"b": np.ones(4, np.float16)}, str(tmp_path / "2.safetensors"))
    files = SafetensorsFiles([tmp_path / "1.safetensors", tmp_path / "2.safetensors"])
    assert files.shapes == {"a": (2, 3), "b": (4,)} and files.dtypes == {"a": "BF16", "b": "F16"}
    assert files["a"].dtype == DType.bfloat16.numpy and np.array_equal(files["a"], a)
    assert files.files["b"] == str(tmp_path / "2.safetensors")



def test_a_shard_replaced_after_its_header_was_read_is_refused(tmp_path):
    """Its header describes another file than the one a read would map (a
    new inode at the path: ``rsync``, ``cp`` + ``mv``): the offsets would read garbage."""
    path = tmp_path / "1.safetensors"
    safetensors.numpy.save_file({"a": np.ones(4, np.float32)}, str(path))
    files = SafetensorsFiles([path])
    safetensors.numpy.save_file({"a": np.zeros(4, np.float32)}, str(tmp_path / "new.safetensors"))
    os.replace(tmp_path / "new.safetensors", path)
    with pytest.raises(WeightsError, match="1.safetensors changed since its header was read"):
        files["a"]


def test_a_rewrite_in_place_keeping_size_and_mtime_after_the_header_was_read_is_refused(tmp_path):
    """``cp -p`` or ``rsync --inplace`` over a loaded checkpoint: same inode,
    size and mtime, new bytes; only the ctime says so. The header's offsets
    must not read the new bytes beside tensors read before."""
    path = tmp_path / "1.safetensors"
    safetensors.numpy.save_file({"a": np.ones(4, np.float32)}, str(path))
    files = SafetensorsFiles([path])
    before = os.stat(path)
    data = path.read_bytes()
    with open(path, "r+b") as f:
        f.write(data[:-16] + np.full(4, 2, np.float32).tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    with pytest.raises(WeightsError, match="changed since its header was read"):
        files["a"]


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    for name in ("1", "2"):
        safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, str(tmp_path / f"{name}.safetensors"))
    with pytest.raises(WeightsError, match=r"2.safetensors: tensor a is also in .*1.safetensors"):
        SafetensorsFiles([tmp_path / "1.safetensors", tmp_path / "2.safetensors"])


@pytest.mark.parametrize("name", ["w.pt", "w.bin", "weights", "w.safetensor"])
def test_unknown_extension(tmp_path, name):
    with pytest.raises(WeightsError, match=r"unknown weights format.*\.safetensors or \.npz"):
        save_weights(tmp_path / name, {"a": np.zeros(1)})
    (tmp_path / name).write_bytes(b"x")
    with pytest.raises(WeightsError, match="unknown weights format"):
        load_weights(tmp_path / name)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(WeightsError, match="not found"):
        load_weights(tmp_path / "nope.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError, match="cannot read"):
        load_weights(tmp_path / "bad.safetensors")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(WeightsError, match="cannot read"):
        load_weights(tmp_path / "bad.npz")
    with pytest.raises(WeightsError, match="does not exist"):
        save_weights(tmp_path / "no" / "dir.npz", {"a": np.zeros(1)})


# -- check_weights ----------------------------------------------------------------
@pytest.mark.parametrize("seed", [-1, 2.5, "0"])
def test_a_seed_numpy_cannot_take_is_refused_when_given(tiny, seed):
    """Not as numpy's ValueError at the first weight made."""
    from blockc.errors import BlockcError
    with pytest.raises(BlockcError, match=f"seed must be a non-negative integer, got {seed!r}"):
        init_weights(tiny, seed=seed)


def test_check_accepts_matching_weights(tiny):
    weights = init_weights(tiny)
    assert check_weights(tiny, weights) is weights
    check_weights(trace(tiny), weights)


def test_check_lists_every_problem(tiny):
    weights = materialize(init_weights(tiny))
    del weights["ln_f.bias"]
    del weights["blocks.0.ln1.weight"]
    weights["blocks.0.attn.w_q.weight"] = weights["blocks.0.attn.w_q.weight"].T[:, :32].copy()
    weights["pos.weight"] = weights["pos.weight"].astype(np.float64)
    weights["tok.weight"] = weights["tok.weight"].astype(np.int32)
    weights["head.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(WeightsError) as info:
        check_weights(tiny, weights)
    problems = info.value.problems
    assert len(problems) == 6, problems
    message = str(info.value)
    assert "6 problems" in message
    for text in ["missing: ln_f.bias (f32[64])", "missing: blocks.0.ln1.weight",
                 "unexpected: head.weight",
                 "shape: blocks.0.attn.w_q.weight is [64, 32], expected [64, 64]",
                 "dtype: pos.weight is float64, expected float32 (pass cast=True",
                 "dtype: tok.weight is int32, expected float32"]:
        assert text in message


def test_check_against_a_graph_reports_the_same(tiny):
    weights = materialize(init_weights(tiny))
    weights["ln_f.weight"] = np.zeros(65, np.float32)
    del weights["tok.weight"]
    with pytest.raises(WeightsError) as info:
        check_weights(trace(tiny), weights)
    assert info.value.problems == ["missing: tok.weight (f32[256,64])",
                                   "shape: ln_f.weight is [65], expected [64]"]


def test_strict_false_allows_extra_names(tiny):
    weights = dict(init_weights(tiny)) | {"optimizer.step": np.zeros(1)}
    with pytest.raises(WeightsError, match="unexpected: optimizer.step"):
        check_weights(tiny, weights)
    assert check_weights(tiny, weights, strict=False) is weights


def test_cast(tiny):
    weights = materialize(init_weights(tiny, dtype=DType.float64))
    with pytest.raises(WeightsError) as info:
        check_weights(tiny, weights)
    assert len(info.value.problems) == len(weights)  # every one is float64
    cast = check_weights(tiny, weights, cast=True)
    assert cast is not weights and set(cast) == set(weights)
    assert all(a.dtype == np.float32 for a in cast.values())
    np.testing.assert_array_equal(cast["tok.weight"], weights["tok.weight"].astype(np.float32))
    assert weights["tok.weight"].dtype == np.float64  # the caller's dict is untouched


def test_cast_refuses_non_float_and_overflow():
    model = build_model("tiny", {"dtype": "float16"})
    weights = materialize(init_weights(model))
    weights["ln_f.weight"] = np.full(64, 1e6, np.float32)  # not representable in float16
    weights["ln_f.bias"] = np.zeros(64, np.int64)
    with pytest.raises(WeightsError) as info:
        check_weights(model, weights, cast=True)
    assert info.value.problems == ["dtype: ln_f.weight overflows when cast from float32 to float16",
                                   "dtype: ln_f.bias is int64, expected float16"]


def test_param_dtype_overrides_model_dtype():
    from blockc.frontends import Model, Parameter

    class M(Model):
        def __init__(self):
            super().__init__()
            self.a = Parameter((2,))
            self.b = Parameter((2,), dtype=DType.float64)

    check_weights(M(), {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float64)})
    with pytest.raises(WeightsError, match="dtype: b is float32, expected float64"):
        check_weights(M(), {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})


@pytest.mark.parametrize("ext", FORMATS)
def test_saved_file_has_ordinary_permissions(tmp_path, ext):
    # A temp-then-rename save must not leave the file readable by its owner only.
    umask = os.umask(0o022)
    try:
        save_weights(tmp_path / f"w{ext}", {"a": np.zeros(2, np.float32)})
    finally:
        os.umask(umask)
    assert (tmp_path / f"w{ext}").stat().st_mode & 0o777 == 0o644


def test_safetensors_are_mapped_not_read(tmp_path):
    """The arrays are views of the file's pages (read-only, no copy), with
    every dtype the library writes, empty tensors included."""
    import mmap
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, ml_dtypes.bfloat16),
              "i": np.arange(3, dtype=np.int64), "e": np.zeros((0, 4), np.float16), "t": np.array(True)}
    save_weights(tmp_path / "w.safetensors", arrays)
    got = load_weights(tmp_path / "w.safetensors")
    for name, a in arrays.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape
        np.testing.assert_array_equal(got[name].astype(np.float64), a.astype(np.float64))
    assert not got["w"].flags.writeable
    base = got["w"]
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the resident size from Linux's /proc")
def test_loading_safetensors_takes_no_second_copy(tmp_path):
    """Peak memory of loading (and scanning for NaN) a 96 MB file: the file's
    pages once, not the file plus a copy (safetensors.numpy's 2x)."""
    import subprocess
    import sys
    rng = np.random.default_rng(0)
    save_weights(tmp_path / "big.safetensors",
                 {f"w{k}": rng.standard_normal((1024, 2048), np.float32) for k in range(12)})
    size = os.path.getsize(tmp_path / "big.safetensors")
    # From the resident memory just before (the peak so far may be higher: imports come and go) to the
    # peak after, both of this process's memory (VmHWM: ru_maxrss can carry the forking parent's over exec).
    script = ("import os, sys; from blockc.frontends.weights import load_weights; "
              "kib = lambda key: int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]); "
              "before = kib('VmRSS:'); w = load_weights(sys.argv[1]); print((kib('VmHWM:') - before) * 1024)")
    grown = int(subprocess.run([sys.executable, "-c", script, str(tmp_path / "big.safetensors")], check=True,
                               capture_output=True, text=True).stdout)
    assert grown < 1.3 * size, (grown, size)


def test_a_safetensors_dtype_blockc_does_not_read_is_named(tmp_path):
    safetensors.numpy.save_file({"ok": np.ones(2, np.float32), "z": np.ones(2, np.complex64)},
                                str(tmp_path / "c.safetensors"))
    with pytest.raises(WeightsError, match=r"c\.safetensors': z has the dtype C64, which blockc does not read"):
        load_weights(tmp_path / "c.safetensors")


def test_file_region_gives_a_views_place_in_its_file(tmp_path):
    """What ONNX Runtime is told to map: the bytes at the region are the tensor's."""
    from blockc.frontends.weights import file_region
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, ml_dtypes.bfloat16)}
    save_weights(tmp_path / "w.safetensors", arrays)
    files = SafetensorsFiles([tmp_path / "w.safetensors"])
    raw = (tmp_path / "w.safetensors").read_bytes()
    for name, a in arrays.items():
        r = file_region(files[name])
        assert r.path == str(tmp_path / "w.safetensors") and r.length == a.nbytes
        assert raw[r.offset:r.offset + r.length] == a.tobytes()
    view = files["a"]
    assert file_region(view.reshape(12)) == file_region(view)
    assert file_region(view.T) is None and file_region(np.array(view)) is None and file_region(arrays["a"]) is None


def resident_kib(path) -> int:
    """Kilobytes of ``path``'s pages resident in this process's maps of it (Linux's smaps)."""
    total, mapped = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:   # a mapping's first line: its range, ..., its path
            mapped = line.rstrip("\n").endswith(" " + str(path))
        elif mapped and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's memory accounting")
def test_release_pages_takes_a_read_files_pages_out_of_this_process(tmp_path):
    """Folding weights reads every byte of their views (``runtime/folded_params.py``);
    released, those pages stop counting in this process (ONNX Runtime's own map reads them)."""
    from blockc.frontends.weights import release_pages
    want = np.arange(2 << 20, dtype=np.float32)   # 8 MiB
    save_weights(tmp_path / "w.safetensors", {"a": want})
    a = SafetensorsFiles([tmp_path / "w.safetensors"])["a"]
    assert float(a.sum()) == float(want.sum())
    assert resident_kib(tmp_path / "w.safetensors") > 6 << 10
    release_pages([a, np.ones(3)])   # an array of no file is passed over
    assert resident_kib(tmp_path / "w.safetensors") < 1 << 10
    np.testing.assert_array_equal(a, want)   # read again from the file


def test_closing_refuses_new_reads_and_keeps_arrays_handed_out(tmp_path):
    save_weights(tmp_path / "w.safetensors", {"a": np.arange(4, dtype=np.float32)})
    with SafetensorsFiles([tmp_path / "w.safetensors"]) as files:
        a = files["a"]
    del files
    import gc
    gc.collect()
    np.testing.assert_array_equal(a, np.arange(4, dtype=np.float32))   # its map lives as long as it does
    again = SafetensorsFiles([tmp_path / "w.safetensors"])
    again.close()
    with pytest.raises(WeightsError, match=r"w\.safetensors\) were closed"):
        again["a"]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the resident size from Linux's /proc")
def test_loading_leaves_the_scanned_pages_to_the_page_cache(tmp_path):
    """After load_weights' scan for NaN read every page of a 48 MB file, the
    process holds few of them: a runtime mapping the file itself does not
    count them twice. The arrays still read right."""
    import subprocess
    import sys
    rng = np.random.default_rng(0)
    arrays = {f"w{k}": rng.standard_normal((1024, 2048), np.float32) for k in range(6)}
    save_weights(tmp_path / "big.safetensors", arrays)
    size = os.path.getsize(tmp_path / "big.safetensors")
    script = ("import sys, numpy as np; from blockc.frontends.weights import load_weights; "
              "kib = lambda key: int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]); "
              "before = kib('VmRSS:'); w = load_weights(sys.argv[1]); print((kib('VmRSS:') - before) * 1024, "
              "repr(float(np.asarray(w['w5'], np.float64).sum())))")
    grown, total = subprocess.run([sys.executable, "-c", script, str(tmp_path / "big.safetensors")], check=True,
                                  capture_output=True, text=True).stdout.split()
    assert int(grown) < 0.25 * size, (grown, size)
    assert float(total) == float(arrays["w5"].astype(np.float64).sum())
