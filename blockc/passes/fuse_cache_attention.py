"""Fuse a preallocated cache's write, its read and the attention core into
one ``cache_attention`` op (``ops/kv_cache.py``). Runs after
``fuse_attention``, whose result it reads; only decode graphs with a
preallocated cache (``DecoderLM.for_cache("decode", cache_len=...)``) have
the pattern.

Before::

    %20:f32[b,4,64,16]    = cache_write %"past.0.key", %17 {axis=2, start=total-seq}
    %21:f32[b,4,64,16]    = cache_write %"past.0.value", %19 {axis=2, start=total-seq}
    %22:f32[b,4,total,16] = slice %20 {axis=2, start=0, end=total}
    %23:f32[b,4,total,16] = slice %21 {axis=2, start=0, end=total}
    %24:f32[b,4,seq,16]   = attention %15, %22, %23, %4 {scale=0.25, mask="bool", causal=true, fill=-3.4e+38}
    return ..., "present.0.key"=%20, "present.0.value"=%21

After::

    %24:f32[b,4,seq,16], %20:f32[b,4,64,16], %21:f32[b,4,64,16] = cache_attention %15, %17, %19,
        %"past.0.key", %"past.0.value", %4 {scale=0.25, mask="bool", causal=true, fill=-3.4e+38, start=total-seq}

Grouped-query attention reads the cache through a reshape to
``[b, kv_heads, 1, total, d]``; that reshape is part of the pattern too.
Why: the read (``slice``) is the one place an unfused graph still copies the
past every step on ONNX Runtime, and ``GroupQueryAttention`` (the op's
``contrib`` encoding) attends to a prefix of a buffer without copying it.
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops.fused import ATTENTION_ATTRS
from .base import PassResult
from .rewrite import Op, Or, Rule, Var, apply_rules


def _read(part: str) -> Op:
    """The first rows of a cache just written: ``slice(cache_write(cache, new))``, maybe regrouped.
    ``concat(past, new)`` (an exporter's cache, a new and longer present each
    step) is matched too, only for ``_check`` to say why it does not fuse."""
    written = Op("slice", Op("cache_write", Var(f"{part}_cache"), Var(f"{part}_new"), name=f"{part}_write"),
                 name=f"{part}_read")
    read = Or(written, Op("concat", Var(f"{part}_cache"), Var(f"{part}_new"), name=f"{part}_read"))
    return Or(Op("reshape", read, name=f"{part}_group"), read)


PATTERN = Op("attention", Var("q"), _read("k"), _read("v"), name="root")


APPENDED = ("the {part} cache is the past with the step's rows appended (concat), a present longer than its "
            "past, not a buffer written in place: cache_attention's caches keep their rows")


def _check(m):
    for part in "kv":
        read = m[f"{part}_read"]
        if read.op == "concat":
            axis = read.attrs["axis"] % read.outputs[0].type.rank
            return APPENDED.format(part=part) if axis == 2 else f"the {part} read is a concat along axis {axis}"
    k_write, v_write = m["k_write"], m["v_write"]
    if k_write.attrs["axis"] % 4 != 2 or v_write.attrs["axis"] % 4 != 2 or k_write.inputs[0].type.rank != 4:
        return "the caches are not [batch, kv_heads, len, head_size] written along their rows"
    if k_write.attrs["start"] != v_write.attrs["start"]:
        return f"keys are written at {k_write.attrs['start']}, values at {v_write.attrs['start']}"
    total = k_write.attrs["start"] + k_write.inputs[1].shape[2]
    for part in "kv":
        read = m[f"{part}_read"]
        if read.attrs["axis"] % 4 != 2 or read.attrs["start"] != 0 or read.attrs["end"] != total:
            return f"the {part} read is not the first {total} rows of the cache just written"
        grouped = m.get(f"{part}_group")
        if grouped is not None and list(grouped.outputs[0].shape) != \
                [read.outputs[0].shape[0], read.outputs[0].shape[1], 1, *read.outputs[0].shape[2:]]:
            return f"the {part} read is reshaped to {grouped.outputs[0].type}, not [b, kv_heads, 1, total, d]"
    if m["q"].type.rank != (5 if "k_group" in m else 4) or ("k_group" in m) != ("v_group" in m):
        return f"q {m['q'].type} and the cache reads are not both plain or both grouped"
    return None


def _rewrite(b, m):
    att = m["root"]
    attrs = {k: att.attrs[k] for k in ATTENTION_ATTRS}
    node = b.node("cache_attention", m["q"], m["k_new"], m["v_new"], m["k_cache"], m["v_cache"], *att.inputs[3:],
                  start=m["k_write"].attrs["start"], **attrs)
    out, k_cache, v_cache = node.outputs
    return {"root": out, "k_write": k_cache, "v_write": v_cache}


RULES = [Rule("cache write + read + attention", PATTERN, _rewrite, _check, "cache_attention")]


def fuse_cache_attention(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
