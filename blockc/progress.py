"""How far a long job has got, told to whoever asked; never printed.

Work that grows with a model's depth or its weights (tracing, the
optimization pipeline, building and checking an ONNX graph, writing weights)
takes an optional ``progress`` callback, ``progress(stage, done, total)``:
``stage`` is one of the names below, ``done`` of ``total`` steps of it are
finished (``done == total`` when it ends). Where a step is worth naming
(``blockc compare``'s, each a session being prepared), it comes as a fourth
argument, ``detail``: only callers that ask for such work need accept it. The library calls it and prints
nothing; ``blockc export`` passes one that draws a progress bar on a
terminal. It sits at the bottom of the layers so that every layer can take
one: the frontends trace, the passes optimize, codegen exports.
"""
from __future__ import annotations

from typing import Callable

Progress = Callable[[str, int, int], None]

TRACING = "tracing"
DECOMPOSING = "decomposing"
OPTIMIZING = "optimizing"
BUILDING_ONNX = "building the ONNX graph"
CHECKING_ONNX = "checking the ONNX graph"
WRITING_WEIGHTS = "writing weights"
MEASURING = "measuring"

# How many times, at most, a stage of cheap steps (a node, a parameter)
# reports: a call per node would cost seconds on a model of millions of
# nodes, for a bar that cannot show the difference.
REPORTS = 200


def ticker(progress: Progress | None, stage: str, total: int, *, every: int | None = None) -> Callable[[int], None]:
    """``tick(done)`` for a stage of ``total`` steps: calls ``progress(stage,
    done, total)`` at the start, every ``every`` steps (None: about
    ``REPORTS`` times in all) and at the end; nothing when ``progress`` is None."""
    if progress is None:
        return lambda done: None
    every = every or max(1, total // REPORTS)
    progress(stage, 0, total)

    def tick(done: int) -> None:
        if done % every == 0 or done == total:
            progress(stage, done, total)
    return tick
