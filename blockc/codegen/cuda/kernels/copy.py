"""Data movement: transpose, slice, split, concat, gather (embedding
lookup) and a KV cache's write as index-mapped copies. (``reshape`` needs no
kernel: the output aliases its input's buffer.)

``cache_write`` is two launches: the cache copied whole into the output, and
the step's rows written over it. Where the caller passes the cache's own
buffer as the output (a decode step's past and present as one device
buffer, through the C API), the first is skipped at run time, so the step
costs its rows, not the cache."""
from __future__ import annotations

from dataclasses import dataclass

from ....ir.graph import Node, Value
from ....ops.registry import get
from ..family import ALIAS, KernelFamily, KernelStep, register
from ..kernel import CudaCodegenError, KernelCode, LowerContext, ctype, index_lines, shape_class, suffix


def _strides(shape, ctx: LowerContext) -> list[str]:
    out, step = [], "1LL"
    for d in reversed(shape):
        out.append(step)
        step = ctx.dim(d) if step == "1LL" else f"{step} * {ctx.dim(d)}"
    return list(reversed(out))


def own_indices(node: Node) -> Value | None:
    """The indices ``node`` checks in its own slot of ``id_errors``: ids it
    reads (its declaration's ``indexes``: a gather's, a rotary's positions)
    that are not a graph input. An input's ids have a range of their own
    (``ops/limits.py``), which Python checks before a run and every kernel
    reading them flags in the input's slot; computed ones nobody checks
    beforehand."""
    indexes = get(node.op).indexes
    return next((ids for ids, _, _ in (indexes(node) if indexes else ()) if ids.kind != "input"), None)


@dataclass(frozen=True)
class IdCheck:
    """How a kernel reads an id ``given`` (a C expression) into a table of
    ``rows`` entries, as the op's numpy meaning does (np.take): negative ids
    count from the end (``at``); ``ok`` where the meaning has an entry.
    ``in_range`` is what the run must hold, reported through ``flag``: an
    input's ids lie in [0, rows) (ops/limits.py), flagged in the input's
    slot; computed ones (own_indices) keep the meaning's [-rows, rows), each
    node in a slot of its own."""

    at: str
    ok: str
    in_range: str
    flag: str | None


def id_check(ctx: LowerContext, node: Node, ids: Value, given: str, rows: str) -> IdCheck:
    ok = f"({given} >= -{rows} && {given} < {rows})"
    flag, in_range = ctx.id_flag(ids), f"({given} >= 0 && {given} < {rows})"
    if flag is None:
        flag, in_range = ctx.id_flag(node), ok
    return IdCheck(f"({given} < 0 ? {given} + {rows} : (long long){given})", ok, in_range, flag)


def _copy(name, title, labels, ctx, in_v, out_v, iter_shape, in_off, out_off, op, value=None, index=None,
          check=None, flag=None):
    params = dict(title=title, T=ctype(out_v.dtype), index_t=ctype(index.dtype) if index is not None else None,
                  check=check, index_lines=index_lines(iter_shape, ctx, f"{out_off} {value or in_off} {check or ''}"),
                  out_offset=out_off, value=value or f"in[{in_off}]", symbols=ctx.symbols)
    args = [ctx.ptr(in_v)] + ([ctx.ptr(index)] if index is not None else []) + ([flag] if check else []) + \
        [ctx.ptr(out_v), ctx.numel(iter_shape)] + [f"dim_{s}" for s in ctx.symbols]
    return KernelCode(name, "copy.cu.j2", params, lambda n: f"{n}_launch({', '.join(args)}, stream);", labels, [op],
                      ("",))


def _linear(strides, shape) -> str:
    return " + ".join(f"idx{a} * {s}" for a, s in enumerate(strides)) or "0"


def _transpose(node: Node, ctx: LowerContext, labels: list[str], dt: str) -> list[KernelCode]:
    x, out = node.inputs[0], node.outputs[0]
    perm = node.attrs["perm"]
    in_strides = _strides(x.shape, ctx)
    off = " + ".join(f"idx{k} * {in_strides[p]}" for k, p in enumerate(perm)) or "0"
    name = f"transpose_{''.join(map(str, perm))}_{dt}_{shape_class(out.shape)}"
    return [_copy(name, f"transpose perm={list(perm)}", labels, ctx, x, out, out.shape, off, "i", node.op)]


def _slices(node: Node, ctx: LowerContext, labels: list[str], dt: str, starts: list) -> list[KernelCode]:
    """Each output a run of the input along ``axis``, from its start."""
    x = node.inputs[0]
    axis = node.attrs["axis"] % x.type.rank
    in_strides = _strides(x.shape, ctx)
    codes = []
    for out, start in zip(node.outputs, starts):
        off = _linear(in_strides, out.shape) + f" + {ctx.dim(start)} * {in_strides[axis]}"
        name = f"{node.op}_axis{axis}_{dt}_{shape_class(out.shape)}"
        codes.append(_copy(name, f"{node.op} along axis {axis}", labels, ctx, x, out, out.shape, off, "i", node.op))
    return codes


def _slice(node: Node, ctx: LowerContext, labels: list[str], dt: str) -> list[KernelCode]:
    return _slices(node, ctx, labels, dt, [node.attrs["start"]])


def _split(node: Node, ctx: LowerContext, labels: list[str], dt: str) -> list[KernelCode]:
    starts, acc = [], 0
    for s in node.attrs["sizes"]:
        starts.append(acc)
        acc = s + acc
    return _slices(node, ctx, labels, dt, starts)


def _concat(node: Node, ctx: LowerContext, labels: list[str], dt: str) -> list[KernelCode]:
    out = node.outputs[0]
    axis = node.attrs["axis"] % out.type.rank
    out_strides = _strides(out.shape, ctx)
    codes, start = [], 0
    for v in node.inputs:
        off = _linear(out_strides, v.shape) + f" + {ctx.dim(start)} * {out_strides[axis]}"
        name = f"concat_axis{axis}_{dt}_{shape_class(v.shape)}"
        codes.append(_copy(name, f"one input of a concat along axis {axis}", labels, ctx, v, out, v.shape, "i",
                           off, node.op))
        start = v.shape[axis] + start
    return codes


def _gather(node: Node, ctx: LowerContext, labels: list[str], dt: str) -> list[KernelCode]:
    table, ids = node.inputs
    out = node.outputs[0]
    if node.attrs["axis"] % table.type.rank != 0:
        raise CudaCodegenError("gather: the CUDA backend takes entries along axis 0 only")
    rank, lead = out.type.rank, ids.type.rank
    ids_off = _linear(_strides(ids.shape, ctx), ids.shape)
    # An entry of the table is a row (an embedding) or, for a 1-D table, one element (a mask bit).
    inner_strides = _strides(table.shape[1:], ctx)
    inner = " + ".join(f"idx{lead + a}" if st == "1LL" else f"idx{lead + a} * {st}"
                       for a, st in enumerate(inner_strides)) or "0"
    rows, width = ctx.dim(table.shape[0]), ctx.numel(table.shape[1:])
    ids_check = id_check(ctx, node, ids, f"index[{ids_off}]", rows)
    T = ctype(out.dtype)
    missing = f"blockc_from_compute<{T}>(NAN)" if out.dtype.is_float else f"({T})0"
    value = f"{ids_check.ok} ? in[{ids_check.at} * {width} + {inner}] : {missing}"
    name = f"gather_rows_{dt}_{shape_class(out.shape)}"
    # Every gather reports a bad id to blockc_run, which refuses the run:
    # its first position goes to first_bad (once per id, from its entry's
    # first element). Every gather of an input's ids checks its own table,
    # and the smallest (the range the error names) flags first.
    flag = ids_check.flag
    first = f"({inner}) == 0 && " if rank > lead else ""
    check = f"if ({first}!{ids_check.in_range}) atomicMin(first_bad, (unsigned long long)({ids_off}));"
    title = f"lookup along axis 0 (an out-of-range id gives {'NaN' if out.dtype.is_float else 0} and is reported)"
    return [_copy(name, title, labels, ctx, table, out, out.shape, "", "i", node.op, value=value, index=ids,
                  check=check, flag=flag)]


def _cache_write(node: Node, ctx: LowerContext, labels: list[str], dt: str) -> list[KernelCode]:
    cache, update = node.inputs
    out = node.outputs[0]
    axis = node.attrs["axis"] % out.type.rank
    whole = _copy(f"copy_{dt}_{shape_class(out.shape)}", "a copy (a cache written elsewhere than in place)",
                  labels, ctx, cache, out, out.shape, "i", "i", node.op)
    copy_all, in_place = whole.launch, f"(const void*){ctx.ptr(out)} != (const void*){ctx.ptr(cache)}"
    whole.launch = lambda name: f"if ({in_place}) {copy_all(name)}"
    strides = _strides(out.shape, ctx)
    off = _linear(strides, update.shape) + f" + {ctx.dim(node.attrs['start'])} * {strides[axis]}"
    rows = _copy(f"cache_rows_axis{axis}_{dt}_{shape_class(update.shape)}",
                 f"a step's rows written into a cache along axis {axis}", labels, ctx, update, out, update.shape,
                 "i", off, node.op)
    return [whole, rows]


def emit_copy(step: KernelStep) -> list[KernelCode]:
    node = step.node
    return COPY.entry(node.op)(node, step.ctx, step.labels, suffix(node.outputs[0].dtype))


# Each op's copy: fn(node, ctx, labels, dtype suffix) -> its launches.
COPY = register(KernelFamily("copy", "copy", emit_copy, entries={
    "transpose": _transpose, "slice": _slice, "split": _split, "concat": _concat, "gather": _gather,
    "cache_write": _cache_write}))

# A reshape's value is its input's buffer: no kernel.
VIEW = register(KernelFamily("alias", "view", placement=ALIAS))
