"""``reference``: blockc's numpy interpreter as a backend."""
from __future__ import annotations

from ..interface import Backend, Compiled, Registration
from ..reference import interpret


class ReferenceBackend(Backend):
    """The numpy interpreter, one numpy call per IR node: in the graph's own
    dtypes, or with ``float64=True`` in float64 (the oracle)."""

    def __init__(self, *, float64: bool = False):
        self.float64 = float64
        # it reads the caller's arrays as they are; in float64 it widens each (float32 -> twice the bytes)
        self.weight_copies = 2.0 if float64 else 0.0
        self.arena_copies = 0.0   # each intermediate is freed after its last use
        self.build_copies = 0.0   # nothing to build

    @property
    def title(self) -> str:
        return "reference interpreter" + (" (float64)" if self.float64 else "")

    def detail(self, threads):
        return "blockc's numpy interpreter in the model's dtype (the float64 oracle's float32 twin), one numpy " \
               "call per IR node; numpy's BLAS picks its own thread count"

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False):
        return ReferenceCompiled(graph, weights, float64=self.float64)


class ReferenceCompiled(Compiled):
    """The interpreter on one graph; it needs the sizes the feeds bind."""

    def __init__(self, graph, weights, *, float64: bool):
        super().__init__(graph=graph, kernels=len(graph.nodes))
        self.weights, self.float64 = weights, float64

    def unchecked_runner(self, feeds, bindings):
        return lambda: interpret(self.graph, self.weights, feeds, bindings, float64=self.float64)


REGISTRATIONS = (Registration("reference", ReferenceBackend, compare=True),)
