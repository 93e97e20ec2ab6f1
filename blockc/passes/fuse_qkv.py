"""Merge projections that read the same input (Q, K and V) into one MatMul
with concatenated weights, then a Split.

Before::

    %4:f32[b,s,64]  = matmul %3, @attn.w_q.weight
    %5:f32[b,s,64]  = add %4, @attn.w_q.bias
    %8:f32[b,s,64]  = matmul %3, @attn.w_k.weight
    %9:f32[b,s,64]  = add %8, @attn.w_k.bias
    %12:f32[b,s,64] = matmul %3, @attn.w_v.weight
    %13:f32[b,s,64] = add %12, @attn.w_v.bias

After::

    %4:f32[64,192]  = concat @attn.w_q.weight, @attn.w_k.weight, @attn.w_v.weight {axis=1}
    %5:f32[b,s,192] = matmul %3, %4
    %6:f32[192]     = concat @attn.w_q.bias, @attn.w_k.bias, @attn.w_v.bias {axis=0}
    %7:f32[b,s,192] = add %5, %6
    %8:f32[b,s,64], %9:f32[b,s,64], %10:f32[b,s,64] = split %7 {axis=-1, sizes=[64,64,64]}

Any sibling projections merge, not only attention's: SwiGLU's gate and up
(``silu(x @ W_gate) * (x @ W_up)``, no bias) become one ``[d, 2·d_ff]`` MatMul
and a two-way Split the same way, and grouped-query attention's narrower K
and V simply get narrower pieces.

This is a horizontal fusion -- siblings, not a chain -- so it is not a tree
pattern: the rule is "every MatMul of the same input by a 2-D parameter",
grouped, then rewritten. The concatenated weights are a ``concat`` of
parameters, which exporters and runtimes fold once at load time.
"""
from __future__ import annotations

from ..ir.builder import Builder
from ..ir.graph import Graph, Node
from .base import PassResult
from .rewrite import Site, _label, _origin_key


def _projection(n: Node, returned: set):
    """(weight, bias-add node, bias) when ``n`` is x @ W (+ b) with W and b
    parameters; the last two are None without a bias (or when x @ W is also
    used elsewhere: a graph output in ``returned``, say)."""
    w = n.inputs[1]
    if n.op != "matmul" or w.kind != "param" or w.type.rank != 2:
        return None
    users = n.outputs[0].users()
    if len(users) == 1 and users[0].op == "add" and len(n.outputs[0].uses) == 1 \
            and id(n.outputs[0]) not in returned:
        add = users[0]
        bias = add.inputs[1] if add.inputs[0] is n.outputs[0] else add.inputs[0]
        if bias.kind == "param" and bias.shape == (w.shape[1],):
            return w, add, bias
    return w, None, None


def fuse_qkv(graph: Graph) -> PassResult:
    g = graph.copy()
    sites: list[Site] = []
    groups: dict[int, list[Node]] = {}
    returned = {id(v) for _, v in g.outputs}
    # Places in the node list, taken once: nodes added later go before an
    # existing one, so the originals keep their relative order.
    order = {n: i for i, n in enumerate(g.nodes)}
    for n in g.nodes:
        if n.op == "matmul" and _projection(n, returned) is not None:
            groups.setdefault(id(n.inputs[0]), []).append(n)
    changed = False
    for members in groups.values():
        if len(members) < 2:
            continue
        site = Site("merge sibling projections", "qkv", _label(members[0]), "matmul", False)
        projections = [_projection(n, returned) for n in members]
        with_bias = [p[1] is not None for p in projections]
        if any(with_bias) != all(with_bias):
            site.reason = "some projections have a bias and some do not"
        elif len({p[0].dtype for p in projections}) != 1:
            site.reason = "the weights have different dtypes"
        if site.reason:
            sites.append(site)
            continue
        x = members[0].inputs[0]
        last = max((p[1] or n for n, p in zip(members, projections)), key=order.__getitem__)
        b = Builder(g, before=last, loc=members[0].loc)
        w = b.op("concat", *[p[0] for p in projections], axis=1)
        y = b.op("matmul", x, w)
        if all(with_bias):
            y = b.op("add", y, b.op("concat", *[p[2] for p in projections], axis=0))
        parts = b.node("split", y, axis=-1, sizes=[p[0].shape[1] for p in projections]).outputs
        consumed = []
        for n, (_, add, _), part in zip(members, projections, parts):
            g.replace_all_uses((add or n).outputs[0], part)
            consumed += [n] + ([add] if add else [])
        origin = tuple(sorted({o for n in consumed for o in n.origin}, key=_origin_key))
        for new in b.created:
            new.origin = origin
        consumed.sort(key=order.__getitem__)
        site.nodes = [_label(n) for n in consumed]
        site.ops = [n.op for n in consumed]
        for n in reversed(consumed):
            g.remove_node(n)
        site.fused, site.result = True, "concat+matmul" + ("+add" if all(with_bias) else "") + "+split"
        sites.append(site)
        changed = True
    if changed:
        g.sort()
    return PassResult(g, changed, sites)
