"""The timing helpers benchmarks and `blockc compare` rest on: counts,
pairing, and the ratio interval."""
import math

import pytest

from blockc.runtime.timing import (Interleaved, event_clock, measure, measure_in_blocks, measure_interleaved,
                                   paired_speedup, ratio_interval)


def test_measure_repeats_until_count_and_time():
    calls = []
    t = measure(lambda: calls.append(1), warmup=2, min_repeats=7, min_time_s=0.0)
    assert t.repeats == 7 and len(calls) == 9          # warm-up runs are not timed
    assert t.min_s <= t.median_s <= t.max_s


def test_the_clock_is_a_parameter_of_the_one_loop():
    """A device's clock (events before and after each run) is the same loop
    with another clock: every run, warm-up included, sits between the two
    marks, and its time is what the device's clock says, not the host's."""
    events = []
    t = measure(lambda: events.append("run"), warmup=1, min_repeats=3, min_time_s=0.0,
                clock=event_clock(lambda: events.append("start"), lambda: events.append("stop") or 0.25))
    assert t.repeats == 3 and events == ["start", "run", "stop"] * 4
    assert t.samples == [0.25] * 3


def test_a_sample_is_n_back_to_back_runs_between_two_clock_reads():
    """Reading a device's clock costs host time (an event recorded and waited
    for): bracketing each run adds it to every sample; bracketing N runs
    spreads it over them."""
    events = []
    overhead, run = 8e-6, 1e-6

    def stop():
        n = events[::-1].index("start")   # runs since the last start
        events.append("stop")
        return overhead + n * run
    t = measure(lambda: events.append("run"), warmup=1, min_repeats=3, min_time_s=0.0, runs_per_sample=10,
                clock=event_clock(lambda: events.append("start"), stop))
    assert events == ["start", "run", "stop"] + (["start"] + ["run"] * 10 + ["stop"]) * 3
    assert t.repeats == 3 and t.samples == [pytest.approx(run + overhead / 10)] * 3
    with pytest.raises(ValueError, match="runs_per_sample"):
        measure(lambda: None, runs_per_sample=0)


def test_the_cuda_child_times_n_back_to_back_runs_per_sample():
    import numpy as np

    import blockc
    from blockc.codegen.cuda import toolchain
    from blockc.codegen.cuda.lower import generate
    from blockc.runtime.cuda_runner import emulated_library, run_model
    if toolchain.find_gxx() is None:
        pytest.skip("no g++")
    cm = generate(blockc.parse_graph("graph g(%x: f32[n]) {\n  %0:f32[n] = relu %x\n  return y=%0\n}\n"), {})
    r = run_model(cm, emulated_library(cm), {"x": np.ones(4, np.float32)}, emulated=True,
                  time={"warmup": 0, "min_repeats": 2, "min_time_s": 0.0, "runs_per_sample": 5})
    assert len(r.times) == 2 and r.counters["graph_launches"] == 10


def test_interleaved_rounds_alternate_contestants():
    order = []
    out = measure_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                              rounds=3, warmup=1, min_repeats=6, min_time_s=0.0)
    assert [len(x.round_medians) for x in out.values()] == [3, 3]
    # after one warm-up each, contestants take turns by rounds: a-slice, b-slice, a-slice ...
    slices = [k for i, k in enumerate(order[2:]) if i == 0 or order[2:][i - 1] != k]
    assert slices == ["a", "b"] * 3


def test_paired_speedup_is_median_of_round_ratios():
    base = Interleaved([], [2.0, 4.0, 3.0])
    other = Interleaved([], [1.0, 4.0, 1.0])
    assert paired_speedup(base, other) == 2.0          # ratios 2, 1, 3


def test_ratio_interval_brackets_the_geometric_mean():
    ratios = [0.98, 1.01, 1.03, 0.99, 1.02, 1.00, 1.04, 0.97]
    iv = ratio_interval(ratios)
    assert iv.ratio == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert iv.low < iv.ratio < iv.high and iv.n == 8
    assert iv.verdict == "no difference resolved"
    assert ratio_interval([1.05, 1.06, 1.07, 1.05, 1.06]).verdict == "faster"
    assert ratio_interval([0.9, 0.92, 0.91, 0.9, 0.93]).verdict == "slower"
    assert ratio_interval([0.9, 0.92]).verdict == "too few repetitions"


def test_ratio_interval_narrows_with_more_repetitions():
    few = ratio_interval([0.97, 1.03] * 3)
    many = ratio_interval([0.97, 1.03] * 30)
    assert many.high - many.low < few.high - few.low


def test_ratio_interval_edge_cases():
    one = ratio_interval([1.2])
    assert (one.ratio, one.low, one.high) == pytest.approx((1.2, 1.2, 1.2))
    with pytest.raises(ValueError):
        ratio_interval([])
    with pytest.raises(ValueError):
        ratio_interval([1.0, 0.0])


def test_blocks_prepare_fresh_contestants_and_close_them():
    made, closed = [], []

    def maker(name):
        def make():
            made.append(name)
            return (lambda: None), (lambda: closed.append(name))
        return make

    blocks = measure_in_blocks({n: maker(n) for n in "abc"}, blocks=4, rounds=2, warmup=0, min_time_s=0.0)
    assert len(blocks) == 4 and all(set(b) == set("abc") for b in blocks)
    assert all(len(b[n].round_medians) == 2 for b in blocks for n in "abc")
    assert sorted(made) == sorted(closed) == sorted("abc" * 4)
    orders = {tuple(made[i:i + 3]) for i in range(0, 12, 3)}
    assert len(orders) > 1                                  # creation order is shuffled between blocks


def test_blocks_run_a_fixed_count_without_a_minimum_time():
    """Processes that must run in step (the ranks of a split model) each run
    the same count, whatever the clock says: ``min_repeats`` a block, spread
    over the rounds, with warm-up and one untimed run before each slice."""
    runs = {"a": 0, "b": 0}

    def maker(name):
        def make():
            def run():
                runs[name] += 1
            return run, (lambda: None)
        return make

    blocks = measure_in_blocks({n: maker(n) for n in runs}, blocks=3, rounds=2, warmup=1, min_time_s=0.0,
                               min_repeats=6)
    assert all(len(b[n].samples) == 6 for b in blocks for n in runs)
    assert runs == {"a": 3 * (1 + 2 * (1 + 3)), "b": 3 * (1 + 2 * (1 + 3))}


def test_blocks_close_what_was_made_when_a_maker_fails():
    made, closed = [], []

    def ok():
        made.append("ok")
        return (lambda: None), (lambda: closed.append("ok"))

    def bad():
        raise RuntimeError("no session")

    for seed in range(4):   # "ok" is made before "bad" in some orders and not in others
        with pytest.raises(RuntimeError):
            measure_in_blocks({"ok": ok, "bad": bad}, blocks=3, seed=seed)
    assert made and closed == made                          # everything prepared was closed
