"""Intra-op threads: how many threads ONNX Runtime's and PyTorch's own pools
get, decided once, here.

A caller that names a count (``compare --threads``, ``threads=2``) gets it;
one that names none gets ``$BLOCKC_THREADS`` where it is set, else the
runtime's own default (a pool as wide as the machine). The variable is for
a process that shares its cores: a CI worker, one of several jobs on a
machine, where pools sized to every core spin against each other.
``ort_runner.session_options`` and ``torch_runner.TorchSession`` ask here;
``compare``, which names a count for every contestant and records it, takes
``default_threads``.
"""
from __future__ import annotations

import os

from ..environment import env_setting, positive_int
from ..errors import BlockcError

THREADS_VARIABLE = "BLOCKC_THREADS"


def intra_op_threads(threads: int | None = None) -> int | None:
    """``threads`` where given (a positive integer, else a ``BlockcError``),
    else ``$BLOCKC_THREADS`` where set (likewise), else None: the runtime's
    own default."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise BlockcError(f"threads must be a positive integer, got {threads!r}")
        return threads
    return env_setting(THREADS_VARIABLE, positive_int, None, "a positive whole number of threads: it sets "
                       "the intra-op threads of ONNX Runtime and PyTorch (unset: every core)")


def default_threads() -> int:
    """The count a command that must name one (``compare`` gives every
    contestant the same and records it) takes when the user names none:
    ``$BLOCKC_THREADS`` where set, else every core, as a session left to its
    runtime's default would have."""
    return intra_op_threads() or os.cpu_count() or 1
