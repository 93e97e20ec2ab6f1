"""The one registry of backends: dispatch on a backend's name happens once,
here, in ``make_backend``. The interface they implement (``Backend``,
``Compiled``, ``CachedStep``) is ``runtime/interface.py``, re-exported here.
``blockc run``, ``blockc check``, ``blockc compare`` and the benches all go
through it::

    backend = make_backend("ort-cpu", fused_as="function")
    ok, why = backend.availability()        # (False, "no GPU ...") where it cannot run
    with backend.compile(graph, weights, variant="basic", threads=2, count_kernels=True) as compiled:
        outputs = compiled.run(feeds)       # {output name: array}
        timing = compiled.time(feeds)       # runtime.timing.Timing
        run = compiled.runner(feeds)        # feeds checked once; run() runs them unchecked

Adding a backend is one module: a ``Backend`` subclass and its
``Registration``s. The built-in ones live in ``runtime/backends/``, each
module declaring ``REGISTRATIONS`` (the package lists them in the order the
CLI shows them); a backend defined anywhere else calls ``register`` with
the same fields. The backend modules import the interface, never this
registry, so the registry imports them without a cycle.

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

from typing import Mapping, Sequence

from ..errors import BlockcError
from . import backends
from .interface import (HOST_CLOCK, Backend, CachedStep, Compiled, CompileHints, Feeds,  # noqa: F401  (re-exported)
                        Outputs, Registration)

# ---- the registry ------------------------------------------------------------------------
_REGISTRY: dict[str, Registration] = {}


def register(name: str, cls: type[Backend], *, compare: bool = False, **fixed) -> None:
    """Make ``name`` a backend: ``make_backend(name, **options)`` builds
    ``cls(**options, **fixed)``. ``compare``: ``blockc compare`` measures it
    unless told otherwise (it can always be asked for by name). Registering a
    name again replaces it."""
    _REGISTRY[name] = Registration(name, cls, dict(fixed), compare)


def unregister(name: str) -> None:
    """Forget the backend ``name`` (a test's own, say)."""
    _REGISTRY.pop(name, None)


for _r in backends.REGISTRATIONS:
    register(_r.name, _r.cls, compare=_r.compare, **_r.fixed)


def registrations() -> tuple[Registration, ...]:
    """Every registered name with its class, fixed options and compare flag."""
    return tuple(_REGISTRY.values())


def backend_names() -> tuple[str, ...]:
    """Every registered backend, built-in ones first, in the CLI's order."""
    return tuple(_REGISTRY)


def compare_backends() -> tuple[str, ...]:
    """The backends ``blockc compare`` measures by default."""
    return tuple(name for name, entry in _REGISTRY.items() if entry.compare)


def registration(name: str) -> Registration:
    """What ``name`` was registered as (a ``BlockcError`` for an unknown name)."""
    registry = _REGISTRY
    if name not in registry:
        raise BlockcError(f"unknown backend {name!r}; backends: {', '.join(registry)}")
    return registry[name]


def backend_options(name: str) -> frozenset[str]:
    """The options the backend ``name`` takes: its class's, less those its registration fixes."""
    entry = registration(name)
    return entry.cls.option_names() - set(entry.fixed)


def _not_taken(names: Sequence[str], option: str) -> BlockcError:
    """The one refusal of an option: who was given it, and who takes it."""
    who = f"backend {names[0]!r} does" if len(names) == 1 else f"backends {', '.join(map(repr, names))} do"
    notes = [f"{n!r} fixes {option}={registration(n).fixed[option]!r}" for n in names if option in registration(n).fixed]
    takers = [n for n in backend_names() if option in backend_options(n)]
    notes.append(f"{', '.join(takers)} take{'s' if len(takers) == 1 else ''} it" if takers else "no backend takes it")
    own = f"; its options: {', '.join(sorted(backend_options(names[0]))) or 'none'}" if len(names) == 1 else ""
    return BlockcError(f"{who} not take the option {option!r} ({'; '.join(notes)}){own}")


def make_backend(name: str, subclass: type[Backend] | None = None, **options) -> Backend:
    """The backend registered as ``name``, built with ``options`` and its
    registration's fixed ones (applied here only); an option it does not
    take is a ``BlockcError`` naming the backend and the option.
    ``subclass``: built as that subclass of the registered class (compare's
    ``TorchPeer``: the backend as a peer), what the name fixes the same."""
    entry = registration(name)
    for option in options:
        if option not in backend_options(name):
            raise _not_taken([name], option)
    cls = entry.cls if subclass is None else subclass
    if not issubclass(cls, entry.cls):
        raise TypeError(f"{cls.__name__} is not a {entry.cls.__name__}, which {name!r} is registered as")
    backend = cls(**options, **entry.fixed)
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
    entry = registration(name)
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
