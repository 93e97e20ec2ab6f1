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

The halves may be sliced rather than split (Hugging Face's ``rotate_half``
through torch.onnx), and the rows may be computed where they are used
rather than gathered from tables (Hugging Face's rotary embedding: the
angles ``positions ⊗ inv_freq`` written twice side by side, their ``cos`` and
``sin``, perhaps times a scalar ``attention_scaling``)::

    %1:f32[1,s,16] = concat %angles, %angles {axis=-1}
    %2:f32[1,s,16] = cos %1
    %3:f32[1,1,s,16] = reshape %2 {shape=[1,1,s,16]}
    ... the rotation above, by %3 (and the sin rows) ...

The computed rows, one per token, become the fused op's table, read in
order: the values the graph multiplied by, for any position::

    %4:f32[s,16] = reshape %3 {shape=[-1,16]}
    %6:i64[s] = arange {n=s}
    %7:f32[b,4,s,16] = rotary %x, %4, %5, %6 {interleaved=false}

(rows ``[batch, 1, s, 16]``, from ``position_ids`` of each row, become a table
of ``batch*s`` rows and positions ``arange(batch*s)`` reshaped to ``[batch, s]``).
``cat(angles, angles)`` writes each angle for both members of its pair, as
the runtime ops' one-angle-per-pair caches assume; so does ``cat(cos(angles),
cos(angles))``, which an opset-23 ``RotaryEmbedding`` imports as (its cache
holds one value per pair, ``frontends/onnx/opset23.py``)::

    %1:f32[1,s,8] = cos %angles
    %2:f32[1,s,16] = concat %1, %1 {axis=-1}
A site that does not fit says why: a sign convention other than
``concat(-x2, x1) * sin``, heads laid out ``[batch, seq, heads, head_dim]``,
tables gathered along another axis, computed rows that pair dims half apart
under a rotation of adjacent pairs.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import PassResult
from .rewrite import Const, Op, Or, Rule, Var, apply_rules


def _table(name: str):
    """A table's rows at the positions: gathered, and for [batch, seq]
    positions reshaped so that one row serves every head; or the rows
    computed where they are used (an exporter's ``cos(cat(freqs, freqs))``,
    times a scalar such as Hugging Face's ``attention_scaling``)."""
    gathered = Op("gather", Var(name), Var("position_ids"), name=f"{name}_rows", consume=False)
    computed = Op(name, Op("concat", Var("angles"), Var("angles"), name=f"{name}_angles", consume=False),
                  name=f"{name}_fn", consume=False)
    computed = Or(Op("mul", computed, Const(f"{name}_scale"), commutative=True, name=f"{name}_scaled",
                     consume=False), computed)
    # the same values as cat(cos(a), cos(a)): an opset-23 RotaryEmbedding's
    # one-per-pair cache, written for both members as the import replays it
    half = Op(name, Var("angles"), name=f"{name}_half", consume=False)
    half = Or(Op("mul", half, Const(f"{name}_scale"), commutative=True, name=f"{name}_half_scaled",
                 consume=False), half)
    paired = Op("concat", half, half, name=f"{name}_paired", consume=False)
    rows = Or(gathered, computed, paired)
    return Or(Op("reshape", rows, name=f"{name}_heads", consume=False), rows)


def _rotated(turned):
    """The pair swap with one sign flipped, in both layouts; the halves split
    or sliced (``x[..., :rd/2]``, ``x[..., rd/2:]``, Hugging Face's ``rotate_half``)."""
    half = (Op("split", turned, name="halves", index=1),
            Op("split", turned, name="halves", index=0))
    rotate_half = Op("concat", Op("neg", half[0]), half[1], name="swap")
    sliced = Op("concat", Op("neg", Op("slice", turned, name="second_half")),
                Op("slice", turned, name="first_half"), name="swap")
    pairs = Op("reshape", turned, name="pairs")
    pair = (Op("split", pairs, name="pair_split", index=1),
            Op("split", pairs, name="pair_split", index=0))
    interleaved = Op("reshape", Op("concat", Op("neg", pair[0]), pair[1], name="swap"),
                     name="unpairs")
    return Or(rotate_half, sliced, interleaved)


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
    for name in ("root", "head_split", "halves", "swap", "pair_split", "cos_angles", "sin_angles",
                 "cos_paired", "sin_paired"):
        node = m.get(name)
        if node is not None and node.op in ("split", "concat"):
            rank = node.outputs[0].type.rank
            if node.attrs["axis"] % rank != rank - 1:
                return f"the {node.op} is along axis {node.attrs['axis']}, not the last"
    problem = _check_tables(m, x, rd) if "cos_rows" in m else _check_computed_rows(m, x, rd)
    if problem:
        return problem
    for name, want in (("first_half", (0, rd // 2)), ("second_half", (rd // 2, rd))):
        node = m.get(name)
        if node is not None and ((node.attrs["axis"] % x.type.rank) != x.type.rank - 1
                                 or (node.attrs["start"], node.attrs["end"]) != want):
            return (f"the {name.replace('_', ' ')} is x[{node.attrs['start']}:{node.attrs['end']}] along axis "
                    f"{node.attrs['axis']}, not [{want[0]}:{want[1]}] of the last")
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


def _check_tables(m, x, rd):
    if "sin_rows" not in m:
        return "the cos rows are gathered from a table but the sin rows are computed"
    cos, sin = m["cos"], m["sin"]
    if cos.type.rank != 2 or sin.type.rank != 2:
        return f"the cos/sin tables are {cos.type} and {sin.type}, not [positions, rotary_dim]"
    for name in ("cos_rows", "sin_rows"):
        if m[name].attrs["axis"] % 2 != 0:
            return f"the {name[:3]} table is gathered along axis {m[name].attrs['axis']}, not its rows"
    batch, seq = x.shape[0], x.shape[2]
    for name in ("cos", "sin"):
        rows = _rows(m, name)
        want = (batch, 1, seq, rd) if m["position_ids"].type.rank == 2 else (seq, rd)
        if tuple(rows.shape) != want:
            return (f"the {name} rows are {rows.type} for x {x.type}: the fused op turns "
                    f"[batch, heads, seq, head_dim] by rows [batch, 1, seq, rotary_dim] (or [seq, rotary_dim])")
    return None


def _rows(m, name: str):
    """The value the rotation multiplies by: the table rows as the pattern found them."""
    for key in ("heads", "rows", "scaled", "fn", "paired"):
        if f"{name}_{key}" in m:
            return m[f"{name}_{key}"].outputs[0]


def _computed_batch(m, x, rd):
    """For rows computed in the graph: the batch dim they have (1, or x's
    batch), or a reason they are not one row per token of x."""
    batch, seq = x.shape[0], x.shape[2]
    shapes = []
    for name in ("cos", "sin"):
        rows = _rows(m, name)
        shape = (1,) * (4 - rows.type.rank) + tuple(rows.shape)
        if rows.type.rank > 4 or shape[1:] != (1, seq, rd) or shape[0] not in (1, batch):
            return None, (f"the {name} rows are {rows.type} for x {x.type}: the fused op turns "
                          f"[batch, heads, seq, head_dim] by one row [rotary_dim] per token")
        shapes.append(shape)
    if shapes[0] != shapes[1]:
        return None, f"the cos and sin rows differ in shape, {_rows(m, 'cos').type} and {_rows(m, 'sin').type}"
    return shapes[0][0], None


def _check_computed_rows(m, x, rd):
    if "pairs" in m:
        # cos(cat(a, a)) writes angle i at i and i + rd/2: the rotate-half pairing, not adjacent pairs
        return "the cos/sin rows are computed as cat(angles, angles), which pairs dims half apart, " \
               "but the rotation turns adjacent pairs"
    return _computed_batch(m, x, rd)[1]


def _rewrite(b, m):
    if "cos_rows" in m:
        cos, sin, positions = m["cos"], m["sin"], m["position_ids"]
    else:
        # Rows computed per token become a table of one row per token, read in
        # order: exactly the values the graph multiplied by, for any position.
        x, rd = m["x"], _rows(m, "cos").shape[-1]
        rows, _ = _computed_batch(m, x, rd)
        cos, sin = (b.op("reshape", _rows(m, name), shape=[-1, rd]) for name in ("cos", "sin"))
        positions = b.op("arange", n=x.shape[2] if rows == 1 else x.shape[0] * x.shape[2])
        if rows != 1:
            positions = b.op("reshape", positions, shape=[x.shape[0], x.shape[2]])
    return {"root": b.op("rotary", m["x"], cos, sin, positions, interleaved="pairs" in m)}


# Partial first: see the module docstring.
PARTIAL_RULES = [Rule("partial rotary", Op("concat", _rotation(_PARTIAL, "rotation"), _REST, name="root",), _rewrite, _check, "rotary")]
RULES = [Rule("rotary", _rotation(Var("x"), "root"), _rewrite, _check, "rotary")]


def fuse_rotary(graph: Graph) -> PassResult:
    partial = apply_rules(graph, PARTIAL_RULES)
    whole = apply_rules(partial.graph, RULES)
    return PassResult(whole.graph, partial.changed or whole.changed, partial.sites + whole.sites)
