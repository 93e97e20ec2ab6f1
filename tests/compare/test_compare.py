"""blockc compare: every form on every available backend beside the peers,
validated against the JSON schema; skipped backends keep their reason; user
mistakes fail before anything is measured."""
from __future__ import annotations

import json
import statistics
import time
from importlib import resources

import jsonschema
import pytest

from blockc.cli import main
from blockc.compare import CompareOptions, plan_comparison, planned_steps, run_comparison
from blockc.errors import BlockcError

SMALL = ["d_model=32", "heads=2", "layers=1", "vocab=61", "max_positions=64"]
QUICK = dict(warmup=1, min_repeats=2, min_time_s=0.0)


def _schema() -> dict:
    return json.loads(resources.files("blockc.compare").joinpath("schema.json").read_text())


@pytest.fixture(scope="module")
def report():
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("reference", "ort-cpu", "cuda"),
                                          peers=("ort-optimizer",), batches=(1, 2), seqs=(8,), threads=1,
                                          **QUICK))
    steps = []
    report = run_comparison(plan, steps.append)
    report["_steps"] = (len(steps), planned_steps(plan))
    return report


def test_report_follows_the_schema(report):
    doc = {k: v for k, v in report.items() if not k.startswith("_")}
    jsonschema.validate(json.loads(json.dumps(doc)), _schema())


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
        assert lat["min"] <= lat["median"] <= lat["max"] and lat["repeats"] >= 2
        assert len(lat["round_medians"]) == report["timing"]["rounds"]
        assert r["max_abs_error"] < 1e-4   # float32 against the float64 reference
        if r["form"] == "standard":
            assert r["speedup_vs_standard"] == pytest.approx(1.0)
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


def test_ratios_pair_fused_with_standard_and_the_peer(report):
    pairs = {(r["a"], r["b"], r["shape"]["batch"]) for r in report["ratios"]}
    assert ("ort-cpu/basic/fused", "ort-cpu/basic/standard", 1) in pairs
    assert ("ort-cpu/all/fused", "ort-cpu/all/ort-optimizer", 2) in pairs
    rows = {(r["backend"] + "/" + r["variant"] + "/" + r["form"], r["shape"]["batch"]): r for r in report["results"]}
    for r in report["ratios"]:
        a, b = rows[(r["a"], r["shape"]["batch"])], rows[(r["b"], r["shape"]["batch"])]
        per_round = [x / y for x, y in zip(b["latency_ms"]["round_medians"], a["latency_ms"]["round_medians"])]
        assert r["speedup"] == pytest.approx(statistics.median(per_round))   # paired round by round


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
    (["--seq", "2000"], "seq=2000 exceeds gpt2-block's maximum of 1024"),
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


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["compare", "tiny", *sum((["--set", s] for s in SMALL), []), "--seq", "8", "--backends",
            "ort-cpu,ort-cuda", "--peers", "none", "--repeats", "2", "--min-time", "0", "--warmup", "1",
            "--json", str(out), "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "ort-cpu" in text and "fused" in text and "vs standard" in text
    assert "ort-cuda: skipped" in text or "ort-cuda: onnxruntime" in text
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, _schema())
    assert doc["command"].startswith("blockc compare tiny")


def test_cli_writes_the_html_report(tmp_path, capsys):
    argv = ["compare", "tiny", *sum((["--set", s] for s in SMALL), []), "--seq", "8", "--backends", "ort-cpu",
            "--peers", "none", "--repeats", "2", "--min-time", "0", "--warmup", "1", "--report",
            str(tmp_path / "rep"), "--no-progress"]
    assert main(argv) == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "tiny" in page and "ort-cpu" in page and page.count("data:image/png;base64,") >= 3


def test_short_memory_times_in_groups(monkeypatch):
    """With memory short after every contestant, each is timed alone and
    closed before the next; ratios across groups say they are not paired."""
    import blockc.compare.run as run
    readings = iter([8 << 30, 1 << 30] * 100)   # before / after each prepare: 7 GiB taken, 1 GiB left
    monkeypatch.setattr(run, "available_memory", lambda: next(readings))
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("ort-cpu",), peers=(),
                                          seqs=(8,), threads=1, kernels=False, **QUICK))
    report = run_comparison(plan)
    assert all(r["status"] == "ok" and r["latency_ms"] for r in report["results"])
    assert report["ratios"] and not any(r["paired"] for r in report["ratios"])


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


def test_sessions_are_pooled():
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("ort-cpu",), peers=(),
                                          seqs=(8,), threads=1, kernels=False, sessions=2, rounds=2, **QUICK))
    steps = []
    report = run_comparison(plan, steps.append)
    assert len(steps) == planned_steps(plan)
    assert report["timing"]["sessions"] == 2
    for r in report["results"]:
        assert r["latency_ms"]["repeats"] >= 2 * 2 and len(r["latency_ms"]["round_medians"]) == 2
    assert all(r["paired"] for r in report["ratios"])


def test_nothing_available_is_an_error_not_an_empty_table(capsys):
    from blockc.runtime.cuda_runner import cuda_available
    if cuda_available()[0]:
        pytest.skip("a GPU is here: ort-cuda can run")
    assert main(["compare", "tiny", "--backends", "ort-cuda,cuda", "--peers", "none", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "nothing to compare" in err and "ort-cuda:" in err and "cuda:" in err
