"""The pictures of the ``blockc compare`` report, each as PNG bytes.

* ``latency_chart_png``: median latency per shape, one bar per
  (backend/variant, form) with min-max whiskers; peers hatched.
* ``roofline_png``: the fused kernels against the memory-bandwidth roof
  (only where ``machine.peak_gbps`` is known; ``roofline_omission`` says why not).
* ``graph_png`` / ``before_after_pngs``: one block's graph as a layered DAG,
  fused ops in their own colours; in the "before" picture the nodes that a
  fusion absorbs carry a lighter shade of the fused op's colour.

Figures are drawn on matplotlib's Agg canvas directly (``Figure`` +
``FigureCanvasAgg``), never through pyplot: no display is needed and no
global backend is switched under a caller that uses pyplot itself.
"""
from __future__ import annotations

import io
from typing import Iterable, Mapping

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch

from ..ir.graph import Graph
from ..ops.registry import fused_ops, get
from ..passes.forms import FORMS

# Colours: plain forms in blues and greys, fused in orange, peers green and hatched.
FORM_COLOURS = {"decomposed": "#9AA5B1", "standard": "#4C78A8", "fused": "#F58518"}
PEER_COLOUR, PEER_HATCH = "#54A24B", "//"
OTHER_FORM_COLOUR = "#B0B0B0"
_SPARE_COLOURS = ("#72B7B2", "#FF9DA6", "#BAB0AC")
PLAIN_OP_COLOUR, IO_COLOUR = "#DDE4EC", "#FFFFFF"
DPI = 100
MAX_INCHES = 60  # keeps a huge graph's picture under Agg's pixel limit


def plain(text) -> str:
    """``text`` as matplotlib shows it literally: a ``$`` would start mathtext
    (and an unbalanced pair makes drawing raise), so every one is escaped."""
    return str(text).replace("$", r"\$")


def shape_label(shape: Mapping | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (shape or {}).items()) or "(no dims)"


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


# -- latency ------------------------------------------------------------------------------------
def _series_key(row: Mapping, order: list):
    """Backends and variants in the order the report lists them, then forms
    as decomposed, standard, fused, then peers."""
    group = (row.get("backend", ""), row.get("variant", ""))
    form = row.get("form", "")
    form_rank = FORMS.index(form) if form in FORMS and not row.get("peer") else len(FORMS)
    return (order.index(group), form_rank, form)


def latency_chart_png(report: Mapping) -> bytes | None:
    """Median latency with min-max whiskers: one panel per shape, one bar per
    (backend/variant, form); error rows are marked where their bar would be.
    ``None`` when the report has no result rows at all."""
    panels = _latency_panels(report)
    if not panels:
        return None
    n_bars = sum(len(rs) for _, rs in panels)
    height = min(MAX_INCHES, 1.2 + 0.34 * n_bars + 0.75 * len(panels))
    fig = Figure(figsize=(10, height), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True,
                        gridspec_kw={"height_ratios": [max(len(rs), 1) + 1 for _, rs in panels]})[:, 0]
    for ax, (shape, rs) in zip(axes, panels):
        _draw_latency_panel(ax, shape, rs)
    _latency_axis(axes, [r for _, rs in panels for r in rs])
    _latency_legend(fig, [r for _, rs in panels for r in rs])
    fig.suptitle(plain(f"{report.get('model', '')}: latency per form and backend"), fontsize=12, x=0.02,
                 ha="left")
    return _png(fig)


def _latency_panels(report: Mapping) -> list[tuple[dict, list]]:
    """(shape, its result rows in series order) for each shape with rows:
    the report's shapes first, then any only a row names."""
    rows = list(report.get("results") or [])
    backends = [b.get("name") for b in report.get("backends") or []]
    order = sorted(dict.fromkeys((r.get("backend", ""), r.get("variant", "")) for r in rows),
                   key=lambda g: backends.index(g[0]) if g[0] in backends else len(backends))
    shapes: list[dict] = []
    for s in list(report.get("shapes") or []) + [r.get("shape") or {} for r in rows]:
        if s not in shapes:
            shapes.append(s)
    panels = [(s, sorted((r for r in rows if (r.get("shape") or {}) == s), key=lambda r: _series_key(r, order)))
              for s in shapes]
    return [(s, rs) for s, rs in panels if rs]


def _bar_style(row: Mapping) -> tuple[str, str | None]:
    """A bar's colour and hatch: peers green and hatched, forms by their colour."""
    if row.get("peer"):
        return PEER_COLOUR, PEER_HATCH
    return FORM_COLOURS.get(row.get("form"), OTHER_FORM_COLOUR), None


def _draw_latency_panel(ax, shape: Mapping, rows: list) -> None:
    """One shape's bars, the first row on top; a row without a timing says why in its place."""
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows):
        if not _has_latency(r):
            why = "error (see the table)" if r.get("status") == "error" else "no timing"
            ax.text(0.01, y, why, transform=ax.get_yaxis_transform(), va="center", ha="left",
                    color="#B00020", fontstyle="italic", fontsize=9)
            continue
        colour, hatch = _bar_style(r)
        t = r["latency_ms"]
        med = t["median"]
        tmin, tmax = t.get("min", med) or med, t.get("max", med) or med
        ax.barh(y, med, height=0.7, color=colour, hatch=hatch, edgecolor="#333333", linewidth=0.6,
                xerr=[[max(med - tmin, 0)], [max(tmax - med, 0)]],
                error_kw={"ecolor": "#222222", "capsize": 3, "elinewidth": 1})
        ax.annotate(f"{med:.3g} ms", (tmax, y), xytext=(5, 0), textcoords="offset points",
                    va="center", fontsize=8, color="#222222")
    ax.set_yticks(ys, [plain(_bar_label(r)) for r in rows], fontsize=9)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_title(plain(shape_label(shape)), fontsize=10, loc="left")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6, which="both")
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _latency_axis(axes, rows: list) -> None:
    """The shared latency axis: log scale where the timings span more than 30x."""
    ok = [r["latency_ms"] for r in rows if _has_latency(r)]
    lo = min((t["min"] if t.get("min") else t["median"]) for t in ok) if ok else 1.0
    hi = max((t["max"] if t.get("max") else t["median"]) for t in ok) if ok else 1.0
    log = hi / max(lo, 1e-12) > 30
    if log:
        axes[0].set_xscale("log")
        axes[0].set_xlim(lo / 2, hi * 2)  # every bar visibly long; room for the value labels
    elif ok:
        axes[0].set_xlim(0, hi * 1.18)  # room for the value labels
    axes[-1].set_xlabel("latency (ms), median; whiskers min-max" + (", log scale" if log else ""))


def _latency_legend(fig: Figure, rows: list) -> None:
    """One entry per form a bar was drawn or marked for (in form order), and one for peers."""
    forms = sorted(dict.fromkeys(r.get("form") for r in rows if not r.get("peer")),
                   key=lambda f: FORMS.index(f) if f in FORMS else len(FORMS))
    handles = [Patch(facecolor=FORM_COLOURS.get(f, OTHER_FORM_COLOUR), edgecolor="#333333", label=plain(f))
               for f in forms]
    if any(r.get("peer") for r in rows):
        handles.append(Patch(facecolor=PEER_COLOUR, hatch=PEER_HATCH, edgecolor="#333333", label="peer"))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9, frameon=False)


def _has_latency(row: Mapping) -> bool:
    t = row.get("latency_ms") or {}
    return row.get("status", "ok") == "ok" and isinstance(t.get("median"), (int, float)) and t["median"] > 0


def _bar_label(row: Mapping) -> str:
    variant = f"/{row['variant']}" if row.get("variant") else ""
    return f"{row.get('backend', '')}{variant}  {row.get('form', '')}"


# -- roofline ------------------------------------------------------------------------------------
def roofline_points(report: Mapping) -> tuple[list[dict], list[str]]:
    """The kernels that go on the roofline, with ``intensity`` (flop/byte)
    and ``gflops`` added, and a line for each one left off saying why.

    A kernel is plotted when the report measured it against the peak
    (``fraction_of_peak`` is not null): a peak belongs to one device, and a
    CPU kernel under a GPU's roof would mislead.
    """
    points, left_off = [], []
    for k in report.get("kernels") or []:
        name = f"{k.get('op')} on {k.get('backend')}/{k.get('variant', '')} at {shape_label(k.get('shape'))}"
        flops, nbytes, ms = k.get("flops_modelled"), k.get("bytes_modelled"), k.get("median_ms")
        if not ms or ms <= 0:
            left_off.append(f"{name}: no time measured")
        elif not flops or not nbytes or flops <= 0 or nbytes <= 0:
            left_off.append(f"{name}: no modelled flops or bytes")
        elif k.get("fraction_of_peak") is None:
            left_off.append(f"{name}: not measured against the peak (fraction_of_peak is null)")
        else:
            points.append(dict(k, intensity=flops / nbytes, gflops=flops / (ms * 1e-3) / 1e9))
    return points, left_off


def roofline_omission(report: Mapping) -> str | None:
    """Why there is no roofline plot, in a sentence; ``None`` when there is one."""
    machine = report.get("machine") or {}
    if not report.get("kernels"):
        return "No fused kernels were measured on their own, so there is nothing to place on a roofline."
    if not machine.get("peak_gbps"):
        source = machine.get("peak_source") or "no source given"
        return (f"The roofline is omitted: the device's peak memory bandwidth is not known ({source}), "
                "so there is no roof to measure the kernels against.")
    if not roofline_points(report)[0]:
        return "The roofline is omitted: no kernel has the flops, bytes and time it needs (see the kernel table)."
    return None


def roofline_png(report: Mapping) -> bytes | None:
    """Achieved GFLOP/s against arithmetic intensity for each fused kernel,
    under the roof ``peak_gbps x intensity``; ``None`` where ``roofline_omission``
    gives a reason. The report has no compute peak, so there is no flat roof."""
    if roofline_omission(report):
        return None
    machine = report["machine"]
    peak = float(machine["peak_gbps"])
    points, _ = roofline_points(report)
    xs = [p["intensity"] for p in points]
    lo, hi = min(xs) / 4, max(xs) * 4
    fig = Figure(figsize=(9, 5.6), layout="constrained")
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot([lo, hi], [peak * lo, peak * hi], color="#333333", linewidth=1.5,
            label=plain(f"memory roof: {peak:g} GB/s × intensity"))
    groups = []
    for p in points:
        g = f"{p.get('backend')}/{p.get('variant', '')}".rstrip("/")
        if g not in groups:
            groups.append(g)
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2"]
    markers = "osD^vP"
    several_shapes = len({shape_label(p.get("shape")) for p in points}) > 1
    for i, g in enumerate(groups):
        mine = [p for p in points if f"{p.get('backend')}/{p.get('variant', '')}".rstrip("/") == g]
        ax.scatter([p["intensity"] for p in mine], [p["gflops"] for p in mine], s=55, zorder=3,
                   color=palette[i % len(palette)], marker=markers[i % len(markers)], edgecolor="#222222",
                   label=plain(g))
        for p in mine:
            text = p.get("op", "?") + (f" ({shape_label(p.get('shape'))})" if several_shapes else "")
            text += f"\n{p['fraction_of_peak']:.0%} of peak bandwidth"
            ax.annotate(plain(text), (p["intensity"], p["gflops"]), xytext=(6, 4), textcoords="offset points",
                        fontsize=8)
    ax.set_xlim(lo, hi)
    ys = [p["gflops"] for p in points] + [peak * lo, peak * hi]
    ax.set_ylim(min(ys) / 3, max(ys) * 3)
    ax.set_xlabel("arithmetic intensity (modelled flop / modelled byte)")
    ax.set_ylabel("achieved GFLOP/s (modelled flops / median time)")
    ax.grid(True, which="both", color="#E4E4E4", linewidth=0.6)
    ax.legend(loc="upper left", fontsize=9)
    device = machine.get("gpu") or machine.get("cpu") or "the device"
    ax.set_title(plain(f"Fused kernels against the memory roof of {device} "
                       f"(peak {peak:g} GB/s: {machine.get('peak_source') or 'source not given'})"), fontsize=10)
    ax.text(0.99, 0.02, "no compute peak in the report: only the bandwidth roof is drawn",
            transform=ax.transAxes, ha="right", va="bottom", fontsize=8, color="#666666")
    return _png(fig)


# -- graphs -------------------------------------------------------------------------------------
def fused_colour(op: str) -> str:
    """A fused op's own colour (its declaration's), else a spare one; a plain op's grey."""
    fused = fused_ops()
    if op not in fused:
        return PLAIN_OP_COLOUR
    return get(op).colour or _SPARE_COLOURS[sorted(fused).index(op) % len(_SPARE_COLOURS)]


def _lighter(colour: str, amount: float = 0.55) -> tuple:
    r, g, b = to_rgb(colour)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def absorbed_nodes(before: Graph, after: Graph) -> dict[int, str]:
    """Which nodes of ``before`` a fused op of ``after`` stands for:
    ``{index in before.nodes: fused op}``.

    ``optimize`` labels the nodes it is given by their printed names (``%12``)
    and each fused node keeps the labels it absorbed (``Node.origin``); the
    same numbering on ``before`` finds them again. Empty when ``after`` was
    not made by ``optimize(before)``.
    """
    from ..passes.manager import label_origins
    owner = {o: n.op for n in after.nodes if n.op in fused_ops() for o in n.origin}
    return {i: owner[n.origin[0]] for i, n in enumerate(label_origins(before).nodes) if n.origin[0] in owner}


def _layers(G) -> list[list]:
    """Topological generations, each ordered by the mean position of its
    predecessors (one barycentre sweep: fewer crossings than insertion order)."""
    import networkx as nx

    layers, position = [], {}
    for generation in nx.topological_generations(G):
        def key(k, _pos=position):
            parents = [_pos[p] for p in G.predecessors(k) if p in _pos]
            return (sum(parents) / len(parents) if parents else -1.0, list(G.nodes).index(k))
        layer = sorted(generation, key=key)
        for i, k in enumerate(layer):
            position[k] = i - (len(layer) - 1) / 2
        layers.append(layer)
    return layers


def _draw_graph(ax, graph: Graph, title: str, absorbed: Mapping[int, str], show_params: bool,
                depth: int = 0) -> set:
    """Draw ``graph`` top-down on ``ax``, leaving room for ``depth`` layers
    if it has fewer; returns the legend entries it used."""
    G = graph.to_networkx()
    if not show_params:
        G.remove_nodes_from([k for k, op in G.nodes(data="op") if op == "param"])
    layers = _layers(G)
    pos = {k: (i - (len(layer) - 1) / 2, -depth) for depth, layer in enumerate(layers) for i, k in enumerate(layer)}
    used = set()
    for a, b in set(G.edges()):
        (xa, ya), (xb, yb) = pos[a], pos[b]
        span = round(ya - yb)
        # An edge that skips layers bends aside, so it does not run through the nodes it passes.
        style = "arc3,rad=0" if span <= 1 else f"arc3,rad={-0.35 if xb <= xa else 0.35}"
        ax.add_patch(FancyArrowPatch((xa, ya), (xb, yb), connectionstyle=style, arrowstyle="-|>",
                                     mutation_scale=8, color="#7A8793", linewidth=0.8, shrinkA=7, shrinkB=8,
                                     zorder=1))
    for k, data in G.nodes(data=True):
        op = data["op"]
        index = int(k[1:]) if k.startswith("n") and k[1:].isdigit() else None
        edge, weight = "#44505C", "normal"
        if op in ("input", "output", "param"):
            fill, text, edge = IO_COLOUR, data["label"], "#2F6F3E"
            used.add(("io", "input / output"))
        elif op in fused_ops():
            fill, text, weight = fused_colour(op), op, "bold"
            used.add((op, f"fused: {op}"))
        elif index is not None and index in absorbed:
            fill, text, edge = _lighter(fused_colour(absorbed[index])), op, fused_colour(absorbed[index])
            used.add(("absorbed:" + absorbed[index], f"fuses into {absorbed[index]}"))
        else:
            fill, text = PLAIN_OP_COLOUR, op
            used.add(("plain", "other op"))
        ax.text(*pos[k], plain(text), ha="center", va="center", fontsize=8, fontweight=weight, zorder=3,
                bbox={"boxstyle": "round,pad=0.3", "facecolor": fill, "edgecolor": edge, "linewidth": 1.0})
    width = max((len(layer) for layer in layers), default=1)
    ax.set_xlim(-width / 2 - 0.3, width / 2 + 0.3)
    ax.set_ylim(-max(len(layers), depth) + 0.4, 0.6)
    ax.set_axis_off()
    ax.set_title(plain(f"{title}\n{len(graph.nodes)} IR nodes"), fontsize=11)
    return used


def _legend(fig: Figure, used: Iterable[tuple]) -> None:
    order = ["plain", "io"] + list(fused_ops()) + ["absorbed:" + op for op in fused_ops()]
    handles = []
    for key, label in sorted(set(used), key=lambda u: order.index(u[0]) if u[0] in order else len(order)):
        if key == "plain":
            handles.append(Patch(facecolor=PLAIN_OP_COLOUR, edgecolor="#44505C", label=label))
        elif key == "io":
            handles.append(Patch(facecolor=IO_COLOUR, edgecolor="#2F6F3E", label=label))
        elif key.startswith("absorbed:"):
            op = key.split(":", 1)[1]
            handles.append(Patch(facecolor=_lighter(fused_colour(op)), edgecolor=fused_colour(op), label=label))
        else:
            handles.append(Patch(facecolor=fused_colour(key), edgecolor="#44505C", label=label))
    fits = max(1, int(fig.get_figwidth() / 2.4))  # legend columns that fit the figure's width
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), fits), fontsize=9,
               frameon=False)


def _graph_size(graph: Graph, show_params: bool) -> tuple[float, float, int]:
    """(width, height) in inches for ``graph``'s picture, and its depth in
    layers; a layer is the same height in every picture, so graphs shown
    together share a vertical scale."""
    G = graph.to_networkx()
    if not show_params:
        G.remove_nodes_from([k for k, op in G.nodes(data="op") if op == "param"])
    layers = _layers(G)
    width = max((len(layer) for layer in layers), default=1)
    return (min(MAX_INCHES, max(4.5, 1.7 * width + 1.0)), min(MAX_INCHES, 1.8 + 0.42 * len(layers)), len(layers))


def graph_png(graph: Graph, title: str, *, absorbed: Mapping[int, str] | None = None,
              show_params: bool = False) -> bytes:
    """``graph`` as a layered DAG, inputs at the top: node labels are op
    names, fused ops in their own colours with a legend. ``absorbed`` (see
    ``absorbed_nodes``) shades the nodes a fusion will take in. Parameters
    are left out unless ``show_params``. Meant for one block: a whole model
    is drawn too, but its labels will crowd."""
    width, height, _ = _graph_size(graph, show_params)
    fig = Figure(figsize=(width, height), layout="constrained")
    used = _draw_graph(fig.subplots(), graph, title, absorbed or {}, show_params)
    _legend(fig, used)
    return _png(fig)


def before_after_pngs(before: Graph, after: Graph, *, show_params: bool = False) -> tuple[bytes, bytes]:
    """The block before and after fusion as two pictures at the same scale
    (so they sit side by side on a page), the nodes each fusion absorbs
    shaded in "before" in its fused op's colour."""
    return (graph_png(before, "before fusion", absorbed=absorbed_nodes(before, after), show_params=show_params),
            graph_png(after, "after fusion", show_params=show_params))


def before_after_png(before: Graph, after: Graph, *, show_params: bool = False) -> bytes:
    """The block before and after fusion in one picture, side by side."""
    (w1, h1, d1), (w2, h2, d2) = _graph_size(before, show_params), _graph_size(after, show_params)
    fig = Figure(figsize=(min(MAX_INCHES, w1 + w2), max(h1, h2)), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[w1, w2])
    depth = max(d1, d2)
    used = _draw_graph(left, before, "before fusion", absorbed_nodes(before, after), show_params, depth)
    used |= _draw_graph(right, after, "after fusion", {}, show_params, depth)
    _legend(fig, used)
    return _png(fig)
