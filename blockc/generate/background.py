"""A graph compiled in a second thread while the caller goes on: generation's
decode step, compiled while the prefill is compiled and runs, so that the
user waits for it only where the prefill is the shorter.

    later = CompileAhead(target, decode_graph, weights, CompileHints(rows=4))   # starts now
    with later, target.compile_hinted(prefill_graph, weights, hints) as prefill:
        later.compile_unless_ahead()      # a backend that cannot compile beside it: now
        out = prefill.run(feeds)          # meanwhile, the decode step compiles
        decode = later.get()              # what is left of it waited for: ``later.waited_s``

At 4 rows ONNX Runtime prepacks every MatMul weight when it makes the
decode step's session (``CompileHints.packs_weights``), 0.4 s of a 125M
model's warm start, which the prefill's own compile and run now cover.

Only where the backend says it is safe (``Backend.compiles_concurrently``);
elsewhere the graph is compiled in the caller's thread, after the prefill's
compile and before its run, as it always was (``compile_unless_ahead``). ``get`` raises an error of the compile as
the compile raised it (its type, its message). ``close``, in every path,
waits for a compile still running and closes what it made; it never raises
the compile's error (the caller is raising its own, or never asked for the
step). The thread is a daemon: a second Ctrl-C while ``close`` waits leaves
a process that can exit, not one held by a compile nobody wants.
"""
from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from typing import Iterator, Mapping

import numpy as np

from ..ir.graph import Graph
from ..runtime.interface import Backend, Compiled, CompileHints


class CompileAhead:
    """``target.compile_hinted(graph, weights, hints)``, begun now in a
    second thread where ``target.compiles_concurrently``, else made in the
    caller's thread by ``compile_unless_ahead``; ``get()`` is its result,
    ``waited_s`` how long ``get`` and ``close`` waited for it."""

    def __init__(self, target: Backend, graph: Graph, weights: Mapping[str, np.ndarray], hints: CompileHints):
        self._future: Future = Future()
        self._compile = lambda: target.compile_hinted(graph, weights, hints)
        self.waited_s = 0.0
        self.ahead = target.compiles_concurrently
        if self.ahead:
            threading.Thread(target=self._run, name="blockc-compile-ahead", daemon=True).start()

    def _run(self) -> None:
        try:
            compiled = self._compile()
        except BaseException as err:   # every error goes to ``get``, none is lost with the thread
            self._future.set_exception(err)
        else:
            self._future.set_result(compiled)

    def compile_unless_ahead(self) -> None:
        """Where the backend compiles in the caller's thread alone: compile
        now (an error raised here), where generation always did: after the
        prefill's compile, before it runs."""
        if not self.ahead and not self._future.done():
            self._future.set_result(self._compile())

    def get(self) -> Compiled:
        """The compiled graph, once it is made (an error of its compile raised here)."""
        self.compile_unless_ahead()
        with self._waiting():
            return self._future.result()

    def close(self) -> None:
        """Wait for the compile if it still runs (counted in ``waited_s``); close what it made."""
        if not self.ahead and not self._future.done():
            return   # never compiled: the prefill's compile failed first
        with self._waiting():
            failed = self._future.exception()   # waits; a Ctrl-C meanwhile is raised, not swallowed
        if failed is None:
            self._future.result().close()

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """The block's time added to ``waited_s`` where the compile was still running (none where it was done)."""
        start = None if self._future.done() else time.perf_counter()
        try:
            yield
        finally:
            if start is not None:
                self.waited_s += time.perf_counter() - start

    def __enter__(self) -> "CompileAhead":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
