"""The comparison as the terminal shows it: the verdict first, then one table
per shape, the skipped backends and peers with their reasons, the
pair-by-pair ratios and the fused kernels alone.

Everything is laid out for the console's width: at 140 columns or more each
shape is one table; below, its columns are split in two tables (time and
error; size and traffic), and rich wraps what still does not fit.

Two kinds of ratio appear, and each says how it was formed: a table's
"vs standard" is the standard form's median over the row's median, the two
figures printed in the same table; the verdict's and the pair list's are
geometric means over blocks of fresh sessions with a 95% interval
(``compare/run.py``).
"""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..files import format_bytes

WIDE = 140   # at least this many columns: one table per shape


def _ms(row: dict) -> str:
    lat = row["latency_ms"]
    return f"{lat['median']:.3f} [{lat['min']:.3f}–{lat['max']:.3f}]" if lat else "–"


def _num(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _times(x) -> str:
    return "–" if x is None else f"{x:.2f}x"


def _shape_words(shape: dict, sep: str = ", ") -> str:
    return sep.join(f"{k}={v}" for k, v in shape.items())


_TIME_COLUMNS = ("ms median [min–max]", "vs standard", "max |err|")
_SIZE_COLUMNS = ("IR nodes", "kernels", "moved", "GB/s", "% peak")


def _cells(r: dict) -> dict[str, str]:
    fraction = r["fraction_of_peak"]
    return {"ms median [min–max]": _ms(r), "vs standard": _times(r["speedup_vs_standard"]),
            "IR nodes": _num(r["ir_nodes"], "d"), "kernels": _num(r["kernels"], "d"),
            "moved": format_bytes(r["bytes_modelled"]) if r["bytes_modelled"] is not None else "–",
            "GB/s": _num(r["bandwidth_gbps"], ".1f"), "% peak": "–" if fraction is None else f"{100 * fraction:.0f}%",
            "max |err|": _num(r["max_abs_error"], ".2e")}


def shape_tables(report: dict, shape: dict, width: int) -> list[Table]:
    """The rows at ``shape``: one table, or two split by column below ``WIDE``."""
    title = f"{report['model']} ({report['dtype']}), {_shape_words(shape)}"
    order = ("ms median [min–max]", "vs standard", "IR nodes", "kernels", "moved", "GB/s", "% peak", "max |err|")
    parts = [order] if width >= WIDE else [_TIME_COLUMNS, _SIZE_COLUMNS]
    tables = []
    for i, columns in enumerate(parts):
        t = _table(title + ("" if len(parts) == 1 else (": time and error", ": size and traffic")[i]),
                   [(name, "left") for name in ("backend", "level", "form")] + [(c, "right") for c in columns])
        for r in report["results"]:
            if r["shape"] != shape:
                continue
            style = "italic" if r["peer"] else ("bold" if r["form"] == "fused" else "")
            if r["status"] != "ok":  # the reason is printed in full under the table
                t.add_row(r["backend"], r["variant"], r["form"],
                          Text(f"{r['status']}, see below", style="red" if r["status"] == "error" else "yellow"),
                          *["–"] * (len(columns) - 1), style=style)
                continue
            cells = _cells(r)
            t.add_row(r["backend"], r["variant"], r["form"], *(cells[c] for c in columns), style=style)
        tables.append(t)
    return tables


def verdict_words(v: dict, effect: str = "fusion") -> str:
    """Whether a difference (``v[effect]``: fusion's on one backend, by
    default) is resolved beside its A/A control (``v["aa"]``), in words."""
    f, aa = v[effect], v["aa"]
    if f["verdict"] == "too few repetitions":
        return f"too few blocks to tell ({f['blocks']}; --blocks 5 or more)"
    if v["resolved"]:
        return f"{f['verdict']}, resolved"
    if f["verdict"] != "no difference resolved":
        if aa["verdict"] != "no difference resolved":
            return f"not resolved: the A/A control differs too ({aa['verdict']}): a noisy machine"
        return "not resolved: within the A/A control's spread"
    return "no difference resolved"


def _table(title: str, columns) -> Table:
    """A table whose cells fold rather than being cut short: a narrow
    terminal wraps a figure, it never drops part of one."""
    # Text, not markup: a model's name may hold brackets ("[float32]" would vanish as a style tag)
    t = Table(title=Text(title), title_justify="left")
    for name, justify in columns:
        t.add_column(name, justify=justify, overflow="fold")
    return t


def with_interval(d: dict) -> str:
    return f"{d['speedup']:.2f}x [{d['low']:.2f}–{d['high']:.2f}]"


def verdict_table(report: dict) -> Table:
    several = len(report["shapes"]) > 1
    t = _table(f"fusion's verdict: fused against standard on each backend, geometric mean over "
               f"{report['timing']['blocks']} blocks of fresh sessions [95% interval]; A/A: a second standard "
               f"session against the first",
               [("backend", "left")] + ([("shape", "left")] if several else [])
               + [("fused vs standard", "right"), ("A/A", "right"), ("verdict", "left"),
                  ("max |err| fused / unfused", "right")])
    for v in report["verdicts"]:
        err = v["max_abs_error"]
        t.add_row(" ".join(x for x in (v["backend"], v["variant"]) if x),
                  *([_shape_words(v["shape"], " ")] if several else []),
                  with_interval(v["fusion"]), with_interval(v["aa"]),
                  Text(verdict_words(v), style="green" if v["resolved"] else ""),
                  f"{_num(err['fused'], '.1e')} / {_num(err['standard'], '.1e')}")
    return t


def ratio_table(report: dict) -> Table:
    several = len(report["shapes"]) > 1
    t = _table("fused against the rest: geometric mean over blocks of each block's ratio (paired round by round "
               "where timed together) [95% interval]; >1 means fused is faster",
               ([("shape", "left")] if several else [])
               + [("fused", "left"), ("against", "left"), ("ratio", "right"), ("verdict", "left")])
    for r in report["ratios"]:
        t.add_row(*([_shape_words(r["shape"], " ")] if several else []), r["a"],
                  r["b"] + ("" if r["paired"] else " (unpaired)"), with_interval(r), r["verdict"])
    return t


def make_console() -> Console:
    """The terminal's width on a terminal or where ``COLUMNS`` says; 160 in a pipe."""
    import os
    import sys
    return Console(markup=False, highlight=False,
                   width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def print_report(report: dict, console: Console | None = None) -> None:
    """Print ``report`` (a ``blockc.compare`` document) for a person."""
    console = console or make_console()
    timing, mem = report["timing"], report["memory"]
    console.print(f"blockc compare: {report['model']}"
                  + (f" {' '.join(f'--set {k}={v}' for k, v in report['settings'].items())}" if report["settings"]
                     else "")
                  + f"; {timing['threads']} threads; {timing['blocks']} blocks of fresh sessions, each timed in "
                    f"{timing['rounds']} interleaved rounds of ≥{timing['min_repeats']} runs and ≥"
                    f"{timing['min_time_s']} s after {timing['warmup']} warm-up; clock: {timing['clock']}")
    if report["verdicts"]:
        console.print(verdict_table(report))
    for shape in report["shapes"]:
        for table in shape_tables(report, shape, console.width):
            console.print(table)
        for r in report["results"]:
            if r["shape"] == shape and r["status"] != "ok":
                console.print(Text.assemble(f"  {r['backend']}/{r['variant']}/{r['form']}: ",
                                            (r["status"], "red" if r["status"] == "error" else "yellow"),
                                            f" -- {r['error']}"))
    console.print("  ms: median [min–max] of every timed run, all blocks pooled; vs standard: the standard "
                  "form's median over this row's (same backend and level); max |err| against the float64 reference")
    for kind in ("backends", "peers"):
        for b in report[kind]:
            if b["available"]:
                console.print(f"  {b['name']}: {b['detail']}")
            else:
                console.print(Text.assemble(f"  {b['name']}: ", ("skipped", "yellow"), f" -- {b['reason']}"))
    if report["ratios"]:
        console.print(ratio_table(report))
    if report["kernels"]:
        console.print("\nfused kernels alone (bytes modelled / measured time):")
        for k in report["kernels"]:
            shape = _shape_words(k["shape"])
            if k["status"] != "ok":
                console.print(f"  {k['op']:<16} {k['backend']:<9} {shape:<20} {k['status']}: {k['error']}")
                continue
            frac = f", {100 * k['fraction_of_peak']:.0f}% of peak" if k["fraction_of_peak"] is not None else ""
            console.print(f"  {k['op']:<16} {k['backend']:<9} {shape:<20} {k['median_ms']:.4f} ms, "
                          f"{format_bytes(k['bytes_modelled'])}, {k['bandwidth_gbps']:.1f} GB/s{frac}")
    machine = report["machine"]
    console.print(f"\nmachine: {machine['cpu']}, {machine['cores']} cores"
                  + (f", {machine['gpu']}" if machine["gpu"] else "")
                  + f"; peak bandwidth: {_num(machine['peak_gbps'], '.0f')} GB/s ({machine['peak_source']})")
    growth = ""
    if mem["peak_growth_bytes"] is not None:
        growth = f", this process grew by {format_bytes(mem['peak_growth_bytes'])} at its peak"
        growth += f" ({mem['peak_at']})" if mem.get("peak_at") else ""
        if mem["budget_bytes"] is not None and mem["peak_growth_bytes"] > mem["budget_bytes"]:
            growth += ": OVER the budget"
    budget = "" if mem["budget_bytes"] is None else f" (budget {format_bytes(mem['budget_bytes'])})"
    console.print(f"took {timing['elapsed_s']:.0f} s (planned about {timing['planned_s']:.0f} s); memory: largest "
                  f"group about {format_bytes(mem['largest_group_bytes'] + mem['holding_bytes'])} with the "
                  f"reference{budget}{growth}")
