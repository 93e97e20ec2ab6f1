"""Which nodes can be computed once, when a model is loaded, instead of on
every run: the one definition that the CUDA backend (it computes them at
generation and stores the results with the weights), the traffic model and
the FLOP model (they leave them out of a run's cost) share."""
from __future__ import annotations

from .graph import Graph


def load_time_nodes(graph: Graph) -> set[int]:
    """ids of the nodes computed from parameters and constants alone, with
    fixed-size results. A node without inputs (a constant, a causal mask)
    is one when its size is fixed."""
    static: set[int] = set()
    for n in graph.nodes:
        if all(v.kind == "param" or (v.producer is not None and id(v.producer) in static) for v in n.inputs) \
                and all(isinstance(d, int) for o in n.outputs for d in o.shape):
            static.add(id(n))
    return static
