"""A collective op a test declares and forgets after (the registry is the
one list of collectives: ``parallel/rank_timing``, ``report/communication``
and ``runtime/tp_reference`` read it; tests/parallel/test_rank_timing.py,
tests/report/test_communication.py, tests/runtime/test_tp_reference.py)."""
from __future__ import annotations

from contextlib import contextmanager

from blockc.ops import registry


@contextmanager
def declared_collective(name: str = "test_scatter"):
    """``name``: a reduce-scatter (rank r's block r of the ranks' sum, along
    the first axis), declared with its shape rule alone; each test attaches
    the rules it tests. Removed from the registry after."""
    op = registry.define(name, ("x",), attrs={"world": (registry.INT, registry.REQUIRED)}, collective=True,
                         doc="a collective the registry declares for a test")
    op.infer(lambda types, attrs: types[0].with_shape((types[0].shape[0] // attrs["world"], *types[0].shape[1:])))
    try:
        yield op
    finally:
        registry.OPS.pop(name, None)
