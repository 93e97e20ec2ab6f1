"""The peers blockc's fused graph is measured against, in the same run, on
the same weights, shapes, thread count and repeats:

* ``ort-optimizer``: ONNX Runtime's own transformer optimizer
  (``onnxruntime.transformers.optimizer.optimize_model``) applied to blockc's
  *unfused* ONNX -- the tool users reach for today -- then run on ONNX Runtime
  at both graph optimization levels, like blockc's own rows;
* ``torch-eager``: the standard-form graph as a PyTorch module (one idiomatic
  torch call per IR node: ``F.layer_norm``, ``torch.softmax``, ...);
* ``torch-compile``: that module under ``torch.compile`` (inductor).

A peer that is not installed is listed as skipped with the reason.
"""
from __future__ import annotations

import os
import tempfile
from typing import Mapping

import numpy as np

from ..errors import BlockcError
from ..ir.graph import Graph
from ..runtime.backend import Backend, Compiled
from ..runtime.backends.ort import count_onnx_nodes
from ..runtime.backends.pytorch import TorchBackend

PEERS = ("ort-optimizer", "torch-eager", "torch-compile")


def attention_shape(model) -> tuple[str, int, int]:
    """(optimizer model_type, heads, hidden size) from the model's first
    multi-head attention: "gpt2" for causal (decoder) attention, "bert"
    otherwise; (.., 0, 0) lets the optimizer detect them itself."""
    from ..frontends.layers import MultiHeadAttention
    for _, m in model.named_modules():
        if isinstance(m, MultiHeadAttention):
            return ("gpt2" if m.causal else "bert"), m.heads, m.w_q.weight.shape[0]
    return "bert", 0, 0


class OrtOptimizerPeer(Backend):
    """ONNX Runtime's transformer optimizer on blockc's unfused ONNX, run on ONNX Runtime."""

    name = "ort-optimizer"
    row_backend = "ort-cpu"   # the backend column of its rows: it runs where ort-cpu does
    variants = ("basic", "all")
    weight_copies = 5.0   # the exported and the optimized onnx models, both serialized, and the session
    arena_copies = 1.3    # ONNX Runtime's CPU arena, as ort-cpu's

    def __init__(self, model):
        self.model_type, self.heads, self.hidden = attention_shape(model)
        self.fused: dict[str, int] = {}
        self.workaround = ""   # how it had to be run, where its defaults fail on this model

    def availability(self):
        try:
            import onnxruntime.transformers.optimizer  # noqa: F401
        except Exception as e:  # it imports onnx, packaging...; any failure means "not usable"
            return False, f"onnxruntime.transformers.optimizer cannot be imported: {e}"
        try:  # imported lazily by the optimizer, and only fails once it runs
            import sympy  # noqa: F401
        except ImportError:
            return False, "onnxruntime's transformer optimizer needs sympy, which is not installed (pip install sympy)"
        return True, ""

    def detail(self, threads):
        return (f"onnxruntime.transformers.optimizer.optimize_model(model_type={self.model_type!r}, "
                f"num_heads={self.heads}, hidden_size={self.hidden}, opt_level=0) on blockc's unfused ONNX, "
                f"then ONNX Runtime CPU at levels basic and all, {threads} intra-op threads"
                + (f"; run with {self.workaround}" if self.workaround else ""))

    def compile(self, graph: Graph, weights: Mapping[str, np.ndarray], *, variant: str | None = None,
                threads: int | None = None) -> Compiled:
        import logging

        import onnxruntime
        from onnxruntime.transformers.optimizer import optimize_model

        from ..codegen.onnx_export import export_onnx
        from ..runtime.ort_runner import session_options
        proto = export_onnx(graph, weights)
        # The optimizer logs each fusion it tries at INFO/WARNING; the report says what it fused.
        logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
        optimized = self._optimize(optimize_model, proto)
        self.fused = {k: v for k, v in (optimized.get_fused_operator_statistics() or {}).items() if v}
        folder = tempfile.TemporaryDirectory(prefix="blockc-compare-")
        saved = os.path.join(folder.name, "optimized.onnx")
        try:
            session = onnxruntime.InferenceSession(optimized.model.SerializeToString(),
                                                   session_options(variant or self.variants[0], threads, saved),
                                                   providers=["CPUExecutionProvider"])
        except Exception as e:
            folder.cleanup()
            raise BlockcError(f"ONNX Runtime could not load the optimizer's model: {e}") from None
        names = [o.name for o in session.get_outputs()]
        inputs = [i.name for i in session.get_inputs()]

        def run(feeds):
            return dict(zip(names, session.run(names, {k: feeds[k] for k in inputs})))
        return Compiled(run, graph=graph, kernels=count_onnx_nodes(saved), close=folder.cleanup)


    def _optimize(self, optimize_model, proto):
        """The optimizer's model. Its simplified-LayerNorm (RMSNorm) fusion
        crashes on the ``Mul(x, x) -> ReduceMean`` spelling of a mean square
        (onnxruntime 1.31 ``fusion_simplified_layernorm.py`` indexes the Mul
        node itself, ``reduce_mean_parent[0]``: a TypeError), which is how
        blockc's RMSNorm is written. Then it runs again with its norm
        fusions off, and its detail says so, rather than the peer's row
        being empty."""
        from onnxruntime.transformers.fusion_options import FusionOptions
        options = FusionOptions(self.model_type)
        for attempt in (1, 2):
            try:
                return optimize_model(proto, model_type=self.model_type, num_heads=self.heads,
                                      hidden_size=self.hidden, opt_level=0, use_gpu=False,
                                      optimization_options=options)
            except TypeError as e:
                if attempt == 1 and "not subscriptable" in str(e):
                    options.enable_layer_norm = options.enable_skip_layer_norm = False
                    self.workaround = ("its LayerNorm/RMSNorm fusions off: with them on it fails "
                                       f"({type(e).__name__}: {e}) on a Mul(x, x) mean square")
                    continue
                raise BlockcError(f"onnxruntime's transformer optimizer failed: {type(e).__name__}: {e}") from None
            except Exception as e:  # a peer's own failure is reported in its row, not raised
                raise BlockcError(f"onnxruntime's transformer optimizer failed: {type(e).__name__}: {e}") from None


class TorchPeer(TorchBackend):
    """The torch backends (``torch-eager``, ``torch-compile``) as peers."""

    row_backend = "torch"
    runs = "the standard-form graph, one torch call per IR node"

    def __init__(self, name: str):
        super().__init__(compile=name == "torch-compile")
        self.name = name


def make_peer(name: str, model) -> Backend:
    """A peer: a ``Backend`` that compare runs on the standard-form graph, its
    rows under ``row_backend``."""
    if name == "ort-optimizer":
        return OrtOptimizerPeer(model)
    if name in ("torch-eager", "torch-compile"):
        return TorchPeer(name)
    raise BlockcError(f"unknown peer {name!r}; peers: {', '.join(PEERS)}")
