"""Fuse rotary position embeddings into one ``rotary`` op.

Before (rotate-half over a whole head of 16, the ops ``RotaryEmbedding``
in ``frontends/rotary.py`` emits)::

    %1:f32[b,s,16] = gather @rope.cos, %position_ids {axis=0}
    %2:f32[b,s,16] = gather @rope.sin, %position_ids {axis=0}
    %3:f32[b,1,s,16] = reshape %1 {shape=[0,1,-1,16]}
    %4:f32[b,1,s,16] = reshape %2 {shape=[0,1,-1,16]}
    %5:f32[b,4,s,8], %6:f32[b,4,s,8] = split %x {axis=-1, sizes=[8,8]}
    %7:f32[b,4,s,8] = neg %6
    %8:f32[b,4,s,16] = concat %7, %5 {axis=-1}
    %9:f32[b,4,s,16] = mul %x, %3
    %10:f32[b,4,s,16] = mul %8, %4
    %11:f32[b,4,s,16] = add %9, %10

After::

    %1:f32[b,4,s,16] = rotary %x, @rope.cos, @rope.sin, %position_ids {interleaved=false}

The gathers of the tables are shared by every layer's queries and keys, so
they are read, not consumed: once every site is fused nothing uses them and
``dce`` drops them.

Variants matched: rotate-half (``concat(-x2, x1)`` of the two halves) and
interleaved pairs (``reshape`` to ``[..., rd/2, 2]``, ``split``, ``concat(-odd,
even)``, ``reshape`` back); either operand order of the ``mul``s and the
``add``; positions ``[batch, seq]`` (the table rows reshaped to
``[batch, 1, seq, rd]``) or ``[seq]`` (the rows as they are); and partial
rotation, where only the first ``rd`` dims turn::

    %5:f32[b,4,s,8], %6:f32[b,4,s,8] = split %x {axis=-1, sizes=[8,8]}
    ... the rotation above, of %5 ...
    %12:f32[b,4,s,16] = concat %11, %6 {axis=-1}

which the first of the pass's two sweeps fuses, before the second fuses the
whole-head rotations (else the second would fuse the turned slice alone).
A site that does not fit says why: a sign convention other than
``concat(-x2, x1) * sin``, heads laid out ``[batch, seq, heads, head_dim]``,
tables gathered along another axis.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Op, Or, Rule, Var, apply_rules


def _table(name: str):
    """A table's rows at the positions: gathered, and for [batch, seq]
    positions reshaped so that one row serves every head."""
    rows = Op("gather", Var(name), Var("position_ids"), name=f"{name}_rows", consume=False)
    return Or(Op("reshape", rows, name=f"{name}_heads", consume=False), rows)


def _rotated(turned):
    """The pair swap with one sign flipped, in both layouts."""
    half = (Op("split", turned, name="halves", index=1),
            Op("split", turned, name="halves", index=0))
    rotate_half = Op("concat", Op("neg", half[0]), half[1], name="swap")
    pairs = Op("reshape", turned, name="pairs")
    pair = (Op("split", pairs, name="pair_split", index=1),
            Op("split", pairs, name="pair_split", index=0))
    interleaved = Op("reshape", Op("concat", Op("neg", pair[0]), pair[1], name="swap"),
                     name="unpairs")
    return Or(rotate_half, interleaved)


def _rotation(turned, name: str):
    """``turned * cos + rotated(turned) * sin``."""
    return Op("add", Op("mul", turned, _table("cos"), commutative=True),
              Op("mul", _rotated(turned), _table("sin"), commutative=True), commutative=True, name=name)


_PARTIAL = Op("split", Var("x"), name="head_split", index=0)
_REST = Op("split", Var("x"), name="head_split", index=1)


def _check(m):
    x = m["x"]
    turned = m["head_split"].outputs[0] if "head_split" in m else x
    rd = turned.shape[-1]
    if x.type.rank != 4:
        return f"the rotated tensor is {x.type}, not [batch, heads, seq, head_dim]"
    for name in ("root", "head_split", "halves", "swap", "pair_split"):
        node = m.get(name)
        if node is not None and node.op in ("split", "concat"):
            rank = node.outputs[0].type.rank
            if node.attrs["axis"] % rank != rank - 1:
                return f"the {node.op} is along axis {node.attrs['axis']}, not the last"
    cos, sin = m["cos"], m["sin"]
    if cos.type.rank != 2 or sin.type.rank != 2:
        return f"the cos/sin tables are {cos.type} and {sin.type}, not [positions, rotary_dim]"
    for name in ("cos_rows", "sin_rows"):
        if m[name].attrs["axis"] % 2 != 0:
            return f"the {name[:3]} table is gathered along axis {m[name].attrs['axis']}, not its rows"
    batch, heads, seq = x.shape[0], x.shape[1], x.shape[2]
    for name in ("cos", "sin"):
        rows = m[f"{name}_heads"] if f"{name}_heads" in m else m[f"{name}_rows"]
        want = (batch, 1, seq, rd) if m["position_ids"].type.rank == 2 else (seq, rd)
        if tuple(rows.outputs[0].shape) != want:
            return (f"the {name} rows are {rows.outputs[0].type} for x {x.type}: the fused op turns "
                    f"[batch, heads, seq, head_dim] by rows [batch, 1, seq, rotary_dim] (or [seq, rotary_dim])")
    if "halves" in m and list(m["halves"].attrs["sizes"]) != [rd // 2, rd // 2]:
        return f"the halves are split {list(m['halves'].attrs['sizes'])}, not [{rd // 2}, {rd // 2}]"
    if "pairs" in m:
        if tuple(m["pairs"].outputs[0].shape) != tuple(turned.shape[:-1]) + (rd // 2, 2):
            return f"the pairs are {m['pairs'].outputs[0].type}, not [..., {rd // 2}, 2]"
        if tuple(m["unpairs"].outputs[0].shape) != tuple(turned.shape):
            return f"the swapped pairs are reshaped to {m['unpairs'].outputs[0].type}, not {turned.type}"
    if "head_split" in m and len(m["head_split"].outputs) != 2:
        return "the head is split in more than two parts"
    return None


def _rewrite(b, m):
    return {"root": b.op("rotary", m["x"], m["cos"], m["sin"], m["position_ids"], interleaved="pairs" in m)}


# Partial first: see the module docstring.
PARTIAL_RULES = [Rule("partial rotary", Op("concat", _rotation(_PARTIAL, "rotation"), _REST, name="root",), _rewrite, _check, "rotary")]
RULES = [Rule("rotary", _rotation(Var("x"), "root"), _rewrite, _check, "rotary")]


def fuse_rotary(graph: Graph) -> PassResult:
    partial = apply_rules(graph, PARTIAL_RULES)
    whole = apply_rules(partial.graph, RULES)
    return PassResult(whole.graph, partial.changed or whole.changed, partial.sites + whole.sites)
