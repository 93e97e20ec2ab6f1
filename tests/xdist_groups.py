"""The ``xdist_group`` a test joins under pytest-xdist: the one its first
module-scoped fixture names (tests/conftest.py marks each test with it)."""
from __future__ import annotations


def module_fixture_group(item) -> str | None:
    """``path::fixture#index`` of the first module-scoped fixture ``item``
    uses (the index of its parameter, if it has any), else None. Every worker
    collects the same names: they are built from indices, never from values."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope == "module":
            callspec = getattr(item, "callspec", None)
            index = callspec.indices.get(name) if callspec is not None else None
            # no "]" in a group's name: loadgroup reads a name only after the test id's last "]"
            return f"{item.nodeid.split('::')[0]}::{name}" + ("" if index is None else f"#{index}")
    return None
