"""Progress of long work: tracing, the passes, the ONNX export and each weight
written report through one callback (blockc/progress.py) and print nothing;
`blockc export` draws them as a bar, on a terminal only."""
import io
import re
import time

import onnx
import pytest

import blockc
from blockc import progress as stages
from blockc.cli import main
from blockc.cli.progress_bar import ProgressBar
from blockc.codegen.onnx_export import export_onnx, save_onnx
from blockc.codegen.onnx_weights_file import save_onnx_weights
from blockc.passes.pipeline import default_pipeline


class Recorder:
    """A progress callback that keeps every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, stage, done, total):
        self.calls.append((stage, done, total))

    def of(self, stage):
        return [(done, total) for s, done, total in self.calls if s == stage]

    def stages(self):
        return list(dict.fromkeys(s for s, _, _ in self.calls))


def tiny():
    model = blockc.build_model("tiny")
    return model, blockc.trace(model), blockc.init_weights(model, seed=1)


# -- the callback ---------------------------------------------------------------------------------
def test_ticker_reports_the_start_about_reports_times_and_the_end():
    rec = Recorder()
    tick = stages.ticker(rec, "work", 10_000)
    for done in range(1, 10_001):
        tick(done)
    calls = rec.of("work")
    assert calls[0] == (0, 10_000) and calls[-1] == (10_000, 10_000)
    assert len(calls) == stages.REPORTS + 1
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    tick = stages.ticker(None, "work", 10)  # nobody asked: nothing to call
    tick(10)


def test_tracing_reports_the_parameters_reached_of_those_declared():
    rec = Recorder()
    model = blockc.build_model("tiny")
    blockc.trace(model, progress=rec)
    calls = rec.of(stages.TRACING)
    assert calls[0] == (0, 36) and calls[-1] == (36, 36)
    assert all(total == 36 for _, total in calls) and len(calls) > 2


def test_the_pass_manager_reports_each_pass():
    rec = Recorder()
    _, graph, _ = tiny()
    blockc.optimize(graph, disable=["cse"], progress=rec)
    ran = len([p for p in default_pipeline() if p.__name__ != "cse"])
    assert rec.of(stages.OPTIMIZING) == [(done, ran) for done in range(ran + 1)]
    rec = Recorder()
    blockc.to_form(graph, "decomposed", progress=rec)
    assert rec.calls == [(stages.DECOMPOSING, 0, 1), (stages.DECOMPOSING, 1, 1)]


def test_a_weightless_export_reports_the_nodes_lowered_and_the_check(capsys):
    rec = Recorder()
    _, graph, _ = tiny()
    export_onnx(graph, None, progress=rec)
    assert rec.stages() == [stages.BUILDING_ONNX, stages.CHECKING_ONNX]
    built = rec.of(stages.BUILDING_ONNX)
    assert built[0] == (0, len(graph.nodes)) and built[-1] == (len(graph.nodes), len(graph.nodes))
    assert rec.of(stages.CHECKING_ONNX) == [(0, 1), (1, 1)]
    assert capsys.readouterr() == ("", "")  # a library call prints nothing


@pytest.mark.parametrize("external_data", [False, True])
def test_an_export_with_weights_reports_each_weight(external_data, tmp_path):
    rec = Recorder()
    _, graph, weights = tiny()
    save_onnx(graph, weights, tmp_path / "m.onnx", external_data=external_data, progress=rec)
    n = len(graph.params)
    assert rec.of(stages.WRITING_WEIGHTS) == [(done, n) for done in range(n + 1)]
    assert stages.BUILDING_ONNX in rec.stages() and stages.CHECKING_ONNX in rec.stages()


def test_weights_written_later_are_reported_each(tmp_path):
    _, graph, weights = tiny()
    save_onnx(graph, None, tmp_path / "m.onnx")
    rec = Recorder()
    save_onnx_weights(tmp_path / "m.onnx", weights, progress=rec)
    n = len(graph.params)
    assert rec.calls == [(stages.WRITING_WEIGHTS, done, n) for done in range(n + 1)]


# -- the bar --------------------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self):
        return True


def export_with(bar: ProgressBar, tmp_path) -> None:
    with bar:
        model = blockc.build_model("tiny")
        graph = blockc.to_form(blockc.trace(model, progress=bar), "fused", progress=bar)
        save_onnx(graph, blockc.init_weights(model), tmp_path / "m.onnx", progress=bar)


def test_the_bar_draws_every_stage_on_a_terminal(tmp_path, monkeypatch):
    # a cache of its own: with the optimized graph already in the compile cache, there is no optimizing to draw
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    screen = Terminal()
    export_with(ProgressBar(stream=screen, delay=0), tmp_path)
    for stage in (stages.TRACING, stages.OPTIMIZING, stages.BUILDING_ONNX, stages.CHECKING_ONNX,
                  stages.WRITING_WEIGHTS):
        assert stage in screen.getvalue()


def test_the_bar_waits_for_a_slow_job_and_never_draws_into_a_pipe(tmp_path, monkeypatch):
    screen = Terminal()
    export_with(ProgressBar(stream=screen, delay=3600), tmp_path)  # a quick job: no bar
    assert screen.getvalue() == ""
    pipe = io.StringIO()
    export_with(ProgressBar(stream=pipe, delay=0), tmp_path)
    assert pipe.getvalue() == ""
    # a job that has run past the delay shows the stages it already began
    clock = iter([0.0, 0.0, 10.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock, 10.0))
    bar = ProgressBar(stream=screen, delay=1.0)
    with bar:
        bar(stages.TRACING, 36, 36)
        bar(stages.BUILDING_ONNX, 0, 75)
    assert stages.TRACING in screen.getvalue() and stages.BUILDING_ONNX in screen.getvalue()


def test_a_long_job_writes_a_line_now_and_then_where_no_bar_can_be_drawn(monkeypatch):
    """``lines_every``: a pipe or a log gets where the job stands, a line at
    most that often and one at the end, instead of minutes of silence; a
    terminal keeps its bar, and ``show=False`` (--no-progress) silences both."""
    clock = iter([0.0, 0.0, 5.0, 20.0, 21.0, 22.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock, 22.0))
    pipe = io.StringIO()
    with ProgressBar(stream=pipe, delay=0, lines_every=15.0) as bar:
        for done, detail in ((0, "a"), (1, "b"), (2, "c"), (3, "d")):
            bar(stages.MEASURING, done, 4, detail)
        bar(stages.MEASURING, 4, 4)
    assert pipe.getvalue().splitlines() == ["measuring 0/4: a (0 s so far)",
                                            "measuring 2/4: c (20 s so far, about 20 s left)",
                                            "measuring 4/4 (22 s so far)"]
    for stream, show in ((io.StringIO(), False), (Terminal(), True)):
        with ProgressBar(stream=stream, delay=3600, show=show, lines_every=15.0) as bar:
            bar(stages.MEASURING, 0, 4, "a")
        assert stream.getvalue() == ""


def test_blockc_compare_into_a_pipe_says_how_far_it_has_got(capsys):
    args = ["compare", "tiny", "--set", "layers=1", "--seq", "8", "--backends", "reference", "--peers", "none",
            "--blocks", "1", "--repeats", "1", "--min-time", "0", "--warmup", "0", "--no-kernels"]
    assert main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("measuring 0/") and re.fullmatch(r"measuring (\d+)/\1 \(\d+ s so far\)", lines[-1])
    assert main([*args, "--no-progress"]) == 0 and capsys.readouterr().err == ""


def test_blockc_export_into_a_pipe_prints_no_bar(tmp_path, capsys):
    assert main(["export", "tiny", "-o", str(tmp_path / "m.onnx")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("wrote ") and err == ""
    onnx.checker.check_model(str(tmp_path / "m.onnx"))
