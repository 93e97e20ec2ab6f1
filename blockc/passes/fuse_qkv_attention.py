"""Fuse the packed Q/K/V projection, the head split, the attention core and
the head join into one ``qkv_attention`` op: multi-head self-attention from
the layer's input up to (not including) the output projection, which is what
ONNX Runtime's ``com.microsoft.Attention`` computes in one kernel. Runs after
``fuse_qkv`` and ``fuse_attention``, whose results it reads.

Before::

    %1:f32[768,2304]    = concat @w_q, @w_k, @w_v {axis=1}
    %2:f32[b,s,2304]    = matmul %0, %1
    %3:f32[2304]        = concat @b_q, @b_k, @b_v {axis=0}
    %4:f32[b,s,2304]    = add %2, %3
    %5:f32[b,s,768], %6:f32[b,s,768], %7:f32[b,s,768] = split %4 {axis=-1, sizes=[768,768,768]}
    %8:f32[b,s,12,64]   = reshape %5 {shape=[0,0,12,64]}
    %9:f32[b,12,s,64]   = transpose %8 {perm=[0,2,1,3]}
    ... the same for %6 (K) and %7 (V), giving %13 and %12
    %14:f32[b,12,s,64]  = attention %9, %13, %12 {scale=0.125, mask="none", causal=true, fill=-3.4e+38}
    %15:f32[b,s,12,64]  = transpose %14 {perm=[0,2,1,3]}
    %16:f32[b,s,768]    = reshape %15 {shape=[0,0,768]}

After::

    %1:f32[768,2304]    = concat @w_q, @w_k, @w_v {axis=1}
    %3:f32[2304]        = concat @b_q, @b_k, @b_v {axis=0}
    %16:f32[b,s,768]    = qkv_attention %0, %1, %3 {heads=12, sizes=[768,768,768], scale=0.125,
                                                    mask="none", causal=true, fill=-3.4e+38}

Why a fusion of its own, after the others: on a CPU the head split and join
are four transposes and a split that only move data, and the packed
projection is the biggest GEMM before the output projection; one runtime op
does all of it without materialising Q, K and V per head. It stays a
separate, switchable pass so ``fuse_qkv`` and ``fuse_attention`` remain
visible on their own; the op decomposes back into exactly their results.

Grouped-query attention (fewer K/V heads than query heads, its core regrouped
from ``[b, kv_heads, group, s, d]`` before the join) is matched only to be
declined with that reason: ``qkv_attention``'s packed sizes are q = k.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops.fused import attention_attrs
from .base import PassResult
from .rewrite import Op, Or, Rule, Var, apply_rules

HEAD_SWAP = [0, 2, 1, 3]


def _swaps_heads(perm) -> bool:
    return list(perm) == HEAD_SWAP


PROJECTION = Op("add", Op("matmul", Var("x"), Var("w"), name="matmul"), Var("bias"), name="bias_add",
                commutative=True)


def _heads(part: str, index: int) -> Op:
    """[b, s, h*d] (one output of the projection's split) -> [b, h, s, d]."""
    split = (Op("split", PROJECTION, name="split", index=0) if index == 0
             else Op("split", name="split", index=index))  # the same split node, another output
    return Op("transpose", Op("reshape", split, name=f"{part}_cut"), name=f"{part}_heads",
              attrs={"perm": _swaps_heads})


ATTENTION = Op("attention", _heads("q", 0), _heads("k", 1), _heads("v", 2), name="attention")
# Grouped-query attention's core is [b, kv_heads, group, s, d], regrouped into [b, heads, s, d]
# before the join: matched only to say why it cannot become qkv_attention.
GROUPED = Op("reshape", Op("attention", name="grouped"), name="regroup")
PATTERN = Op("reshape", Op("transpose", Or(ATTENTION, GROUPED), name="join", attrs={"perm": _swaps_heads}),
             name="root")


def _check(m):
    if "grouped" in m:
        q, k = m["grouped"].inputs[:2]
        return (f"grouped-query attention ({q.shape[1]} K/V heads, each shared by {q.shape[2]} query heads): "
                f"qkv_attention takes one K/V head per query head")
    x, split = m["x"], m["split"]
    if x.type.rank != 3:
        return f"the projected input is {x.type}, not [batch, seq, hidden]"
    if m["w"].type.rank != 2 or m["bias"].type.rank != 1:
        return "the projection is not x @ W + b with a 2-D W and a 1-D b"
    if len(split.outputs) != 3 or split.attrs["axis"] % 3 != 2:
        return "the projection is not split in three along its last axis"
    batch, seq = x.shape[:2]
    shapes = [m[f"{p}_cut"].outputs[0].shape for p in "qkv"]
    if any(s[:2] != (batch, seq) for s in shapes) or len({s[2] for s in shapes}) != 1:
        return f"the head split {[list(s) for s in shapes]} does not cut Q, K and V into the same heads"
    heads = shapes[0][2]
    if not isinstance(heads, int) or any(not isinstance(s[3], int) for s in shapes):
        return "the heads or head sizes are not fixed numbers"
    if m["root"].outputs[0].shape != (batch, seq, heads * shapes[2][3]):
        return f"the heads are joined into {m['root'].outputs[0].type}, not [batch, seq, heads*head_size]"
    return None


def _rewrite(b, m):
    att = m["attention"]
    shapes = [m[f"{p}_cut"].outputs[0].shape for p in "qkv"]
    sizes = [s[2] * s[3] for s in shapes]
    attrs = attention_attrs(att.attrs)
    return {"root": b.op("qkv_attention", m["x"], m["w"], m["bias"], *att.inputs[3:],
                         heads=shapes[0][2], sizes=sizes, **attrs)}


RULES = [Rule("projection + attention", PATTERN, _rewrite, _check, "qkv_attention")]


def fuse_qkv_attention(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
