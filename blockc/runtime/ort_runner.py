"""Run a blockc graph on ONNX Runtime.

``OrtSession`` exports the graph once and keeps an ``InferenceSession`` to run
many times (what a benchmark times); ``run_ort`` is the one-shot form. The
weights reach ONNX Runtime as OrtValues over the caller's arrays, never
through protobuf (see ``OrtSession``).
"""
from __future__ import annotations

import ctypes
import json
import os
from typing import Mapping

import numpy as np

from ..codegen.onnx_export import checked_weights, export_onnx_decided
from ..errors import BlockcError
from ..files import cache_key, cached_value
from ..frontends.weights import FileRegion, check_still_mapped, contiguous, file_region
from ..ir.dtypes import DType
from ..ir.graph import Graph, Value
from ..ir.printer import print_graph
from ..version import code_version
from .interface import CachedStep, CompileHints
from .bindings import bind_inputs
from .folded_params import folded_over_files
from .threads import intra_op_threads

_CUDA, _CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
_LEVELS = ("disabled", "basic", "extended", "all")
# The weights file a session's model declares and ONNX Runtime never opens: every
# parameter is bound to an OrtValue at load (``OrtSession``).
_BOUND_AT_LOAD = "bound-at-load.data"


def _ort():
    try:
        import onnxruntime
    except ImportError as err:  # pragma: no cover - onnxruntime is a dependency
        raise BlockcError("onnxruntime is not installed (pip install onnxruntime)") from err
    return onnxruntime


def session_options(optimization: str = "basic", threads: int | None = None,
                    optimized_model_path: str | None = None, prepack: bool = True):
    """ONNX Runtime ``SessionOptions`` as blockc uses them everywhere: one of
    the graph optimization levels ``disabled``, ``basic``, ``extended``,
    ``all``; ``threads`` intra-op threads (None: ``$BLOCKC_THREADS``, else
    ONNX Runtime's default: ``threads.intra_op_threads``);
    ``prepack``: whether ONNX Runtime repacks each MatMul weight into a copy
    of its own, per session (2-3x faster products of many rows, measured
    with 128 and 4 rows; no faster with one row, where MLAS reads the weight
    as it is)."""
    ort = _ort()
    if optimization not in _LEVELS:
        raise BlockcError(f"unknown optimization level {optimization!r}: use {', '.join(_LEVELS)}")
    threads = intra_op_threads(threads)
    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    # fatal only: its warnings (unused initializers) are noise here, and a run that fails raises, which
    # blockc reports as its own one-line error; ONNX Runtime would print its coloured log line first
    options.log_severity_level = 4
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if threads is not None:
        options.intra_op_num_threads = threads
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
        # the weights beside it, not in it: whoever reads the graph (a kernel count) reads no weight bytes
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         os.path.basename(str(optimized_model_path)) + ".data")
    return options


def weightless_export(graph: Graph, *, fused_as: str, provider: str, opset: int | None,
                      decide: bool = False) -> tuple[bytes, list[dict] | None]:
    """``graph`` exported to ONNX for ONNX Runtime, every parameter declared as
    external data it never opens (bound at load), serialized: from the
    compile cache (``files.cached_value``, under ``$BLOCKC_CACHE/onnx``) when
    this graph was exported with these options by this code and this onnx
    before. The key never holds a weight: they are bound when a session
    loads. With ``decide``, the fused-op encodings chosen, and why, come
    back too; only a fresh export hears them, so asking skips the cache
    (None where not asked)."""
    def make() -> tuple[bytes, list[dict]]:
        exported = export_onnx_decided(graph, None, fused_as=fused_as, provider=provider, opset=opset,
                                       data_location=_BOUND_AT_LOAD)
        return exported.model.SerializeToString(), exported.decisions
    if decide:
        return make()
    import onnx
    key = cache_key(print_graph(graph), json.dumps([fused_as, provider, opset]), code_version(), onnx.__version__)
    return cached_value("onnx", key, "model.onnx", lambda: make()[0], _parsed), None


def _parsed(data: bytes) -> bytes:
    """``data``, once it parses as an ONNX model with a graph (a cache entry's check)."""
    import onnx
    if not onnx.ModelProto.FromString(data).HasField("graph"):
        raise ValueError("no graph")
    return data


def in_files(model: bytes, regions: Mapping[str, FileRegion]) -> tuple[bytes, str]:
    """``model`` (serialized) with each initializer named in ``regions``
    declared as external data at its region of its file, and the folder
    the locations are relative to (ONNX Runtime refuses absolute ones)."""
    import onnx
    proto = onnx.ModelProto.FromString(model)
    folder = os.path.commonpath([os.path.dirname(r.path) for r in regions.values()])
    for t in proto.graph.initializer:
        r = regions.get(t.name)
        if r is None:
            continue
        del t.external_data[:]
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", os.path.relpath(r.path, folder).replace(os.sep, "/")),
                           ("offset", str(r.offset)), ("length", str(r.length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    return proto.SerializeToString(), folder


class OrtSession:
    """``graph`` exported once and loaded into ONNX Runtime; ``run`` many times.

    ``provider``: ``"cpu"``, ``"cuda"`` (an error when the CUDA execution
    provider cannot be used) or ``"auto"`` (CUDA when it works, else CPU).
    ``optimization``: ONNX Runtime's graph optimization level, one of
    ``disabled``, ``basic``, ``extended``, ``all``. ``threads``: intra-op
    threads (None: ONNX Runtime's default). ``fused_as`` and ``opset`` go to
    ``export_onnx_decided``, with the execution provider the session will use
    as the provider the fused-op encodings are chosen for; with ``decide``,
    ``decisions`` is what it decided for each fused node (None without: the
    export may come from the compile cache, which keeps no decisions).
    ``optimized_model_path``: where ONNX Runtime saves the graph it actually
    runs, after its own optimizations (what ``blockc compare`` counts as
    kernels), its weights beside it in ``<name>.data``. ``prepack``: see
    ``session_options``.

    The weights never pass through protobuf: the model ONNX Runtime loads is
    the weightless export (each parameter an initializer declared as external
    data, holding no bytes, checked without them), and each parameter's
    initializer is bound to an OrtValue over the caller's own array
    (``SessionOptions.add_external_initializers``). Serializing them would
    copy every weight twice and take seconds on a 125M model; a model of any
    size loads the same way. The arrays are kept as long as the session.
    A node computed from parameters alone that lie in ``.safetensors``
    files (a QKV merge, a tied head's transpose) is not left to ONNX
    Runtime, which would fold it in each session: it comes folded, its
    array made once into the cache and mapped from there
    (``folded_params.folded_over_files``).
    """

    def __init__(self, graph: Graph, weights: Mapping[str, np.ndarray], *, provider: str = "cpu",
                 optimization: str = "basic", threads: int | None = None, fused_as: str = "auto",
                 opset: int | None = None, decide: bool = False,
                 optimized_model_path: str | None = None, prepack: bool = True):
        ort = _ort()
        if provider not in ("cpu", "cuda", "auto"):
            raise BlockcError(f"unknown provider {provider!r}: use cpu, cuda or auto")
        options = session_options(optimization, threads, optimized_model_path, prepack)
        available = ort.get_available_providers()
        if provider == "cuda" and _CUDA not in available:
            raise BlockcError("the CUDA execution provider is not available in this onnxruntime "
                              f"(available: {', '.join(available)}); install onnxruntime-gpu or use provider='cpu'")
        providers = [_CUDA, _CPU] if provider in ("cuda", "auto") and _CUDA in available else [_CPU]

        self.graph = graph
        # the memory ONNX Runtime reads, kept alive; parameter-only nodes over file views come folded, from the cache
        exported, self._weights = folded_over_files(graph, dict(checked_weights(graph, weights)))
        model, self.decisions = weightless_export(exported, fused_as=fused_as, opset=opset, decide=decide,
                                                  provider="cuda" if _CUDA in providers else "cpu")
        model = self._bind_weights(ort, options, model, exported.params)
        try:
            # ONNX Runtime opens the weights files by their paths: each must still be the file the arrays map,
            # before and after it has read them
            check_still_mapped(self._weights.values())
            self._session = ort.InferenceSession(model, options, providers=providers)
            check_still_mapped(self._weights.values())
        except BlockcError:
            self.close()
            raise
        except Exception as err:  # onnxruntime's exceptions share no public base class
            self.close()
            raise BlockcError(f"onnxruntime could not load the exported model: {_short(err)}") from err

        if provider == "cuda" and _CUDA not in self._session.get_providers():
            self.close()
            raise BlockcError("the CUDA execution provider could not be initialized (no usable GPU, or missing "
                              "CUDA/cuDNN libraries); use provider='cpu' or 'auto'")
        self._ort = ort
        self._outputs = [o.name for o in self._session.get_outputs()]
        # numpy has no bfloat16 for onnxruntime: such graphs go through OrtValues.
        self._bfloat16 = any(v.dtype == DType.bfloat16 for v in graph.inputs) or \
            any(v.dtype == DType.bfloat16 for _, v in graph.outputs)

    def _bind_weights(self, ort, options, model: bytes, params: Mapping[str, Value]) -> bytes:
        """The weights handed to ONNX Runtime, and the model that declares
        them: a parameter whose array lies in a ``.safetensors`` file
        (``weights.file_region``) is declared as external data at its place
        in that file, which ONNX Runtime memory-maps itself (no copy, one
        copy in memory for every session over the file); the rest are bound
        as OrtValues over their arrays (which ONNX Runtime 1.31 copies).
        ``params``: the exported graph's."""
        regions = {name: r for name, a in self._weights.items() if (r := file_region(a)) is not None}
        if regions and len({os.path.splitdrive(r.path)[0] for r in regions.values()}) > 1:
            regions = {}   # files on two drives have no common folder to name them from: bound instead
        bound = [name for name in self._weights if name not in regions]
        # in order, as ONNX Runtime reads them: a view out of order (a checkpoint's transpose no cache holds) copied
        self._weights.update({name: contiguous(self._weights[name]) for name in bound})
        self._weight_values = [_to_ortvalue(ort, self._weights[name], params[name].dtype) for name in bound]
        if bound:
            options.add_external_initializers(bound, self._weight_values)
        if not regions:
            return model
        model, folder = in_files(model, regions)
        # an in-memory model's external files are found under this folder, and may not leave it
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        return model

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The arrays ONNX Runtime reads the parameters from: the caller's own
        where they were contiguous and of the parameter's dtype (empty once closed)."""
        return self._weights

    @property
    def providers(self) -> list[str]:
        """The execution providers the session actually uses, first preferred."""
        return self._session.get_providers()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs for ``feeds`` (checked against the graph inputs first)."""
        bind_inputs(self.graph, feeds)
        return self.run_unchecked(feeds)

    def run_unchecked(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs for ``feeds`` that were checked already (``Compiled`` checks
        once, then times this)."""
        if self._session is None:
            raise BlockcError("this OrtSession is closed")
        try:
            if not self._bfloat16:
                outs = self._session.run(self._outputs, {v.name: feeds[v.name] for v in self.graph.inputs})
                return dict(zip(self._outputs, outs))
            values = {v.name: _to_ortvalue(self._ort, feeds[v.name], v.dtype) for v in self.graph.inputs}
            outs = self._session.run_with_ort_values(self._outputs, values)
            return {name: _to_numpy(o) for name, o in zip(self._outputs, outs)}
        except BlockcError:
            raise
        except Exception as err:
            raise BlockcError(f"onnxruntime failed to run the model: {_short(err)}") from err

    def cached(self, carry: Mapping[str, str], state: Mapping[str, np.ndarray], *, check: bool = True) -> CachedStep:
        """A step whose carried state stays in ONNX Runtime between runs
        (``OrtCachedStep``); bfloat16 graphs, which numpy cannot bind, keep
        it on the host (``CachedStep``)."""
        if self._session is None:
            raise BlockcError("this OrtSession is closed")
        if self._bfloat16:
            from .interface import Compiled
            return CachedStep(Compiled(self.run), carry, state)
        return OrtCachedStep(self._session, self.graph, carry, state, check=check)

    def close(self) -> None:
        """Release the session and the weights it reads (also done when garbage collected)."""
        self._session = None
        self._weight_values, self._weights = [], {}

    def __enter__(self) -> "OrtSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class OrtCachedStep(CachedStep):
    """A step run through IO binding, its carried state kept in OrtValues.

    A carried output whose type is its input's (a preallocated KV cache,
    ``[batch, kv_heads, cache_len, head_dim]`` in and out) is bound to the
    very OrtValue its input reads: ONNX Runtime's ``ScatterElements``
    (``cache_write``) and ``GroupQueryAttention`` (``cache_attention``) see
    input and output share a buffer and write the step's rows into it, so
    the buffer never moves and is never copied. A carried output of another
    shape (the concat cache, one row longer each step) is left to ONNX
    Runtime to allocate, and the OrtValue it returns is bound as the next
    run's input: no copy to numpy and back, one new buffer per step.
    ``check``: check every run's feeds against the graph (the state by its
    shapes and dtypes).
    """

    def __init__(self, session, graph: Graph, carry: Mapping[str, str], state: Mapping[str, np.ndarray], *,
                 check: bool = True):
        ort = _ort()
        self.carry, self.graph, self._session, self._check = dict(carry), graph, session, check
        self._io = session.io_binding()
        self._ortvalue = ort.OrtValue
        types = {v.name: v.type for v in graph.inputs} | {name: v.type for name, v in graph.outputs}
        self._values, self._keep, self._moving = {}, {}, []
        self._order = []   # outputs in the order bound: the order get_outputs returns them
        for output, input_name in self.carry.items():
            array = np.ascontiguousarray(state[input_name])
            self._keep[input_name] = array   # the OrtValue reads this memory: keep it alive
            value = ort.OrtValue.ortvalue_from_numpy(array)
            self._values[input_name] = value
            self._io.bind_ortvalue_input(input_name, value)
            if types[output] == types[input_name]:
                self._io.bind_ortvalue_output(output, value)   # in place: the same buffer
            else:
                self._io.bind_output(output, "cpu")
                self._moving.append((output, input_name))
            self._order.append(output)
        self._outputs = [name for name, _ in graph.outputs if name not in self.carry]
        for name in self._outputs:
            self._io.bind_output(name, "cpu")
            self._order.append(name)
        self.state = {name: np.broadcast_to(np.zeros((), a.dtype), a.shape) for name, a in self._keep.items()}

    def runner(self, feeds: Mapping[str, np.ndarray]):
        """Bind ``feeds`` (checked once, unless ``check`` is off) and return a
        call that runs them, unchecked, as often as timing wants."""
        if self._check:
            bind_inputs(self.graph, {**feeds, **self.state})
        arrays = {name: np.ascontiguousarray(a) for name, a in feeds.items()}
        for name, a in arrays.items():
            self._io.bind_cpu_input(name, a)
        self._feeds = arrays   # bound by address: alive until the next bind

        def run() -> dict[str, np.ndarray]:
            try:
                self._session.run_with_iobinding(self._io)
            except Exception as err:
                raise BlockcError(f"onnxruntime failed to run the model: {_short(err)}") from err
            got = dict(zip(self._order, self._io.get_outputs()))
            for output, input_name in self._moving:
                value = got.pop(output)
                self._values[input_name] = value
                self._io.bind_ortvalue_input(input_name, value)
                self.state[input_name] = np.broadcast_to(np.zeros((), self.state[input_name].dtype), value.shape())
            # A binding keeps the value ONNX Runtime allocated and would write the next run into it, at
            # this run's shape: bound afresh, each run gets a new one of its own shape.
            for name in [o for o, _ in self._moving] + self._outputs:
                self._io.bind_output(name, "cpu")
            return {name: got[name].numpy() for name in self._outputs}
        return run

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner(feeds)()

    def value(self, name: str) -> np.ndarray:
        return self._values[name].numpy().copy()

    def address(self, name: str) -> int:
        return self._values[name].data_ptr()

    def close(self) -> None:
        self._values, self._keep, self.state, self._io = {}, {}, {}, None


def run_ort(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray], *,
            provider: str = "cpu", optimization: str = "basic", threads: int | None = None,
            **kw) -> dict[str, np.ndarray]:
    """Export ``graph``, run it once on ONNX Runtime, return ``{output name: array}``.

    ``kw`` goes to ``OrtSession`` (``fused_as``, ``opset``). A graph run
    once is not prepacked (``CompileHints.packs_weights``).
    """
    bind_inputs(graph, feeds)  # before the export: a bad feed should not cost one
    kw.setdefault("prepack", CompileHints(runs=1).packs_weights)
    with OrtSession(graph, weights, provider=provider, optimization=optimization, threads=threads, **kw) as s:
        return s.run_unchecked(feeds)


# -- numpy <-> OrtValue, for bfloat16 ----------------------------------------------
# onnxruntime's numpy bridge has no bfloat16: feed its bits as uint16 with the
# ONNX type named, and copy bfloat16 results out of host memory by hand.
# (Other graphs use InferenceSession.run, which also copies results off a GPU.)
def _to_ortvalue(ort, array: np.ndarray, dtype: DType):
    array = np.ascontiguousarray(array)
    if dtype == DType.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), dtype.onnx_code)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _to_numpy(value) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    if value.device_name().lower() != "cpu":
        raise BlockcError("a bfloat16 output was left on the GPU; cannot copy it to numpy")
    out = np.empty(value.shape(), np.uint16)
    if out.size:
        ctypes.memmove(out.ctypes.data, value.data_ptr(), out.nbytes)
    return out.view(DType.bfloat16.numpy)


def _short(err: Exception) -> str:
    text = str(err).strip()
    return text if len(text) < 2000 else text[:2000] + " ..."
