"""The CPU comparison in docs/PERFORMANCE.md: `blockc compare` on ONNX
Runtime CPU and the peers, for the gpt2 block and a 2-layer gpt2, at batch 1
and 8, seq 128 and 512, rendered as markdown with the issue's targets checked.

    python bench/compare_cpu.py [--json-dir bench/results] [--min-time 0.4] [--blocks 8] [--models gpt2-block]

Each model runs as one `blockc compare` invocation (the same code as the
command line); its JSON lands in --json-dir, the markdown on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

MODELS = (("gpt2-block", []), ("gpt2", ["layers=2"]))


def run(model: str, sets: list[str], args) -> dict:
    out = os.path.join(args.json_dir, f"compare-{model}{''.join('-' + s.replace('=', '') for s in sets)}.json")
    cmd = [sys.executable, "-m", "blockc.cli", "compare", model, *sum((["--set", s] for s in sets), []),
           "--backends", "ort-cpu", "--batch", args.batch, "--seq", args.seq, "--min-time", str(args.min_time),
           "--threads", str(args.threads), "--blocks", str(args.blocks), "--rounds", str(args.rounds),
           "--json", out, "--no-progress"]
    print(f"$ {shlex.join(['blockc', *cmd[3:]])}", file=sys.stderr)
    subprocess.run(cmd, check=False, stdout=sys.stderr)
    with open(out) as f:
        return json.load(f)


def markdown(report: dict) -> str:
    lines = []
    sets = " ".join(f"--set {k}={v}" for k, v in report["settings"].items())
    lines.append(f"### {report['model']} {sets}".rstrip())
    lines.append(f"\n`{report['command']}`\n")
    lines.append("| shape | ORT level | form | median ms [min–max] | vs standard | kernels | max abs err |")
    lines.append("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in report["results"]:
        shape = f"b{r['shape'].get('batch')} s{r['shape'].get('seq')}"
        if r["status"] != "ok":
            lines.append(f"| {shape} | {r['variant']} | {r['form']} | error: {r['error'][:80]} | | | |")
            continue
        lat = r["latency_ms"]
        speed = f"{r['speedup_vs_standard']:.2f}x" if r["speedup_vs_standard"] else ""
        form = f"**{r['form']}**" if r["form"] == "fused" else (f"*{r['form']}*" if r["peer"] else r["form"])
        lines.append(f"| {shape} | {r['variant'] or '-'} | {form} | {lat['median']:.2f} [{lat['min']:.2f}–"
                     f"{lat['max']:.2f}] | {speed} | {r['kernels'] if r['kernels'] is not None else ''} | "
                     f"{r['max_abs_error']:.1e} |")
    lines.append("")
    for line in targets(report):
        lines.append(f"- {line}")
    return "\n".join(lines)


def targets(report: dict) -> list[str]:
    """The issue's two CPU targets, checked shape by shape and level by level."""
    out = []
    for r in report["ratios"]:
        a, b = r["a"], r["b"]
        if a.endswith("/fused") and (b.endswith("/standard") or b.endswith("/ort-optimizer")):
            shape = f"b{r['shape'].get('batch')} s{r['shape'].get('seq')}"
            verdict = {"faster": "met", "slower": "MISSED"}.get(r["verdict"], r["verdict"])
            out.append(f"{shape}: {a} vs {b}: {r['speedup']:.3f}x [{r['low']:.3f}–{r['high']:.3f}] ({verdict})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json-dir", default="bench/results")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seq", default="128,512")
    ap.add_argument("--min-time", type=float, default=0.4, help="seconds timed per session per block")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=8, help="blocks of fresh sessions")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default=",".join(m for m, _ in MODELS))
    args = ap.parse_args()
    os.makedirs(args.json_dir, exist_ok=True)
    chosen = args.models.split(",")
    for model, sets in MODELS:
        if model in chosen:
            print(markdown(run(model, sets, args)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
