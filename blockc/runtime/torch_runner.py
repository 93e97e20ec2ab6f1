"""Run a blockc graph in PyTorch: eager, or under ``torch.compile``.

``lower_to_torch`` turns a ``Graph`` plus weights into a ``torch.fx.GraphModule``
built directly with ``torch.fx.Graph``: one placeholder per graph input, the
weights as parameters of the module, one torch call per IR node (each op's
``torch`` rule in its declaration: ``F.layer_norm``, ``torch.softmax``,
``F.scaled_dot_product_attention``, ...; an op without one is legalized by
decomposition first) and a dict of the graph's outputs.
Symbolic dims (``batch``, ``seq``) become ``x.size(i)`` of the input that
carries them, so one module runs at any shape. Nodes computed from weights
and constants alone (the fused form's concatenated QKV weight, the transposed
tied LM head) are computed once, at build time, and held as buffers, as ONNX
Runtime's constant folding and the CUDA backend's load-time steps do.

``TorchSession`` is what a benchmark times: build once, ``run`` many times.
torch is an optional dependency (a test extra): it is imported only here, on
first use, and ``torch_available()`` says whether it can be.
"""
from __future__ import annotations

import keyword
import operator
import re
from typing import Callable, Mapping

import numpy as np

from ..errors import BlockcError
from ..ir.graph import Graph, Node
from ..ir.load_time import load_time_nodes
from ..ops import registry
from ..passes.legalize import legalize
from ..ir.dims import is_plain_symbol
from .bindings import bind_inputs, checked_weights
from .threads import intra_op_threads


def torch_available() -> tuple[bool, str]:
    """``(True, "torch VERSION")`` when torch imports, else ``(False, why)``."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (pip install torch)"
    except Exception as err:  # a broken install (missing shared library, ...)
        return False, f"torch failed to import: {type(err).__name__}: {err}"
    return True, f"torch {torch.__version__}"


def _torch():
    ok, why = torch_available()
    if not ok:
        raise BlockcError(f"the PyTorch backend needs torch: {why}")
    import torch
    return torch


def node_labels(graph: Graph) -> dict[int, str]:
    """``id(node) -> "%7"`` (or ``"%7,%8"``): the names ``blockc show`` prints."""
    from ..ir.printer import result_numbers
    numbers = result_numbers(graph)
    return {id(n): ",".join(f"%{numbers[id(n)] + i}" for i in range(len(n.outputs))) for n in graph.nodes}


def lowers(opdef) -> bool:
    """Whether the PyTorch backend lowers ``opdef`` itself."""
    return opdef.torch_fn is not None


def lowerable(graph: Graph) -> Graph:
    """``graph`` with every op that has no ``torch`` rule but a decomposition
    (``qkv_attention`` with none would become ``attention``) decomposed."""
    return legalize(graph, lowers).graph


def check_supported(graph: Graph) -> None:
    """Raise a ``BlockcError`` naming every op the PyTorch table lacks, with its
    first node, before anything is built or run."""
    labels, missing = node_labels(graph), {}
    for n in graph.nodes:
        if not lowers(registry.get(n.op)) and n.op not in missing:
            missing[n.op] = f"op {n.op!r} (node {labels[id(n)]} = {n.op}" + (f", from {n.loc}" if n.loc else "") + ")"
    if missing:
        raise BlockcError("the PyTorch backend has no lowering for " + "; ".join(missing.values()))


_NOT_IDENT = re.compile(r"\W")


class _Names:
    """Unique Python identifiers for module attributes and placeholders (graph
    labels like ``blocks.0.attn.w_q.weight`` are keys, not identifiers)."""

    def __init__(self, reserved=()):
        self.taken: set[str] = {"self", *reserved}

    def make(self, label: str) -> str:
        base = _NOT_IDENT.sub("_", label) or "v"
        base = "v_" + base if base[0].isdigit() else base
        base = base + "_" if keyword.iskeyword(base) else base
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


class _Emitter:
    """What an op's ``torch`` rule is given as ``b``: ``b.call(fn, *args, **kw)``
    (a torch function), ``b.method(name, x, *args)`` (``x.name(*args)``),
    ``b.dim(d)`` (an IR dim as an int or the expression computing it from
    input sizes), ``b.tensor(array, dtype)`` (a constant), ``b.dtype(dtype)``,
    and the modules ``b.torch`` and ``b.F`` (``torch.nn.functional``), so that
    the ops themselves never import torch."""

    def __init__(self):
        import torch
        import torch.nn.functional as F

        from .torch_tensors import TORCH_DTYPES, to_torch
        self.torch, self.F, self._dtypes, self._to_torch = torch, F, TORCH_DTYPES, to_torch

    def tensor(self, array, dtype):
        return self._to_torch(array, dtype, copy=True)

    def dtype(self, dtype):
        return self._dtypes[dtype]


class _FxEmitter(_Emitter):
    """Emits fx nodes; ``dim`` computes symbolic dims from the input sizes."""

    def __init__(self, g, symbols: dict):
        super().__init__()
        self.g, self.symbols, self.origin = g, symbols, ""
        self._dims: dict = {}  # each symbolic dim computed once (past+seq, ...)

    def _tag(self, node):
        node.meta["blockc"] = self.origin  # which IR node an fx node comes from
        return node

    def call(self, fn, *args, **kw):
        return self._tag(self.g.call_function(fn, tuple(args), kw))

    def method(self, name, x, *args, **kw):
        return self._tag(self.g.call_method(name, (x,) + tuple(args), kw))

    def dim(self, d):
        if isinstance(d, int):
            return d
        if d not in self._dims:
            self._dims[d] = self._expression(d)
        return self._dims[d]

    def _expression(self, d):
        total = None
        for monomial, coeff in d.terms.items():
            term = None
            for s in monomial:
                if s not in self.symbols:
                    raise BlockcError(f"dimension '{s}' (in {d}) is not the size of any input axis, so the "
                                      f"PyTorch module cannot compute it")
                term = self.symbols[s] if term is None else self.call(operator.mul, term, self.symbols[s])
            if term is None:
                term = coeff
            elif coeff != 1:
                term = self.call(operator.mul, term, coeff)
            total = term if total is None else self.call(operator.add, total, term)
        return total


class _EagerEmitter(_Emitter):
    """Runs the same lowerings on tensors: folds weight-only nodes at build time."""

    @staticmethod
    def call(fn, *args, **kw):
        return fn(*args, **kw)

    @staticmethod
    def method(name, x, *args, **kw):
        return getattr(x, name)(*args, **kw)

    @staticmethod
    def dim(d):
        assert isinstance(d, int), f"a folded node has a symbolic dim {d}"
        return d


def eager_lowering(node: Node) -> Callable[..., list]:
    """``node``'s ``torch`` rule (its op's declaration) as a function of
    tensors that runs it at once, rather than recording it into a module:
    how ``lower_to_torch`` folds a weight-only node at build time, and how
    ``parallel/rank_timing`` times a collective alone. An op without a rule
    is refused by name, never skipped."""
    lower = registry.get(node.op).torch_fn
    if lower is None:
        raise BlockcError(f"the PyTorch backend has no lowering for op {node.op!r}"
                          + (f" (from {node.loc})" if node.loc else ""))
    emitter = _EagerEmitter()
    return lambda *tensors: _as_list(lower(emitter, node, list(tensors)))


def lower_to_torch(graph: Graph, weights: Mapping[str, np.ndarray], *, fold_constants: bool = True):
    """``graph`` as a ``torch.fx.GraphModule`` holding ``weights``.

    Call it with the graph's inputs as tensors, positionally in
    ``graph.inputs`` order; it returns ``{output name: tensor}``. Weights are
    copied (cast to the graph's dtypes) into parameters named after their
    labels (``blocks_0_attn_w_q_weight``). ``fold_constants=False`` keeps every
    weight-only node in the module (constants are buffers either way).
    """
    torch = _torch()
    import torch.fx as fx

    from .torch_tensors import to_torch
    graph = lowerable(graph)
    check_supported(graph)
    arrays = checked_weights(graph, weights)
    root, g, labels = torch.nn.Module(), fx.Graph(), node_labels(graph)
    names = _Names(reserved=dir(root))  # a weight called "forward" or "training" must not shadow those
    env: dict[int, object] = {}              # id(Value) -> fx node
    static: dict[int, tuple] = {}            # id(Value) -> (tensor, attribute label, is a weight)
    for name, v in graph.params.items():
        static[id(v)] = (to_torch(arrays[name], v.dtype, copy=True), name, True)

    symbols: dict[str, object] = {}
    for v in graph.inputs:
        env[id(v)] = g.placeholder(names.make(v.name))
    for v in graph.inputs:
        for axis, d in enumerate(v.shape):
            if is_plain_symbol(d) and next(iter(d.symbols)) not in symbols:
                sym = next(iter(d.symbols))
                symbols[sym] = g.create_node("call_method", "size", (env[id(v)], axis), name=sym)
    emit = _FxEmitter(g, symbols)

    def value(v):
        if id(v) not in env:   # a weight or folded value: fetched where first used
            tensor, label, is_weight = static[id(v)]
            attr = names.make(label)
            if is_weight:
                root.register_parameter(attr, torch.nn.Parameter(tensor, requires_grad=False))
            else:
                root.register_buffer(attr, tensor)
            env[id(v)] = g.get_attr(attr)
        return env[id(v)]

    load_time = load_time_nodes(graph)
    for n in graph.nodes:
        if id(n) in load_time and (fold_constants or not n.inputs):   # fold_constants=False: constants alone
            with torch.no_grad():
                outs = eager_lowering(n)(*[static[id(v)][0] for v in n.inputs])
            for i, (o, t) in enumerate(zip(n.outputs, outs)):
                static[id(o)] = (t, f"{n.op}_{labels[id(n)].split(',')[i][1:]}", False)
            continue
        emit.origin = f"{labels[id(n)]} = {n.op}"
        outs = _as_list(registry.get(n.op).torch_fn(emit, n, [value(v) for v in n.inputs]))
        for o, r in zip(n.outputs, outs):
            env[id(o)] = r
    g.output({name: value(v) for name, v in graph.outputs})
    g.eliminate_dead_code()  # size() of symbols no dim used
    g.lint()
    return fx.GraphModule(root, g, class_name="BlockcModule")


def _as_list(result) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


class TorchSession:
    """``graph`` lowered to PyTorch once; ``run`` many times.

    ``module`` is the ``torch.fx.GraphModule`` (``session.module.code`` is its
    Python). ``compile=True`` runs it through ``torch.compile(module,
    backend=backend, dynamic=dynamic)``: inductor by default, which compiles on
    the first ``run`` at each new shape (``dynamic=False`` specializes to the
    shape; torch's recompile limit, 8 by default, then falls back to eager);
    a compile failure (no C++ compiler, ...) is a ``BlockcError`` saying why.
    ``threads`` sets torch's intra-op threads for the duration of each ``run``
    (and of the compile it triggers) and restores the previous count after;
    None: ``$BLOCKC_THREADS`` where set, else torch's setting is left alone
    (``threads.intra_op_threads``). Runs are under ``torch.inference_mode()``,
    on the CPU. ``backend`` is ``torch.compile``'s (a name or a callable);
    ``fold_constants`` goes to ``lower_to_torch``.
    """

    def __init__(self, graph: Graph, weights: Mapping[str, np.ndarray], *, compile: bool = False,
                 threads: int | None = None, dynamic: bool | None = False, backend="inductor",
                 fold_constants: bool = True):
        torch = _torch()
        self.graph, self.threads, self._torch = graph, intra_op_threads(threads), torch
        self.module = lower_to_torch(graph, weights, fold_constants=fold_constants).eval()
        self.compiled = None
        if compile:
            try:
                self.compiled = torch.compile(self.module, backend=backend, dynamic=dynamic)
            except Exception as err:  # e.g. a Python version this torch's dynamo does not support
                raise BlockcError(f"torch.compile is not available: {_reason(err)}") from err
        # An output that is (a view of) a weight or an input is copied out, so
        # that writing to the returned array cannot change the module or a feed.
        self._weight_storage = {t.untyped_storage().data_ptr()
                                for t in list(self.module.parameters()) + list(self.module.buffers())}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs for ``feeds`` by the graph's output names, as numpy arrays
        (checked against the graph inputs first)."""
        bind_inputs(self.graph, feeds)
        return self.run_unchecked(feeds)

    def run_unchecked(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``run`` for feeds that were checked already (``Compiled`` checks
        once, then times this)."""
        from .torch_tensors import to_numpy, to_torch
        torch = self._torch
        args = [to_torch(feeds[v.name], v.dtype, copy=False) for v in self.graph.inputs]
        old = torch.get_num_threads()
        if self.threads is not None and self.threads != old:
            torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                out = (self.module if self.compiled is None else self.compiled)(*args)
        except BlockcError:
            raise
        except Exception as err:
            if self.compiled is not None and _is_compile_error(err):
                raise BlockcError(f"torch.compile could not compile the model: {_reason(err)}") from err
            raise BlockcError(f"PyTorch failed to run the model: {_reason(err)}") from err
        finally:
            if torch.get_num_threads() != old:
                torch.set_num_threads(old)
        shared = self._weight_storage | {t.untyped_storage().data_ptr() for t in args}
        return {name: to_numpy(out[name]).copy() if out[name].untyped_storage().data_ptr() in shared
                else to_numpy(out[name]) for name, _ in self.graph.outputs}


def run_torch(graph: Graph, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray],
              **kw) -> dict[str, np.ndarray]:
    """Lower ``graph``, run it once in PyTorch, return ``{output name: array}``;
    ``kw`` goes to ``TorchSession``."""
    bind_inputs(graph, feeds)  # before the lowering: a bad feed should not cost one
    return TorchSession(graph, weights, **kw).run_unchecked(feeds)


def _is_compile_error(err: Exception) -> bool:
    import torch._dynamo.exc as dynamo_exc
    kinds = [dynamo_exc.TorchDynamoException]
    try:
        from torch._inductor.exc import InductorError
        kinds.append(InductorError)
    except ImportError:  # older torch
        pass
    return isinstance(err, tuple(kinds))


def _reason(err: Exception) -> str:
    # BackendCompilerFailed wraps the backend's own exception: that is the reason.
    inner = getattr(err, "inner_exception", None) or err
    text = f"{type(inner).__name__}: {inner}".strip()
    lines = [line for line in text.splitlines() if line.strip()]
    text = "\n".join(lines[:12]) + ("\n..." if len(lines) > 12 else "")
    return text if len(text) < 2000 else text[:2000] + " ..."


