"""Under pytest-xdist (.ci/run: ``-n auto --dist loadgroup``) the tests that
share a module-scoped fixture join one ``xdist_group``, so that one worker
makes the fixture once (tests/conftest.py, tests/xdist_groups.py)."""
from pathlib import Path

from xdist_groups import module_fixture_group

pytest_plugins = ["pytester"]

MODULE = """
import pytest

@pytest.fixture(scope="module")
def shared():
    return 1

@pytest.fixture(scope="module", params=["a", "b"])
def case(request):
    return request.param

@pytest.fixture
def own():
    return 2

def test_shared(shared, own):
    pass

def test_case(own, case):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_alone(own, n):
    pass
"""


def test_tests_sharing_a_module_fixture_join_its_group_and_each_case_its_own(pytester):
    groups = {item.name: module_fixture_group(item) for item in pytester.getitems(MODULE)}
    assert groups == {"test_shared": "test_tests_sharing_a_module_fixture_join_its_group_and_each_case_its_own.py::shared",
                      "test_case[a]": "test_tests_sharing_a_module_fixture_join_its_group_and_each_case_its_own.py::case#0",
                      "test_case[b]": "test_tests_sharing_a_module_fixture_join_its_group_and_each_case_its_own.py::case#1",
                      "test_alone[1]": None, "test_alone[2]": None}
    # xdist's loadgroup reads a group only after a test id's last "]"
    assert not any("]" in g for g in groups.values() if g)


def test_the_conftest_marks_each_test_with_its_group_and_keeps_a_group_given(pytester):
    """The suite's own conftest, run on a module whose last test has a group
    of its own, and whose last two are marked long: those are collected first."""
    here = Path(__file__).parent
    pytester.makeconftest((here / "conftest.py").read_text())
    pytester.makepyfile(xdist_groups=(here / "xdist_groups.py").read_text())
    pytester.makepyfile(test_mod=MODULE + """
@pytest.mark.xdist_group("mine")
def test_given(shared):
    pass

@pytest.mark.long
def test_long_a():
    pass

@pytest.mark.long
def test_long_b(shared):
    pass
""")
    items, calls = pytester.inline_genitems()
    marks = {item.name: [m.args[0] for m in item.iter_markers("xdist_group")] for item in items}
    assert marks["test_shared"] == ["test_mod.py::shared"] and marks["test_case[b]"] == ["test_mod.py::case#1"]
    assert marks["test_alone[1]"] == [] and marks["test_given"] == ["mine"]
    (hook,) = calls.getcalls("pytest_collection_modifyitems")   # its list, in the order the run takes it
    assert [item.name for item in hook.items][:3] == ["test_long_a", "test_long_b", "test_shared"]

