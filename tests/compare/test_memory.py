"""compare's grouping under the memory budget (``memory.Grouping``), fed
numbers: no sessions are made."""
from __future__ import annotations

from blockc.compare.memory import Grouping

GIB = 1 << 30


def _grouping(estimates, budget=8 * GIB, holding=0, one_run=0, builds=None) -> Grouping:
    return Grouping(estimates, builds or {}, budget, holding, one_run)


def _block(g: Grouping, first: bool, cuts=None) -> list[list[str]]:
    """The groups one block prepares, cutting where ``cuts`` (key -> growth
    measured before it) says the grouping must; each group closes."""
    out = []
    for keys in g.block(first=first):
        for i, key in enumerate(keys):
            if g.cut_here(keys, i, (cuts or {}).get(key, 0)):
                keys = g.cut(keys, i)
                break
        g.close(keys)
        out.append(keys)
    return out


def test_the_estimates_plan_the_first_blocks_groups():
    g = _grouping({"a": 3 * GIB, "b": 3 * GIB, "c": 3 * GIB, "huge": 9 * GIB})
    assert g.too_big == {"huge": 9 * GIB}
    assert _block(g, first=True) == [["a", "b"], ["c"]]
    assert g.largest() == 6 * GIB


def test_a_preparation_counts_beside_the_rest():
    g = _grouping({"a": 3 * GIB, "b": 3 * GIB}, builds={"b": 3 * GIB})
    assert _block(g, first=True) == [["a"], ["b"]]


def test_measured_growth_cuts_the_group_and_the_rest_come_next():
    """Growth that, with what the next session holds, passes the budget
    closes the group there; the rest form the next group, and later blocks
    start from the groups the first block timed."""
    g = _grouping({"a": GIB, "b": GIB, "c": GIB})
    assert _block(g, first=True, cuts={"b": 7 * GIB + 1}) == [["a"], ["b", "c"]]
    assert _block(g, first=False) == [["a"], ["b", "c"]]
    assert g.largest() == 2 * GIB


def test_the_first_session_of_a_group_is_never_cut():
    g = _grouping({"a": GIB})
    assert not g.cut_here(["a"], 0, 100 * GIB)


def test_no_cut_without_a_budget_or_a_measure():
    assert not _grouping({"a": GIB, "b": GIB}, budget=None).cut_here(["a", "b"], 1, 100 * GIB)
    assert not _grouping({"a": GIB, "b": GIB}).cut_here(["a", "b"], 1, None)


def test_the_budget_counts_what_compare_holds_beside_it():
    g = _grouping({"a": GIB, "b": GIB}, budget=2 * GIB, holding=5 * GIB)
    assert not g.cut_here(["a", "b"], 1, 6 * GIB)     # 6 + 1 held by b = 7 of 2 + 5
    assert g.cut_here(["a", "b"], 1, 6 * GIB + 1)


def test_each_sessions_check_runs_add_up():
    """The group's runs count the sum of what each session's check runs took
    beyond what stayed, ``one_run`` for one not yet checked."""
    g = _grouping({"a": 0, "b": 0, "c": 0}, one_run=GIB)
    keys = ["a", "b", "c"]
    assert g.transient(keys, 2) == 3 * GIB
    g.learned_runs("a", 3 * GIB, None, None)
    assert g.one_run == 3 * GIB and g.transient(keys, 1) == 6 * GIB   # b, unchecked, counts the most one took
    g.learned_runs("b", 2 * GIB, None, None)
    assert g.transient(keys, 1) == 5 * GIB
    assert g.planned(keys, 1, GIB) == 6 * GIB and g.planned(keys, 1, None) is None


def test_a_session_that_holds_more_than_its_estimate_counts_for_the_next():
    g = _grouping({"a": GIB, "b": GIB})
    g.learned_runs("a", 0, GIB, 4 * GIB)   # grew by 3 GiB, 2 more than its estimate
    assert g.one_over == 2 * GIB and g.holds("b") == 3 * GIB


def test_measured_preparation_and_timing_count_as_transients():
    g = _grouping({"a": 0, "b": 0})
    g.learned_build(2 * GIB)
    assert g.transient(["a", "b"], 1) == 2 * GIB
    g.learned_timing(5 * GIB)
    g.learned_timing(GIB)   # the most is kept
    assert g.transient(["a", "b"], 1) == 5 * GIB
    assert g.cut_here(["a", "b"], 1, 3 * GIB + 1) and not g.cut_here(["a", "b"], 1, 3 * GIB)
