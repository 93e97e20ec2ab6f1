"""Compile time -- trace, optimize, weightless ONNX export -- against depth.

The targets: compile time grows linearly with depth (96 layers take at most
9x the time of 12 at equal width), and the GPT-3-shaped model (96 layers,
d=12288, 96 heads, 2048 positions: 175B parameters, ~700 GB in float32)
compiles in under a minute and under 2 GiB of memory, its weights never made.

    python bench/compile_time.py [--rounds 3] [--configs gpt2:12,gpt3:12,gpt3:24,gpt3:48,gpt3:96]

A config is ``gpt2:LAYERS`` (GPT-2 small's width) or ``gpt3:LAYERS`` (GPT-3's
width). Each run is a fresh subprocess, so its peak RSS (``ru_maxrss`` from
``resource.getrusage``: the whole process, interpreter and imports included)
is that config's alone. In it, a 1-layer model of the same width is compiled
first, untimed, so that one-time costs (lazy imports, first-use caches) do not
count against the shallow configs; then the model is traced
(``blockc.trace``), optimized (``blockc.optimize``: the full pipeline, the
verifier after every pass) and exported without weights
(``save_onnx(graph, None, path)``: written to a temporary folder), each stage
timed with ``time.perf_counter``. The configs run in interleaved rounds and
each reports its fastest round, which damps other load on the machine.

Prints a markdown table for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WIDTHS = {
    "gpt2": {},  # the built-in's own: d=768, 12 heads, 1024 positions
    "gpt3": {"d_model": "12288", "heads": "96", "max_positions": "2048"},
}
DEFAULT_CONFIGS = "gpt2:12,gpt3:12,gpt3:24,gpt3:48,gpt3:96"
MAX_RATIO, MAX_SECONDS, MAX_RSS_GIB = 9.0, 60.0, 2.0


def parse_config(text: str) -> tuple[str, int]:
    width, _, layers = text.partition(":")
    if width not in WIDTHS or not layers.isdigit() or int(layers) < 1:
        raise SystemExit(f"bad config {text!r}: expected gpt2:LAYERS or gpt3:LAYERS")
    return width, int(layers)


def build(width: str, layers: int):
    import blockc
    return blockc.build_model("gpt2", {"layers": str(layers), **WIDTHS[width]})


def compile_once(model, folder: str) -> dict:
    """Trace, optimize and export ``model``; seconds per stage and sizes."""
    import blockc
    from blockc.codegen.onnx_export import save_onnx

    t0, c0 = time.perf_counter(), time.process_time()
    graph = blockc.trace(model)
    t1 = time.perf_counter()
    fused = blockc.optimize(graph).graph
    t2 = time.perf_counter()
    path = os.path.join(folder, "model.onnx")
    save_onnx(fused, None, path)
    t3, c3 = time.perf_counter(), time.process_time()
    declared = sum(math.prod(v.shape) * v.dtype.itemsize for v in fused.params.values())
    return {"trace": t1 - t0, "optimize": t2 - t1, "export": t3 - t2, "total": t3 - t0, "cpu": c3 - c0,
            "nodes": len(graph.nodes), "fused_nodes": len(fused.nodes), "onnx_bytes": os.path.getsize(path),
            "weights_gb": declared / 1e9}


def child(width: str, layers: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        compile_once(build(width, 1), folder)  # warm-up, untimed
        result = compile_once(build(width, layers), folder)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps(result))


def run_child(config: str) -> dict:
    width, layers = parse_config(config)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", config],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{config} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB; Python {platform.python_version()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated (default {DEFAULT_CONFIGS})")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each config's fastest is reported")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*parse_config(args.child))
        return 0

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        parse_config(c)
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for c in configs:
            r = run_child(c)
            if c not in best or r["total"] < best[c]["total"]:
                r["peak_rss_mib"] = max(r["peak_rss_mib"], best.get(c, {}).get("peak_rss_mib", 0))
                best[c] = r
            else:
                best[c]["peak_rss_mib"] = max(best[c]["peak_rss_mib"], r["peak_rss_mib"])

    print(f"{machine()}; {time.strftime('%Y-%m-%d')}; fastest of {args.rounds} interleaved rounds, "
          "one fresh process per run")
    print(f"command: python {' '.join(sys.argv)}\n")
    print("| config | layers | d_model | IR nodes (traced / optimized) | weights declared | trace s | optimize s "
          "| export s | total s | CPU s | peak RSS MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in configs:
        width, layers = parse_config(c)
        r = best[c]
        d = WIDTHS[width].get("d_model", "768")
        print(f"| {c} | {layers} | {d} | {r['nodes']} / {r['fused_nodes']} | {r['weights_gb']:.1f} GB "
              f"| {r['trace']:.3f} | {r['optimize']:.3f} | {r['export']:.3f} | {r['total']:.3f} | {r['cpu']:.3f} "
              f"| {r['peak_rss_mib']:.0f} |")

    if "gpt3:12" in best and "gpt3:96" in best:
        shallow, deep = best["gpt3:12"], best["gpt3:96"]
        ratio = deep["total"] / shallow["total"]
        stages = ", ".join(f"{s} {deep[s] / shallow[s]:.1f}x" for s in ("trace", "optimize", "export"))
        print(f"\n96 / 12 layers at d=12288: {ratio:.2f}x in total ({stages}; CPU time "
              f"{deep['cpu'] / shallow['cpu']:.2f}x); target at most {MAX_RATIO:.0f}x: "
              + ("met" if ratio <= MAX_RATIO else "MISSED"))
        fast = deep["total"] < MAX_SECONDS and deep["peak_rss_mib"] < MAX_RSS_GIB * 1024
        print(f"GPT-3-shaped compile: {deep['total']:.1f} s, peak RSS {deep['peak_rss_mib']:.0f} MiB; target under "
              f"{MAX_SECONDS:.0f} s and {MAX_RSS_GIB:.0f} GiB: " + ("met" if fast else "MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
