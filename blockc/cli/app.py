"""The ``blockc`` parser, built from the list of command modules, and ``main``:
the one place errors reach the terminal.

A command is a module of this package with ``NAME``, ``HELP``,
``DESCRIPTION``, ``add_arguments(parser)`` (the options it alone takes; the
shared ones come from ``options``) and ``run(args) -> exit status``, and may
have ``check_outputs(args)`` (every path it will write, checked before any
work). A new command is its module and one line in ``COMMANDS``.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import BlockcError
from . import cache, check, compare, cuda, export, fusions, generate, models, run, show, summary
from .common import inside
from .options import check_tp, given_backend_options, resolve_forms

# In the order `blockc --help` lists them.
COMMANDS = (models, show, fusions, check, summary, export, cuda, run, generate, compare, cache)

EXAMPLES = """\
examples:
  blockc compare                                  # the default gpt2 block: every form, backend and peer
  blockc compare gpt2 --set layers=2 --batch 1,8 --seq 128,512 --json r.json --report out/
  blockc models
  blockc show tiny --form decomposed
  blockc show tiny --form fused --disable fuse_attention --print-after fuse_masked_softmax
  blockc fusions gpt2 --set layers=4 --json report.json
  blockc check bert-base --set layers=2
  blockc cuda gpt2 --set layers=2 -o build/gpt2-cuda
  blockc run tiny --backend cuda-emu --check
  blockc export gpt2 --set layers=2 -o gpt2-2l.onnx
  blockc run bert-base --set layers=2 --backend ort --check
  blockc run my_model.py:build --dim seq=64
  blockc run tiny --inputs ids.npz --save out.npz   # your arrays in (numpy.savez), the outputs out
  blockc export gpt2 --fused-as function -o f.onnx  # --fused-as alone means --form fused
  blockc generate llama-tiny --prompt-ids 1,2,3 --prompt-ids 4,5 --max-new 16
"""


class _Parser(argparse.ArgumentParser):
    """argparse with blockc's errors: a mistake in the arguments is a
    ``BlockcError``, which ``main`` prints as its one line, ``blockc: error:
    ...``, exit status 2 (argparse prints its usage block and, for a command,
    ``blockc generate: error:``). The command's own parser raises it too:
    ``add_subparsers`` makes them of the parser's class."""

    def error(self, message: str):
        raise BlockcError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """The arguments, with ``backend_options``: the backend flags as given,
        read before ``resolve_forms`` fills in their defaults."""
        parsed = super().parse_args(args, namespace)
        parsed.backend_options = given_backend_options(parsed)
        return parsed


def build_parser(commands=COMMANDS) -> argparse.ArgumentParser:
    """The parser of ``blockc`` and of each of ``commands`` (command modules, as ``COMMANDS``)."""
    parser = _Parser(
        prog="blockc", description="blockc: a compiler for transformer models. Declare or pick a model, "
        "see its IR, export ONNX, run it.", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(p)
        p.set_defaults(fn=command.run, check_outputs=getattr(command, "check_outputs", None))
    return parser


def check_outputs(args) -> None:
    """Every path a command will write, checked before it does any work, so
    a bad -o costs nothing and never ends in a traceback halfway through."""
    from ..files import check_writable
    if args.check_outputs:
        args.check_outputs(args)
    if getattr(args, "json", None) and not inside(args.json, getattr(args, "report", None)):
        check_writable(args.json)   # (one inside --report's folder is written after the report makes it)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """blockc's warnings as one escaped line, like its errors (not Python's
    two lines naming the file that raised them)."""
    from ..errors import printable
    print(f"blockc: warning: {printable(str(message))}", file=sys.stderr)


def _start(parser, argv: list[str]) -> int:
    """Parse ``argv``, check what can be checked before any work, run the command."""
    args = parser.parse_args(argv)  # an option's type= may raise BlockcError (--arch)
    args.argv = argv  # as typed, for reports that record their command
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0
    resolve_forms(args)
    check_tp(args)
    if hasattr(args, "seed"):   # before any work: numpy would refuse it at the first draw, as a traceback
        from ..frontends.module import check_seed
        check_seed(args.seed, "--seed")
    check_outputs(args)
    return args.fn(args)


def main(argv: list[str] | None = None, commands=COMMANDS) -> int:
    """``blockc`` with ``argv`` (None: the program's own arguments): the
    command's exit status, or 2 with one line ``blockc: error: ...``."""
    import warnings

    from ..errors import printable
    parser = build_parser(commands)
    shown = warnings.showwarning
    if argv is None:   # the program itself, not a caller that may record warnings (pytest.warns)
        warnings.showwarning = _show_warning
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _start(parser, argv)
    # The one place errors reach the terminal: names from weight files and
    # models in a message are shown escaped, never interpreted (a name
    # "\x1b[31m" must not turn the terminal red). Line breaks are blockc's own.
    except BlockcError as e:
        print(f"blockc: error: {printable(str(e), keep_newlines=True)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `blockc show gpt2 | head`
        sys.stderr.close()
        return 0
    except OSError as e:  # the machine, not blockc: a full disk, a folder that cannot be made
        where = f"{e.filename}: " if e.filename else ""
        print(f"blockc: error: {printable(where + (e.strerror or str(e)))}", file=sys.stderr)
        return 2
    except MemoryError:
        print("blockc: error: out of memory (make the model or the sizes smaller with --set or --dim)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("blockc: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown
