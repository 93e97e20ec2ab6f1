"""blockc compare: every form on every available backend beside the peers,
validated against the JSON schema; skipped backends keep their reason; user
mistakes fail before anything is measured."""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import time
from importlib import resources

import numpy as np
import pytest

from blockc.cli import main
from blockc.compare import CompareOptions, plan_comparison, planned_steps, run_comparison
from blockc.compare import memory
from blockc.progress import MEASURING
from blockc.errors import BlockcError
from blockc.files import parse_size

SMALL = ["d_model=32", "heads=2", "layers=1", "vocab=61", "max_positions=64"]
QUICK = dict(warmup=1, min_repeats=2, min_time_s=0.0, blocks=2)


def _schema() -> dict:
    return json.loads(resources.files("blockc.compare").joinpath("schema.json").read_text())


def _validate(doc) -> None:
    """``doc`` against compare's JSON schema (skips without jsonschema)."""
    pytest.importorskip("jsonschema").validate(doc, _schema())


@pytest.fixture(scope="module")
def report():
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("reference", "ort-cpu", "cuda"),
                                          peers=("ort-optimizer",), batches=(1, 2), seqs=(8,), threads=1,
                                          **QUICK))
    steps = Steps()
    steps.total = planned_steps(plan)
    report = run_comparison(plan, steps)
    report["_steps"] = (len(steps), planned_steps(plan))
    return report


class Steps(list):
    """A ``blockc.progress`` callback that keeps each step begun (its detail)."""

    def __call__(self, stage, done, total, detail=""):
        assert stage == MEASURING and 0 <= done <= total == self.total
        if detail.startswith("block "):   # a step begun; "timing ..." notes come within one
            self.append((done, detail))


def test_report_follows_the_schema(report):
    doc = {k: v for k, v in report.items() if not k.startswith("_")}
    _validate(json.loads(json.dumps(doc)))


def test_every_form_backend_level_and_shape_is_measured(report):
    got = {(r["backend"], r["variant"], r["form"], r["shape"]["batch"]) for r in report["results"] if not r["peer"]}
    want = {("reference", "", f, b) for f in ("decomposed", "standard", "fused") for b in (1, 2)}
    want |= {("ort-cpu", lvl, f, b) for lvl in ("basic", "all") for f in ("decomposed", "standard", "fused")
             for b in (1, 2)}
    assert got == want
    assert all(r["status"] == "ok" for r in report["results"]), [r["error"] for r in report["results"]]
    assert report["_steps"][0] == report["_steps"][1]   # the progress bar's total was right


def test_numbers_hang_together(report):
    for r in report["results"]:
        lat = r["latency_ms"]
        assert lat["min"] <= lat["median"] <= lat["max"] and lat["repeats"] >= 2 * report["timing"]["blocks"]
        assert len(lat["round_medians"]) == report["timing"]["rounds"] * report["timing"]["blocks"]
        assert r["max_abs_error"] < 1e-4   # float32 against the float64 reference
        if not r["peer"]:   # "vs standard" is the ratio of the two medians printed beside it
            standard = next(s for s in report["results"] if s["shape"] == r["shape"] and s["form"] == "standard"
                            and (s["backend"], s["variant"]) == (r["backend"], r["variant"]))
            assert r["speedup_vs_standard"] == pytest.approx(standard["latency_ms"]["median"] / lat["median"])
        if not r["peer"]:
            assert r["bandwidth_gbps"] == pytest.approx(r["bytes_modelled"] / (lat["median"] / 1e3) / 1e9)
            assert r["fraction_of_peak"] is None   # a CPU's peak is unknown unless given
    fused = [r for r in report["results"] if r["form"] == "fused"]
    standard = [r for r in report["results"] if r["form"] == "standard"]
    assert all(f["ir_nodes"] < s["ir_nodes"] for f, s in zip(fused, standard))
    assert all(f["bytes_modelled"] < s["bytes_modelled"] for f, s in zip(fused, standard))
    assert report["forms"]["fused"]["ops"].get("add_layernorm", 0) >= 1


def test_missing_backends_are_listed_with_the_reason(report):
    cuda = next(b for b in report["backends"] if b["name"] == "cuda")
    if not cuda["available"]:
        assert cuda["reason"]
        assert not any(r["backend"] == "cuda" for r in report["results"])


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++: the CUDA emulator needs one")
def test_generated_cuda_is_timed_on_cuda_events_and_the_report_says_so():
    """compare times a CUDA backend in its child process, on CUDA events
    (emulated here: host time between the records), and records that clock."""
    # tiny at 1 layer: the graph runtime/test_limits.py and test_backend.py build for cuda-emu, so the
    # build cache compiles its fused form once for the suite (SMALL's would be a g++ build of its own)
    plan = plan_comparison(CompareOptions(model="tiny", settings=["layers=1"], backends=("reference", "cuda-emu"),
                                          peers=(), seqs=(8,), threads=1, kernels=False, **QUICK))
    report = run_comparison(plan)
    assert "CUDA events around each run, emulated" in report["timing"]["clock"]
    rows = [r for r in report["results"] if r["backend"] == "cuda-emu"]
    assert rows and all(r["status"] == "ok" and r["latency_ms"]["min"] > 0 for r in rows), rows


def test_ratios_pair_fused_with_standard_and_the_peer(report):
    pairs = {(r["a"], r["b"], r["shape"]["batch"]) for r in report["ratios"]}
    assert ("ort-cpu/basic/fused", "ort-cpu/basic/standard", 1) in pairs
    assert ("ort-cpu/all/fused", "ort-cpu/all/ort-optimizer", 2) in pairs
    rows = {(r["backend"] + "/" + r["variant"] + "/" + r["form"], r["shape"]["batch"]): r for r in report["results"]}
    rounds, blocks = report["timing"]["rounds"], report["timing"]["blocks"]
    for r in report["ratios"]:
        a, b = rows[(r["a"], r["shape"]["batch"])], rows[(r["b"], r["shape"]["batch"])]
        assert r["paired"] and r["blocks"] == blocks
        per_block = []
        for i in range(blocks):   # each block's ratio is paired round by round; the blocks' geometric mean
            ra, rb = (x["latency_ms"]["round_medians"][i * rounds:(i + 1) * rounds] for x in (a, b))
            per_block.append(statistics.median(y / x for x, y in zip(ra, rb)))
        assert r["speedup"] == pytest.approx(statistics.geometric_mean(per_block))
        assert r["low"] <= r["speedup"] <= r["high"]


def test_fused_kernels_are_timed_alone(report):
    ops = {k["op"] for k in report["kernels"] if k["status"] == "ok"}
    assert {"add_layernorm", "masked_softmax", "qkv_attention"} <= ops
    for k in report["kernels"]:
        assert k["bytes_modelled"] > 0 and k["flops_modelled"] > 0 and k["median_ms"] > 0
        assert k["max_abs_error"] < 1e-4


def test_peak_bandwidth_given_makes_fractions():
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("ort-cpu",), peers=(),
                                          seqs=(8,), threads=1, peak_gbps=10.0, kernels=False, **QUICK))
    report = run_comparison(plan)
    assert report["machine"]["peak_gbps"] == 10.0
    for r in report["results"]:
        assert r["fraction_of_peak"] == pytest.approx(r["bandwidth_gbps"] / 10.0)


@pytest.mark.parametrize("argv, message", [
    (["--backends", "ort-cpu,tpu"], "unknown backend 'tpu'"),
    (["--peers", "tvm"], "unknown peer 'tvm'"),
    (["--backends", "ort-cpu,ort-cpu"], "--backends names ort-cpu more than once: each is measured once"),
    (["--backends", "reference,ort-cpu,reference"], "--backends names reference more than once"),
    (["--backends", "ort,ort-cpu"], "--backends names ort and ort-cpu, which are one backend (ONNX Runtime (cpu, "
                                    "fused ops as auto)): each is measured once, name it once"),   # ort: cpu by default
    (["--peers", "torch-eager,torch-eager"], "--peers names torch-eager more than once"),
    (["--backends", ""], "no backend to compare: --backends needs at least one of reference, ort"),
    (["--backends", "none"], "no backend to compare"),
    (["tiny", "--seq", "2000"], "seq=2000 exceeds tiny's maximum of 128"),   # its position table's rows
    (["--batch", "1,x"], "malformed --batch"),
    (["--batch", "0"], "--batch needs positive integers"),
    (["--set", "heads=5"], "not divisible"),
    (["--json", "/nonexistent-dir/r.json"], "does not exist"),
    (["--report", "/proc/version/report"], "cannot write the report"),
])
def test_bad_input_fails_before_measuring(argv, message, capsys):
    t0 = time.perf_counter()
    assert main(["compare", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert time.perf_counter() - t0 < 20   # nothing was measured


@pytest.mark.parametrize("backends, peers, message", [
    (("ort-cpu", "ort-cpu"), (), "--backends names ort-cpu more than once"),   # each row printed twice
    (("ort", "ort-cpu"), (), "--backends names ort and ort-cpu, which are one backend"),   # ort: cpu by default
    ((), ("ort-optimizer",), "no backend to compare"),   # the peers alone: no verdict
    (("reference",), ("torch-eager", "torch-eager"), "--peers names torch-eager more than once"),
])
def test_a_list_naming_a_backend_twice_or_none_is_refused_when_planned(backends, peers, message):
    with pytest.raises(BlockcError, match=message):
        plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=backends, peers=peers, **QUICK))


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One ``blockc compare`` on the command line, asked for both its JSON and
    its HTML report (each test below checks one of them): its exit code, its
    printed table, and the folder it wrote to."""
    import contextlib
    import io
    folder = tmp_path_factory.mktemp("cli")
    argv = ["compare", "tiny", *sum((["--set", s] for s in SMALL), []), "--seq", "8", "--backends",
            "ort-cpu,ort-cuda", "--peers", "none", "--repeats", "2", "--min-time", "0", "--warmup", "1",
            "--blocks", "2", "--json", str(folder / "r.json"), "--report", str(folder / "rep"), "--no-progress"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    return code, printed.getvalue(), folder


def test_cli_prints_the_table_and_writes_json(cli_run):
    code, text, folder = cli_run
    assert code == 0
    assert "ort-cpu" in text and "fused" in text and "vs standard" in text
    assert "ort-cuda: skipped" in text or "ort-cuda: onnxruntime" in text
    doc = json.loads((folder / "r.json").read_text())
    _validate(doc)
    assert doc["command"].startswith("blockc compare tiny")


def test_cli_writes_the_html_report(cli_run):
    code, _, folder = cli_run
    assert code == 0
    page = (folder / "rep" / "index.html").read_text()
    assert "tiny" in page and "ort-cpu" in page and page.count("data:image/png;base64,") >= 3


def test_threads_not_given_are_blockc_threads_else_every_core(monkeypatch):
    """compare names one count for every contestant (and records it): one not
    given is $BLOCKC_THREADS where set (a process sharing its cores: a CI
    worker), else the CPU count; --threads wins over both."""
    from blockc.cli import build_parser
    from blockc.cli.compare import compare_options
    from blockc.runtime.threads import THREADS_VARIABLE

    def threads(*argv):
        args = build_parser().parse_args(["compare", "tiny", *argv])
        args.argv = ["compare", "tiny", *argv]
        return compare_options(args).threads
    monkeypatch.setenv(THREADS_VARIABLE, "3")
    assert threads() == CompareOptions().threads == 3 and threads("--threads", "2") == 2
    monkeypatch.delenv(THREADS_VARIABLE)
    assert threads() == CompareOptions().threads == (os.cpu_count() or 1)


def _plan(**kw):
    return plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=kw.pop("backends", ("ort-cpu",)),
                                          peers=kw.pop("peers", ()), seqs=(8,), threads=1, kernels=False, **{**QUICK, **kw}))


def test_a_small_budget_times_in_groups():
    """With room for one session at a time beside what compare holds, each
    is prepared, timed and closed alone; ratios across groups say they are
    not paired, and every row still ran."""
    probe = _plan()
    one = max(memory.session_bytes(b, probe.graphs["fused"], probe.shapes[0])
              + memory.build_bytes(b, probe.graphs["fused"], probe.shapes[0]) for b, _, _ in probe.backends)
    plan = _plan(max_memory=probe.holding + int(one * 1.5))
    report = run_comparison(plan)
    assert all(r["status"] == "ok" and r["latency_ms"] for r in report["results"])
    assert report["ratios"] and not any(r["paired"] for r in report["ratios"])
    assert report["memory"]["largest_group_bytes"] <= one * 1.5


def test_a_session_over_the_budget_is_skipped_with_the_reason(capsys):
    plan = _plan(max_memory=_plan().holding + 1000)
    report = run_comparison(plan)
    assert {r["status"] for r in report["results"]} == {"skipped"}
    assert all("that the budget of" in r["error"] and "--max-memory" in r["error"] for r in report["results"])
    assert main(["compare", "tiny", *sum((["--set", s] for s in SMALL), []), "--seq", "8", "--backends", "ort-cpu",
                 "--peers", "none", "--no-kernels", "--no-progress", "--max-memory",
                 str(plan.budget + plan.holding)]) == 0
    out = capsys.readouterr().out
    assert "over the budget, not run: ort-cpu/basic/decomposed" in out and "skipped, see below" in out


def test_more_memory_than_estimated_cuts_the_group(monkeypatch):
    """A session that holds more than its estimate (measured as it is
    prepared) closes its group early: the rest are timed in a later group."""
    readings = iter(range(0, 10 ** 15, 1 << 40))   # every reading 1 TiB above the last
    monkeypatch.setattr(memory, "resident_bytes", lambda: next(readings))
    plan = _plan(max_memory=8 << 30)
    report = run_comparison(plan)
    assert all(r["status"] == "ok" for r in report["results"])
    assert not any(r["paired"] for r in report["ratios"])   # each session was timed alone


def test_memory_the_process_kept_cuts_the_group(monkeypatch):
    """The cut measures the process's whole growth since compare began, not
    each session's own: memory a closed group's runtime kept (glibc's arenas)
    counts. Here no session grows the process at all, but it already holds
    more than the budget once compare has started."""
    readings = iter([0] + [9 << 30] * 10 ** 6)   # at the start, then every later reading
    monkeypatch.setattr(memory, "resident_bytes", lambda: next(readings))
    plan = _plan(max_memory=8 << 30)
    report = run_comparison(plan)
    assert all(r["status"] == "ok" for r in report["results"])
    assert not any(r["paired"] for r in report["ratios"])


def test_what_a_run_was_measured_to_take_cuts_the_group(monkeypatch):
    """A run that takes more than its estimate (an interpreter's temporaries,
    read from the peak during the first block's check run) counts for the
    sessions that join the group after it: here nothing stays resident, but
    each run peaks 9 GiB above it."""
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    monkeypatch.setattr(memory, "peak_resident", lambda: 9 << 30)
    plan = _plan(max_memory=8 << 30)
    report = run_comparison(plan)
    assert all(r["status"] == "ok" for r in report["results"])
    assert not any(r["paired"] for r in report["ratios"])


def test_what_preparing_a_session_is_estimated_to_take_cuts_the_group(monkeypatch):
    """A session is made from more than it keeps (ONNX Runtime's from a
    serialized model): that transient, estimated from the backend's
    ``build_copies``, counts before a session joins a group. Here nothing is
    measured to grow, and each session's preparation fits the budget beside
    itself, but not beside another session."""
    from blockc.report.footprint import footprint
    from blockc.runtime.backends.ort import OrtBackend
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    monkeypatch.setattr(memory, "peak_resident", lambda: 0)
    plan = _plan(max_memory=8 << 30)
    shape = plan.shapes[0]
    largest = max(memory.session_bytes(b, g, shape) for b, _, _ in plan.backends for g in plan.graphs.values())
    monkeypatch.setattr(OrtBackend, "build_copies",
                        (plan.budget - largest) / max(footprint(g, shape).weights for g in plan.graphs.values()))
    report = run_comparison(plan)
    assert all(r["status"] == "ok" for r in report["results"])
    assert not any(r["paired"] for r in report["ratios"])


def test_what_preparing_a_session_was_measured_to_take_cuts_the_group(monkeypatch):
    """And as measured: where making a session peaked (here 9 GiB above what
    it kept; its check run took nothing), later sessions count that much."""
    from blockc.runtime.backends.ort import OrtBackend
    peaks = []
    real = OrtBackend.compile

    def compile(self, *args, **kw):
        peaks.append(9 << 30)   # read by the first peak reading after it: the preparation's
        return real(self, *args, **kw)
    monkeypatch.setattr(OrtBackend, "compile", compile)
    monkeypatch.setattr(OrtBackend, "build_copies", 0.0)
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    monkeypatch.setattr(memory, "peak_resident", lambda: peaks.pop() if peaks else 0)
    report = run_comparison(_plan(max_memory=8 << 30, peers=()))
    assert all(r["status"] == "ok" for r in report["results"])
    assert not any(r["paired"] for r in report["ratios"])
    assert report["memory"]["peak_at"].startswith("preparing ort-cpu/")


def test_what_timing_a_group_was_measured_to_take_cuts_later_groups(monkeypatch):
    """Timing can take more than a group's sessions held when it began
    (ONNX Runtime's arenas grow on later runs; glibc keeps freed
    temporaries): the most a group's timing took counts for every later
    cut, in every block. Here only timing peaks (9 GiB over what was held),
    after the first group: the groups after it are cut to one session."""
    import blockc.compare.run as compare_run
    from blockc.runtime.backends.ort import OrtBackend
    peaks = []
    real = compare_run._time_group

    def time_group(*args, **kw):
        out = real(*args, **kw)
        peaks.append(9 << 30)   # read by the peak reading that ends the timing stretch
        return out
    monkeypatch.setattr(compare_run, "_time_group", time_group)
    monkeypatch.setattr(OrtBackend, "build_copies", 0.0)
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    monkeypatch.setattr(memory, "peak_resident", lambda: peaks.pop() if peaks else 0)
    report = run_comparison(_plan(max_memory=8 << 30))
    assert all(r["status"] == "ok" for r in report["results"])
    assert not any(r["paired"] for r in report["ratios"])
    assert report["memory"]["peak_at"].startswith("timing ")


def test_each_sessions_run_counts_in_the_groups_cut(monkeypatch):
    """Timing a group runs each of its sessions, and each runtime's
    allocator may keep its run's temporaries until the group closes, so the
    cut counts the sum of what the sessions' check runs took, not the most
    one took. Here each check run peaks 3 GiB over what stays, with a budget
    of 8 GiB: at most two sessions a group (one run's 3 GiB would have let
    every session into one group, and the timing 9 GiB and more)."""
    import blockc.compare.run as compare_run
    from blockc.runtime.backends.ort import OrtBackend
    ending, sizes = {"name": ""}, []
    real_stretch, real_time = memory.Watch.stretch, compare_run._time_group

    def stretch(self, name):
        ending["name"] = self._name   # the stretch this call ends
        return real_stretch(self, name)

    def time_group(ready, *args, **kw):
        sizes.append(len(ready))
        return real_time(ready, *args, **kw)
    monkeypatch.setattr(memory.Watch, "stretch", stretch)
    monkeypatch.setattr(compare_run, "_time_group", time_group)
    monkeypatch.setattr(OrtBackend, "build_copies", 0.0)
    monkeypatch.setattr(memory, "resident_bytes", lambda: 0)
    monkeypatch.setattr(memory, "peak_resident", lambda: (3 << 30) if ending["name"].startswith("checking") else 0)
    report = run_comparison(_plan(max_memory=8 << 30))
    assert all(r["status"] == "ok" for r in report["results"])
    assert max(sizes) == 2, sizes
    # the report lists each group timed, with what its cut planned for (a run's 3 GiB per session)
    groups = report["memory"]["groups"]
    assert [len(g["sessions"]) for g in groups] == sizes
    assert all(g["planned_bytes"] >= (3 << 30) * len(g["sessions"]) for g in groups)


def test_what_a_sessions_runs_keep_is_seen_before_the_next_session_joins(monkeypatch):
    """ONNX Runtime's arena grows on a session's second run (the memory
    pattern its first run recorded is allocated beside the first run's
    blocks) and keeps that until the session closes. The first block runs
    each session twice before the next may join, and counts the most a
    checked session came to hold beyond its estimate for every later one.
    Here each session's second run keeps 3 GiB, with a budget of 8 GiB:
    groups of two, and the process never passes the budget (with one run
    checked, or with the runs' keep not counted for the next session, a
    third session joins and the group grows to 9 GiB)."""
    from blockc.runtime.ort_runner import OrtSession
    state = {"held": 0, "peak": 0}
    kept: dict[int, int] = {}
    real_run, real_close = OrtSession.run_unchecked, OrtSession.close

    def run_unchecked(self, feeds):
        kept[id(self)] = kept.get(id(self), -1) + 1   # -1 after the first run, 0 after the second
        if kept[id(self)] == 0:
            kept[id(self)] = 3 << 30
            state["held"] += 3 << 30
            state["peak"] = max(state["peak"], state["held"])
        return real_run(self, feeds)

    def close(self):
        state["held"] -= max(0, kept.pop(id(self), 0))
        return real_close(self)

    def reset_peak():
        state["peak"] = state["held"]
    monkeypatch.setattr(OrtSession, "run_unchecked", run_unchecked)
    monkeypatch.setattr(OrtSession, "close", close)
    monkeypatch.setattr(memory, "resident_bytes", lambda: state["held"])
    monkeypatch.setattr(memory, "reset_peak", reset_peak)
    monkeypatch.setattr(memory, "peak_resident", lambda: state["peak"])
    report = run_comparison(_plan(max_memory=8 << 30))
    assert all(r["status"] == "ok" for r in report["results"])
    assert max(len(g["sessions"]) for g in report["memory"]["groups"]) == 2
    assert report["memory"]["peak_growth_bytes"] <= report["memory"]["budget_bytes"]


def test_a_process_that_shrinks_below_its_start_reports_no_negative_growth(monkeypatch):
    """Memory freed after compare began (a closed group's, the oracle's) can
    take the process below where it started: every growth the report gives
    (each group's planned and peak, the run's peak) is then 0, never below,
    as the schema says."""
    readings = iter([6 << 30] + [1 << 30] * 10 ** 6)   # at the start, then 5 GiB less at every reading
    monkeypatch.setattr(memory, "resident_bytes", lambda: next(readings))
    monkeypatch.setattr(memory, "peak_resident", lambda: 1 << 30)
    report = run_comparison(_plan(max_memory=8 << 30))
    groups = report["memory"]["groups"]
    assert groups and all(g["planned_bytes"] == 0 and g["peak_bytes"] == 0 for g in groups)
    _validate(json.loads(json.dumps({k: v for k, v in report.items() if not k.startswith("_")})))


def test_closed_sessions_caught_in_reference_cycles_are_freed_between_groups():
    """A torch session's fx module (its parameters, a folded transposed
    embedding among them) sits in reference cycles, which Python frees only
    when its cycle collector runs -- by counts of objects made, not bytes.
    Compare collects after each group, so no closed group's module outlives
    it even where the collector would not have run (here: switched off)."""
    pytest.importorskip("torch")
    import gc
    from torch.fx import GraphModule

    def modules():
        return sum(isinstance(o, GraphModule) for o in gc.get_objects())
    plan = _plan(backends=("reference",), peers=("torch-eager",))
    gc.collect()
    before = modules()
    gc.disable()
    try:
        report = run_comparison(plan)
        left = modules()
    finally:
        gc.enable()
    assert [r["status"] for r in report["results"] if r["peer"]] == ["ok"]
    assert left == before


def test_the_collections_between_groups_walk_only_what_compare_made(monkeypatch):
    """Collecting after each group walks every object Python tracks unless
    what existed before compare (torch's, ONNX Runtime's modules: some
    300,000 objects, 0.14 CPU-s a collection) is frozen for the while: each
    collection then sees only what compare made, and afterwards everything
    is as before, a caller's own freeze untouched."""
    import gc
    frozen_while_collecting = []
    real = memory.release_freed
    monkeypatch.setattr(memory, "release_freed", lambda: frozen_while_collecting.append(gc.get_freeze_count())
                        or real())
    plan = _plan(backends=("reference",), blocks=1)
    before = gc.get_freeze_count()
    report = run_comparison(plan)
    assert all(r["status"] == "ok" for r in report["results"])
    assert frozen_while_collecting and all(n > before for n in frozen_while_collecting)
    assert gc.get_freeze_count() == before == 0
    gc.freeze()   # a caller that froze its own objects keeps them frozen
    try:
        mine = gc.get_freeze_count()
        run_comparison(plan)
        assert 0 < gc.get_freeze_count() <= mine   # only those that died have left (unfrozen: none there)
    finally:
        gc.unfreeze()


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="no resettable peak here (Linux only)")
def test_the_peak_reported_is_the_comparisons_own():
    """The report's peak growth is measured from compare's start, not the
    process's lifetime high-water mark (a Python caller may have held more
    before)."""
    big = np.ones(64 << 20)   # 512 MiB, touched
    del big
    report = run_comparison(_plan())
    assert 0 < report["memory"]["peak_growth_bytes"] < 256 << 20


def test_the_budget_that_holds_not_even_the_reference_is_refused():
    with pytest.raises(BlockcError, match="float64 reference .* need about .* more than the budget"):
        _plan(max_memory=1000)


@pytest.mark.parametrize("text, size", [("8G", 8 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("4096", 4096)])
def test_max_memory_sizes(text, size):
    assert parse_size(text, "--max-memory") == size


@pytest.mark.parametrize("text", ["", "8X", "-1G", "0"])
def test_bad_max_memory_is_refused(text):
    with pytest.raises(BlockcError, match="--max-memory"):
        parse_size(text, "--max-memory")


def test_blocks_prepare_fresh_sessions(monkeypatch):
    """Each block prepares every contestant anew (an A/A control beside each
    standard form), and the progress bar's count is right."""
    from blockc.runtime.backends.ort import OrtBackend
    made = []
    real = OrtBackend.compile
    monkeypatch.setattr(OrtBackend, "compile", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    plan = _plan(blocks=3)
    steps = Steps()
    steps.total = planned_steps(plan)
    report = run_comparison(plan, steps)
    assert len(steps) == planned_steps(plan) == len(made) == 3 * (6 + 2)   # 2 levels x (3 forms + A/A)
    assert report["timing"]["blocks"] == 3
    assert not any(r["form"].endswith("(A/A)") for r in report["results"])   # the control has no row


def test_the_verdict_names_fusion_and_its_control():
    report = run_comparison(_plan(blocks=5))
    assert {(v["backend"], v["variant"]) for v in report["verdicts"]} == {("ort-cpu", "basic"), ("ort-cpu", "all")}
    for v in report["verdicts"]:
        assert v["fusion"]["blocks"] == v["aa"]["blocks"] == 5
        assert v["fusion"]["low"] <= v["fusion"]["speedup"] <= v["fusion"]["high"]
        assert v["max_abs_error"]["fused"] < 1e-4
        f, aa = v["fusion"], v["aa"]
        assert v["resolved"] == (f["verdict"] in ("faster", "slower") and aa["verdict"] == "no difference resolved"
                                 and (f["low"] > aa["high"] or f["high"] < aa["low"]))


def _verdict(fusion, aa, blocks=5, aa_spread=0.03):
    def iv(verdict, x, spread=0.03):
        return {"speedup": x, "low": x * (1 - spread), "high": x * (1 + spread), "blocks": blocks,
                "verdict": verdict, "paired": True}
    return {"fusion": iv(fusion, 1.2), "aa": iv(aa, 1.0, aa_spread),
            "resolved": fusion in ("faster", "slower") and aa == "no difference resolved" and aa_spread < 0.1}


@pytest.mark.parametrize("fusion, aa, blocks, words", [
    ("faster", "no difference resolved", 5, "faster, resolved"),
    ("slower", "no difference resolved", 5, "slower, resolved"),
    ("faster", "faster", 5, "not resolved: the A/A control differs too"),
    ("no difference resolved", "no difference resolved", 5, "no difference resolved"),
    ("too few repetitions", "too few repetitions", 3, "too few blocks to tell (3; --blocks 5 or more)"),
])
def test_verdict_words(fusion, aa, blocks, words):
    from blockc.compare.table import verdict_words
    assert verdict_words(_verdict(fusion, aa, blocks)).startswith(words)


def test_an_effect_within_the_controls_spread_is_not_resolved():
    """Fusion 1.20x [1.16-1.24] beside an A/A of 1.00x [0.80-1.20]: both
    intervals taken alone look fine, but the control's spread reaches the
    effect, so the verdict does not call it."""
    import numpy as np

    from blockc.compare.results import Row, verdicts
    from blockc.compare.table import verdict_words
    from blockc.runtime.timing import Interleaved

    def blocks(ratios):   # one block per ratio: the standard at 1 s, the other at 1/ratio
        return [Interleaved([1 / r], [1 / r], group=i) for i, r in enumerate(ratios)]
    rng = np.random.default_rng(0)
    times = {"x//standard": blocks([1.0] * 8), "x//fused": blocks(1.2 * np.exp(rng.normal(0, 0.01, 8))),
             "x//standard (A/A)": blocks([0.7, 1.45, 0.75, 1.4, 1.0, 0.8, 1.35, 1.1])}
    contestants = [type("C", (), {"key": k, "row": Row("x", "", k.split("/")[2], False, max_abs_error=0.0)})()
                   for k in times]
    (v,) = verdicts(contestants, times, {"batch": 1})
    assert v["fusion"]["verdict"] == "faster" and v["aa"]["verdict"] == "no difference resolved"
    assert v["aa"]["high"] > v["fusion"]["low"] and not v["resolved"]
    assert verdict_words(v) == "not resolved: within the A/A control's spread"


@pytest.mark.parametrize("width", [80, 100, 200])
def test_the_table_fits_the_terminal(report, width):
    """Every line fits the console's width and no figure is cut short; below
    140 columns each shape's table is split in two."""
    import io

    from rich.console import Console

    from blockc.compare.table import print_report
    out = io.StringIO()
    print_report(report, Console(file=out, width=width, markup=False))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    assert ("time and error" in text) == (width < 140)
    median = f"{report['results'][0]['latency_ms']['median']:.3f}"
    assert median in text.replace("\n", "")


def test_the_plan_is_said_before_measuring():
    from blockc.compare.run import describe_plan
    lines = describe_plan(_plan(max_memory=8 << 30))
    assert lines[0].startswith("measuring 6 contestants and 2 A/A control(s) at 1 shape(s)")
    assert "the budget is 8 GiB" in lines[1] and lines[-1].startswith("time: about ")
    # the figure says what it is: a quiet machine's, from which rate
    assert re.search(r" on a quiet machine \((a first guess from FLOPs and bytes: no comparison has been recorded "
                     r"here yet|each step's model scaled by what earlier comparisons measured here); longer where "
                     r"other work shares the cores\)$", lines[-1]), lines[-1]


def test_readme_compare_examples_fit_the_memory_budget(tmp_path, monkeypatch):
    """Each `blockc compare` line in the README, planned here: no contestant
    is over the default budget (half the memory available; taken as 45% of
    this machine's memory, what an idle one has, so that other work running
    beside the test does not change its answer), so none is skipped, and the
    largest group with the reference fits within it. A user's ONNX file the
    README names stands for the user's: a small GPT-2 block exported here."""
    import pathlib
    import shlex

    from blockc.cli import build_parser
    from blockc.cli.compare import compare_options
    from blockc.compare.machine import memory_gib
    from blockc.compare.run import _contestants
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    lines = [line.split("#")[0].strip() for line in readme.splitlines() if line.strip().startswith("blockc compare")]
    assert len(lines) >= 4
    monkeypatch.chdir(tmp_path)
    for line in lines:
        argv = shlex.split(line)[1:]
        model = argv[1] if len(argv) > 1 else ""   # argv[0] is "compare"
        if model.endswith(".onnx") and not os.path.exists(model):
            assert main(["export", "gpt2-block", "--set", "d_model=64", "--set", "heads=4", "-o", model]) == 0
        args = build_parser().parse_args(argv)
        args.argv = argv
        options = compare_options(args)
        options.max_memory = int(0.45 * memory_gib() * (1 << 30))
        plan = plan_comparison(options)
        for shape in plan.shapes:
            cs = _contestants(plan, shape)
            groups, too_big = memory.plan_groups({c.key: c.estimate for c in cs}, plan.budget,
                                                 {c.key: c.build for c in cs})
            assert not too_big, line
            assert max(g.estimate for g in groups) <= plan.budget, line


def test_a_failing_row_prints_its_whole_reason(capsys):
    from rich.console import Console

    from blockc.compare.table import print_report
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("ort-cpu",), peers=(),
                                          seqs=(8,), threads=1, kernels=False, **QUICK))
    report = run_comparison(plan)
    report["results"][1].update(status="error", error="onnxruntime said no: " + "x" * 150, latency_ms=None)
    print_report(report, Console(width=200, markup=False))
    out = capsys.readouterr().out
    assert "error, see below" in out and "ort-cpu/basic/standard: error -- onnxruntime said no:" in out
    assert "x" * 150 in out.replace("\n", "")   # the whole reason, however the console folds it


def test_nothing_available_is_an_error_not_an_empty_table(capsys):
    from blockc.runtime.cuda_runner import cuda_available
    if cuda_available()[0]:
        pytest.skip("a GPU is here: ort-cuda can run")
    assert main(["compare", "tiny", "--backends", "ort-cuda,cuda", "--peers", "none", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "nothing to compare" in err and "ort-cuda:" in err and "cuda:" in err


def test_the_ort_optimizer_peer_runs_on_rmsnorm_models():
    """onnxruntime's optimizer crashes on blockc's Mul(x, x) RMSNorm with its
    norm fusions on; the peer runs it with them off, says so in its detail,
    and its rows are measured instead of failing."""
    plan = plan_comparison(CompareOptions(model="llama-tiny", backends=("ort-cpu",), peers=("ort-optimizer",),
                                          seqs=(8,), threads=1, kernels=False, **QUICK))
    report = run_comparison(plan)
    rows = [r for r in report["results"] if r["form"] == "ort-optimizer"]
    assert rows and all(r["status"] == "ok" and r["max_abs_error"] < 1e-4 for r in rows)
    assert "LayerNorm/RMSNorm fusions off" in report["peers"][0]["detail"]


def test_ort_original_is_unavailable_for_a_dsl_model(capsys):
    """ort-original runs the user's own ONNX file: a DSL model has none, so
    it is listed as skipped with the reason, like a peer that is not
    installed, and has no rows."""
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("ort-cpu",), peers=("ort-original",),
                                          seqs=(8,), threads=1, kernels=False, **{**QUICK, "blocks": 1}))
    report = run_comparison(plan)
    (peer,) = report["peers"]
    assert peer["name"] == "ort-original" and not peer["available"] and "not an ONNX file" in peer["reason"]
    assert not any(r["form"] == "ort-original" for r in report["results"])
    _validate(json.loads(json.dumps(report)))
    # asked for alone, no backend: a peer is measured against blockc's backends, so that is refused first
    assert main(["compare", "tiny", "--backends", "none", "--peers", "ort-original", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no backend to compare" in err and "Traceback" not in err


@pytest.mark.parametrize("model, settings, expected", [
    ("tiny", SMALL, ("gpt2", 2, 32)),                        # causal: a decoder
    ("bert-base", SMALL[:2] + ["layers=1"], ("bert", 2, 32)),  # a padding mask, not causal
    ("llama-tiny", ["layers=1"], ("gpt2", 4, 64)),            # grouped-query heads: 2 K/V heads x 2 queries each
])
def test_the_optimizers_settings_come_from_the_fused_attention(model, settings, expected):
    """ONNX Runtime's optimizer is told the model type, heads and their width
    read from blockc's fused graph: the one reading for DSL models and
    imported files."""
    from blockc import optimize
    from blockc.compare.peers import attention_shape
    from blockc.frontends import build_model, trace
    from blockc.frontends.catalog import parse_sets
    assert attention_shape(optimize(trace(build_model(model, parse_sets(settings)))).graph) == expected


@pytest.mark.parametrize("op", ["cache_attention", "append_attention"])
@pytest.mark.parametrize("grouped", [False, True], ids=["heads", "grouped"])
def test_the_optimizers_heads_come_from_a_cache_steps_queries(op, grouped):
    """A cache step's queries are read as attention's are: 4 heads of 8,
    as 4 heads or as 2 K/V heads x 2 queries each."""
    from blockc.compare.peers import attention_shape
    from blockc.ir.dims import parse_dim
    from blockc.ir.dtypes import DType
    from blockc.ir.graph import Graph
    from blockc.ir.types import TensorType

    def t(*shape):
        return TensorType(DType.float32, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))
    g = Graph(op)
    kv = 2 if grouped else 4
    q = g.add_input("q", t("batch", 2, 2, "seq", 8) if grouped else t("batch", 4, "seq", 8))
    k, v = (g.add_input(n, t("batch", kv, "seq", 8)) for n in "kv")
    past = [g.add_input(n, t("batch", kv, 16 if op == "cache_attention" else "past", 8)) for n in ("pk", "pv")]
    attrs = {"start": parse_dim("past")} if op == "cache_attention" else {}
    out = g.add_node(op, [q, k, v, *past], {"causal": True, "scale": 0.5, **attrs}).outputs
    g.set_outputs([("y", out[0])])
    assert attention_shape(g) == ("gpt2", 4, 32)


def test_the_planned_time_uses_the_best_matmul_rate_this_machine_has_shown(tmp_path, monkeypatch):
    """A rate measured while every core is busy is many times too low (a
    38-minute compare announced 955 minutes): the best rate measured on this
    machine is kept in the cache and the higher one used. A cache that
    cannot be read or written leaves today's measurement."""
    from blockc.compare import machine
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    measured = iter([1e10, 4e8, 2e10, 3e9, 5e8])
    monkeypatch.setattr(machine, "_measure_rate", lambda: next(measured))

    def rate():
        machine._RATE.clear()
        return machine.matmul_flops_per_s()
    monkeypatch.setattr(machine, "_RATE", [])
    assert rate() == 1e10
    assert rate() == 1e10    # measured 4e8 under load: the machine has shown better
    assert rate() == 2e10    # a better one is kept
    (tmp_path / "cache" / "matmul-rate.json").write_text("{not json")
    assert rate() == 3e9     # a damaged record is today's measurement, and replaced
    assert json.loads((tmp_path / "cache" / "matmul-rate.json").read_text()) != {}
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "a-file"))   # no cache folder can be made there
    assert rate() == 5e8


def test_a_torch_peer_is_its_registered_backend_as_a_peer():
    """make_peer builds torch-eager and torch-compile through their
    registrations (torch-compile fixes compile=True there), so each peer
    is the backend its name is, named so."""
    from blockc.compare.peers import TorchPeer, make_peer
    eager, compiled = (make_peer(name, None, None) for name in ("torch-eager", "torch-compile"))
    assert isinstance(eager, TorchPeer) and isinstance(compiled, TorchPeer)
    assert (eager.name, eager.compile_module) == ("torch-eager", False)
    assert (compiled.name, compiled.compile_module) == ("torch-compile", True)
    assert compiled.row_backend == "torch"
