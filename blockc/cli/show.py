"""``blockc show``: a model's IR, one line per node."""
from __future__ import annotations

import sys

from .common import make_graph
from .options import graph_args, tp_args

NAME = "show"
HELP = "print a model's IR"
DESCRIPTION = "Trace MODEL and print its IR (one line per node; the text parses back with blockc.parse_graph)."


def add_arguments(p) -> None:
    graph_args(p)
    tp_args(p)


def run(args) -> int:
    if args.tp is not None:
        from .tensor_parallel import show_ranks
        return show_ranks(args)
    _, graph = make_graph(args)
    sys.stdout.write(str(graph))
    return 0
