"""Fuse a cache step into one op: a preallocated cache's write, its read
and the attention core into ``cache_attention`` (``ops/kv_cache.py``); an
appended cache and the attention over it into ``append_attention``. Runs after
``fuse_attention``, whose result it reads. The first is what a decode graph
with a preallocated cache (``DecoderLM.for_cache("decode", cache_len=...)``)
holds.

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

An exporter's cache (torch.onnx's, Optimum's ``decoder_with_past_model.onnx``)
is appended instead: the present is ``concat(past, new)`` along the rows, a
new and longer tensor each step, and a graph output. That is the second
rule, into ``append_attention`` (``ops/append_attention.py``)::

    %20:f32[b,h,past+seq,d] = concat %past_k, %17 {axis=2}
    %21:f32[b,h,past+seq,d] = concat %past_v, %19 {axis=2}
    %22:f32[b,h,seq,d]      = attention %15, %20, %21, %4 {scale=0.25, mask="bool", ..., guarded=true}
    return ..., present_k=%20, present_v=%21

becomes::

    %22:f32[b,h,seq,d], %20:f32[b,h,past+seq,d], %21:f32[b,h,past+seq,d] =
        append_attention %15, %17, %19, %past_k, %past_v, %4 {scale=0.25, mask="bool", ..., guarded=true}
"""
from __future__ import annotations

from ..ir.graph import Graph
from ..ops.fused import attention_attrs
from .base import PassResult
from .rewrite import Op, Or, Rule, Var, apply_rules


def _grouped(read: Op, part: str) -> Or:
    """``read``, maybe reshaped to [b, kv_heads, 1, total, d] (grouped-query attention)."""
    return Or(Op("reshape", read, name=f"{part}_group"), read)


def _read(part: str) -> Or:
    """The first rows of a cache just written: ``slice(cache_write(cache, new))``, maybe regrouped."""
    written = Op("cache_write", Var(f"{part}_cache"), Var(f"{part}_new"), name=f"{part}_write")
    return _grouped(Op("slice", written, name=f"{part}_read"), part)


def _appended(part: str) -> Or:
    """The past with the step's rows appended: ``concat(past, new)``, maybe regrouped."""
    return _grouped(Op("concat", Var(f"{part}_past"), Var(f"{part}_new"), name=f"{part}_append"), part)


PATTERN = Op("attention", Var("q"), _read("k"), _read("v"), name="root")
APPENDED = Op("attention", Var("q"), _appended("k"), _appended("v"), name="root")


def _check_grouping(m, read: str) -> str | None:
    """Why the reads of the k and v caches (matched as ``{part}_{read}``) are not as attention's q wants them."""
    for part in "kv":
        grouped, r = m.get(f"{part}_group"), m[f"{part}_{read}"].outputs[0]
        if grouped is not None and list(grouped.outputs[0].shape) != [r.shape[0], r.shape[1], 1, *r.shape[2:]]:
            return f"the {part} read is reshaped to {grouped.outputs[0].type}, not [b, kv_heads, 1, total, d]"
    if m["q"].type.rank != (5 if "k_group" in m else 4) or ("k_group" in m) != ("v_group" in m):
        return f"q {m['q'].type} and the cache reads are not both plain or both grouped"
    return None


def _check(m):
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
    return _check_grouping(m, "read")


def _check_appended(m):
    for part in "kv":
        append = m[f"{part}_append"]
        rank = append.outputs[0].type.rank
        if rank != 4 or append.attrs["axis"] % rank != 2:
            return (f"the {part} cache is a concat along axis {append.attrs['axis']} of {append.outputs[0].type}, "
                    f"not [batch, kv_heads, len, head_size] appended along its rows")
    return _check_grouping(m, "append")


def _rewrite(b, m):
    att = m["root"]
    attrs = attention_attrs(att.attrs)
    node = b.node("cache_attention", m["q"], m["k_new"], m["v_new"], m["k_cache"], m["v_cache"], *att.inputs[3:],
                  start=m["k_write"].attrs["start"], **attrs)
    out, k_cache, v_cache = node.outputs
    return {"root": out, "k_write": k_cache, "v_write": v_cache}


def _rewrite_appended(b, m):
    att = m["root"]
    node = b.node("append_attention", m["q"], m["k_new"], m["v_new"], m["k_past"], m["v_past"], *att.inputs[3:],
                  **attention_attrs(att.attrs))
    out, present_k, present_v = node.outputs
    return {"root": out, "k_append": present_k, "v_append": present_v}


RULES = [Rule("cache write + read + attention", PATTERN, _rewrite, _check, "cache_attention"),
         Rule("cache append + attention", APPENDED, _rewrite_appended, _check_appended, "append_attention")]


def fuse_cache_attention(graph: Graph) -> PassResult:
    return apply_rules(graph, RULES)
