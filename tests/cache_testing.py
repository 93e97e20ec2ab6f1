"""Damaging a cache entry as a killed build or a tampered file leaves it
(the compile cache's tests: tests/runtime/test_compile_cache.py,
tests/generate/test_warm_start.py); and two fixtures for prepared weights'
tests (``from cache_testing import fresh_cache, not_racy``)."""
import json
import time

import pytest

from blockc import files

DAMAGES = ["truncated", "garbage, recorded as intact"]


def damage(entry, how: str) -> None:
    data = entry.read_bytes()
    if how == "truncated":   # a build killed mid-write whose record survived
        entry.write_bytes(data[: len(data) // 2])
    else:                    # its record matches: only reading it back can tell
        entry.write_bytes(b"\x00garbage" * 10)
        entry.with_name(entry.name + ".ok").write_text(json.dumps(files._fingerprint(entry)))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty ``BLOCKC_CACHE`` and no cache counts yet."""
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    files.CACHE_COUNTS.clear()
    return tmp_path / "cache"


@pytest.fixture
def not_racy(monkeypatch):
    """``files``' clock 10 s on: files the test just wrote are no longer
    racy (``files.racy``), as they are not on a second run."""
    monkeypatch.setattr(files, "_now_ns", lambda: time.time_ns() + 10 * 10**9)
