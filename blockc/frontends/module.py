"""Modules and parameters, PyTorch-style, and tracing a model into IR.

Parameters are declared (shape, dtype, initialiser) but hold no data: the
graph refers to them by hierarchical name (``blocks.3.attn.w_q.weight``) and
weights are made on demand, deterministically from a seed, by
``init_weights``. A GPT-3-shaped model therefore traces without 700 GB.
"""
from __future__ import annotations

import contextlib
import math
import os
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import BlockcError, ModelError, at_user_line, raised_at
from ..files import format_bytes
from ..ir.dims import Dim, Sym, evaluate
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ir.types import TensorType, size_problem
from ..progress import TRACING, Progress, ticker
from .tensor import Tensor, current_graph, tracing

Init = Callable[[tuple, np.random.Generator], np.ndarray]


class Parameter:
    """A declared weight. ``init`` is "normal", "zeros", "ones" or a function
    ``(shape, rng) -> array``; ``dtype`` None means the model's dtype.
    ``fixed``: its value follows from the model's settings (a rotary table),
    so weights given for it must equal what ``make`` makes -- fused forms may
    rely on its layout (``check_weights`` refuses others)."""

    def __init__(self, shape: Sequence[int], init: str | Init = "normal", std: float = 0.02,
                 dtype: DType | None = None, *, fixed: bool = False):
        shape = tuple(int(d) for d in shape)
        if any(d <= 0 for d in shape):
            raise ModelError(at_user_line(f"parameter shape {list(shape)} has a non-positive dimension"))
        too_big = size_problem(shape)
        if too_big:
            raise ModelError(at_user_line(f"parameter shape {list(shape)} {too_big}"))
        if isinstance(init, str) and init not in ("normal", "zeros", "ones"):
            raise ModelError(at_user_line(f"unknown initialiser {init!r}: use normal, zeros, ones or a function"))
        self.shape, self.init, self.std, self.dtype, self.fixed = shape, init, std, dtype, fixed

    @property
    def numel(self) -> int:
        return math.prod(self.shape)   # Python ints: exact for any size, and fast

    def make(self, name: str, seed: int, dtype: DType) -> np.ndarray:
        """The initial value; the same for the same (name, seed) whatever else exists."""
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        target = (self.dtype or dtype).numpy
        if callable(self.init):
            value = np.asarray(self.init(self.shape, rng))
            if value.dtype == target:   # read from a checkpoint: kept as it came (a view of its file), no copy
                return value
        elif self.init == "normal":
            value = rng.standard_normal(self.shape) * self.std
        elif self.init == "zeros":
            value = np.zeros(self.shape)
        else:
            value = np.ones(self.shape)
        return value.astype(np.float64).astype(target)

    def __repr__(self) -> str:
        return f"Parameter({list(self.shape)})"


# The names and dtype of parameters of the model being traced, and the tick
# of its progress (parameters reached, of those declared).
_PARAM_CTX: list[tuple[dict, DType, Callable[[int], None]]] = []


class Module:
    """Base class of DSL modules: assign ``Parameter``s and sub-``Module``s as
    attributes in ``__init__``; write ``forward`` with ``Tensor`` operations."""

    def __init__(self):
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if "_params" not in self.__dict__:
            raise ModelError(at_user_line(f"{type(self).__name__}.__init__ must call super().__init__() "
                                          f"before setting attributes"))
        self._params.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._params[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        d = self.__dict__
        if name in d.get("_params", {}):
            return _param_tensor(d["_params"][name])
        if name in d.get("_modules", {}):
            return d["_modules"][name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def parameter(self, name: str) -> Parameter:
        """The declaration of a parameter (outside tracing, attribute access
        gives this too)."""
        return self._params[name]

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter once, in declaration order, by hierarchical name."""
        seen: set[int] = set()
        for name, p in self._named_parameters(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named_parameters(self, prefix: str):
        for name, p in self._params.items():
            yield prefix + name, p
        for name, m in self._modules.items():
            yield from m._named_parameters(f"{prefix}{name}.")

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix.rstrip("."), self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}{name}.")

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def _param_tensor(p: Parameter):
    if not _PARAM_CTX:
        return p
    names, dtype, tick = _PARAM_CTX[-1]
    if id(p) not in names:
        raise ModelError(at_user_line(f"{p} is used by the model but not registered in any of its modules"))
    ptype = TensorType(p.dtype or dtype, p.shape)
    g = current_graph()
    value = g.add_param(names[id(p)], ptype)
    tick(len(g.params))
    return Tensor(value)


class ModuleList(Module):
    """A list of modules, named ``0``, ``1``, ... in parameter names."""

    def __init__(self, modules: Sequence[Module] = ()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m: Module) -> None:
        self._modules[str(len(self._modules))] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]


@dataclass
class InputSpec:
    """A graph input: name, dtype and symbolic shape, and how to sample it.

    ``kind`` is "float" (standard normal), "ids" (ints in [0, high)),
    "positions" (each row ``0, 1, ..., seq-1``: a batch of unpadded
    sequences; any values in [0, high) are valid) or "mask" (per row along
    the last axis, 1s over a random span and 0s around it: ``padding_rows``)
    or "ones" (a mask of 1s alone: one whose sum a file reads as every row's
    length, as ONNX Runtime GenAI's ``seqlens_k``, which blockc's attention
    takes as one length for all rows).
    """

    name: str
    dtype: DType
    shape: tuple
    kind: str = "float"
    high: int = 0

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, self.shape)

    @property
    def value_range(self) -> tuple[int, int] | None:
        """``(low, high)``: the integers the input may hold, for ids and positions."""
        return (0, self.high) if self.kind in ("ids", "positions") else None

    def sample(self, bindings: Mapping[str, int], rng: np.random.Generator) -> np.ndarray:
        shape = tuple(evaluate(d, bindings) for d in self.shape)
        if self.kind == "ids":
            return rng.integers(0, self.high, size=shape).astype(self.dtype.numpy)
        if self.kind == "positions":
            return np.broadcast_to(np.arange(shape[-1]), shape).astype(self.dtype.numpy)
        if self.kind == "mask":
            return padding_rows(shape, rng).astype(self.dtype.numpy)
        if self.kind == "ones":
            return np.ones(shape, self.dtype.numpy)
        return rng.standard_normal(shape).astype(self.dtype.numpy)


def padding_rows(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """A 0/1 mask of ``shape`` whose rows (along the last axis) hold every
    padding a check must see: the first row left-padded (a causal model's
    first queries there see no key at all) and maybe right-padded, the last
    of two or more fully masked, those between 1s over a random span. A
    fused op that does not average a fully masked row as the others do
    differs on both ends (Hugging Face's masks put float32's lowest there)."""
    keep = np.zeros(shape, dtype=np.int64)
    if not keep.size:
        return keep
    rows, n = keep.reshape(-1, shape[-1]), shape[-1]
    for i, row in enumerate(rows):
        if i == len(rows) - 1 and i > 0:
            continue                                # fully masked
        start = rng.integers(1 if i == 0 and n > 1 else 0, n)
        row[start:rng.integers(start + 1, n + 1)] = 1
    return keep


class Model(Module):
    """A module that can be traced on its own: it declares its graph inputs."""

    name = "model"
    dtype = DType.float32

    def inputs(self) -> list[InputSpec]:
        raise ModelError(f"{type(self).__name__} defines no inputs(): a Model declares its graph inputs, e.g. "
                         f"def inputs(self): return [InputSpec('x', DType.float32, (batch, seq, 64))]")

    def lookup_tables(self) -> set[str]:
        """Names of parameters that are lookup tables though no embedding
        module holds them (an imported file has no modules to say so); the
        parameter summary counts them as embeddings."""
        return set()


def trace(model: Model, dtype: DType | str | None = None, *, progress: Progress | None = None) -> Graph:
    """Trace ``model.forward`` on symbolic inputs into a verified ``Graph``.

    A model whose graph cannot fit in the memory available is refused first
    (``check_graph_fits``). ``progress`` (``blockc.progress``) hears of the
    parameters reached, of those declared."""
    if not isinstance(model, Model):
        raise ModelError(f"{type(model).__name__} is not a blockc Model (subclass blockc.Model and define inputs())")
    check_graph_fits(model)  # every command that traces, and compare, goes through here
    dtype = DType.parse(dtype) if isinstance(dtype, str) else (dtype or model.dtype)
    g = Graph(model.name)
    names = {id(p): n for n, p in model.named_parameters()}
    tick = ticker(progress, TRACING, len(names))
    _PARAM_CTX.append((names, dtype, tick))
    try:
        with tracing(g), user_code(f"{type(model).__name__}.inputs()/forward()"):
            args = [Tensor(g.add_input(s.name, s.type)) for s in model.inputs()]
            out = model(*args)
    finally:
        _PARAM_CTX.pop()
    if isinstance(out, Tensor):
        outputs = [("output", out)]
    elif isinstance(out, dict):
        outputs = list(out.items())
    elif isinstance(out, (tuple, list)):
        outputs = [(f"output{i}", t) for i, t in enumerate(out)]
    else:
        raise ModelError(f"{type(model).__name__}.forward returned {type(out).__name__}; "
                         f"return a Tensor, a tuple or a dict of Tensors")
    for name, t in outputs:
        if not isinstance(t, Tensor):
            raise ModelError(f"{type(model).__name__}.forward output {name!r} is a {type(t).__name__}, not a Tensor")
    g.set_outputs([(name, t.value) for name, t in outputs])
    tick(len(names))  # the end, also where the forward leaves parameters unused
    return g


@contextlib.contextmanager
def user_code(what: str, path: str | None = None):
    """Run a user's model code: any error it raises, and a ``sys.exit`` it
    calls, becomes a ``ModelError`` naming the user's file and line (or
    ``path``) instead of a traceback, or blockc ending silently."""
    try:
        yield
    except BlockcError:
        raise
    except SystemExit as e:
        where = raised_at(e) or path or what
        raise ModelError(f"{where}: {what} called sys.exit({e.code!r}); a model file must not end the "
                         f"program") from None
    except RecursionError as e:
        raise ModelError(f"{raised_at(e) or path or what}: {what} recursed too deeply") from None
    except MemoryError as e:
        raise ModelError(f"{raised_at(e) or path or what}: {what} ran out of memory") from None
    except Exception as e:
        raise ModelError(f"{raised_at(e) or path or what}: error in {what}: {type(e).__name__}: {e}") from None


def weights_nbytes(model: Model, dtype: DType | None = None) -> int:
    """The bytes ``model``'s weights take when all are made (counted from the
    declarations: nothing is allocated)."""
    dtype = dtype or model.dtype
    return sum(p.numel * (p.dtype or dtype).numpy.itemsize for _, p in model.named_parameters())


def available_memory() -> int | None:
    """The memory a new allocation can have, in bytes: ``MemAvailable``, else
    the physical memory; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_weights_fit(model: Model, dtype: DType | None = None) -> None:
    """Refuse, with the estimated size, seeded weights that cannot all be held
    in memory: ``--set vocab=10000000000000`` is an error, not numpy trying
    to allocate 4.55 PiB."""
    need, have = weights_nbytes(model, dtype), available_memory()
    if have is not None and need > have:
        count = sum(p.numel for _, p in model.named_parameters())
        raise ModelError(f"{model.name}'s weights would take {format_bytes(need)} ({count:,} parameters as "
                         f"{(dtype or model.dtype).name}), more than the {format_bytes(have)} of memory available; "
                         f"make the model smaller with --set, or export it with --no-weights")


# What tracing a model and exporting its graph hold in memory, per parameter
# the model declares (not per element: a graph's size follows its layers,
# not their width). Counted per parameter because that is known without
# tracing, and the built-in models trace to about two IR nodes per parameter
# (a Linear is a matmul and an add for its two, a norm one node for two,
# attention's shape ops ride on its projections). Measured by
# bench/graph_memory.py (docs/PERFORMANCE.md, "Memory of a deep graph"): the
# peak of trace, form and ONNX export over the built model, 15-28 KiB a
# parameter on gpt2, bert-base and tiny at 512 and 2,000 layers; this is the
# worst form's (decomposed), rounded up. A forward that calls one module many
# times (weights shared across layers) makes more graph than its parameters
# say, and is not seen here.
GRAPH_BYTES_PER_PARAMETER = 30 * 1024


def graph_nbytes(model: Model) -> int:
    """About what tracing ``model`` and exporting its graph will hold in
    memory (counted from the declarations: nothing is traced)."""
    return sum(1 for _ in model.named_parameters()) * GRAPH_BYTES_PER_PARAMETER


def check_graph_fits(model: Model) -> None:
    """Refuse, with the estimated size, a model whose graph cannot be traced
    and exported in the memory available: ``gpt2 --set layers=100000`` is an
    error up front, not minutes of tracing into an out-of-memory kill."""
    need, have = graph_nbytes(model), available_memory()
    if have is None or need <= have:
        return
    layers = getattr(getattr(model, "cfg", None), "layers", None)
    if isinstance(layers, int) and layers > 0:
        who, per = f"{model.name} with {layers:,} layers", f"~{format_bytes(need / layers)} a layer"
    else:
        count = need // GRAPH_BYTES_PER_PARAMETER
        who, per = model.name, f"~{format_bytes(GRAPH_BYTES_PER_PARAMETER)} for each of its {count:,} parameter tensors"
    raise ModelError(f"{who} would need about {format_bytes(need)} to trace and export (the IR and the ONNX "
                     f"graph, {per}), more than the {format_bytes(have)} of memory available; make it smaller "
                     f"with --set (`blockc summary` counts its parameters without tracing)")


class LazyWeights(Mapping):
    """``{name: array}`` made on access from the model's initialisers and a seed.

    Nothing is stored, so a huge model costs memory only for what a consumer
    holds at a time.
    """

    def __init__(self, model: Model, seed: int = 0, dtype: DType | None = None):
        self._params = dict(model.named_parameters())
        self.seed, self.dtype = check_seed(seed), dtype or model.dtype

    def __getitem__(self, name: str) -> np.ndarray:
        p = self._params[name]
        # Made in float64, then cast: both copies are alive for a moment.
        need, have = p.numel * (8 + (p.dtype or self.dtype).numpy.itemsize), available_memory()
        if have is not None and need > have:
            raise ModelError(f"weight {name!r} {list(p.shape)} would take {format_bytes(need)} to make, more than "
                             f"the {format_bytes(have)} of memory available")
        return p.make(name, self.seed, self.dtype)

    def __iter__(self):
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)


def check_seed(seed, name: str = "seed") -> int:
    """``seed`` as an int, or a ``BlockcError`` saying what a seed must be.

    Every seed ends in ``numpy.random.default_rng``, which takes 0 and up
    only; refused here, where it is given (the weights, ``--seed``, a
    ``Sampler``), never as numpy's ValueError at the first draw."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise BlockcError(f"{name} must be a non-negative integer, got {seed!r}")
    return int(seed)


def init_weights(model: Model, seed: int = 0, dtype: DType | None = None) -> LazyWeights:
    """Deterministic initial weights for ``model`` (made lazily, on access)."""
    return LazyWeights(model, seed, dtype)


def symbol(name: str) -> Dim:
    """A named symbolic dimension, e.g. ``seq = symbol("seq")``."""
    return Sym.var(name)
