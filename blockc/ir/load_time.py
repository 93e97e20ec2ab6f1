"""Which nodes can be computed once, when a model is loaded, instead of on
every run: the one definition that the CUDA backend (it computes them at
generation and stores the results with the weights), the traffic model and
the FLOP model (they leave them out of a run's cost) share."""
from __future__ import annotations

from .graph import Graph
from .opdef import attr_symbols


def load_time_nodes(graph: Graph) -> set[int]:
    """ids of the nodes computed from parameters and constants alone, with
    fixed-size results. A node without inputs (a constant, a causal mask)
    is one when its size is fixed. A node whose attributes name a symbolic
    dim is not: its value depends on that dim even when its size does not
    (``dim_value {value=seq}`` is a fixed-size scalar known only at run time)."""
    static: set[int] = set()
    for n in graph.nodes:
        if all(v.kind == "param" or (v.producer is not None and id(v.producer) in static) for v in n.inputs) \
                and all(isinstance(d, int) for o in n.outputs for d in o.shape) and not attr_symbols(n.attrs):
            static.add(id(n))
    return static
