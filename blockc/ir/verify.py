"""The verifier: SSA, definition before use, use-lists, and types.

Run on the optimizer's result, and after every pass in tests
(``BLOCKC_VERIFY_EACH_PASS``, ``passes/manager.py``; like JAX's
``check_jaxpr`` or torch.fx's ``graph.lint()``). Raises ``VerifyError`` naming the first broken node.
"""
from __future__ import annotations

from ..errors import BlockcError, VerifyError
from . import opdef as registry
from .graph import Graph


def verify(g: Graph) -> None:

    defined: set[int] = set()
    for v in g.inputs:
        if v.kind != "input":
            raise VerifyError(f"graph input {v.name!r} is not an input value")
        defined.add(id(v))
    for name, v in g.params.items():
        if v.kind != "param" or v.name != name:
            raise VerifyError(f"parameter {name!r} is mislabelled")
        defined.add(id(v))
    seen_nodes: set[int] = set()
    for index, n in enumerate(g.nodes):
        where = f"node {index} ({n.op})"
        if id(n) in seen_nodes:
            raise VerifyError(f"{where} appears twice in the node list")
        seen_nodes.add(id(n))
        for pos, v in enumerate(n.inputs):
            if id(v) not in defined:
                raise VerifyError(f"{where}: input {pos} is used before it is defined (or never defined)")
            if (n, pos) not in v.uses:
                raise VerifyError(f"{where}: input {pos} is missing from its value's use-list")
        try:
            _, types = registry.get(n.op).result_types([v.type for v in n.inputs], n.attrs)
        except BlockcError as e:
            raise VerifyError(f"{where}: {e}") from None
        if [o.type for o in n.outputs] != list(types):
            raise VerifyError(f"{where}: result types {[str(o.type) for o in n.outputs]} "
                              f"differ from the op's rule {[str(t) for t in types]}")
        for i, o in enumerate(n.outputs):
            if o.producer is not n or o.index != i or id(o) in defined:
                raise VerifyError(f"{where}: result {i} is not an SSA value of this node")
            defined.add(id(o))
    for v in list(g.inputs) + list(g.params.values()) + [o for n in g.nodes for o in n.outputs]:
        for user, pos in v.uses:
            if id(user) not in seen_nodes or user.inputs[pos] is not v:
                raise VerifyError(f"a use-list names a {user.op} node that does not use the value")
    names = set()
    for name, v in g.outputs:
        if name in names:
            raise VerifyError(f"graph output {name!r} is named twice")
        names.add(name)
        if id(v) not in defined:
            raise VerifyError(f"graph output {name!r} is not defined in the graph")
