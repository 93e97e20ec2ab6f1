"""The command line: every command, its --help, and clean errors for bad input."""
import os
import subprocess
import sys

import numpy as np
import pytest

from blockc.cli import build_parser, main

COMMANDS = ["models", "show", "summary", "export", "run"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS)
def test_help_says_what_each_command_does(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) > 3
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    assert sub.description and sub.description.split()[0] in out


def test_models_lists_builtins(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for name in ("tiny", "gpt2", "bert-base", "gpt2-block"):
        assert f"\n{name}" in "\n" + out
    assert "layers=12" in out and "vocab=50257" in out


def test_show_prints_parsable_ir(capsys):
    from blockc import parse_graph
    code, out, _ = run(capsys, "show", "tiny", "--set", "layers=1", "--form", "decomposed")
    assert code == 0
    g = parse_graph(out)
    assert "layernorm" not in g.op_counts() and "reduce_mean" in g.op_counts()


def test_run_reference_with_check(capsys):
    code, out, _ = run(capsys, "run", "tiny", "--backend", "reference", "--check", "--dim", "seq=7")
    assert code == 0
    assert "logits" in out and "[2, 7, 256]" in out and "max |err| vs f64" in out


@pytest.mark.parametrize("argv, message", [
    (["show", "nope"], "unknown model 'nope'"),
    (["show", "gpt2", "--set", "colour=blue"], "gpt2 has no setting 'colour'"),
    (["show", "gpt2", "--set", "layers"], "malformed --set 'layers'"),
    (["show", "gpt2", "--set", "layers=two"], "--set layers='two' is not a valid int"),
    (["show", "gpt2", "--set", "heads=7"], "d_model=768 is not divisible by heads=7"),
    (["run", "tiny", "--backend", "reference", "--dim", "seq=500"], "exceeds the model's maximum of 128"),
    (["run", "tiny", "--backend", "reference", "--dim", "seq=x"], "malformed --dim"),
    (["run", "tiny", "--backend", "reference", "--dim", "heads=3"], "no such dimension"),
    (["show", "missing_file.py:build"], "not found"),
])
def test_bad_input_is_a_clean_error(argv, message, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_console_script_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "blockc.cli", "show", "gpt2", "--set", "heads=7"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("blockc: error:") and "Traceback" not in proc.stderr
