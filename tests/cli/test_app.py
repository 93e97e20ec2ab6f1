"""The command line is built from its list of command modules: a new command
is one module and one line in that list, and the shared options come from
``blockc.cli.options``."""
import types

from blockc.cli import COMMANDS, build_parser, main
from blockc.cli.options import model_args


def _hello_command():
    """A command declared here alone, as a module of blockc/cli/ declares one."""
    seen = {}

    def add_arguments(p):
        model_args(p)   # a shared option, declared once elsewhere
        p.add_argument("--times", type=int, default=1, help="how many times")

    def run(args):
        seen.update(model=args.model, times=args.times, set=args.set)
        print(f"hello {args.model}" * args.times)
        return 0

    command = types.SimpleNamespace(NAME="hello", HELP="say hello", DESCRIPTION="Say hello to MODEL.",
                                    add_arguments=add_arguments, run=run)
    return command, seen


def test_a_new_command_is_one_module_and_one_line(capsys):
    hello, seen = _hello_command()
    commands = COMMANDS + (hello,)   # the one line
    choices = build_parser(commands)._subparsers._group_actions[0].choices
    assert "hello" in choices and "--times" in choices["hello"].format_help()
    assert main(["hello", "tiny", "--times", "2", "--set", "layers=1"], commands=commands) == 0
    assert capsys.readouterr().out == "hello tinyhello tiny\n"
    assert seen == {"model": "tiny", "times": 2, "set": ["layers=1"]}
    # not registered: blockc's one-line error, as for any unknown command
    assert main(["hello"]) == 2
    assert capsys.readouterr().err.startswith("blockc: error: argument COMMAND: invalid choice: 'hello'")


def test_every_command_module_is_listed_once_in_the_help():
    names = [c.NAME for c in COMMANDS]
    assert len(set(names)) == len(names)
    assert list(build_parser()._subparsers._group_actions[0].choices) == names


def test_a_command_checks_its_outputs_before_any_work(tmp_path, capsys):
    hello, seen = _hello_command()
    hello.check_outputs = lambda args: (_ for _ in ()).throw(OSError(2, "No such file or directory", "nowhere/x"))
    assert main(["hello", "tiny"], commands=COMMANDS + (hello,)) == 2
    assert capsys.readouterr().err == "blockc: error: nowhere/x: No such file or directory\n"
    assert not seen   # never run


def test_building_the_parser_imports_no_matplotlib():
    """Every command builds the whole parser: blockc.compare (whose charts
    need matplotlib, seconds to import) is imported only when compare runs."""
    import subprocess
    import sys
    code = ("import sys; from blockc.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
