"""``blockc/files.py``: the one byte formatter, and the one answer to "can
this path be written"."""
from __future__ import annotations

import os

import numpy as np
import pytest

from blockc.errors import BlockcError
from blockc.files import check_writable, check_writable_dir, format_bytes


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (128 << 10, "128 KiB"),
    (int(22.3 * 2**30), "22.3 GiB"), (int(2.27 * 2**50), "2.27 PiB"), (12 << 20, "12 MiB"), (8 << 30, "8 GiB"),
    (-3 << 20, "-3 MiB"), (1 << 70, "1024 EiB"),
    # frontends/module's .3g once printed these as "1e+03 KiB"
    (1000 << 10, "1000 KiB"), (int(999.7 * 1024), "1000 KiB"), (1023 << 20, "1023 MiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


# -- can it be written: one rule for every command and report -------------------------
def test_a_file_that_cannot_be_written_is_refused(tmp_path):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    for path, why in [(tmp_path, "it is a folder"),
                      (tmp_path / "no" / "such" / "x.npz", f"the folder {tmp_path / 'no' / 'such'} does not exist"),
                      (a_file / "sub" / "x.npz", f"{a_file} is a file, not a folder")]:
        with pytest.raises(BlockcError) as info:
            check_writable(path)
        assert str(info.value) == f"cannot write {path}: {why}"
    check_writable(tmp_path / "new.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]   # asking writes nothing


def test_a_folder_that_cannot_be_filled_is_refused(tmp_path):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    with pytest.raises(BlockcError, match=r"cannot write the build into .*afile: it is a file, not a folder "
                                          r"\(give a new or existing folder with -o\)"):
        check_writable_dir(a_file, "the build into", "-o")
    with pytest.raises(BlockcError, match=rf"cannot write the report to .*afile/a/b: {a_file} is a file"):
        check_writable_dir(a_file / "a" / "b", "the report to", "--report")
    check_writable_dir(tmp_path / "new" / "deeper", "the build into", "-o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_folder_that_is_not_writable_is_refused(tmp_path, monkeypatch):
    # Tests run as root, whom permission bits do not stop: make os.access say no.
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    with pytest.raises(BlockcError, match=f"cannot write .*x.npz: the folder {tmp_path} is not writable"):
        check_writable(tmp_path / "x.npz")
    with pytest.raises(BlockcError, match=f"the folder {tmp_path} is not writable"):
        check_writable_dir(tmp_path / "build", "the build into", "-o")


def test_saving_arrays_under_a_file_names_the_file(tmp_path):
    # runtime/feeds once had its own check, which called this folder missing
    from blockc.runtime.feeds import save_npz
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BlockcError, match=f"{tmp_path / 'afile'} is a file, not a folder"):
        save_npz(str(tmp_path / "afile" / "out.npz"), {"a": np.zeros(1)})


# -- the cache's size: capped, least recently used first, listed and cleared -------------------
def _entry(name: str, size: int):
    from blockc.files import cache_root, cached_file
    return cached_file(cache_root() / name / "lib.so", lambda tmp: tmp.write_bytes(b"x" * size))


def test_the_cache_keeps_under_its_cap_by_dropping_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BLOCKC_CACHE_MAX", "2.5K")
    a, b = _entry("a", 1024), _entry("b", 1024)
    os.utime(a.with_name("lib.so.ok"), (100, 100))   # a was built first ...
    os.utime(b.with_name("lib.so.ok"), (200, 200))
    assert _entry("a", 1024) == a                    # ... but used last
    _entry("c", 1024)                                # 3 KiB > 2.5 KiB: b goes
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["a", "c"]


def test_the_default_cap_and_a_bad_one(monkeypatch):
    from blockc.files import CACHE_LIMIT, cache_limit
    monkeypatch.delenv("BLOCKC_CACHE_MAX", raising=False)
    assert cache_limit() == CACHE_LIMIT == 10 << 30
    monkeypatch.setenv("BLOCKC_CACHE_MAX", "lots")
    with pytest.raises(BlockcError, match=r"^BLOCKC_CACHE_MAX 'lots': expected a positive size, e\.g\. 8G, 512M"):
        cache_limit()


def test_blockc_cache_lists_and_clears_the_entries(tmp_path, monkeypatch, capsys):
    from blockc.cli import main
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("BLOCKC_CACHE_MAX", raising=False)
    _entry("gpt2-gpu-1234", 2048)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "gpt2-gpu-1234" in out[0] and out[0].split()[:2] == ["2.09", "KiB"]
    assert out[-1] == f"{tmp_path / 'cache'}: 1 entries, 2.09 KiB (at most 10 GiB: BLOCKC_CACHE_MAX)"
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.startswith("removed 1 entries (2.09 KiB)")
    assert list((tmp_path / "cache").iterdir()) == []


# -- a large entry checked by stat, not by hashing it ---------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "replaced", "no record"])
def test_a_damaged_stat_verified_entry_is_rebuilt(tmp_path, damage):
    from blockc.files import cached_file
    path, builds = tmp_path / "entry.bin", []

    def make(tmp):
        builds.append(tmp)
        tmp.write_bytes(b"weights!" * 100)
    cached_file(path, make, verify="stat")
    recorded = (tmp_path / "entry.bin.ok").read_text()
    assert "sha256" not in recorded and "mtime_ns" in recorded
    if damage == "truncated":
        with open(path, "r+b") as f:
            f.truncate(400)
    elif damage == "replaced":             # same size, a new file renamed over it: its inode tells
        (tmp_path / "other").write_bytes(b"WEIGHTS!" * 100)
        os.utime(tmp_path / "other", ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
        os.replace(tmp_path / "other", path)
    else:
        (tmp_path / "entry.bin.ok").unlink()
    assert cached_file(path, make, verify="stat").read_bytes() == b"weights!" * 100
    assert len(builds) == 2
    cached_file(path, make, verify="stat")
    assert len(builds) == 2


def test_a_metadata_change_does_not_rebuild_a_stat_verified_entry(tmp_path):
    """An entry is only ever replaced: a chmod (or chown, hard link, xattr) changes its ctime, not its bytes."""
    from blockc.files import cached_file
    path, builds = tmp_path / "entry.bin", []
    cached_file(path, lambda tmp: builds.append(tmp.write_bytes(b"w" * 100)), verify="stat")
    os.chmod(path, 0o600)
    os.link(path, tmp_path / "another name")
    cached_file(path, lambda tmp: builds.append(tmp.write_bytes(b"w" * 100)), verify="stat")
    assert len(builds) == 1


@pytest.mark.parametrize("verify", ["stat", "sha256"])
def test_a_rebuild_leaves_the_old_file_at_the_path_until_it_is_replaced(tmp_path, verify):
    """A reader in another process opens the entry by its path meanwhile (ONNX Runtime does)."""
    from blockc.files import cached_file
    path, seen = tmp_path / "entry.bin", []
    cached_file(path, lambda tmp: tmp.write_bytes(b"old" * 100), verify=verify)
    (tmp_path / "entry.bin.ok").write_text("{}")   # a damaged record

    def make(tmp):
        seen.append(path.read_bytes())
        tmp.write_bytes(b"new" * 100)
    assert cached_file(path, make, verify=verify).read_bytes() == b"new" * 100
    assert seen == [b"old" * 100]


def test_an_entry_that_read_refuses_stays_at_its_path_while_it_is_made_again(tmp_path, monkeypatch):
    from blockc import files
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path))
    files.cached_value("t", "k", "v", lambda: b"bad", lambda b: b)
    path, seen = tmp_path / "t" / "k" / "v", []

    def read(data):
        if data == b"bad":
            raise ValueError("refused")
        return data

    def make():
        seen.append(path.read_bytes())
        return b"good"
    assert files.cached_value("t", "k", "v", make, read) == b"good"
    assert seen == [b"bad"]


def test_an_entry_recorded_one_way_is_rebuilt_when_checked_the_other(tmp_path):
    from blockc.files import cached_file
    path, builds = tmp_path / "entry.bin", []

    def make(tmp):
        builds.append(tmp)
        tmp.write_bytes(b"x" * 10)
    cached_file(path, make)
    cached_file(path, make, verify="stat")
    cached_file(path, make, verify="stat")
    assert len(builds) == 2


def test_a_prune_locks_the_use_file_of_an_entry_that_has_none_yet(tmp_path, monkeypatch):
    """An entry written before ``.use`` files existed, or whose first reader
    has not opened one yet: a reader starting while the prune removes it
    must wait on the same file, then see it removed (``EntryUse``)."""
    import fcntl

    from blockc import files
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path))
    files.cached_value("t", "k", "v", lambda: b"x", lambda b: b)
    use = tmp_path / "t" / "k" / "v.use"
    use.unlink(missing_ok=True)
    with files._claimed(use.parent) as free:
        assert free
        fd = os.open(use, os.O_RDWR | os.O_CREAT)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(fd)


@pytest.mark.parametrize("code, hinted", [("ENOLCK", True), ("EOPNOTSUPP", True), ("ENOSYS", True), ("EINVAL", True),
                                          ("EBADF", False), ("ENOMEM", False)])
def test_a_failed_lock_names_its_file_and_blames_the_filesystem_only_when_it_is_to_blame(
        code, hinted, tmp_path, monkeypatch):
    """flock(2)'s errnos for a filesystem that cannot lock get the hint to
    move the cache; others (a bad descriptor, no memory) only the file."""
    import errno
    import fcntl
    from blockc.files import file_lock

    def failing(fd, operation):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
    monkeypatch.setattr(fcntl, "flock", failing)
    lock = tmp_path / "x.lock"
    with pytest.raises(BlockcError) as e:
        with file_lock(lock):
            pass
    assert str(e.value).startswith(f"cannot lock {lock}: {os.strerror(getattr(errno, code))}")
    assert ("its filesystem gives no working flock; set BLOCKC_CACHE to a folder on a local disk" in str(e.value)) \
        == hinted, str(e.value)
