"""The command line's options: each shared option declared once, with one
help everywhere, and the --fused-as / --form rule."""
import ast
import re
from collections import Counter
from pathlib import Path

import pytest
from registry_testing import registered_torch_backend

import blockc.cli
from blockc.cli import build_parser, main
from blockc.cli.options import BACKEND_FLAGS
from blockc.runtime.backend import backend_names

# Flags that mean something different on each command that has them, so are
# declared per command: --backend lists the command's own backends, and
# -o/--output is a file for export and a folder for cuda.
PER_COMMAND = {"--backend", "--output"}

# The shared options whose help has a parameter, and the one shape that help
# may take; every other shared option's help is the same text everywhere.
HELP_SHAPES = {
    "--seed": r"seed of .+ \(default 0\)",
    "--dim": r"bind a symbolic dimension.* \(repeatable; default .+\)",
    "--form": r"the graph form( the fusions start from)?: decomposed \(.+\), standard \(.+\)"
              r"(, fused \(.+\))? \(default (standard|fused)\)",
    "--fused-as": r"how fused ops are written in ONNX: function \(.+\), contrib \(.+\), onnx23 \(.+\), auto \(.+\)"
                  r"(; all: every encoding)? \(default (auto|all)\)(; given without --form it means --form fused.*)?",
    "--dtype": r"the model's dtype, as --set dtype= \(default: the model's own\)",
    "--json": r"also write .+ as JSON to FILE( \(schema: docs/[\w-]+\.md\))?",
}


def subcommands() -> dict:
    return build_parser()._subparsers._group_actions[0].choices


def options_by_flag() -> dict[str, list[tuple[str, object]]]:
    """Each long flag -> [(command, its argparse action)] over every command."""
    found: dict[str, list] = {}
    for command, parser in subcommands().items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    found.setdefault(flag, []).append((command, action))
    return found


def declared_flags(source: str) -> Counter:
    """How many ``add_argument`` calls in ``source`` declare each long flag."""
    counts: Counter = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    counts[arg.value] += 1
    return counts


def declared_more_than_once(source: str) -> dict[str, int]:
    return {flag: n for flag, n in declared_flags(source).items() if n > 1 and flag not in PER_COMMAND}


# Every module of the command line, as one text: an option declared in two of them counts twice.
CLI_SOURCE = "\n".join(p.read_text() for p in sorted(Path(blockc.cli.__file__).parent.glob("*.py")))


def test_every_shared_option_is_declared_once():
    shared = {flag for flag, uses in options_by_flag().items() if len(uses) > 1}
    assert {"--seed", "--weights", "--dim", "--set", "--form", "--fused-as", "--provider"} <= shared
    assert not declared_more_than_once(CLI_SOURCE), "declared in more than one place in blockc/cli/"
    # and the check is not vacuous: a second --seed is caught
    stray = CLI_SOURCE + '\n\ndef _stray(p):\n    p.add_argument("--seed", type=int, default=0, help="a seed")\n'
    assert declared_more_than_once(stray) == {"--seed": 2}


def test_a_shared_option_reads_the_same_on_every_command():
    for flag, uses in options_by_flag().items():
        if len(uses) < 2 or flag in PER_COMMAND:
            continue
        kinds = {(type(a).__name__, a.dest, a.type, a.nargs, a.metavar) for _, a in uses}
        assert len(kinds) == 1, f"{flag} is a different option on different commands: {kinds}"
        helps = {command: a.help for command, a in uses}
        if flag in HELP_SHAPES:
            for command, text in helps.items():
                assert re.fullmatch(HELP_SHAPES[flag], text), f"{flag} on {command}: {text!r}"
        else:
            assert len(set(helps.values())) == 1, f"{flag} has different help on different commands: {helps}"


# ---- --fused-as and --form ----------------------------------------------------
def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_export_fused_as_alone_writes_the_fused_graph(tmp_path, capsys):
    import onnx
    out = tmp_path / "f.onnx"
    code, text, err = run(capsys, "export", "tiny", "--fused-as", "function", "-o", str(out))
    assert code == 0, err
    model = onnx.load(str(out))
    functions = {f.name for f in model.functions}
    assert any(name.startswith("AddLayerNorm") for name in functions), functions
    assert {n.op_type for n in model.graph.node} & functions  # the graph calls them
    assert "fused ops as" in text


@pytest.mark.parametrize("command", ["export", "run"])
@pytest.mark.parametrize("form", ["standard", "decomposed"])
def test_fused_as_with_an_unfused_form_is_refused(command, form, tmp_path, capsys):
    out = tmp_path / "f.onnx"
    rest = ["-o", str(out)] if command == "export" else ["--backend", "reference"]
    code, _, err = run(capsys, command, "tiny", "--form", form, "--fused-as", "contrib", *rest)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("blockc: error: --fused-as contrib") and f"--form {form} has no fused ops" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_run_fused_as_alone_runs_the_fused_graph(capsys):
    code, out, err = run(capsys, "run", "tiny", "--set", "layers=1", "--fused-as", "function", "--dim", "seq=5")
    assert code == 0, err
    assert out.startswith("tiny [fused] on ONNX Runtime (cpu, fused ops as function)")


def test_defaults_without_fused_as_are_unchanged(tmp_path, capsys):
    import onnx
    out = tmp_path / "s.onnx"
    assert run(capsys, "export", "tiny", "-o", str(out))[0] == 0
    assert not onnx.load(str(out)).functions  # the standard form: no fused ops
    code, text, _ = run(capsys, "run", "tiny", "--set", "layers=1", "--dim", "seq=5")
    assert code == 0 and text.startswith("tiny [standard] on ONNX Runtime (cpu, fused ops as auto)")
    assert run(capsys, "export", "tiny", "--form", "fused", "--fused-as", "function", "-o", str(out))[0] == 0


def test_fused_as_leaves_check_and_fusions_form_alone(capsys):
    # These commands fuse whatever --form they start from: the rule does not apply.
    code, out, _ = run(capsys, "fusions", "tiny", "--form", "decomposed", "--fused-as", "contrib")
    assert code == 0 and "tiny (decomposed form)" in out
    code, _, err = run(capsys, "check", "tiny", "--form", "fused")   # nothing to fuse in a fused graph: not offered
    assert code == 2 and "argument --form: invalid choice: 'fused'" in err


# ---- --seed ------------------------------------------------------------------
def required_args(command: str, tmp_path) -> list[str]:
    """What ``command`` cannot run without besides MODEL (its required options)."""
    values = {"--output": str(tmp_path / "out"), "--prompt-ids": "1"}
    parser = subcommands()[command]
    required = [a for a in parser._actions if a.required and a.option_strings]
    required += [g._group_actions[0] for g in parser._mutually_exclusive_groups if g.required]   # one of them
    return [arg for action in required for arg in (action.option_strings[-1], values[action.option_strings[-1]])]


@pytest.mark.parametrize("command", sorted(c for c, _ in options_by_flag()["--seed"]))
def test_a_negative_seed_is_one_line_on_every_command(command, tmp_path, capsys):
    code, out, err = run(capsys, command, "tiny", "--seed", "-1", *required_args(command, tmp_path))
    assert code == 2 and err == "blockc: error: --seed must be a non-negative integer, got -1\n"
    assert not list(tmp_path.iterdir())   # refused before anything is written


# ---- backend options ------------------------------------------------------------
# Each backend flag with a value, by the option it sets (blockc.cli.options.BACKEND_FLAGS).
FLAG_ARGS = {"provider": ["--provider", "cuda"], "fused_as": ["--fused-as", "contrib"], "gemm": ["--gemm", "tiled"],
             "tf32": ["--tf32"], "float64": ["--float64"]}


def test_every_backend_flag_is_a_backend_option():
    from blockc.runtime.backend import registrations
    assert set(FLAG_ARGS) == set(BACKEND_FLAGS)
    taken = set().union(*(entry.cls.option_names() for entry in registrations()))
    assert set(FLAG_ARGS) <= taken


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("backend", backend_names())
def test_a_flag_the_backend_does_not_take_is_refused(command, backend, capsys):
    """--float64 on ort or cuda-emu, --provider on reference: once ignored,
    while --tf32 and --gemm were refused; now one rule for every flag."""
    from blockc.runtime.backend import backend_options
    flags = {flag for flag, uses in options_by_flag().items() if command in dict(uses)}
    not_taken = [o for o in FLAG_ARGS if o not in backend_options(backend) and f"--{o.replace('_', '-')}" in flags]
    for option in not_taken:
        code, _, err = run(capsys, command, "tiny", "--backend", backend, *FLAG_ARGS[option])
        assert code == 2 and err.startswith(f"blockc: error: backend '{backend}' does not take the option "
                                            f"'{option}' (") and err.count("\n") == 1, (option, err)


def test_the_help_names_the_backends_a_rank_runs_from_the_registry():
    """With --tp, --backend(s) help names the backends a rank runs as the
    backend registry holds them when the parser is built, never typed."""
    with registered_torch_backend("torch-variant"):
        commands = subcommands()
    for command, flag in (("run", "--backend"), ("generate", "--backend"), ("compare", "--backends")):
        text = next(a.help for a in commands[command]._actions if flag in a.option_strings)
        assert "with --tp torch-eager by default, or torch-compile or torch-variant" in text, command
