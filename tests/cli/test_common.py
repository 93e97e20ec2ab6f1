"""The graph a command works on (``cli/common.make_graph``): a built-in
model's fused form comes from the compile cache without tracing on a second
run; a run that prints the IR after a pass still runs the passes."""
import pytest

import blockc.frontends
from blockc import files
from blockc.cli import main

TINY = ["tiny", "--set", "layers=1", "--form", "fused"]


@pytest.fixture
def traces(tmp_path, monkeypatch):
    """How many graphs the commands traced, with an empty cache."""
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    files.CACHE_COUNTS.clear()
    made = []
    real = blockc.frontends.trace

    def counted(model, *args, **kw):
        made.append(model.name)
        return real(model, *args, **kw)
    monkeypatch.setattr(blockc.frontends, "trace", counted)
    return made


def test_a_second_show_of_a_builtin_model_does_not_trace(traces, capsys):
    assert main(["show", *TINY]) == 0
    first = capsys.readouterr().out
    assert main(["show", *TINY]) == 0
    assert capsys.readouterr().out == first
    assert traces == ["tiny"] and files.CACHE_COUNTS["model", "hit"] == 1


def test_printing_after_a_pass_runs_the_passes(traces, capsys):
    assert main(["show", *TINY]) == 0
    assert main(["show", *TINY, "--print-after", "fuse_attention"]) == 0
    assert "fuse_attention" in capsys.readouterr().err
    assert traces == ["tiny", "tiny"]
