"""compare's estimate of its own time learns from what it measured here
(``compare/pace.py``): a workload compared once is estimated from its own
measured pace the next time, whatever the FLOP model guessed."""
import json
import time

import pytest

from blockc.compare import CompareOptions, plan_comparison, run_comparison
from blockc.compare import pace as pace_mod
from blockc.compare.pace import KEEP, Pace, load_pace, pace_key, record_pace
from blockc.compare.run import planned_seconds
from blockc.runtime.backend import register, unregister
from blockc.runtime.backends.reference import ReferenceBackend, ReferenceCompiled

SMALL = ["d_model=32", "heads=2", "layers=1", "vocab=61", "max_positions=64"]
PREPARE_S, RUN_S = 0.3, 0.01   # long enough that the model, which cannot know it, is off by 2x on any machine


class Slow(ReferenceBackend):
    """The reference interpreter, with a preparation and runs of known, long times:
    what the FLOP model cannot guess (a build, a per-run overhead)."""

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False):
        time.sleep(PREPARE_S)
        return SlowCompiled(graph, weights, float64=self.float64)


class SlowCompiled(ReferenceCompiled):
    def unchecked_runner(self, feeds, bindings):
        run = super().unchecked_runner(feeds, bindings)
        return lambda: (time.sleep(RUN_S), run())[1]


@pytest.fixture
def slow(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    register("slow", Slow)
    yield "slow"
    unregister("slow")


def _plan(backend):
    return plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=(backend,), peers=(), seqs=(8,),
                                          threads=1, kernels=False, warmup=1, min_repeats=4, min_time_s=0.0,
                                          blocks=2))


def test_a_second_comparison_is_estimated_from_the_first_ones_pace(slow):
    """The first estimate is the model's (it cannot know the sleeps: 0.3 s
    for each session's preparation, and 10 ms a run); the
    second is within 1.5x of what the first took, and the record says why.
    Run after many other tests, compare's own work around each session
    took a second more than its steps did: it is recorded too."""
    first = planned_seconds(_plan(slow))
    started = time.perf_counter()
    report = run_comparison(_plan(slow))
    took = time.perf_counter() - started
    assert first < took / 1.5, (first, took)        # the model alone was far off
    second = planned_seconds(_plan(slow))
    assert took / 1.5 <= second <= took * 1.5, (first, second, took)
    assert report["timing"]["planned_s"] == pytest.approx(first, rel=0.5)
    recorded = load_pace().ratios
    # no preparation shorter than the sleep: a ratio of at least 0.3 s over the model's 0.2 s and the weights
    assert any(k.startswith("slow/ | ") and v["prepare"] >= PREPARE_S / 0.21 for k, v in recorded.items())


def test_a_workload_not_seen_keeps_the_model(slow):
    """What a tiny model's runs took says nothing of a large one's (a
    reference run of tiny is all per-node overhead): only the same workload
    -- backend, variant, node count, FLOPs -- is scaled."""
    record_pace({pace_key("slow/", 7, 1e6): {"run": 1000.0, "prepare": 50.0}})
    pace = load_pace()
    assert pace.factor(pace_key("slow/", 7, 1e6), "run") == 1000.0
    assert pace.factor(pace_key("slow/", 7, 2e6), "run") == 1.0
    assert pace.factor(pace_key("reference/", 7, 2e6), "run") == pace_mod.FIRST_GUESS["reference"]["run"]


def test_the_record_keeps_the_fastest_pace_and_survives_damage(slow, tmp_path):
    """Other work on the machine only slows a step: the smallest ratio seen
    is kept. A damaged record is started again; malformed entries are
    dropped; the record keeps the most recent workloads only."""
    key = pace_key("slow/", 7, 1e6)
    record_pace({key: {"run": 2.0, "prepare": 3.0}})
    record_pace({key: {"run": 5.0, "prepare": 1.0}})
    assert load_pace().ratios[key] == {"run": 2.0, "prepare": 1.0}
    path = tmp_path / "cache" / "compare-pace.json"
    path.write_text("{not json")
    assert load_pace().ratios == {}
    record_pace({key: {"run": -1.0, "prepare": float("nan"), "other": 4.0}, "x": "y"})
    assert load_pace().ratios.get(key, {}) == {}
    record_pace({pace_key("slow/", n, 1.0): {"run": 1.0} for n in range(KEEP + 10)})
    kept = json.loads(path.read_text())
    (entry,) = kept.values()
    assert len(entry) == KEEP and pace_key("slow/", KEEP + 9, 1.0) in entry and pace_key("slow/", 0, 1.0) not in entry


def test_an_unwritable_cache_estimates_from_the_model(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "a-file"))   # no cache folder can be made there
    assert load_pace() == Pace({})
    assert record_pace({pace_key("x/", 1, 1.0): {"run": 2.0}}).ratios == {pace_key("x/", 1, 1.0): {"run": 2.0}}
