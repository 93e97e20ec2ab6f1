"""The nodes the importer walks: the graph's, with every call of a
model-local function (``ModelProto.functions``) replaced by the function's
body, as ONNX defines a call (onnx/docs/IR.md, "Functions"):

* the body's formal inputs and outputs are the call's actual ones; an input
  the call leaves out (``""``, or past its last) is an omitted optional input
  in the body, an output it leaves out a value no one reads;
* every other value of the body is renamed ``call/value`` (``call`` is the
  call node's name, else its first output), made unique, so that two calls of
  one function, and the graph around them, keep their values apart;
* an attribute that refers to one of the function's (``ref_attr_name``)
  takes the call's attribute of that name, else the function's default
  (``attribute_proto``), else is left out, as an attribute not given is;
* the body's operators are read at the function's own opsets
  (``opset_import``; the model's for a domain it does not import). ONNX
  Runtime reads them at the model's instead; ONNX requires the two to name
  the same operator schema, so on a file that keeps to that they agree.

A body is checked once, as the graph is (``safe_load.order_nodes``: a name
nothing defines, a value defined twice, a cycle). Nested calls are expanded
from an explicit stack, so nesting however deep is no ``RecursionError``; a
function that calls itself, directly or through others, is refused naming
the cycle. A file of a few kilobytes can call functions that call functions,
each many times: what inlining would make is counted before any node is made,
and refused when it cannot fit in memory; the names it makes are cut to a
bounded length, and a body's attributes are shared by its calls, not copied.
A call of a function the model does not define stays a node; the importer
lists it with the operators it lacks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import onnx

from ...files import format_bytes
from ..module import GRAPH_BYTES_PER_PARAMETER, available_memory
from .safe_load import OnnxFile, label, node_label, order_nodes

DEFAULT_DOMAINS = ("", "ai.onnx")

# What a node costs to trace: the built-in models trace to about two IR nodes
# per parameter (module.py, GRAPH_BYTES_PER_PARAMETER), and an ONNX node
# becomes about one (shape arithmetic folds to none, a few rules write several).
GRAPH_BYTES_PER_NODE = GRAPH_BYTES_PER_PARAMETER // 2
# The longest name inlining makes: names are labels (a message shows 60
# characters of one) and are made unique apart from their text, so a name
# nested a thousand calls deep need not be a thousand names long.
NAME_CHARS = 200
# What one such name costs: its characters and a Python string's header.
BYTES_PER_NAME = NAME_CHARS + 64


def default_opset(opsets: Mapping[str, int]) -> int:
    """The ai.onnx opset in ``opsets`` (domain -> version): the one
    ``rules.TABLE``'s ranges are read against."""
    return next((v for d, v in opsets.items() if d in DEFAULT_DOMAINS), 1)


def opset_versions(opset_import) -> dict[str, int]:
    """A model's or function's ``opset_import`` as domain -> version."""
    return {o.domain: o.version for o in opset_import}


@dataclass(frozen=True, eq=False)
class GraphNode:
    """A node as the importer walks it: a ``NodeProto``'s fields (for a node
    from a function body, renamed and with its attribute references
    resolved) and the opsets its operator is read against."""

    op_type: str
    domain: str
    name: str
    input: tuple[str, ...]
    output: tuple[str, ...]
    attrs: Mapping[str, onnx.AttributeProto]   # by the name the operator knows it by
    opsets: Mapping[str, int]
    overload: str = ""

    @property
    def opset(self) -> int:
        """The ai.onnx opset the node is read at."""
        return default_opset(self.opsets)


def _key(n) -> tuple[str, str, str]:
    """The function a node calls, if it names one: (domain, name, overload)."""
    return n.domain, n.op_type, n.overload


def _function_key(f: onnx.FunctionProto) -> tuple[str, str, str]:
    return f.domain, f.name, f.overload


def _short(name: str) -> str:
    """``name`` cut to ``NAME_CHARS`` in the middle, where it is longer."""
    if len(name) <= NAME_CHARS:
        return name
    half = NAME_CHARS // 2 - 2
    return f"{name[:half]}...{name[-half:]}"


def _function_label(key) -> str:
    domain, name, overload = key
    return label(f"{domain}::{name}" + (f":{overload}" if overload else ""))


def inline_functions(loaded: OnnxFile) -> list[GraphNode]:
    """``loaded``'s nodes (``loaded.nodes``, in dependency order) with every
    call of a local function replaced by its body, in dependency order still."""
    model = loaded.model
    opsets = opset_versions(model.opset_import)
    for n in loaded.nodes:
        for a in n.attribute:
            if a.ref_attr_name:
                raise loaded.error(f"node {node_label(n)} ({label(n.op_type)}): "
                                   f"its attribute {label(a.name)} refers to {label(a.ref_attr_name)}, but only a "
                                   f"function's nodes can refer to its attributes")
    top = [GraphNode(n.op_type, n.domain, n.name, tuple(n.input), tuple(n.output), {a.name: a for a in n.attribute},
                     opsets, n.overload) for n in loaded.nodes]
    functions: dict[tuple, onnx.FunctionProto] = {}
    for f in model.functions:
        if _function_key(f) in functions:
            raise loaded.error(f"function {_function_label(_function_key(f))} is defined twice")
        functions[_function_key(f)] = f
    if not any(_key(n) in functions for n in top):
        return top
    order = _callees_first(loaded, functions, [_key(n) for n in top])
    bodies = {key: _Body(loaded, functions[key], opsets) for key in order}
    _check_fits(loaded, bodies, order, [_key(n) for n in top if _key(n) in functions])
    return _expand(loaded, top, bodies, _Names(set(_defined(model))))


def _defined(model: onnx.ModelProto):
    g = model.graph
    yield from (v.name for v in g.input)
    yield from (t.name for t in g.initializer)
    yield from (o for n in g.node for o in n.output)


class _Body:
    """A function's body, checked and in dependency order, with what its
    calls need: its formals, its attribute defaults, its opsets."""

    def __init__(self, loaded: OnnxFile, f: onnx.FunctionProto, model_opsets: Mapping[str, int]):
        self.name = _function_label(_function_key(f))
        self.inputs, self.outputs = list(f.input), list(f.output)
        self.opsets = {**model_opsets, **opset_versions(f.opset_import)}
        self.defaults = {a.name: a for a in f.attribute_proto}
        self.nodes = order_nodes(loaded, list(f.node), self.inputs, function=self.name)
        made = set(self.inputs) | {o for n in f.node for o in n.output}
        for o in self.outputs:
            if o not in made:
                raise loaded.error(f"function {self.name}: its output {label(o)} is not defined by any of its "
                                   f"nodes or inputs")
        self.calls = [_key(n) for n in self.nodes]
        # Each node's attributes, made once and shared by every call (those
        # without references as they are): a tensor is one object however
        # many calls inline it, and the importer decodes it once.
        self.attrs = [{a.name: a for a in n.attribute} for n in self.nodes]
        self.refers = [any(a.ref_attr_name for a in n.attribute) for n in self.nodes]


def _callees_first(loaded: OnnxFile, functions: dict, roots: list) -> list[tuple]:
    """The functions ``roots`` call, directly or through others, each after
    those it calls; refuses a function that calls itself. A depth-first walk
    on a stack of its own: a chain of functions a thousand deep is a file of
    a few kilobytes."""
    def callees(key):
        return iter([k for k in map(_key, functions[key].node) if k in functions])

    done, order = set(), []
    for root in roots:
        if root not in functions or root in done:
            continue
        path, on_path, stack = [root], {root}, [callees(root)]
        while stack:
            callee = next(stack[-1], None)
            if callee is None:
                stack.pop()
                on_path.discard(path[-1])
                done.add(path[-1])
                order.append(path.pop())
            elif callee in on_path:
                cycle = [_function_label(k) for k in path[path.index(callee):] + [callee]]
                if len(cycle) > 8:   # a message is one line: a cycle through 10,000 functions is named by its ends
                    cycle = cycle[:4] + [f"... {len(cycle) - 7:,} more ..."] + cycle[-3:]
                raise loaded.error(f"function {_function_label(callee)} calls itself ({' -> '.join(cycle)}): a "
                                   f"recursive function cannot be inlined")
            elif callee not in done:
                path.append(callee)
                on_path.add(callee)
                stack.append(callees(callee))
    return order


def _check_fits(loaded: OnnxFile, bodies: dict, order: list, calls: list) -> None:
    """Refuse, before any is made, the nodes inlining would make when they
    cannot be traced in the memory available: calls nested k deep, each
    calling twice, make 2**k copies of a body."""
    nodes: dict[tuple, int] = {}
    nbytes: dict[tuple, int] = {}
    for key in order:   # callees first: each body's counts are its nodes' and its calls'
        body = bodies[key]
        nodes[key] = nbytes[key] = 0
        for n, callee in zip(body.nodes, body.calls):
            if callee in nodes:
                nodes[key] += nodes[callee]
                nbytes[key] += nbytes[callee]
            else:
                nodes[key] += 1
                nbytes[key] += GRAPH_BYTES_PER_NODE + (len(n.input) + len(n.output) + 1) * BYTES_PER_NAME
    made, need, have = sum(nodes[k] for k in calls), sum(nbytes[k] for k in calls), available_memory()
    if have is not None and need > have:
        raise loaded.error(f"inlining its functions would make {made:,} nodes, about {format_bytes(need)} to "
                           f"trace, more than the {format_bytes(have)} of memory available")


class _Names:
    """Unique value names: ``fresh`` gives ``name``, else ``name~2``,
    ``name~3``... (a counter per name, so that a thousand calls named alike
    cost a thousand steps, not a million)."""

    def __init__(self, taken: set[str]):
        self.taken, self.next = taken, {}

    def fresh(self, name: str) -> str:
        name = _short(name)
        out, k = name, self.next.get(name, 1)
        while out in self.taken:
            k += 1
            out = f"{name}~{k}"
        self.next[name] = k
        self.taken.add(out)
        return out


class _Call:
    """One call being expanded: how its body's names and attribute
    references read in the caller's scope."""

    def __init__(self, loaded: OnnxFile, body: _Body, call: GraphNode, names: _Names):
        what = f"node {node_label(call)} (function {body.name})"
        if len(call.input) > len(body.inputs) or len(call.output) > len(body.outputs):
            raise loaded.error(f"{what}: gives {len(call.input)} inputs and {len(call.output)} outputs; the "
                               f"function takes {len(body.inputs)} and {len(body.outputs)}")
        self.loaded, self.body, self.call, self.what, self.names = loaded, body, call, what, names
        self.prefix = call.name or (call.output[0] if call.output and call.output[0] else call.op_type)
        self.renamed = {x: (call.input[i] if i < len(call.input) else "") for i, x in enumerate(body.inputs)}
        # An output the body takes from an input, or gives twice, is an Identity after the body.
        self.after = []
        for j, formal in enumerate(body.outputs):
            actual = call.output[j] if j < len(call.output) else ""
            if actual and formal in self.renamed:
                if not self.renamed[formal]:
                    raise loaded.error(f"{what}: its output {label(actual)} is the function's input "
                                       f"{label(formal)}, which the call leaves out")
                self.after.append(GraphNode("Identity", "", _short(f"{self.prefix}/{formal}"),
                                            (self.renamed[formal],), (actual,), {}, call.opsets))
            elif actual:
                self.renamed[formal] = actual

    def name(self, value: str) -> str:
        if value and value not in self.renamed:
            self.renamed[value] = self.names.fresh(f"{self.prefix}/{value}")
        return self.renamed[value] if value else ""

    def place(self, i: int) -> GraphNode:
        """The body's node ``i`` as a node of the caller's scope."""
        n, attrs = self.body.nodes[i], self.body.attrs[i]
        if self.body.refers[i]:
            attrs = {}
            for a in n.attribute:
                given = a
                if a.ref_attr_name:
                    given = self.call.attrs.get(a.ref_attr_name, self.body.defaults.get(a.ref_attr_name))
                    if given is None:
                        continue   # neither given nor defaulted: absent, as an attribute not written is
                    if given.type != a.type:
                        kind = onnx.AttributeProto.AttributeType.Name
                        raise self.loaded.error(f"{self.what}: attribute {label(a.ref_attr_name)} is "
                                                f"{kind(given.type)}, but its body's node {label(n.name or n.op_type)} "
                                                f"reads it as {kind(a.type)} {label(a.name)}")
                attrs[a.name] = given   # the call's own object, under the name the body's operator knows
        return GraphNode(n.op_type, n.domain, _short(f"{self.prefix}/{n.name}") if n.name else "",
                         tuple(map(self.name, n.input)), tuple(map(self.name, n.output)), attrs,
                         self.body.opsets, n.overload)


def _expand(loaded: OnnxFile, top: list[GraphNode], bodies: dict, names: _Names) -> list[GraphNode]:
    """``top`` with each call replaced by its body, callers before callees
    on a stack of their own (nesting depth is the file's to choose)."""
    out: list[GraphNode] = []
    stack: list[tuple] = [(iter(top), None)]
    while stack:
        nodes, call = stack[-1]
        n = next(nodes, None)
        if n is None:
            stack.pop()
            if call is not None:
                out.extend(call.after)
            continue
        node = n if call is None else call.place(n)
        body = bodies.get(_key(node))
        if body is not None:
            stack.append((iter(range(len(body.nodes))), _Call(loaded, body, node, names)))
        else:
            out.append(node)
    return out
