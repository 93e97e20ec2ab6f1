"""Building nodes at a position in a graph: used by decompositions and rewrites."""
from __future__ import annotations

import numpy as np

from .dtypes import DType
from .graph import Graph, Node, Value


class Builder:
    """Adds nodes to ``graph`` just before ``before`` (or at the end).

    ``created`` lists the nodes added, in order, so a rewrite can tell its new
    nodes apart without rescanning the graph.
    """

    def __init__(self, graph: Graph, before: Node | None = None, loc: str | None = None):
        self.graph, self.before, self.loc = graph, before, loc
        self.created: list[Node] = []

    def node(self, op: str, *inputs: Value, **attrs) -> Node:
        node = self.graph.add_node(op, inputs, attrs, before=self.before, loc=self.loc)
        self.created.append(node)
        return node

    def op(self, op: str, *inputs: Value, **attrs) -> Value:
        return self.node(op, *inputs, **attrs).output

    def const(self, value, dtype: DType) -> Value:
        """A scalar or array constant of ``dtype``."""
        return self.op("constant", value=np.asarray(value, dtype=np.float64 if dtype.is_float else None)
                       .astype(dtype.numpy))
