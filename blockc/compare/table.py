"""The comparison as the terminal shows it: one table per shape, then the
skipped backends and peers with their reasons, then the pair-by-pair ratios."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..report.traffic import human_bytes


def _ms(row: dict) -> str:
    lat = row["latency_ms"]
    return f"{lat['median']:.3f} [{lat['min']:.3f}–{lat['max']:.3f}]" if lat else "–"


def _num(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def shape_table(report: dict, shape: dict) -> Table:
    title = ", ".join(f"{k} {v}" for k, v in shape.items())
    # Text, not markup: a model's name may hold brackets ("[float32]" would vanish as a style tag)
    t = Table(title=Text(f"{report['model']} ({report['dtype']}), {title}"), title_justify="left")
    for name, justify in (("backend", "left"), ("level", "left"), ("form", "left"),
                          ("ms median [min–max]", "right"), ("vs standard", "right"), ("IR nodes", "right"),
                          ("kernels", "right"), ("moved", "right"), ("GB/s", "right"), ("% peak", "right"),
                          ("max |err|", "right")):
        t.add_column(name, justify=justify)
    for r in report["results"]:
        if r["shape"] != shape:
            continue
        style = "italic" if r["peer"] else ("bold" if r["form"] == "fused" else "")
        if r["status"] != "ok":  # the reason is printed in full under the table
            t.add_row(r["backend"], r["variant"], r["form"], Text("error, see below", style="red"),
                      *["–"] * 7, style=style)
            continue
        fraction = r["fraction_of_peak"]
        t.add_row(r["backend"], r["variant"], r["form"], _ms(r),
                  _num(r["speedup_vs_standard"], ".2f") + ("x" if r["speedup_vs_standard"] else ""),
                  _num(r["ir_nodes"], "d"), _num(r["kernels"], "d"),
                  human_bytes(r["bytes_modelled"]) if r["bytes_modelled"] is not None else "–",
                  _num(r["bandwidth_gbps"], ".1f"), "–" if fraction is None else f"{100 * fraction:.0f}%",
                  _num(r["max_abs_error"], ".2e"), style=style)
    return t


def print_report(report: dict, console: Console | None = None) -> None:
    """Print ``report`` (a ``blockc.compare/1`` document) for a person."""
    if console is None:
        import sys
        console = Console(markup=False, highlight=False, width=None if sys.stdout.isatty() else 160)
    timing = report["timing"]
    console.print(f"blockc compare: {report['model']}"
                  + (f" {' '.join(f'--set {k}={v}' for k, v in report['settings'].items())}" if report["settings"]
                     else "")
                  + f"; {timing['threads']} threads; median of ≥{timing['min_repeats']} runs and ≥"
                    f"{timing['min_time_s']} s after {timing['warmup']} warm-up; clock: {timing['clock']}")
    for shape in report["shapes"]:
        console.print(shape_table(report, shape))
        for r in report["results"]:
            if r["shape"] == shape and r["status"] != "ok":
                console.print(Text.assemble(f"  {r['backend']}/{r['variant']}/{r['form']}: ", ("error", "red"),
                                            f" -- {r['error']}"))
    for kind in ("backends", "peers"):
        for b in report[kind]:
            if b["available"]:
                console.print(f"  {b['name']}: {b['detail']}")
            else:
                console.print(Text.assemble(f"  {b['name']}: ", ("skipped", "yellow"), f" -- {b['reason']}"))
    if report["ratios"]:
        console.print("\nfused against the rest (pair by pair, same shape; >1 means fused is faster):")
        for r in report["ratios"]:
            shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
            console.print(f"  {shape:<20} {r['a']:<24} vs {r['b']:<28} {r['speedup']:.2f}x")
    if report["kernels"]:
        console.print("\nfused kernels alone (bytes modelled / measured time):")
        for k in report["kernels"]:
            shape = ", ".join(f"{a}={v}" for a, v in k["shape"].items())
            if k["status"] != "ok":
                console.print(f"  {k['op']:<16} {k['backend']:<9} {shape:<20} error: {k['error']}")
                continue
            frac = f", {100 * k['fraction_of_peak']:.0f}% of peak" if k["fraction_of_peak"] is not None else ""
            console.print(f"  {k['op']:<16} {k['backend']:<9} {shape:<20} {k['median_ms']:.4f} ms, "
                          f"{human_bytes(k['bytes_modelled'])}, {k['bandwidth_gbps']:.1f} GB/s{frac}")
    machine = report["machine"]
    console.print(f"\nmachine: {machine['cpu']}, {machine['cores']} cores"
                  + (f", {machine['gpu']}" if machine["gpu"] else "")
                  + f"; peak bandwidth: {_num(machine['peak_gbps'], '.0f')} GB/s ({machine['peak_source']})")
