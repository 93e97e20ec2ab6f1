"""Measure every ONNX form of every fused op on ONNX Runtime; rewrite the
table that ``export_onnx(fused_as="auto")`` chooses from.

    python bench/fused_encodings.py                       # cpu, 2 intra-op threads
    python bench/fused_encodings.py --provider cuda
    python bench/fused_encodings.py --min-time 0.2 --dry-run
    python bench/fused_encodings.py --kinds rotary         # measure one kind, keep the rest

Each fused kind is a one-node graph (symbolic batch and seq, as exported
models have) at its representative shapes; each form (function, contrib,
onnx23) is exported, loaded at ONNX Runtime's *basic* optimization level
(so ONNX Runtime's own fusions do not blur the forms) with N intra-op
threads, warmed up, then run until both a minimum count and a minimum time
are reached (in interleaved rounds, so a drift in machine load hits every
form alike); the median is kept. Each form runs through blockc's ONNX
Runtime backend (``runtime/backends/ort.py``) and is timed by
``runtime.timing``, as ``blockc compare`` does; ``cache_attention``, a decode
step that writes its row into a cache buffer, runs as the generation loop
runs it (``Compiled.cached``: IO binding, each cache output bound to its
input's buffer), one query row at several pasts in a buffer of 1024 rows. A
form that declines the node is recorded with its reason. The kind's form is
the one with the lowest geometric mean of medians over its shapes, except
that ``function`` -- portable, and what ONNX Runtime inlines into plain ops --
is kept unless another form beats it by more than ``--margin`` (5%): a fusion
is worth emitting only where the target runs it faster. The other forms that
beat ``function`` by the margin are kept too, fastest first, as the entry's
``then``: what ``auto`` writes where the chosen form declines a node.

The table (``blockc/codegen/fused_encodings_table.json``) is rewritten for the
measured provider only; entries for other providers are kept. With
``--kinds`` only those kinds are measured and replaced; each such entry
carries its own ``machine``, ``onnxruntime`` and ``date``, since the
provider's header describes the run that measured the others. ``--note``
says what the numbers should be read with (a loaded machine, say), kept in
each entry measured, or in the header of a full run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
from typing import NamedTuple

import numpy as np

# Run from a checkout: this file's repository before any installed blockc.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnxruntime as ort  # noqa: E402

from blockc.codegen.fused_encodings import TABLE_PATH  # noqa: E402
from blockc.codegen.onnx_export import export_onnx_decided  # noqa: E402
from blockc.frontends.rotary import rope_table  # noqa: E402
from blockc.ir.dims import parse_dim  # noqa: E402
from blockc.ir.dtypes import DType  # noqa: E402
from blockc.ir.graph import Graph  # noqa: E402
from blockc.ir.types import TensorType  # noqa: E402
from blockc.ops.activations import ACTIVATIONS  # noqa: E402
from blockc.runtime.backend import make_backend  # noqa: E402
from blockc.runtime.timing import measure_interleaved  # noqa: E402

FORMS = ("function", "contrib", "onnx23")
F32 = DType.float32
SCHEMA = "blockc.fused-forms-table/1"


def _t(*shape) -> TensorType:
    return TensorType(F32, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


# ---- the cases ----------------------------------------------------------------------
class Case(NamedTuple):
    key: str                      # the table's kind (fused_encodings.table_key)
    shape: str                    # the shape, in words
    graph: Graph
    sizes: dict                   # {symbol: size}
    weights: dict | None = None   # None: random ones (measure_case)
    carry: dict | None = None     # a step's carried state, {output: input} (Compiled.cached); None: plain runs
    state: dict | None = None     # the carried inputs' first values


def add_norm(op: str, batch: int, seq: int, hidden: int):
    g = Graph(op)
    x, r = g.add_input("x", _t("batch", "seq", hidden)), g.add_input("residual", _t("batch", "seq", hidden))
    params = [g.add_param("gamma", _t(hidden))] + ([g.add_param("beta", _t(hidden))] if op == "add_layernorm" else [])
    g.set_outputs([("y", g.op(op, x, r, *params))])
    return Case(op, f"[{batch},{seq},{hidden}]", g, {"batch": batch, "seq": seq})


def attention(batch: int, heads: int, seq: int, head: int):
    g = Graph("attention")
    q, k, v = (g.add_input(n, _t("batch", heads, "seq", head)) for n in "qkv")
    g.set_outputs([("y", g.op("attention", q, k, v, scale=1 / math.sqrt(head), causal=True))])
    return Case("attention", f"[{batch},{heads},{seq},{head}] causal", g, {"batch": batch, "seq": seq})


def grouped_attention(batch: int, heads: int, kv_heads: int, seq: int, head: int):
    """Attention in the grouped layout (ops.fused.group_heads), as llama-tiny and imported Llamas have it."""
    g = Graph("grouped_attention")
    q = g.add_input("q", _t("batch", kv_heads, heads // kv_heads, "seq", head))
    k, v = (g.add_input(n, _t("batch", kv_heads, 1, "seq", head)) for n in "kv")
    g.set_outputs([("y", g.op("attention", q, k, v, scale=1 / math.sqrt(head), causal=True))])
    return Case("attention/grouped", f"[{batch},{heads} on {kv_heads} K/V heads,{seq},{head}] causal", g,
                {"batch": batch, "seq": seq})


def cache_attention(heads: int, kv_heads: int, head: int, past: int, buffer: int = 1024):
    """One decode step (one query row, batch 1) writing its keys and values at
    row ``past`` of a ``buffer``-row cache and attending to the first
    ``past+1``, its caches carried in place from run to run as generation
    carries them."""
    g = Graph("cache_attention")
    group = heads // kv_heads
    q = g.add_input("q", _t("batch", kv_heads, group, 1, head) if group > 1 else _t("batch", heads, 1, head))
    k, v = (g.add_input(n, _t("batch", kv_heads, 1, head)) for n in "kv")
    caches = [g.add_input(n, _t("batch", kv_heads, buffer, head)) for n in ("cache_k", "cache_v")]
    g.add_input("positions", TensorType(DType.int64, (parse_dim("past"),)))   # gives 'past' a source
    y, present_k, present_v = g.add_node("cache_attention", [q, k, v, *caches], {
        "scale": 1 / math.sqrt(head), "causal": True, "start": parse_dim("past")}).outputs
    g.set_outputs([("y", y), ("present_k", present_k), ("present_v", present_v)])
    rng = np.random.default_rng(1)
    state = {c.name: rng.standard_normal((1, kv_heads, buffer, head)).astype(np.float32) for c in caches}
    layout = f"{heads} heads" if group == 1 else f"{heads} on {kv_heads} K/V heads"
    return Case("cache_attention", f"{layout} of {head}, past {past} in {buffer} rows", g, {"batch": 1, "past": past},
                carry={"present_k": "cache_k", "present_v": "cache_v"}, state=state)


def append_attention(heads: int, kv_heads: int, head: int, past: int):
    """One decode step (one query row, batch 1) of an exporter's cache: its
    keys and values appended to a ``past``-row past, the presents new tensors."""
    g = Graph("append_attention")
    group = heads // kv_heads
    q = g.add_input("q", _t("batch", kv_heads, group, 1, head) if group > 1 else _t("batch", heads, 1, head))
    k, v = (g.add_input(n, _t("batch", kv_heads, 1, head)) for n in "kv")
    pasts = [g.add_input(n, _t("batch", kv_heads, "past", head)) for n in ("past_k", "past_v")]
    y, present_k, present_v = g.add_node("append_attention", [q, k, v, *pasts], {
        "scale": 1 / math.sqrt(head), "causal": True}).outputs
    g.set_outputs([("y", y), ("present_k", present_k), ("present_v", present_v)])
    layout = f"{heads} heads" if group == 1 else f"{heads} on {kv_heads} K/V heads"
    return Case("append_attention", f"{layout} of {head}, past {past}", g, {"batch": 1, "past": past})


def qkv_attention(batch: int, seq: int, hidden: int, heads: int):
    g = Graph("qkv_attention")
    x = g.add_input("x", _t("batch", "seq", hidden))
    w, b = g.add_param("w", _t(hidden, 3 * hidden)), g.add_param("b", _t(3 * hidden))
    g.set_outputs([("y", g.op("qkv_attention", x, w, b, heads=heads, sizes=[hidden] * 3,
                              scale=1 / math.sqrt(hidden // heads), causal=True))])
    return Case("qkv_attention", f"[{batch},{seq},{hidden}] {heads} heads causal", g, {"batch": batch, "seq": seq})


def masked_softmax(batch: int, heads: int, seq: int, head: int):
    g = Graph("masked_softmax")
    s = g.add_input("scores", _t("batch", heads, "seq", "seq"))
    g.set_outputs([("y", g.op("masked_softmax", s, scale=1 / math.sqrt(head), causal=True))])
    return Case("masked_softmax", f"scores of [{batch},{heads},{seq},{head}] causal", g, {"batch": batch, "seq": seq})


def matmul_bias_act(activation: str, batch: int, seq: int, d: int, ff: int):
    g = Graph("matmul_bias_act")
    x = g.add_input("x", _t("batch", "seq", d))
    w, b = g.add_param("w", _t(d, ff)), g.add_param("b", _t(ff))
    g.set_outputs([("y", g.op("matmul_bias_act", x, w, b, activation=activation))])
    return Case(f"matmul_bias_act/{activation}", f"[{batch},{seq},{d}]x[{d},{ff}]", g, {"batch": batch, "seq": seq})


def rotary(batch: int, heads: int, seq: int, head: int, rotary_dim: int, interleaved: bool):
    g = Graph("rotary")
    x = g.add_input("x", _t("batch", heads, "seq", head))
    pos = g.add_input("position_ids", TensorType(DType.int64, (parse_dim("batch"), parse_dim("seq"))))
    cos, sin = g.add_param("cos", _t(4096, rotary_dim)), g.add_param("sin", _t(4096, rotary_dim))
    g.set_outputs([("y", g.op("rotary", x, cos, sin, pos, interleaved=interleaved))])
    pairing = "interleaved" if interleaved else "rotate-half"
    # The tables RotaryEmbedding makes: the runtime ops read one angle per pair of them (ops/rotary.py)
    tables = {name: rope_table((4096, rotary_dim), fn=fn, base=10000.0, interleaved=interleaved).astype(np.float32)
              for name, fn in (("cos", np.cos), ("sin", np.sin))}
    return Case("rotary", f"[{batch},{heads},{seq},{head}] {pairing} rotary_dim {rotary_dim}", g,
                {"batch": batch, "seq": seq}, weights=tables)


def cases():
    for op in ("add_layernorm", "add_rmsnorm"):
        yield add_norm(op, 4, 128, 768)
        yield add_norm(op, 8, 512, 768)
    yield attention(4, 12, 128, 64)
    # llama-tiny's heads (4 on 2 K/V heads of 16), and Llama-3-8B's (32 on 8 of 128)
    yield grouped_attention(4, 4, 2, 128, 16)
    yield grouped_attention(1, 32, 8, 128, 128)
    yield grouped_attention(1, 32, 8, 512, 128)
    yield qkv_attention(4, 128, 768, 12)
    yield qkv_attention(8, 128, 768, 12)
    yield masked_softmax(4, 12, 128, 64)
    for act in ACTIVATIONS:
        yield matmul_bias_act(act, 4, 128, 768, 3072)
    # Llama-7B's heads (32 of 128) whole, and GPT-J's pairs over 64 of 256
    yield rotary(4, 32, 128, 128, 128, False)
    yield rotary(4, 16, 128, 256, 64, True)
    # GPT-2's heads (12 of 64) and Llama-3-8B's (32 on 8 K/V heads of 128), early, midway and at the end
    for heads, kv_heads, head in ((12, 12, 64), (32, 8, 128)):
        for past in (64, 512, 1000):
            yield cache_attention(heads, kv_heads, head, past)
        for past in (64, 512):
            yield append_attention(heads, kv_heads, head, past)


# ---- measuring ------------------------------------------------------------------------
def median_ms(fns: dict, *, min_time: float, min_repeats: int = 20, warmup: int = 5, rounds: int = 5) -> dict:
    """{name: (median ms, runs)} for each callable in ``fns``, timed in
    interleaved rounds (``runtime.timing.measure_interleaved``) so that a
    drift in machine load hits every form alike."""
    timed = measure_interleaved(fns, rounds=rounds, warmup=warmup, min_repeats=min_repeats, min_time_s=min_time)
    return {name: (t.timing.median_s * 1e3, t.timing.repeats) for name, t in timed.items()}


def measure_case(case: Case, provider: str, threads: int, min_time: float) -> dict:
    graph, sizes = case.graph, case.sizes
    rng = np.random.default_rng(0)
    # Weights scaled like a trained layer's (1/sqrt(fan-in)): with unit weights a
    # 768-wide projection gives attention scores in the hundreds, a softmax
    # that is one-hot, and forms that differ by float32 rounding alone.
    weights = case.weights or {
        n: (rng.standard_normal(v.type.concrete_shape({})) / np.sqrt(v.shape[0] if v.type.rank == 2 else 1))
        .astype(np.float32) for n, v in graph.params.items()}
    # ids (rotary's positions) within the table they index, the rest unit normal
    feeds = {v.name: rng.integers(0, 4096, v.type.concrete_shape(sizes)) if v.dtype == DType.int64 else
             rng.standard_normal(v.type.concrete_shape(sizes)).astype(np.float32) for v in graph.inputs}
    compiled, runners, declined, reference = {}, {}, {}, None
    try:
        for form in FORMS:
            decisions = export_onnx_decided(graph, weights, fused_as=form, provider=provider).decisions
            if decisions[0]["form"] != form:
                declined[form] = decisions[0]["reason"]
                continue
            c = compiled[form] = make_backend(f"ort-{provider}", fused_as=form).compile(
                graph, weights, variant="basic", threads=threads)
            if case.carry is None:
                runners[form] = c.runner(feeds)
            else:   # each form its own copy of the caches, written in place run after run
                state = {name: a.copy() for name, a in case.state.items()}
                runners[form] = c.cached(case.carry, state).runner(feeds)
            out = runners[form]()["y"]
            if reference is None:
                reference = out
            else:  # every form computes the same thing, or its time means nothing
                np.testing.assert_allclose(out, reference, rtol=1e-3, atol=1e-4, err_msg=form)
        timed = median_ms(runners, min_time=min_time)
    finally:
        for c in compiled.values():
            c.close()
    return {"ms": {f: round(t, 4) for f, (t, _) in timed.items()}, "runs": {f: n for f, (_, n) in timed.items()},
            "declined": declined}


def _geomeans(cases: list[dict]) -> dict:
    """{form: geometric mean of its medians} for the forms every case ran."""
    forms = [f for f in FORMS if all(f in c["ms"] for c in cases)]
    return {f: math.exp(sum(math.log(c["ms"][f]) for c in cases) / len(cases)) for f in forms}


def fallbacks(cases: list[dict], form: str, margin: float) -> list[str]:
    """The forms after ``form`` that also beat ``function`` by more than
    ``margin``, fastest first: what ``auto`` tries where ``form`` declines
    a node (a grouped attention with a boolean mask, say)."""
    geo = _geomeans(cases)
    return sorted((f for f in geo if f not in (form, "function") and geo["function"] > geo[f] * (1 + margin)),
                  key=geo.get)


def choose(cases: list[dict], margin: float) -> tuple[str, str]:
    geo = _geomeans(cases)
    forms = list(geo)
    best = min(geo, key=geo.get)
    if best != "function" and geo["function"] <= geo[best] * (1 + margin):
        best = "function"  # within the noise: keep the portable form
    parts = []
    for c in cases:
        timed = ", ".join(f"{f} {t:.3g} ms" for f, t in sorted(c["ms"].items(), key=lambda kv: kv[1]))
        parts.append(f"{timed} at {c['shape']}")
    why = "; ".join(parts)
    if len(forms) == 1:
        why += " (the only form that applies)"
    elif best == "function" and min(geo, key=geo.get) != "function":
        why += f" (within {margin:.0%}: the portable form is kept)"
    return best, why


def machine(provider: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    text = f"{cpu}, {os.cpu_count()} cores"
    if provider == "cuda":
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
            text = f"{gpu} ({text})"
        except (OSError, IndexError, subprocess.SubprocessError):
            text = f"a CUDA GPU ({text})"
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed runs per form and shape (default 1)")
    p.add_argument("--margin", type=float, default=0.05, help="how much faster than function a form must be")
    p.add_argument("--out", default=TABLE_PATH, help="the table to rewrite")
    p.add_argument("--dry-run", action="store_true", help="print the table, do not write it")
    p.add_argument("--kinds", help="comma-separated table keys to measure (e.g. rotary); the others are kept")
    p.add_argument("--note", help="a remark kept with what is measured: each entry with --kinds, else the "
                                  "provider's header (that the machine was loaded, say)")
    args = p.parse_args(argv)
    only = set(args.kinds.split(",")) if args.kinds else None
    make_backend(f"ort-{args.provider}").require()

    kinds: dict[str, dict] = {}
    for case in cases():
        if only is not None and case.key not in only:
            continue
        result = measure_case(case, args.provider, args.threads, args.min_time)
        result["shape"] = case.shape
        kinds.setdefault(case.key, {"cases": []})["cases"].append(result)
        print(f"{case.key:<26} {case.shape:<28} " + "  ".join(f"{f} {t:.3f} ms" for f, t in result["ms"].items()),
              flush=True)
    for key, entry in kinds.items():
        entry["form"], entry["why"] = choose(entry["cases"], args.margin)
        entry["then"] = fallbacks(entry["cases"], entry["form"], args.margin)
        entry.update({k: entry.pop(k) for k in ("cases",)})  # keep form and why first
        print(f"{key:<26} -> {entry['form']} (then {', '.join(entry['then']) or 'function'}): {entry['why']}")

    try:
        with open(args.out) as f:
            table = json.load(f)
    except FileNotFoundError:
        table = {}
    table.update({"schema": SCHEMA, "generated_by": "bench/fused_encodings.py"})
    run = {"machine": machine(args.provider), "onnxruntime": ort.__version__,
           "date": datetime.date.today().isoformat()}
    previous = table.setdefault("providers", {}).get(args.provider)
    if only is not None and previous:
        for entry in kinds.values():
            entry.update(run)   # measured apart from the provider's other kinds
            if args.note:
                entry["note"] = args.note
        previous["kinds"].update(kinds)
    else:
        table["providers"][args.provider] = {
            "machine": run["machine"],
            "onnxruntime": run["onnxruntime"],
            "optimization": "basic",
            "intra_op_threads": args.threads,
            "statistic": f"median of >= 20 runs and >= {args.min_time:g} s per form, in 5 interleaved rounds, "
                         "after 5 warm-up runs",
            "margin": args.margin,
            "date": run["date"],
            **({"note": args.note} if args.note else {}),
            "kinds": kinds,
        }
    text = json.dumps(table, indent=1) + "\n"
    if args.dry_run:
        print(text)
    else:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
