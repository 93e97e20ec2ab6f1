"""Entries a test adds to blockc's registries and removes after, to show
that what reads a registry takes a new entry with no edit: a collective op
(``parallel/rank_timing``, ``report/communication``,
``runtime/tp_reference`` read the op registry's collectives) and a PyTorch
backend (``parallel.launch.rank_backends`` and the help built from it read
the backend registry)."""
from __future__ import annotations

from contextlib import contextmanager

from blockc.ops import registry


@contextmanager
def declared_collective(name: str = "test_scatter"):
    """``name``: a reduce-scatter (rank r's block r of the ranks' sum, along
    the first axis), declared with its shape rule alone; each test attaches
    the rules it tests. Removed from the registry after."""
    op = registry.define(name, ("x",), attrs={"world": (registry.INT, registry.REQUIRED)}, collective=True,
                         doc="a collective the registry declares for a test")
    op.infer(lambda types, attrs: types[0].with_shape((types[0].shape[0] // attrs["world"], *types[0].shape[1:])))
    try:
        yield op
    finally:
        registry.OPS.pop(name, None)


@contextmanager
def registered_torch_backend(name: str = "torch-variant", cls=None, **fixed):
    """``name``: the PyTorch backend (or ``cls``, a subclass) registered under a
    name of its own, compiled unless ``fixed`` says otherwise; unregistered after."""
    from blockc.runtime.backend import register, unregister
    from blockc.runtime.backends.pytorch import TorchBackend
    register(name, cls or TorchBackend, **{"compile": True, **fixed})
    try:
        yield name
    finally:
        unregister(name)
