"""``torch-eager`` and ``torch-compile``: the graph as a PyTorch module, on the CPU.

One idiomatic torch call per IR node (``runtime/torch_runner.py``), run
eagerly or under ``torch.compile`` (inductor). ``blockc compare`` measures
them as peers on the standard-form graph (``compare/peers.py``).
"""
from __future__ import annotations

from ..interface import Backend, Compiled, Registration


class TorchBackend(Backend):
    """PyTorch on the CPU under ``inference_mode``; option ``compile``: under
    ``torch.compile`` (one compile per shape)."""

    runs = "one torch call per IR node"   # what the module is, for ``detail``

    def __init__(self, *, compile: bool = False):
        self.compile_module = compile
        # lower_to_torch copies the weights into the module's parameters, and folds weight-only
        # nodes (GPT-2's transposed head) into buffers of their own: measured resident after one
        # run, gpt2 with 2 layers, 1.13x the footprint's weights eager, 0.94x under inductor
        self.weight_copies = 1.0 if compile else 1.15
        self.arena_copies = 1.0 if compile else 0.0   # eager frees each intermediate; inductor plans its buffers
        # measured 0 beyond what it keeps: the copies are the parameters (inductor compiles at the first
        # run, whose peak compare measures as the run's)
        self.build_copies = 0.0

    def availability(self):
        from ..torch_runner import torch_available
        ok, why = torch_available()
        return (True, "") if ok else (False, why)

    @property
    def title(self) -> str:
        return "PyTorch" + (" under torch.compile" if self.compile_module else " (eager)")

    def detail(self, threads):
        import torch
        how = "torch.compile (inductor, one compile per shape)" if self.compile_module else "eager"
        return f"torch {torch.__version__} on the CPU, {how}, {threads} intra-op threads, inference_mode; {self.runs}"

    def session(self, graph, weights, *, threads=None):
        """The ``TorchSession`` this backend runs ``graph`` in: what ``compile``
        wraps, and what a tensor-parallel rank runs (``parallel/rank_model``),
        so a subclass that lowers otherwise does so on the ranks too."""
        from ..torch_runner import TorchSession
        return TorchSession(graph, weights, compile=self.compile_module, threads=threads)

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False):
        session = self.session(graph, weights, threads=threads)
        return Compiled(session.run_unchecked, graph=graph)


REGISTRATIONS = (Registration("torch-eager", TorchBackend),
                 Registration("torch-compile", TorchBackend, {"compile": True}))
