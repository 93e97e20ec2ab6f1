"""The peers blockc's fused graph is measured against, in the same run, on
the same weights, shapes, thread count and repeats:

* ``ort-optimizer``: ONNX Runtime's own transformer optimizer
  (``onnxruntime.transformers.optimizer.optimize_model``) -- the tool users
  reach for today -- applied to the model's own ONNX: the user's file itself
  where MODEL is an ONNX file, else blockc's *unfused* export; then run on
  ONNX Runtime at both graph optimization levels, like blockc's own rows;
* ``ort-original``: the user's ONNX file itself, unmodified, on ONNX Runtime
  at both levels (only where MODEL is an ONNX file);
* ``torch-eager``: the standard-form graph as a PyTorch module (one idiomatic
  torch call per IR node: ``F.layer_norm``, ``torch.softmax``, ...);
* ``torch-compile``: that module under ``torch.compile`` (inductor).

A peer that is not installed, or does not apply to the model, is listed as
skipped with the reason.
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Mapping

import numpy as np

from ..errors import BlockcError
from ..ir.graph import Graph
from ..ir.opdef import get
from ..ops.fused import takes_queries
from ..runtime.backend import Backend, Compiled, make_backend
from ..runtime.backends.ort import OrtBackend, count_onnx_nodes
from ..runtime.backends.pytorch import TorchBackend

def attention_shape(fused: Graph) -> tuple[str, int, int]:
    """(optimizer model_type, num_heads, hidden_size) for ONNX Runtime's
    transformer optimizer, from the first attention of ``fused`` (blockc's
    fused form: one reading for DSL models and imported files alike):
    "gpt2" where it is causal, "bert" otherwise; the heads and their joint
    width (heads x head size, what the optimizer's Attention fusion calls
    the hidden size) from ``qkv_attention``'s attributes or the queries
    ``[batch, heads..., seq, head]`` of any op that takes them
    (``ops.fused.takes_queries``: attention and its cache steps;
    grouped-query heads are split in two axes). (.., 0, 0) where they
    cannot be read (no fused attention, a symbolic or folded head axis)
    lets the optimizer detect them itself.

    A file whose causal mask is merged with its padding mask into one
    additive mask (Hugging Face GPT-2 by torch.onnx) reads as "bert": on
    such files onnxruntime 1.31's optimizer fuses the same under either type
    (FastGelu, LayerNorm, SkipLayerNorm; measured on the test exports)."""
    for n in fused.nodes:
        if "causal" not in get(n.op).attrs:   # the fused softmax and attention ops all carry the mask rule
            continue
        model_type = "gpt2" if n.attrs["causal"] else "bert"
        if n.op == "qkv_attention":
            return model_type, n.attrs["heads"], n.attrs["sizes"][0]
        q = n.inputs[0].type.shape
        fixed = all(isinstance(d, int) for d in q[1:-2] + q[-1:])
        if takes_queries(n.op) and len(q) >= 4 and fixed:
            heads = math.prod(q[1:-2])
            return model_type, heads, heads * q[-1]
        return model_type, 0, 0
    return "bert", 0, 0


def _onnx_file(model):
    """The ``OnnxModel`` where MODEL is an ONNX file, else None."""
    from ..frontends.onnx import OnnxModel
    return model if isinstance(model, OnnxModel) else None


def _ort_session(proto, variant: str, threads: int | None, folder: str, what: str):
    """An ONNX Runtime CPU session of ``proto`` (in ``folder``: the optimized
    graph it saves, for the kernel count, and the model itself where its
    weights need external data), and the saved graph's path."""
    import onnxruntime

    from ..codegen.onnx_export import wants_external_data, write_model
    from ..runtime.ort_runner import session_options
    saved = os.path.join(folder, "optimized.onnx")
    if wants_external_data(proto, None):   # protobuf cannot serialize 2 GB or more in one message
        source = os.path.join(folder, "model.onnx")
        write_model(proto, source, external_data=True)
    else:
        source = proto.SerializeToString()
    try:
        return onnxruntime.InferenceSession(source, session_options(variant, threads, saved),
                                            providers=["CPUExecutionProvider"]), saved
    except Exception as e:  # onnxruntime's exceptions share no public base class
        raise BlockcError(f"ONNX Runtime could not load {what}: {e}") from None


def _compiled(proto, graph: Graph, variant: str, threads: int | None, what: str) -> Compiled:
    """``proto`` run on ONNX Runtime's CPU provider as a ``Compiled`` of ``graph``."""
    folder = tempfile.TemporaryDirectory(prefix="blockc-compare-")
    try:
        session, saved = _ort_session(proto, variant, threads, folder.name, what)
    except BaseException:
        folder.cleanup()
        raise
    names = [o.name for o in session.get_outputs()]
    inputs = [i.name for i in session.get_inputs()]

    def run(feeds):
        # an initializer the file also lists as an input (IR version < 4) keeps its value
        return dict(zip(names, session.run(names, {k: feeds[k] for k in inputs if k in feeds})))
    return Compiled(run, graph=graph, kernels=count_onnx_nodes(saved), close=folder.cleanup)


def _replaced_words(n: int) -> str:
    return f", {n} initializer{'s' if n != 1 else ''} replaced by --weights" if n else ""


class OrtOptimizerPeer(Backend):
    """ONNX Runtime's transformer optimizer on the user's ONNX file (MODEL is
    one) or blockc's unfused ONNX (a DSL model), run on ONNX Runtime."""

    name = "ort-optimizer"
    row_backend = "ort-cpu"   # the backend column of its rows: it runs where ort-cpu does
    variants = ("basic", "all")
    weight_copies = 5.0   # the exported and the optimized onnx models, both serialized, and the session
    arena_copies = OrtBackend.arena_copies   # ONNX Runtime's CPU arena, as ort-cpu's
    build_copies = 2.0    # measured 1.94x more while the optimizer runs and the session is made

    def __init__(self, model, fused: Graph):
        self.file = _onnx_file(model)
        self.model_type, self.heads, self.hidden = attention_shape(fused)
        self.fused: dict[str, int] = {}
        self.workaround = ""   # how it had to be run, where its defaults fail on this model
        self.replaced = 0      # initializers of the user's file replaced by --weights

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
                f"num_heads={self.heads}, hidden_size={self.hidden}, opt_level=0) on {self._source()}, "
                f"then ONNX Runtime CPU at levels basic and all, {threads} intra-op threads"
                + (f"; run with {self.workaround}" if self.workaround else ""))

    def _source(self) -> str:
        if self.file is None:
            return "blockc's unfused ONNX"
        return f"the user's file {os.path.basename(self.file.file.path)}" + _replaced_words(self.replaced)

    def compile(self, graph: Graph, weights: Mapping[str, np.ndarray], *, variant: str | None = None,
                threads: int | None = None, count_kernels: bool = False) -> Compiled:
        import logging

        from onnxruntime.transformers.optimizer import optimize_model

        if self.file is not None:
            proto, self.replaced = self.file.own_proto(weights)
        else:
            from ..codegen.onnx_export import export_onnx
            proto = export_onnx(graph, weights)
        # The optimizer logs each fusion it tries at INFO/WARNING; the report says what it fused.
        logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
        optimized = self._optimize(optimize_model, proto)
        del proto
        self.fused = {k: v for k, v in (optimized.get_fused_operator_statistics() or {}).items() if v}
        return _compiled(optimized.model, graph, variant or self.variants[0], threads, "the optimizer's model")

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


class OrtOriginalPeer(Backend):
    """The user's ONNX file itself, unmodified (its initializers replaced
    only by ``--weights``), run on ONNX Runtime at both levels: what the
    file gives without blockc or ONNX Runtime's transformer optimizer."""

    name = "ort-original"
    row_backend = "ort-cpu"
    variants = ("basic", "all")
    # The same session as ort-cpu's, so its figures: measured (resident memory before and after compile, and
    # after one run, onnxruntime 1.31, batch 1, seq 128) on blockc exports of a 2-layer GPT-2 (204 MB) and a
    # 4-layer BERT (209 MB) read as files, this peer kept what ort-cpu's session of the same graph did, within
    # 2% (2.2x and 2.6x the weights' footprint; 4.8x and 5.6x at the peak while the session is made).
    weight_copies = OrtBackend.weight_copies
    arena_copies = OrtBackend.arena_copies
    build_copies = OrtBackend.build_copies

    def __init__(self, model):
        self.file = _onnx_file(model)
        self.replaced = 0

    def availability(self):
        if self.file is None:
            return False, ("MODEL is not an ONNX file: this peer runs the user's own file "
                           "(for a DSL model, ort-cpu's standard form is that file)")
        return True, ""

    def detail(self, threads):
        return (f"the user's file {os.path.basename(self.file.file.path)} as it is{_replaced_words(self.replaced)}, "
                f"on ONNX Runtime CPU at levels basic and all, {threads} intra-op threads")

    def compile(self, graph: Graph, weights: Mapping[str, np.ndarray], *, variant: str | None = None,
                threads: int | None = None, count_kernels: bool = False) -> Compiled:
        proto, self.replaced = self.file.own_proto(weights)
        return _compiled(proto, graph, variant or self.variants[0], threads, "the user's file")


class TorchPeer(TorchBackend):
    """The torch backends (``torch-eager``, ``torch-compile``) as peers."""

    row_backend = "torch"
    runs = "the standard-form graph, one torch call per IR node"


# each peer's name and how it is made from (model, fused): the one list of peers
_MAKERS = {
    "ort-optimizer": lambda model, fused: OrtOptimizerPeer(model, fused),
    "ort-original": lambda model, fused: OrtOriginalPeer(model),
    # what the name fixes, its registration applies
    "torch-eager": lambda model, fused: make_backend("torch-eager", TorchPeer),
    "torch-compile": lambda model, fused: make_backend("torch-compile", TorchPeer),
}
PEERS = tuple(_MAKERS)


def make_peer(name: str, model, fused: Graph) -> Backend:
    """A peer of ``model`` (``fused``: its fused form, where the optimizer's
    settings are read): a ``Backend`` that compare runs on the standard-form
    graph, its rows under ``row_backend``."""
    if name not in _MAKERS:
        raise BlockcError(f"unknown peer {name!r}; peers: {', '.join(PEERS)}")
    return _MAKERS[name](model, fused)
