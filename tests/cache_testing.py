"""Damaging a cache entry as a killed build or a tampered file leaves it
(the compile cache's tests: tests/runtime/test_compile_cache.py,
tests/generate/test_warm_start.py)."""
import json

from blockc import files

DAMAGES = ["truncated", "garbage, recorded as intact"]


def damage(entry, how: str) -> None:
    data = entry.read_bytes()
    if how == "truncated":   # a build killed mid-write whose record survived
        entry.write_bytes(data[: len(data) // 2])
    else:                    # its record matches: only reading it back can tell
        entry.write_bytes(b"\x00garbage" * 10)
        entry.with_name(entry.name + ".ok").write_text(json.dumps(files._fingerprint(entry)))
