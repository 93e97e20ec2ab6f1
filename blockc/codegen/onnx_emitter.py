"""The object each op's ONNX lowering writes into.

An op's ``onnx_fn(e, node, input_names)`` (declared beside the op in
``blockc/ops``) calls four methods of ``e``:

* ``e.emit(op_type, inputs, n=1, domain="", unused=(), **attrs)`` -- one ONNX
  node; its fresh output name (or ``n`` of them, ``""`` at the optional
  output positions ``unused`` left off);
* ``e.const(array)`` -- a constant, stored once per distinct value;
* ``e.dims(dims)`` -- a 1-D int64 tensor of dims, symbolic ones read from the
  graph inputs' shapes at run time;
* ``e.scalar_dim(dim)`` -- the same for one dim, as a 0-D int64 scalar.

The emitter owns naming: every name it makes is fresh and never equal to a
graph input, parameter or output name, since ONNX names are one namespace.
A ``FunctionEmitter`` writes the body of an ONNX function instead (constants
become ``Constant`` nodes). ``lower_nodes`` drives the lowerings over a graph.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import BlockcError
from ..ir.dims import Dim, Sym, is_plain_symbol
from ..ir.graph import Graph
from ..ops import registry
from ..passes.legalize import legalize
from ..progress import BUILDING_ONNX, Progress, ticker



def _contiguous(array: np.ndarray) -> np.ndarray:
    """``array`` in C order, its shape kept: ``np.ascontiguousarray`` makes a
    0-D array 1-D, and ONNX ops that want scalars (``Range``) refuse that."""
    return np.ascontiguousarray(array).reshape(array.shape)

class OnnxEmitter:
    """Collects ONNX nodes and constant initializers for one graph."""

    def __init__(self, graph: Graph, opset: int, reserved: Iterable[str]):
        self.opset = opset              # lowerings may read it to pick an op version
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: dict[str, int] = {}   # custom domains used, with their versions
        self.scope = "graph"            # prefix of node names: the IR node being lowered
        self._taken = set(reserved)
        self._counter = 0
        self._made_by_node: set[str] = set()   # names that some emitted node outputs
        self._consts: dict[tuple, str] = {}
        self._dims1d: dict[Dim, str] = {}
        self._dims0d: dict[Dim, str] = {}
        self._dim_lists: dict[tuple, str] = {}
        # Where each symbolic dim can be read at run time: the first input axis of exactly that dim.
        self._axes: dict[Dim, tuple[str, int]] = {}
        for v in graph.inputs:
            for axis, d in enumerate(v.shape):
                if isinstance(d, Sym):
                    self._axes.setdefault(d, (v.name, axis))

    # -- names ------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A name no other value, input, parameter or output has."""
        while True:
            self._counter += 1
            name = f"{hint}_{self._counter}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def is_node_output(self, name: str) -> bool:
        return name in self._made_by_node

    # -- the lowering interface -------------------------------------------------------
    def emit(self, op_type: str, inputs: list[str], n: int = 1, domain: str = "", unused: Iterable[int] = (),
             **attrs):
        """Append one ONNX node; its output name, or a list of ``n`` names
        (``""`` for the optional outputs at positions ``unused``)."""
        unused = set(unused)
        outputs = ["" if i in unused else self.fresh(f"{self.scope}.{op_type}") for i in range(n)]
        while outputs and not outputs[-1]:
            outputs.pop()  # trailing optional outputs are simply left off
        self._made_by_node.update(o for o in outputs if o)
        if domain:
            self.domains.setdefault(domain, 1)
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=outputs[0],
                                           domain=domain or None, **attrs))
        outputs += [""] * (n - len(outputs))
        return outputs[0] if n == 1 else outputs

    def const(self, value) -> str:
        """A constant holding ``value``; identical values share one (``hold``
        says where it lives)."""
        array = np.asarray(value)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.fresh("const")
            self.hold(self._consts[key], numpy_helper.from_array(_contiguous(array), self._consts[key]))
        return self._consts[key]

    def hold(self, name: str, tensor) -> None:
        """Keep the constant ``name`` (a ``TensorProto``): in a graph, an initializer."""
        self.initializers.append(tensor)

    def dims(self, dims) -> str:
        """A 1-D int64 tensor of ``dims``: ints (including Reshape's 0 and -1)
        as constants, symbolic dims computed from input shapes."""
        dims = tuple(dims)
        if all(isinstance(d, int) for d in dims):
            return self.const(np.array(dims, np.int64))
        if dims not in self._dim_lists:
            if len(dims) == 1:
                self._dim_lists[dims] = self._dim_1d(dims[0])
            else:
                # Runs of plain ints become one constant piece of the Concat.
                pieces, run = [], []
                for d in dims:
                    if isinstance(d, int):
                        run.append(d)
                        continue
                    if run:
                        pieces.append(self.const(np.array(run, np.int64)))
                        run = []
                    pieces.append(self._dim_1d(d))
                if run:
                    pieces.append(self.const(np.array(run, np.int64)))
                self._dim_lists[dims] = self.emit("Concat", pieces, axis=0)
        return self._dim_lists[dims]

    def scalar_dim(self, dim: Dim) -> str:
        """A 0-D int64 scalar holding ``dim``."""
        if isinstance(dim, int):
            return self.const(np.array(dim, np.int64))
        if dim not in self._dims0d:
            self._dims0d[dim] = self.emit("Squeeze", [self._dim_1d(dim), self.const(np.array([0], np.int64))])
        return self._dims0d[dim]

    # -- symbolic arithmetic, on int64 tensors of shape [1] ------------------------
    def _dim_1d(self, dim: Dim) -> str:
        if isinstance(dim, int):
            return self.const(np.array([dim], np.int64))
        if dim not in self._dims1d:
            # A dim whose symbols are not all readable (batch*seq where only that product is an axis) is
            # read whole from its axis.
            whole = dim in self._axes and not all(self._solve(s) for s in dim.symbols)
            self._dims1d[dim] = self._read(dim) if whole else self._polynomial(dim)
        return self._dims1d[dim]

    def _read(self, dim: Sym) -> str:
        source, axis = self._axes[dim]
        return self.emit("Shape", [source], start=axis, end=axis + 1)

    def _solve(self, name: str) -> tuple[Sym, Dim] | None:
        """Where to read the symbol ``name``: an input axis ``dim`` and the
        rest ``dim - name`` to take off it -- its own axis (rest 0) first, else
        an axis where it is added once to dims read from their own axes
        (``past`` from a ``past+seq`` axis less a ``seq`` one)."""
        key = Sym.var(name)
        if key in self._axes:
            return key, 0
        for dim in self._axes:
            rest = dim - key
            symbols = rest.symbols if isinstance(rest, Sym) else set()
            if name not in symbols and all(Sym.var(s) in self._axes for s in symbols):
                return dim, rest
        return None

    def _symbol(self, name: str) -> str:
        key = Sym.var(name)
        if key not in self._dims1d:
            found = self._solve(name)
            if found is None:
                raise BlockcError(f"ONNX export: dimension '{name}' is used by an op, but no graph input has "
                                  f"an axis of exactly '{name}' (or of '{name}' plus dims read so) to read it from")
            dim, rest = found
            if dim not in self._dims1d:
                self._dims1d[dim] = self._read(dim)
            self._dims1d[key] = self._dims1d[dim] if rest == 0 else self.emit("Sub", [self._dims1d[dim],
                                                                                      self._dim_1d(rest)])
        return self._dims1d[key]

    def _polynomial(self, dim: Sym) -> str:
        if is_plain_symbol(dim):
            return self._symbol(next(iter(dim.symbols)))
        acc = None
        for monomial, coeff in dim.terms.items():
            if not monomial:
                continue  # the constant term is added last
            term = self._monomial(monomial)
            if acc is None:
                acc = term if coeff == 1 else self.emit("Mul", [term, self._dim_1d(coeff)])
                continue
            if abs(coeff) != 1:
                term = self.emit("Mul", [term, self._dim_1d(abs(coeff))])
            acc = self.emit("Add" if coeff > 0 else "Sub", [acc, term])
        constant = dim.terms.get((), 0)
        if constant:
            acc = self.emit("Add" if constant > 0 else "Sub", [acc, self._dim_1d(abs(constant))])
        return acc

    def _monomial(self, monomial: tuple) -> str:
        key = Sym({monomial: 1})
        if key not in self._dims1d:
            acc = self._symbol(monomial[0])
            for name in monomial[1:]:
                acc = self.emit("Mul", [acc, self._symbol(name)])
            self._dims1d[key] = acc
        return self._dims1d[key]


class FunctionEmitter(OnnxEmitter):
    """Writes the body of an ONNX function: a ``FunctionProto`` has no
    initializers, so constants are ``Constant`` nodes; symbolic dims are read
    from the shapes of the function's own inputs (``graph`` is the body)."""

    def hold(self, name: str, tensor) -> None:
        """A function has no initializers: the constant is a ``Constant`` node's output."""
        self._made_by_node.add(name)
        self.nodes.append(helper.make_node("Constant", [], [name], name=name, value=tensor))


# -- driving the lowerings over a graph ------------------------------------------------
def lower_composites(graph: Graph, keep: Iterable[str] = ()) -> Graph:
    """``graph`` legalized for ONNX: the ops without an ONNX lowering
    decomposed, except those in ``keep`` (lowered by other means); an error
    names the first op that has neither."""
    keep = set(keep)
    graph = legalize(graph, lambda opdef: opdef.onnx_fn is not None or opdef.name in keep).graph
    for index, node in enumerate(graph.nodes):
        opdef = registry.get(node.op)
        if opdef.onnx_fn is None and node.op not in keep:
            raise BlockcError(f"ONNX export: op {node.op} (node {index}) has no ONNX lowering and no decomposition")
    return graph


def lower_nodes(e: OnnxEmitter, graph: Graph, names: dict, lower: Callable | None = None,
                progress: Progress | None = None) -> None:
    """Lower every node of ``graph`` into ``e``, in order. ``names`` maps
    ``id(value)`` to its ONNX name, inputs and parameters already in; each
    node's results are added. Nodes whose op has no ``onnx_fn`` go to
    ``lower(e, node, input_names, index)``. ``progress`` (``blockc.progress``)
    hears of the nodes lowered."""
    tick = ticker(progress, BUILDING_ONNX, len(graph.nodes))
    for index, node in enumerate(graph.nodes):
        e.scope = f"n{index}.{node.op}"
        ins = [names[id(v)] for v in node.inputs]
        fn = registry.get(node.op).onnx_fn
        outs = fn(e, node, ins) if fn is not None else lower(e, node, ins, index)
        if len(outs) != len(node.outputs):
            raise BlockcError(f"ONNX export: the lowering of {node.op} (node {index}) gave {len(outs)} "
                              f"results for {len(node.outputs)} outputs")
        for value, name in zip(node.outputs, outs):
            names[id(value)] = name
        tick(index + 1)


def name_outputs(e: OnnxEmitter, outputs: list[tuple[str, str]]) -> list:
    """The emitted node list with each output (``(output name, current
    name)``) renamed to its output name.

    A value first made by a node is renamed in place; anything else (an
    input, a parameter, a constant, a value already named by an earlier
    output) goes through an Identity node.
    """
    rename: dict[str, str] = {}
    extra = []
    for out_name, current in outputs:
        if current == out_name:
            continue
        if e.is_node_output(current) and current not in rename:
            rename[current] = out_name
        else:
            extra.append(helper.make_node("Identity", [rename.get(current, current)], [out_name],
                                          name=e.fresh("output.Identity")))
    for node in e.nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name in rename:
                    field[i] = rename[name]
    return e.nodes + extra
