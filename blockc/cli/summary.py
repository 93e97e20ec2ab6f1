"""``blockc summary``: parameter counts per module."""
from __future__ import annotations

from .common import load_model
from .options import model_args, tp_args

NAME = "summary"
HELP = "parameter counts per module"
DESCRIPTION = ("Print MODEL's parameters per module, the total, and the non-embedding count against the 12·L·d² "
               "rule of thumb.")


def add_arguments(p) -> None:
    model_args(p)
    tp_args(p)


def run(args) -> int:
    if args.tp is not None:
        from .tensor_parallel import summary_ranks
        return summary_ranks(args)
    from ..frontends.summary import summarize
    # Counted from the module tree: a 100,000-layer model is counted, not traced.
    print(summarize(load_model(args)).format())
    return 0
