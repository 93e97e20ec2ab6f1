"""One interface for every backend, and the one registry of them.

A ``Backend`` compiles a graph (with its weights) into a ``Compiled``:
something that runs feeds many times, times itself, and says how many
kernels it executes (tinygrad's ``Compiled`` device; torch's dynamo backends,
which are plain callables). ``blockc run``, ``blockc check``, ``blockc
compare`` and the benches all go through it, and dispatch on a backend's
name happens once, here, in ``make_backend``::

    backend = make_backend("ort-cpu", fused_as="function")
    ok, why = backend.availability()        # (False, "no GPU ...") where it cannot run
    with backend.compile(graph, weights, variant="basic", threads=2) as compiled:
        outputs = compiled.run(feeds)       # {output name: array}
        timing = compiled.time(feeds)       # runtime.timing.Timing
        run = compiled.runner(feeds)        # feeds checked once; run() runs them unchecked

Adding a backend is one module: a ``Backend`` subclass and a
``register("name", TheBackend)`` call. The built-in ones live in
``runtime/backends/`` (importing that package registers them, in the order
the CLI lists them); a backend defined anywhere else registers the same way.

Options. A backend declares the options it takes as its constructor's
keyword-only parameters (``Backend.option_names``), and ``make_backend``
refuses any other, naming the backend, the option and who does take it: an
option that would do nothing (``--float64`` on ONNX Runtime, ``provider``
on the reference, a misspelt ``fused_ass``) is never ignored. Options a
registration fixes (``ort-cpu`` is ``ort`` with ``provider="cpu"``) are not
the registered backend's to take. The command-line flags (``--provider``,
``--fused-as``, ``--gemm``, ``--tf32``, ``--float64``) are these options,
passed when given; a command that runs several backends with one set of
flags gives each the options it takes (``split_options``).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
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

    kernels: int | None = None     # what the runtime executes per run, where it can be counted
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
                threads: int | None = None) -> Compiled:
        """``graph`` with ``weights``, ready to run. ``variant``: one of
        ``variants`` (None: the first); ``threads``: intra-op threads (None:
        the runtime's default)."""
        raise NotImplementedError

    def run(self, graph: Graph, weights: Mapping[str, np.ndarray], feeds: Feeds) -> Outputs:
        """Compile ``graph``, run it once on ``feeds``, release it."""
        bindings = bind_inputs(graph, feeds)   # before compiling: a bad feed should not cost a compile
        with self.compile(graph, weights) as compiled:
            return compiled.unchecked_runner(feeds, bindings)()


# ---- the registry ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Entry:
    cls: type[Backend]
    fixed: dict            # options the registration fixes
    compare: bool          # in `blockc compare`'s default list


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, cls: type[Backend], *, compare: bool = False, **fixed) -> None:
    """Make ``name`` a backend: ``make_backend(name, **options)`` builds
    ``cls(**options, **fixed)``. ``compare``: ``blockc compare`` measures it
    unless told otherwise (it can always be asked for by name). Registering a
    name again replaces it."""
    _REGISTRY[name] = _Entry(cls, dict(fixed), compare)


def unregister(name: str) -> None:
    """Forget the backend ``name`` (a test's own, say)."""
    _REGISTRY.pop(name, None)


def _registry() -> dict[str, _Entry]:
    from . import backends  # noqa: F401  (registers the built-in backends)
    return _REGISTRY


def backend_names() -> tuple[str, ...]:
    """Every registered backend, built-in ones first, in the CLI's order."""
    return tuple(_registry())


def compare_backends() -> tuple[str, ...]:
    """The backends ``blockc compare`` measures by default."""
    return tuple(name for name, entry in _registry().items() if entry.compare)


def _entry(name: str) -> _Entry:
    registry = _registry()
    if name not in registry:
        raise BlockcError(f"unknown backend {name!r}; backends: {', '.join(registry)}")
    return registry[name]


def backend_options(name: str) -> frozenset[str]:
    """The options the backend ``name`` takes: its class's, less those its registration fixes."""
    entry = _entry(name)
    return entry.cls.option_names() - set(entry.fixed)


def _not_taken(names: Sequence[str], option: str) -> BlockcError:
    """The one refusal of an option: who was given it, and who takes it."""
    who = f"backend {names[0]!r} does" if len(names) == 1 else f"backends {', '.join(map(repr, names))} do"
    notes = [f"{n!r} fixes {option}={_entry(n).fixed[option]!r}" for n in names if option in _entry(n).fixed]
    takers = [n for n in backend_names() if option in backend_options(n)]
    notes.append(f"{', '.join(takers)} take{'s' if len(takers) == 1 else ''} it" if takers else "no backend takes it")
    own = f"; its options: {', '.join(sorted(backend_options(names[0]))) or 'none'}" if len(names) == 1 else ""
    return BlockcError(f"{who} not take the option {option!r} ({'; '.join(notes)}){own}")


def make_backend(name: str, **options) -> Backend:
    """The backend registered as ``name``, built with ``options``; an option
    it does not take is a ``BlockcError`` naming the backend and the option."""
    entry = _entry(name)
    for option in options:
        if option not in backend_options(name):
            raise _not_taken([name], option)
    backend = entry.cls(**options, **entry.fixed)
    backend.name = name
    return backend


def split_options(names: Sequence[str], options: Mapping[str, object]) -> dict[str, dict]:
    """Each of the backends ``names`` with the ``options`` it takes, for a
    command that runs several with one set of flags (``blockc check``): each
    option must be taken by one of them at least, else it is refused as
    ``make_backend`` refuses it."""
    for option in options:
        if not any(option in backend_options(n) for n in names):
            raise _not_taken(list(names), option)
    return {n: {k: v for k, v in options.items() if k in backend_options(n)} for n in names}


def _built_as(name: str, options: Mapping[str, object]) -> tuple:
    """What the backend ``name`` given ``options`` is built as: its class and
    every option it gets (given, fixed by its registration, or its class's
    default). Two names built alike are one backend: ``ort`` is ``ort-cpu``
    where ``provider`` is not given (cpu, its default)."""
    entry = _entry(name)
    settings = {**entry.cls.option_defaults(), **options, **entry.fixed}
    return entry.cls, tuple(sorted((k, repr(v)) for k, v in settings.items()))


def check_distinct(names: Sequence[str], options: Mapping[str, Mapping[str, object]], *, flag: str) -> None:
    """Refuse two of ``names`` (each with its ``options``, as ``split_options``
    gives them) that are one backend under two names (``ort`` and ``ort-cpu``,
    where no provider is given): a command that runs each in turn would run
    it twice. ``flag``: where the names came from, for the message."""
    groups: dict[tuple, list[str]] = {}
    for name in dict.fromkeys(names):
        groups.setdefault(_built_as(name, options.get(name, {})), []).append(name)
    for same in groups.values():
        if len(same) > 1:
            title = make_backend(same[0], **options.get(same[0], {})).title
            raise BlockcError(f"{flag} names {' and '.join(same)}, which are one backend ({title}): "
                              f"each is measured once, name it once")
