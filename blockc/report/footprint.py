"""The memory model: what running a graph once holds at its peak.

Computed from the IR's types with the dims bound, like the traffic model:

* ``weights``: every parameter;
* ``activations``: the largest sum of intermediate values alive at once,
  each value alive from the node that makes it to the last node that reads
  it (graph outputs to the end) -- what an interpreter that frees a value
  after its last use holds (``runtime/reference.py`` does), and what a
  runtime's arena planner is sized by;
* ``outputs``: the graph's outputs, which the caller receives as new arrays.

Backends turn this into host bytes (``Backend.host_bytes``): ONNX Runtime
holds a copy of the weights besides the caller's, a GPU backend holds its
activations on the device. ``blockc compare`` plans its memory with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..ir.graph import Graph
from ..ir.load_time import load_time_nodes


@dataclass(frozen=True)
class Footprint:
    weights: int
    activations: int
    outputs: int
    inputs: int


def footprint(graph: Graph, bindings: Mapping[str, int], *, itemsize: int | None = None) -> Footprint:
    """``graph``'s memory at ``bindings``. ``itemsize``: count every float
    value at this many bytes (8 for the float64 reference), else its dtype's."""
    def nbytes(v) -> int:
        n = v.type.nbytes(bindings)
        if itemsize is not None and v.dtype.is_float:
            n = n // v.dtype.numpy.itemsize * itemsize
        return n

    static = load_time_nodes(graph)   # run once at load: their results are weights, not activations
    weights = sum(nbytes(v) for v in graph.params.values())
    weights += sum(nbytes(o) for n in graph.nodes if id(n) in static for o in n.outputs)
    last_use = graph.last_uses()
    inputs = sum(nbytes(v) for v in graph.inputs)
    live, peak, dying = 0, 0, {}
    for i, n in enumerate(graph.nodes):
        if id(n) in static:
            continue
        for o in n.outputs:
            b = nbytes(o)
            live += b
            end = last_use.get(id(o), i)
            dying[end] = dying.get(end, 0) + b
        peak = max(peak, live)
        live -= dying.pop(i, 0)
    outputs = sum(nbytes(v) for _, v in graph.outputs)
    return Footprint(weights, peak, outputs, inputs)
