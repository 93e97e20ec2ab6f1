"""The dataflow graph: values, nodes and graphs.

Mutable nodes, changed only through ``Graph`` methods so use-lists stay right
(the onnx-ir / torch.fx model). Nodes are kept in a list in topological order.
Values have no stored names for intermediates: the printer numbers them.
Graph inputs and parameters carry labels (``input_ids``, ``blocks.0.attn.w_q``)
that are keys, never trusted as identifiers in generated code.

Parameters are typed values with no data: weights live apart, in a
``{name: ndarray}`` mapping, so a GPT-3-sized graph costs only its nodes.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..errors import ShapeError, at_user_line
from . import opdef as registry
from .types import TensorType


class Value:
    """One SSA value. ``kind`` is ``input``, ``param`` or ``node``."""

    __slots__ = ("type", "kind", "name", "producer", "index", "uses", "__weakref__")

    def __init__(self, type: TensorType, kind: str, name: str | None = None,
                 producer: "Node | None" = None, index: int = 0):
        self.type = type
        self.kind = kind
        self.name = name
        self.producer = producer
        self.index = index
        self.uses: list = []  # (node, input position), one entry per use

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def shape(self):
        return self.type.shape

    def users(self) -> list:
        seen, out = set(), []
        for n, _ in self.uses:
            if id(n) not in seen:
                seen.add(id(n))
                out.append(n)
        return out

    def __repr__(self) -> str:
        label = self.name or (f"{self.producer.op}#{self.index}" if self.producer else "?")
        return f"<Value {label}: {self.type}>"


class Node:
    """One op application: ``outputs = op(inputs) {attrs}``."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "loc", "origin", "__weakref__")

    def __init__(self, op: str, inputs: Sequence[Value], attrs: Mapping[str, Any],
                 output_types: Sequence[TensorType], loc: str | None = None):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.outputs = [Value(t, "node", producer=self, index=i) for i, t in enumerate(output_types)]
        self.loc = loc  # the user's source line that created the node, when known
        # Which nodes of the unoptimized graph this one stands for (labels like
        # "%12"); set by the pass manager, carried through fusions for reports.
        self.origin: tuple = ()

    @property
    def output(self) -> Value:
        assert len(self.outputs) == 1, f"{self.op} has {len(self.outputs)} outputs"
        return self.outputs[0]

    def __repr__(self) -> str:
        return f"<Node {self.op}>"


class Graph:
    """A typed SSA dataflow graph with named inputs, parameters and outputs.

    ``nodes`` is a plain list in order. Inserting before a node and removing
    one are recorded and applied to the list in one sweep when it is next
    read: a pass makes hundreds of such edits between reads, and doing each
    in the list (``list.index``, ``list.remove``) cost a scan per edit, which
    made rewriting quadratic in depth. Use-lists are updated at once.
    """

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.params: dict[str, Value] = {}
        self._nodes: list[Node] = []
        self._before: dict[Node, list[Node]] = {}   # nodes to go just before a node, in order
        self._removed: set[Node] = set()
        self.outputs: list[tuple[str, Value]] = []

    @property
    def nodes(self) -> list[Node]:
        if self._before or self._removed:
            self._apply_edits()
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: list[Node]) -> None:
        self._nodes = nodes
        self._before, self._removed = {}, set()

    def _apply_edits(self) -> None:
        before, removed = self._before, self._removed
        order: list[Node] = []

        def place(n):
            for m in before.pop(n, ()):
                place(m)  # a node may have been put before one that was itself put before another
            if n not in removed:
                order.append(n)

        for n in self._nodes:
            place(n)
        lost = [m.op for ms in before.values() for m in ms]
        self._before, self._removed = {}, set()
        self._nodes[:] = order  # in place: a list read earlier stays the graph's list
        if lost:
            raise ShapeError(f"{', '.join(lost)} node(s) were inserted before a node that is not in the graph")

    # -- construction -------------------------------------------------------
    def add_input(self, name: str, type: TensorType) -> Value:
        if any(v.name == name for v in self.inputs):
            raise ShapeError(f"graph input {name!r} declared twice")
        v = Value(type, "input", name)
        self.inputs.append(v)
        return v

    def add_param(self, name: str, type: TensorType) -> Value:
        if name in self.params:
            if self.params[name].type != type:
                raise ShapeError(f"parameter {name!r} used with types {self.params[name].type} and {type}")
            return self.params[name]
        v = Value(type, "param", name)
        self.params[name] = v
        return v

    def make_node(self, op: str, inputs: Sequence[Value], attrs: Mapping[str, Any] | None = None,
                  *, loc: str | None = None) -> Node:
        """A node whose output types come from the op registry (not yet placed)."""
        attrs, types = registry.get(op).result_types([v.type for v in inputs], attrs or {})
        return Node(op, inputs, attrs, types, loc)

    def add_node(self, op: str, inputs: Sequence[Value], attrs: Mapping[str, Any] | None = None,
                 *, before: Node | None = None, loc: str | None = None) -> Node:
        node = self.make_node(op, inputs, attrs, loc=loc)
        self.insert(node, before=before)
        return node

    def insert(self, node: Node, *, before: Node | None = None) -> None:
        if node in self._removed:
            self._apply_edits()  # re-inserting a removed node: drop its old place first
        if before is None:
            self._nodes.append(node)
        else:
            self._before.setdefault(before, []).append(node)
        for i, v in enumerate(node.inputs):
            v.uses.append((node, i))

    def op(self, op: str, *inputs: Value, **attrs) -> Value:
        """Shorthand for single-output ops: ``g.op("add", a, b)``."""
        return self.add_node(op, inputs, attrs).output

    def set_outputs(self, outputs: Iterable[tuple[str, Value]]) -> None:
        self.outputs = list(outputs)

    # -- mutation -------------------------------------------------------------
    def set_input(self, node: Node, index: int, value: Value) -> None:
        old = node.inputs[index]
        old.uses.remove((node, index))
        node.inputs[index] = value
        value.uses.append((node, index))

    def replace_all_uses(self, old: Value, new: Value) -> None:
        for node, i in list(old.uses):
            self.set_input(node, i, new)
        self.outputs = [(n, new if v is old else v) for n, v in self.outputs]

    def remove_node(self, node: Node) -> None:
        for out in node.outputs:
            if out.uses or any(v is out for _, v in self.outputs):
                raise ShapeError(f"cannot remove {node.op}: its result is still used")
        for i, v in enumerate(node.inputs):
            v.uses.remove((node, i))
        self._removed.add(node)

    def sort(self) -> None:
        """Re-order nodes topologically, keeping the current order where it is
        already valid (rewrites may leave a fused node after a user)."""
        position = {id(n): i for i, n in enumerate(self.nodes)}
        if all(position.get(id(v.producer), i) < i for i, n in enumerate(self.nodes)
               for v in n.inputs if v.producer is not None):
            return  # already in order: what the search below would give, in linear time
        producers_left = {}
        users: dict[int, list] = {}
        for n in self.nodes:
            deps = {id(v.producer) for v in n.inputs if v.producer is not None}
            producers_left[id(n)] = len(deps)
            for d in deps:
                users.setdefault(d, []).append(n)
        import heapq
        ready = [(position[id(n)], n) for n in self.nodes if producers_left[id(n)] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for u in users.get(id(n), []):
                producers_left[id(u)] -= 1
                if producers_left[id(u)] == 0:
                    heapq.heappush(ready, (position[id(u)], u))
        if len(order) != len(self.nodes):
            raise ShapeError("the graph has a cycle")
        self.nodes = order

    def remove_unused_params(self) -> None:
        self.params = {k: v for k, v in self.params.items() if v.uses}

    # -- queries ----------------------------------------------------------------
    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(name)

    def output(self, name: str) -> Value:
        for n, v in self.outputs:
            if n == name:
                return v
        raise KeyError(name)

    def symbols(self) -> list[str]:
        """Symbolic dim names of the inputs, in order of first appearance."""
        out: list[str] = []
        for v in self.inputs:
            for d in v.shape:
                for s in sorted(getattr(d, "symbols", ())):
                    if s not in out:
                        out.append(s)
        return out

    def last_uses(self) -> dict[int, int]:
        """For each value read (by ``id``), the index in ``nodes`` of the last
        node that reads it; a graph output's is ``len(nodes)``: it outlives
        every node. What frees an intermediate, or counts it live, after use."""
        last: dict[int, int] = {}
        for i, n in enumerate(self.nodes):
            for v in n.inputs:
                last[id(v)] = i
        for _, v in self.outputs:
            last[id(v)] = len(self.nodes)
        return last

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def copy(self) -> "Graph":
        """A structural copy (weights are not part of a graph, so this is cheap)."""
        g = Graph(self.name)
        vmap: dict[int, Value] = {}
        for v in self.inputs:
            vmap[id(v)] = g.add_input(v.name, v.type)
        for name, v in self.params.items():
            vmap[id(v)] = g.add_param(name, v.type)
        for n in self.nodes:
            new = Node(n.op, [vmap[id(v)] for v in n.inputs], n.attrs, [o.type for o in n.outputs], n.loc)
            new.origin = n.origin
            g.insert(new)
            for a, b in zip(n.outputs, new.outputs):
                vmap[id(a)] = b
        g.outputs = [(name, vmap[id(v)]) for name, v in self.outputs]
        return g

    def to_networkx(self):
        """A ``networkx.MultiDiGraph``: one graph node per IR node, input and param.

        Node keys are ``"in:NAME"``, ``"param:NAME"``, ``"out:NAME"`` and
        ``"n<index>"``; each carries ``op`` and ``label``; each edge carries the
        value's ``type`` (a ``TensorType``) and its ``port``.
        """
        import networkx as nx

        G = nx.MultiDiGraph(name=self.name)
        key: dict[int, str] = {}
        for v in self.inputs:
            key[id(v)] = f"in:{v.name}"
            G.add_node(key[id(v)], op="input", label=v.name)
        for name, v in self.params.items():
            key[id(v)] = f"param:{name}"
            G.add_node(key[id(v)], op="param", label=name)
        for i, n in enumerate(self.nodes):
            k = f"n{i}"
            G.add_node(k, op=n.op, label=n.op, attrs=dict(n.attrs))
            for port, v in enumerate(n.inputs):
                G.add_edge(key[id(v)], k, type=v.type, port=port)
            for o in n.outputs:
                key[id(o)] = k
        for name, v in self.outputs:
            G.add_node(f"out:{name}", op="output", label=name)
            G.add_edge(key[id(v)], f"out:{name}", type=v.type, port=0)
        return G

    def __str__(self) -> str:
        from .printer import print_graph
        return print_graph(self)


def traced_loc() -> str | None:
    """The user's ``file:line`` for a node being created, when there is one."""
    text = at_user_line("")
    return text[:-2] if text.endswith(": ") else None
