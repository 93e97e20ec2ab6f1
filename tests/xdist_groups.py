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


def long_tests_first(items: list) -> None:
    """Moves the tests marked ``long`` to the front, keeping every other
    order. loadgroup hands out the groups, largest first, then single tests
    in collection order: one of the longest tests collected late (the
    default ``blockc compare``, in tests/test_cli.py) started in the run's
    tail and ran there alone, one core idle."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)   # stable: False (marked) first
