"""The ``blockc compare --report DIR`` page: one self-contained ``index.html``
(CSS inline, pictures as base64 data URIs, no script, nothing fetched) made
from a ``blockc.compare/1`` result (docs/compare-report.md), with the PNGs
written beside it too.

Every string from the report reaches the page through jinja2's autoescape,
so a model named ``<script>`` is shown, never run. The files are written to
temporary names and renamed into place, ``index.html`` last: a reader (or a
crash) never sees a half-written page.
"""
from __future__ import annotations

import base64
import pathlib
from typing import Mapping

import jinja2

from ..errors import BlockcError
from ..files import check_writable_dir, format_bytes, output_folder
from ..ir.graph import Graph
from . import plots

SCHEMA = "blockc.compare/2"
INDEX = "index.html"


def check_report_dir(path) -> pathlib.Path:
    """Check that ``path`` can hold the report (``files.check_writable_dir``);
    the CLI calls this before measuring anything, so a bad ``--report DIR``
    fails in a second, not after the benchmark. Nothing is made: the folder
    appears with the report (``files.output_folder``), so a run that fails
    leaves none."""
    directory = pathlib.Path(path)
    check_writable_dir(directory, "the report to", "--report")
    return directory


def write_html_report(report: Mapping, directory, *, before: Graph | None = None,
                      after: Graph | None = None) -> pathlib.Path:
    """Write ``directory/index.html`` (and its PNGs beside it) for a
    ``blockc.compare/1`` result; ``before``/``after`` are one block's graph
    unfused and fused, drawn when given. Returns the page's path."""
    if report.get("schema") != SCHEMA:
        raise BlockcError(f"the report page reads {SCHEMA} results; this one says {report.get('schema')!r}")
    directory = check_report_dir(directory)
    images = _render_images(report, before, after)
    page = _template().render(r=_view(report), images=images)
    files = {name: png for name, png in images.items() if png}
    files[INDEX] = page.encode("utf-8")
    _write_all(directory, files)
    return directory / INDEX


# -- files --------------------------------------------------------------------------------------
def _write_all(directory: pathlib.Path, files: dict[str, bytes]) -> None:
    """Every file staged, then all put in place together, ``index.html`` last
    (``files.output_folder``); on any failure nothing is replaced and nothing
    temporary, not even the folder, is left."""
    with output_folder(directory, last=INDEX) as staging:
        for name, data in files.items():
            (staging / name).write_bytes(data)


def _render_images(report: Mapping, before: Graph | None, after: Graph | None) -> dict[str, bytes | None]:
    images = {"latency.png": plots.latency_chart_png(report), "roofline.png": plots.roofline_png(report),
              "graph_before.png": None, "graph_after.png": None}
    if before is not None and after is not None:
        images["graph_before.png"], images["graph_after.png"] = plots.before_after_pngs(before, after)
    elif before is not None or after is not None:
        name, graph = ("graph_before.png", before) if before is not None else ("graph_after.png", after)
        images[name] = plots.graph_png(graph, "before fusion" if before is not None else "after fusion")
    return images


# -- the data the template reads: every number formatted here, every string left raw --------------
def _view(report: Mapping) -> dict:
    machine = dict(report.get("machine") or {})
    backends = list(report.get("backends") or [])
    peers = list(report.get("peers") or [])
    rows = [_result_row(r) for r in report.get("results") or []]
    ran = {r.get("backend") for r in report.get("results") or []} | {r.get("form") for r in report.get("results") or []}
    for kind, entries in (("backend", backends), ("peer", peers)):
        for b in entries:
            if not b.get("available", True):
                rows.append({"kind": "skipped", "name": b.get("name", ""), "what": kind,
                             "reason": b.get("reason") or "no reason given"})
            elif b.get("name") not in ran:
                rows.append({"kind": "skipped", "name": b.get("name", ""), "what": kind,
                             "reason": "available, but the report has no row for it"})
    kernels = []
    for k in report.get("kernels") or []:
        flops, nbytes = k.get("flops_modelled"), k.get("bytes_modelled")
        kernels.append({"name": "/".join(x for x in (k.get("backend"), k.get("variant")) if x), "op": k.get("op"),
                        "shape": plots.shape_label(k.get("shape")), "node": k.get("node"),
                        "median": _ms(k.get("median_ms")), "bytes": _bytes(nbytes), "flops": _count(flops),
                        "intensity": f"{flops / nbytes:.3g}" if flops and nbytes else "—",
                        "gbps": _num(k.get("bandwidth_gbps")), "peak": _pct(k.get("fraction_of_peak"))})
    ratios = [{"shape": plots.shape_label(q.get("shape")), "a": q.get("a"), "b": q.get("b"),
               **_interval(q)} for q in report.get("ratios") or []]
    verdicts = [{"backend": "/".join(x for x in (v.get("backend"), v.get("variant")) if x),
                 "shape": plots.shape_label(v.get("shape")), **_interval(v.get("fusion") or {}),
                 "aa": _interval(v.get("aa") or {}), "resolved": bool(v.get("resolved")),
                 "fused_error": _sci((v.get("max_abs_error") or {}).get("fused")),
                 "standard_error": _sci((v.get("max_abs_error") or {}).get("standard"))}
                for v in report.get("verdicts") or []]
    forms = [{"name": name, "ir_nodes": f.get("ir_nodes"),
              "ops": ", ".join(f"{op} {n}" for op, n in sorted((f.get("ops") or {}).items())) or "—"}
             for name, f in (report.get("forms") or {}).items()]
    peak = machine.get("peak_gbps")
    machine_rows = [("CPU", machine.get("cpu")), ("cores", machine.get("cores")),
                    ("memory", f"{machine['memory_gib']:g} GiB" if machine.get("memory_gib") else None),
                    ("GPU", machine.get("gpu") or "none used"), ("OS", machine.get("os")),
                    ("Python", machine.get("python")),
                    ("peak memory bandwidth", f"{peak:g} GB/s" if peak else "unknown"),
                    ("peak from", machine.get("peak_source"))]
    timing = dict(report.get("timing") or {})
    _, left_off = plots.roofline_points(report)
    return {
        "model": report.get("model", ""), "schema": report.get("schema"),
        "settings": [(k, v) for k, v in (report.get("settings") or {}).items()],
        "dtype": report.get("dtype"), "created": report.get("created"), "command": report.get("command"),
        "machine": [(k, "—" if v is None else v) for k, v in machine_rows],
        "versions": [(k, v if v is not None else "not installed") for k, v in (report.get("versions") or {}).items()],
        "timing": [(k, "—" if v is None else v) for k, v in timing.items()],
        "shapes": [plots.shape_label(s) for s in report.get("shapes") or []],
        "forms": forms, "backends": [_entry(b, "backend") for b in backends] + [_entry(p, "peer") for p in peers],
        "rows": rows, "ratios": ratios, "verdicts": verdicts, "kernels": kernels,
        "roofline_omitted": plots.roofline_omission(report), "roofline_left_off": left_off,
        "errors": sum(1 for r in rows if r["kind"] == "error"),
        "skipped": sum(1 for r in rows if r["kind"] == "skipped"),
    }


def _entry(b: Mapping, what: str) -> dict:
    available = bool(b.get("available", True))
    text = (b.get("detail") or "") if available else (b.get("reason") or "no reason given")
    return {"name": b.get("name", ""), "what": what, "available": available, "text": text}


def _interval(q: Mapping) -> dict:
    """A ratio with its 95% interval over blocks and what it says."""
    low, high = q.get("low"), q.get("high")
    return {"speedup": _times(q.get("speedup")), "cls": _speed_class(q.get("speedup")),
            "interval": f"{low:.2f}–{high:.2f}" if low is not None and high is not None else "—",
            "verdict": q.get("verdict") or "—", "blocks": q.get("blocks"),
            "paired": q.get("paired", True)}


def _result_row(r: Mapping) -> dict:
    t = r.get("latency_ms") or {}
    if r.get("status") == "skipped":
        return {"kind": "skipped", "name": f"{r.get('backend', '')}/{r.get('variant', '')}/{r.get('form', '')} "
                                           f"{plots.shape_label(r.get('shape'))}",
                "what": "row", "reason": r.get("error") or "no reason given"}
    row = {"kind": "error" if r.get("status") == "error" else "ok", "backend": r.get("backend", ""),
           "variant": r.get("variant", ""), "form": r.get("form", ""), "peer": bool(r.get("peer")),
           "shape": plots.shape_label(r.get("shape")), "error": r.get("error") or "no reason given",
           "ir_nodes": _count(r.get("ir_nodes")), "kernels": _count(r.get("kernels"))}
    if row["kind"] == "ok":
        median = t.get("median")
        spread = f" [{_num(t.get('min'))}–{_num(t.get('max'))}]" if t.get("min") is not None else ""
        row.update(latency=f"{_num(median)}{spread}" if median is not None else "—",
                   repeats=t.get("repeats"), speedup=_times(r.get("speedup_vs_standard")),
                   speed_cls=_speed_class(r.get("speedup_vs_standard")),
                   bytes=_bytes(r.get("bytes_modelled")), gbps=_num(r.get("bandwidth_gbps")),
                   peak=_pct(r.get("fraction_of_peak")), error_value=_sci(r.get("max_abs_error")))
    return row


def _num(x) -> str:
    return "—" if x is None else f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _ms(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _count(x) -> str:
    return "—" if x is None else f"{x:,}"


def _bytes(x) -> str:
    return "—" if x is None else format_bytes(x)


def _pct(x) -> str:
    return "—" if x is None else f"{x:.1%}"


def _sci(x) -> str:
    return "—" if x is None else f"{x:.2g}"


def _times(x) -> str:
    return "—" if x is None else f"{x:.2f}×"


def _speed_class(x) -> str:
    if x is None:
        return ""
    return "faster" if x > 1.02 else "slower" if x < 0.98 else ""


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _template() -> jinja2.Template:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["data_uri"] = _data_uri
    return env.from_string(_PAGE)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="blockc compare ({{ r.schema }})">
<title>blockc compare: {{ r.model }}</title>
<style>
:root { --ink: #1d2430; --muted: #5b6573; --rule: #d9dee5; --band: #f5f7fa; --bad: #b00020; --good: #1e7b34; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink);
       margin: 0 auto; padding: 24px 32px 48px; max-width: 1400px; }
h1 { font-size: 1.6em; margin: 0 0 4px; } h1 code { font-size: 0.95em; }
h2 { font-size: 1.2em; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 2px solid var(--rule); }
.sub { color: var(--muted); margin: 0 0 16px; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.92em; }
.facts { display: flex; flex-wrap: wrap; gap: 12px 28px; }
.facts table { min-width: 260px; }
.facts caption { text-align: left; font-weight: 600; padding-bottom: 4px; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--rule); vertical-align: top; text-align: left; }
th { background: var(--band); font-weight: 600; }
.facts th { background: none; font-weight: normal; color: var(--muted); }
td.shape { white-space: nowrap; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.peer td:first-child { border-left: 4px solid #54a24b; }
tr.error td, tr.skipped td { background: #fff4f4; }
.why { color: var(--bad); }
.faster { color: var(--good); font-weight: 600; } .slower { color: var(--bad); font-weight: 600; }
.tag { display: inline-block; font-size: 0.8em; padding: 0 6px; border-radius: 8px;
       background: #e4f2e1; color: #2a6b25; }
.tag.err { background: #fde2e2; color: var(--bad); } .tag.skip { background: #ece9e0; color: #6b5b25; }
.note { color: var(--muted); font-size: 0.92em; max-width: 70em; }
.omitted { border-left: 4px solid #e0a800; background: #fffbea; padding: 8px 12px; max-width: 70em; }
figure { margin: 12px 0; } figcaption { color: var(--muted); font-size: 0.9em; }
img { max-width: 100%; height: auto; border: 1px solid var(--rule); }
.pair { display: flex; gap: 16px; align-items: flex-start; }
.pair figure { flex: 0 1 auto; min-width: 0; margin: 0; }  /* shrink alike: both graphs keep one scale */
.scroll { overflow-x: auto; }
</style>
</head>
<body>
<h1>blockc compare: <code>{{ r.model }}</code></h1>
<p class="sub">fused against unfused, measured side by side with peers &middot; {{ r.created or "time not recorded" }}
&middot; <code>{{ r.command or "" }}</code></p>

<div class="facts">
<table><caption>Model</caption>
<tr><th>model</th><td><code>{{ r.model }}</code></td></tr>
<tr><th>dtype</th><td>{{ r.dtype or "—" }}</td></tr>
{% for k, v in r.settings %}<tr><th>--set {{ k }}</th><td><code>{{ v }}</code></td></tr>
{% endfor %}
<tr><th>shapes</th><td>{{ r.shapes | join("; ") or "—" }}</td></tr>
</table>
<table><caption>Machine</caption>
{% for k, v in r.machine %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>
{% endfor %}
</table>
<table><caption>Versions</caption>
{% for k, v in r.versions %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>
{% endfor %}
</table>
<table><caption>Timing protocol</caption>
{% for k, v in r.timing %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>
{% endfor %}
</table>
</div>

<h2>Verdict</h2>
{% if r.verdicts %}
<p class="note">Fused against standard on each backend: the geometric mean over blocks of fresh sessions of each
block's ratio, with its 95% interval. A/A: a second session of the standard form, timed the same way; a difference
counts as resolved when fusion's interval lies on one side of 1 and the A/A control's does not.</p>
<table>
<tr><th>backend</th><th>shape</th><th>fused vs standard</th><th>95% interval</th><th>blocks</th><th>A/A</th>
<th>verdict</th><th>max abs error fused</th><th>unfused</th></tr>
{% for v in r.verdicts %}<tr><td>{{ v.backend }}</td><td class="shape">{{ v.shape }}</td>
<td class="n {{ v.cls }}">{{ v.speedup }}</td><td class="n">{{ v.interval }}</td><td class="n">{{ v.blocks }}</td>
<td class="n">{{ v.aa.speedup }} ({{ v.aa.interval }})</td>
<td>{{ v.verdict }}{% if v.resolved %}, resolved{% else %}, not resolved{% endif %}</td>
<td class="n">{{ v.fused_error }}</td><td class="n">{{ v.standard_error }}</td></tr>
{% endfor %}
</table>
{% else %}<p class="note">No verdict: no backend ran both the standard and the fused form.</p>{% endif %}

<h2>Results</h2>
<p class="note">Latency in milliseconds: median [min–max] over the repeats of every block. Speedup: the standard form's median
on the same backend, variant and shape divided by this row's. Bytes moved: the traffic model at this shape.
{% if r.errors or r.skipped %}<strong class="why">{{ r.errors }} row(s) failed and {{ r.skipped }} backend(s) or
peer(s) did not run; their reasons are in the table.</strong>{% endif %}</p>
<div class="scroll"><table class="results">
<tr><th>backend</th><th>variant</th><th>form</th><th>shape</th><th>latency ms</th><th>repeats</th>
<th>speedup vs standard</th>
<th>IR nodes</th><th>kernels</th><th>bytes moved</th><th>GB/s</th><th>of peak</th><th>max abs error</th></tr>
{% for row in r.rows %}
{% if row.kind == "skipped" %}
<tr class="skipped"><td>{{ row.name }}</td><td colspan="3"><span class="tag skip">skipped {{ row.what }}</span></td>
<td colspan="9" class="why">{{ row.reason }}</td></tr>
{% elif row.kind == "error" %}
<tr class="error{% if row.peer %} peer{% endif %}"><td>{{ row.backend }}</td><td>{{ row.variant }}</td>
<td>{{ row.form }}{% if row.peer %} <span class="tag">peer</span>{% endif %}</td><td class="shape">{{ row.shape }}</td>
<td colspan="3" class="why"><span class="tag err">error</span> {{ row.error }}</td>
<td class="n">{{ row.ir_nodes }}</td><td class="n">{{ row.kernels }}</td><td colspan="4"></td></tr>
{% else %}
<tr{% if row.peer %} class="peer"{% endif %}><td>{{ row.backend }}</td><td>{{ row.variant }}</td>
<td>{{ row.form }}{% if row.peer %} <span class="tag">peer</span>{% endif %}</td><td class="shape">{{ row.shape }}</td>
<td class="n">{{ row.latency }}</td><td class="n">{{ row.repeats if row.repeats is not none else "—" }}</td>
<td class="n {{ row.speed_cls }}">{{ row.speedup }}</td><td class="n">{{ row.ir_nodes }}</td>
<td class="n">{{ row.kernels }}</td><td class="n">{{ row.bytes }}</td><td class="n">{{ row.gbps }}</td>
<td class="n">{{ row.peak }}</td><td class="n">{{ row.error_value }}</td></tr>
{% endif %}
{% else %}
<tr><td colspan="13" class="why">The report has no result rows.</td></tr>
{% endfor %}
</table></div>

<h2>Ratios</h2>
{% if r.ratios %}
<p class="note">How much faster <em>a</em> is than <em>b</em> at the same shape; above 1: <em>a</em> is faster. The
geometric mean over blocks of each block's ratio (paired round by round where the two were timed together), with
its 95% interval.</p>
<table>
<tr><th>shape</th><th>a</th><th>b</th><th>speedup of a over b</th><th>95% interval</th><th>verdict</th></tr>
{% for q in r.ratios %}<tr><td>{{ q.shape }}</td><td><code>{{ q.a }}</code></td><td><code>{{ q.b }}</code>{% if not q.paired %} (unpaired){% endif %}</td>
<td class="n {{ q.cls }}">{{ q.speedup }}</td><td class="n">{{ q.interval }}</td><td>{{ q.verdict }}</td></tr>
{% endfor %}
</table>
{% else %}<p class="note">No ratios: no pair of rows ran at the same shape.</p>{% endif %}

<h2>Latency</h2>
{% if images["latency.png"] %}
<figure><img src="{{ images["latency.png"] | data_uri }}" alt="latency per form and backend">
<figcaption>Median latency per shape; whiskers span min to max; peers hatched green.
Failed rows are marked, not drawn.</figcaption></figure>
{% else %}<p class="omitted">No chart: the report has no result rows.</p>{% endif %}

<h2>Fused kernels: roofline</h2>
{% if images["roofline.png"] %}
<figure><img src="{{ images["roofline.png"] | data_uri }}" alt="roofline of the fused kernels">
<figcaption>Each fused op measured alone: modelled flops per modelled byte against achieved GFLOP/s, under the
memory-bandwidth roof. A point on the roof moves its bytes at the device's peak.</figcaption></figure>
{% else %}<p class="omitted">{{ r.roofline_omitted }}</p>{% endif %}
{% if images["roofline.png"] and r.roofline_left_off %}
<p class="note">Not on the plot:</p>
<ul class="note">{% for why in r.roofline_left_off %}<li>{{ why }}</li>{% endfor %}</ul>
{% endif %}
{% if r.kernels %}
<div class="scroll"><table>
<tr><th>backend</th><th>op</th><th>shape</th><th>node</th><th>median ms</th><th>bytes modelled</th>
<th>flops modelled</th>
<th>flop/byte</th><th>GB/s</th><th>of peak</th></tr>
{% for k in r.kernels %}<tr><td>{{ k.name }}</td><td>{{ k.op }}</td><td>{{ k.shape }}</td>
<td><code>{{ k.node }}</code></td>
<td class="n">{{ k.median }}</td><td class="n">{{ k.bytes }}</td><td class="n">{{ k.flops }}</td>
<td class="n">{{ k.intensity }}</td><td class="n">{{ k.gbps }}</td><td class="n">{{ k.peak }}</td></tr>
{% endfor %}
</table></div>
{% endif %}

<h2>One block before and after fusion</h2>
{% if images["graph_before.png"] or images["graph_after.png"] %}
<div class="pair">
{% for name, caption in (("graph_before.png", "before fusion"), ("graph_after.png", "after fusion")) %}
{% if images[name] %}<figure><img src="{{ images[name] | data_uri }}" alt="the block's graph {{ caption }}">
<figcaption>{{ caption }}</figcaption></figure>{% endif %}
{% endfor %}
</div>
<p class="note">Inputs at the top. Fused ops are drawn in their own colours; before fusion, the nodes each fusion
takes in carry a lighter shade of its colour. Parameters are left out.</p>
{% else %}<p class="omitted">No block pictures: no graph was given to the report.</p>{% endif %}

<h2>Forms, backends and peers</h2>
<div class="facts">
<table><tr><th>form</th><th>IR nodes</th><th>ops</th></tr>
{% for f in r.forms %}<tr><td>{{ f.name }}</td>
<td class="n">{{ f.ir_nodes if f.ir_nodes is not none else "—" }}</td><td>{{ f.ops }}</td></tr>
{% endfor %}
</table>
<table><tr><th>name</th><th>kind</th><th>ran</th><th>detail or reason</th></tr>
{% for b in r.backends %}<tr><td>{{ b.name }}</td><td>{{ b.what }}</td>
<td>{% if b.available %}yes{% else %}<span class="tag skip">skipped</span>{% endif %}</td>
<td{% if not b.available %} class="why"{% endif %}>{{ b.text }}</td></tr>
{% endfor %}
</table>
</div>
</body>
</html>
"""
