"""The interface every backend implements: ``Backend`` compiles a graph
(with its weights) into a ``Compiled``, something that runs feeds many
times, times itself, and says how many kernels it executes (tinygrad's
``Compiled`` device; torch's dynamo backends, which are plain callables);
``CachedStep`` is a compiled step whose carried state (a KV cache) stays with
the backend between runs. ``Registration`` is how a backend module declares
the names it is run by. The registry that reads those declarations, and
dispatches on a backend's name, is ``runtime/backend.py``: this module is
below it, so that a backend module imports the interface and never the
registry that imports it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import BlockcError
from ..ir.graph import Graph
from .bindings import bind_inputs
from .timing import Timing, measure

HOST_CLOCK = "time.perf_counter"

Feeds = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]


class Compiled:
    """A graph compiled for one backend: ``run(feeds)`` many times, ``time(feeds)``.

    Feeds are checked against the graph (``bindings.bind_inputs``: names,
    dtypes, shapes, ids in range) here, at the boundary, once per ``run``,
    ``runner`` or ``time`` call, and never inside a timed loop: ``runner``
    checks once and returns a call that runs unchecked, which is what
    ``time`` (and compare's interleaved timing) measures.

    Subclasses override ``unchecked_runner`` (and ``time`` where the clock is
    not the host's, ``close`` where something must be released); or a plain
    function that runs checked feeds is wrapped: ``Compiled(fn, graph=...,
    kernels=..., close=...)``.
    """

    kernels: int | None = None     # what the runtime executes per run, where it can be counted and was
                                   # asked for (``Backend.compile(..., count_kernels=True)``)
    times_itself = False           # True: ``time`` measures where the run happens (a device's clock, a
                                   # child process); callers call it instead of timing ``run`` themselves

    def __init__(self, run: Callable[[Feeds], Outputs] | None = None, *, graph: Graph | None = None,
                 kernels: int | None = None, close: Callable[[], None] | None = None):
        """``run(feeds)`` runs feeds that fit ``graph`` without checking them;
        ``graph`` is what they are checked against (None: not checked here,
        ``run`` checks them itself or not at all)."""
        self._run, self._close, self.graph = run, close, graph
        self._closed = False
        if kernels is not None:
            self.kernels = kernels

    def check(self, feeds: Feeds) -> dict[str, int]:
        """The symbol sizes ``feeds`` bind, once they are checked against the
        graph (an ``InputsError`` for the first problem)."""
        return bind_inputs(self.graph, feeds) if self.graph is not None else {}

    def run(self, feeds: Feeds) -> Outputs:
        """The outputs for ``feeds``, by the graph's output names (checked first)."""
        return self.runner(feeds)()

    def runner(self, feeds: Feeds) -> Callable[[], Outputs]:
        """Check ``feeds`` once; a call that runs them, unchecked, as often as
        timing wants. The arrays must not change while it is in use."""
        return self.unchecked_runner(feeds, self.check(feeds))

    def unchecked_runner(self, feeds: Feeds, bindings: Mapping[str, int]) -> Callable[[], Outputs]:
        """A call that runs ``feeds``, already checked (``bindings``: the sizes
        they bind), without checking them again. What a subclass overrides."""
        if self._closed:
            raise BlockcError("this compiled graph is closed")
        if self._run is None:
            raise NotImplementedError(f"{type(self).__name__} does not run")
        run = self._run
        return lambda: run(feeds)

    def time(self, feeds: Feeds, *, warmup: int = 3, min_repeats: int = 10, min_time_s: float = 1.0,
             runs_per_sample: int = 1) -> Timing:
        """Seconds per run of ``feeds``: ``warmup`` untimed runs, then samples of
        ``runs_per_sample`` back-to-back runs until both ``min_repeats`` and
        ``min_time_s`` are reached (``timing.measure`` on the host clock around
        ``runner(feeds)``, unless the backend has its own)."""
        return measure(self.runner(feeds), warmup=warmup, min_repeats=min_repeats, min_time_s=min_time_s,
                       runs_per_sample=runs_per_sample)

    def cached(self, carry: Mapping[str, str], state: Feeds) -> "CachedStep":
        """A step that keeps state between runs: ``carry`` maps each output
        that feeds the next run to the input it feeds (``present.0.key`` ->
        ``past.0.key``: a KV cache); ``state`` holds those inputs' first
        values. See ``CachedStep``; this one keeps the state as host arrays."""
        return CachedStep(self, carry, state)

    def close(self) -> None:
        """Release what the compiled graph holds (sessions, temporary files).
        The run function goes too: a session it holds (its closure) is freed
        now, not whenever the last reference to this object goes."""
        close, self._close, self._run, self._closed = self._close, None, None, True
        if close is not None:
            close()

    def __enter__(self) -> "Compiled":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CachedStep:
    """A compiled step run again and again with state carried from each run
    to the next (``Compiled.cached``): ``run(feeds)`` takes the other inputs
    and returns the outputs that are not carried; the carried ones stay with
    the backend and become the next run's inputs.

    This base keeps them as host arrays, fed and returned like any others:
    right for the reference interpreter and PyTorch, and for any backend
    whose ``run`` hands back fresh arrays. A backend that owns device or
    runtime memory overrides ``Compiled.cached`` to keep the state where it
    lives: ONNX Runtime binds each carried output to the OrtValue its input
    was read from (``ort_runner.OrtCachedStep``), so a graph that writes its
    cache in place (``cache_write``) never copies it; the CUDA backends keep
    the cache in device buffers passed as the step's input and its output
    alike, in one process for every step (``backends/cuda.CudaCachedStep``),
    with no host copy between steps.
    """

    def __init__(self, compiled: Compiled, carry: Mapping[str, str], state: Feeds):
        self.compiled, self.carry = compiled, dict(carry)
        missing = sorted(set(self.carry.values()) - set(state))
        if missing:
            raise BlockcError(f"no first value for the carried input{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(map(repr, missing))}")
        self.state = {name: state[name] for name in self.carry.values()}

    def run(self, feeds: Feeds) -> Outputs:
        """The outputs of one run on ``feeds`` and the carried state, less the carried outputs."""
        out = self.compiled.run({**feeds, **self.state})
        for output, input_name in self.carry.items():
            self.state[input_name] = out.pop(output)
        return out

    def value(self, name: str) -> np.ndarray:
        """The carried input ``name`` as the next run will read it, copied to the host."""
        return np.array(self.state[name])

    def address(self, name: str) -> int:
        """Where the carried input ``name`` lives now (a host or device
        address): the same after every run when the state is updated in place."""
        return self.state[name].__array_interface__["data"][0]

    def close(self) -> None:
        self.state = {}

    def __enter__(self) -> "CachedStep":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class CompileHints:
    """What a caller knows of the runs to come, which a backend may use or
    ignore: never needed to run right. A backend that can use them declares
    a ``hints`` keyword on its ``compile``, and ``Backend.compile_hinted``
    passes them to it alone; a backend without one compiles as it always
    does (a backend written before a hint existed keeps working).

    ``rows``: every run multiplies this many rows by each weight (a decode
    step: one row a prompt); None: unknown, or many. ``runs``: how many
    times the graph will run (a prefill: once); None: unknown, or many.
    ``packs_weights`` says what they mean for a packed copy of each weight."""
    rows: int | None = None
    runs: int | None = None

    @property
    def packs_weights(self) -> bool:
        """Whether a packed copy of each MatMul weight, made when the session
        loads (ONNX Runtime's prepacking), pays for itself. Not for one-row
        products, which MLAS runs as GEMV over the weight as it is (1.03x,
        one 768x3072 MatMul, best of 200); nor for a graph run once (a
        prefill, a one-shot run): its product packs each weight's panels as
        it goes, the same work, with no copy made and kept. Measured on the
        125M Llama's prefill, session made and run once, interleaved: 128
        rows 1.17 s unpacked against 1.81 s prepacked, 512 rows 2.99 against
        4.37, 8 rows 0.88 against 1.61 (loaded machine, the run itself within
        the noise); a graph run many times keeps it (2-3x faster at 4 rows
        and more)."""
        return self.rows != 1 and self.runs != 1


class Backend:
    """Compiles graphs for one target. Subclass it, override ``compile`` (and
    what else differs), and ``register`` it under a name."""

    name = ""                            # the registered name (make_backend sets it)
    variants: tuple[str, ...] = ("",)    # settings compare measures each of (ONNX Runtime: its levels)
    kernel_variant: str | None = None    # the variant compare times fused kernels alone on; None: not here
    clock = HOST_CLOCK                   # how a run is timed, in words (compare's report records it)
    on_gpu = False                       # runs on a GPU (compare's report names the GPU)
    # For planning memory (``compare/memory.py``), measured per backend on a 2-layer GPT-2 at batch 8,
    # seq 512 (resident memory after compiling, then after one run), 1 and 1 where unmeasured: the
    # host copies of the weights a compiled graph keeps beside the caller's, and how many times its
    # peak live activations it keeps between runs (0: each intermediate is freed; an arena that rounds
    # its regions up keeps more than 1). A GPU backend keeps its activations on the device. And the
    # copies of the weights compiling holds for a while beyond those it keeps (the peak while it
    # compiles, less what stays after).
    weight_copies: float = 1.0
    arena_copies: float = 1.0
    build_copies: float = 1.0

    def __init__(self):
        """A subclass declares its options as keyword-only parameters (see the module docstring)."""

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """The options this backend's class takes: its constructor's keyword-only parameters."""
        return frozenset(p.name for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY)

    @classmethod
    def option_defaults(cls) -> dict:
        """Each option's value where it is not given: its constructor's default."""
        return {p.name: p.default for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY}

    @property
    def times_itself(self) -> bool:
        """Whether its compiled graphs time themselves (``Compiled.time`` with a device's clock)."""
        return self.clock != HOST_CLOCK

    def availability(self) -> tuple[bool, str]:
        """``(True, "")``, or ``(False, why)`` where it cannot run here."""
        return True, ""

    def require(self) -> None:
        """Raise a ``BlockcError`` that says plainly why, where it cannot run here."""
        ok, why = self.availability()
        if not ok:
            raise BlockcError(f"--backend {self.name} cannot run here: {why}")

    @property
    def title(self) -> str:
        """Where a run happens, for ``blockc run``'s first line."""
        return self.name

    @property
    def label(self) -> str:
        """The backend and the options that change its numbers, for ``blockc check``."""
        return self.name

    def detail(self, threads: int) -> str:
        """Its settings in one line, for compare's report."""
        return ""

    def supports(self, form: str) -> bool:
        """Whether compare measures the graph form ``form`` here."""
        return True

    def compile(self, graph: Graph, weights: Mapping[str, np.ndarray], *, variant: str | None = None,
                threads: int | None = None, count_kernels: bool = False) -> Compiled:
        """``graph`` with ``weights``, ready to run. ``variant``: one of
        ``variants`` (None: the first); ``threads``: intra-op threads (None:
        the runtime's default); ``count_kernels``: the caller reads
        ``Compiled.kernels`` (compare does; a run or a generation does not).
        A backend whose count costs work (ONNX Runtime saves the model it
        optimized to count its nodes) does that work only when asked; one
        whose count is free may always give it. A backend that can use
        ``CompileHints`` adds a keyword ``hints`` (see ``compile_hinted``)."""
        raise NotImplementedError

    def compile_hinted(self, graph: Graph, weights: Mapping[str, np.ndarray], hints: CompileHints,
                       **options) -> Compiled:
        """``compile(graph, weights, **options)``, with ``hints=hints`` where
        this backend's ``compile`` declares that keyword, or takes any keyword
        (a wrapper that passes them on): hints are optional to a backend, so
        one that does not take them is never handed them."""
        params = inspect.signature(self.compile).parameters
        if "hints" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            options["hints"] = hints
        return self.compile(graph, weights, **options)

    def run(self, graph: Graph, weights: Mapping[str, np.ndarray], feeds: Feeds) -> Outputs:
        """Compile ``graph``, run it once on ``feeds``, release it: compiled
        as a graph run once (``CompileHints(runs=1)``)."""
        bindings = bind_inputs(graph, feeds)   # before compiling: a bad feed should not cost a compile
        with self.compile_hinted(graph, weights, CompileHints(runs=1)) as compiled:
            return compiled.unchecked_runner(feeds, bindings)()


@dataclass(frozen=True)
class Registration:
    """A name a backend runs by: ``make_backend(name, **options)`` builds
    ``cls(**options, **fixed)``. ``compare``: ``blockc compare`` measures it
    unless told otherwise (it can always be asked for by name)."""
    name: str
    cls: type[Backend]
    fixed: Mapping[str, object] = field(default_factory=dict)   # options the registration fixes
    compare: bool = False
