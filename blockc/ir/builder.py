"""Building nodes at a position in a graph: used by decompositions and rewrites."""
from __future__ import annotations

import numpy as np

from .dtypes import DType
from .graph import Graph, Node, Value


class Builder:
    """Adds nodes to ``graph`` just before ``before`` (or at the end)."""

    def __init__(self, graph: Graph, before: Node | None = None, loc: str | None = None):
        self.graph, self.before, self.loc = graph, before, loc

    def node(self, op: str, *inputs: Value, **attrs) -> Node:
        return self.graph.add_node(op, inputs, attrs, before=self.before, loc=self.loc)

    def op(self, op: str, *inputs: Value, **attrs) -> Value:
        return self.node(op, *inputs, **attrs).output

    def const(self, value, dtype: DType) -> Value:
        """A scalar or array constant of ``dtype``."""
        return self.op("constant", value=np.asarray(value, dtype=np.float64 if dtype.is_float else None)
                       .astype(dtype.numpy))
