"""Absorb a written-out ``repeat_kv`` into attention: grouped-query attention
whose K/V heads were copied out to one per query head becomes attention over
the grouped heads (``ops.fused.group_heads``, the form blockc's own models
trace), which reads each K/V head once instead of a copy per query head.
Runs after ``fuse_attention``, whose result it reads, and before
``fuse_cache_attention`` and ``fuse_qkv_attention``, which know the grouped
form.

Before (Hugging Face's ``repeat_kv`` through torch.onnx: Unsqueeze, Expand,
Reshape)::

    %0:f32[b,2,1,s,16] = reshape %k {shape=[b,2,1,s,16]}
    %1:f32[b,2,2,s,16] = expand %0 {shape=[b,2,2,s,16]}
    %2:f32[b,4,s,16]   = reshape %1 {shape=[b,4,s,16]}
    %3:f32[b,2,1,s,16] = reshape %v {shape=[b,2,1,s,16]}
    %4:f32[b,2,2,s,16] = expand %3 {shape=[b,2,2,s,16]}
    %5:f32[b,4,s,16]   = reshape %4 {shape=[b,4,s,16]}
    %6:f32[b,4,s,16]   = attention %q, %2, %5, %mask {scale=0.25, mask="additive", causal=false, fill=-3.4e+38}

After::

    %0:f32[b,2,1,s,16] = reshape %k {shape=[b,2,1,s,16]}
    %1:f32[b,2,1,s,16] = reshape %v {shape=[b,2,1,s,16]}
    %2:f32[b,2,2,s,16] = reshape %q {shape=[0,2,2,-1,16]}
    %3:f32[b,1,1,s,s]  = reshape %mask {shape=[b,1,1,s,s]}
    %4:f32[b,2,2,s,16] = attention %2, %0, %1, %3 {scale=0.25, mask="additive", causal=false, fill=-3.4e+38}
    %5:f32[b,4,s,16]   = reshape %4 {shape=[0,4,-1,16]}

(``%mask`` ``[b, 1, s, s]``: a mask over every head is grouped as q is).

The copies' order is the grouped form's: ``repeat_kv`` repeats each K/V head
``n_rep`` times in a row, so query head ``h`` reads K/V head ``h // n_rep``.
K/V tiled the other way (``torch.Tensor.repeat``: query head ``h`` reads
``h % kv_heads``, the new axis before the K/V heads) is declined with that
reason, and so is a repeat that something else reads too (it would stay
materialised).
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops._rules import fmt
from ..ops.fused import group_heads, ungroup_heads
from .base import PassResult
from .rewrite import Op, Rule, Var, apply_rules


def _repeated(part: str) -> Op:
    """``[b, kv_heads, 1, t, d]`` expanded to ``[b, kv_heads, n_rep, t, d]`` and merged into ``[b, heads, t, d]``."""
    return Op("reshape", Op("expand", Var(f"{part}_grouped"), name=f"{part}_expand"), name=f"{part}_merge")


PATTERN = Op("attention", Var("q"), _repeated("k"), _repeated("v"), name="root")


def _repeat(m, part: str) -> tuple[int, int] | str:
    """(kv_heads, n_rep) of K's or V's repeat, or why it is not one the grouped form reads."""
    grouped, expanded = m[f"{part}_grouped"].shape, m[f"{part}_expand"].outputs[0].shape
    merged = m[f"{part}_merge"].outputs[0].shape
    name = part.upper()
    if len(grouped) != 5 or len(expanded) != 5 or len(merged) != 4:
        return f"{name} is not [b, kv_heads, 1, t, d] expanded and merged into [b, heads, t, d]"
    if grouped[1] == 1 != expanded[1] and grouped[2] == expanded[2]:
        return (f"{name}'s heads are tiled (query head h reads {name} head h % {expanded[2]}), not each "
                f"repeated in a row (head h // group) as grouped attention reads them")
    kv_heads, n_rep = expanded[1:3]
    if grouped[2] != 1 or any(grouped[i] != expanded[i] for i in (0, 1, 3, 4)):
        return f"the expand of {name} {fmt(grouped)} -> {fmt(expanded)} does more than repeat its heads"
    if tuple(merged) != (expanded[0], kv_heads * n_rep, *expanded[3:]):
        return f"the repeated {name} is reshaped to {fmt(merged)}, not its heads and their copies merged"
    if not (isinstance(kv_heads, int) and isinstance(n_rep, int)):
        return f"{name} has {kv_heads} heads repeated {n_rep} times: grouping needs fixed head counts"
    return kv_heads, n_rep


def _check(m):
    q = m["q"]
    if q.type.rank != 4:
        return f"q is {q.type}, not [batch, heads, seq, head_size]"
    k, v = _repeat(m, "k"), _repeat(m, "v")
    for found in (k, v):
        if isinstance(found, str):
            return found
    if k != v:
        return f"K has {k[0]} heads repeated {k[1]} times, V {v[0]} repeated {v[1]} times"
    if q.shape[1] != k[0] * k[1]:
        return f"q has {q.shape[1]} heads, K and V {k[0]} repeated {k[1]} times"
    return None


def _rewrite(b, m):
    att = m["root"]

    def reshape(x, dims):
        return b.op("reshape", x, shape=dims)

    mask = att.inputs[3] if len(att.inputs) > 3 else None
    kv_heads = m["k_expand"].outputs[0].shape[1]
    # K and V go in as they were before the repeat: [b, kv_heads, 1, t, d]
    q, k, v, mask = group_heads(m["q"], m["k_grouped"], m["v_grouped"], mask, kv_heads, reshape)
    out = b.op("attention", q, k, v, *([] if mask is None else [mask]), **att.attrs)
    return {"root": ungroup_heads(out, reshape)}


RULES = [Rule("repeat_kv + attention -> grouped attention", PATTERN, _rewrite, _check, "grouped_attention")]


def fuse_repeat_kv(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
