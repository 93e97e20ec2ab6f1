"""The ``blockc compare --report DIR`` page, from a hand-made ``blockc.compare/1``
result: its tables and reasons, escaping, the PNGs, atomic writing, and the
page as a real headless browser (Debian's chromium) renders it."""
from __future__ import annotations

import copy
import json
import html.parser
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import matplotlib.image
import pytest

import blockc
from blockc.errors import BlockcError
from blockc.report import compare_html, plots
from blockc.report.compare_html import check_report_dir, write_html_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOSTILE = '<script>alert("pwned")</script> $\\alpha$ & co'
SHAPE1, SHAPE2 = {"batch": 1, "seq": 128}, {"batch": 4, "seq": 128}


def _row(backend, variant, form, shape, median, *, peer=False, speedup=None, ir_nodes=22, kernels=19,
         nbytes=12582912, peak=None):
    gbps = nbytes / (median * 1e-3) / 1e9
    return {"backend": backend, "variant": variant, "form": form, "peer": peer, "shape": dict(shape),
            "status": "ok", "error": "",
            "latency_ms": {"median": median, "min": median * 0.95, "max": median * 1.2, "repeats": 161},
            "speedup_vs_standard": speedup, "ir_nodes": ir_nodes, "kernels": kernels, "bytes_modelled": nbytes,
            "bandwidth_gbps": round(gbps, 2), "fraction_of_peak": None if peak is None else gbps / peak,
            "max_abs_error": 1.9e-06}


def make_report(*, peak_gbps: float | None = 40.0) -> dict:
    """A result as ``blockc compare`` would write it (docs/compare-report.md):
    a skipped backend, a skipped peer, an error row, a peer row, kernels."""
    p = peak_gbps
    results = [
        _row("reference", "", "standard", SHAPE1, 41.0, speedup=1.0, ir_nodes=34, kernels=34, peak=p),
        _row("reference", "", "fused", SHAPE1, 38.5, speedup=41.0 / 38.5, peak=p),
        _row("ort-cpu", "basic", "decomposed", SHAPE1, 4.4, speedup=3.35 / 4.4, ir_nodes=61, kernels=58, peak=p),
        _row("ort-cpu", "basic", "standard", SHAPE1, 3.35, speedup=1.0, ir_nodes=34, kernels=30, peak=p),
        _row("ort-cpu", "basic", "fused", SHAPE1, 3.1, speedup=3.35 / 3.1, peak=p),
        _row("ort-cpu", "basic", "ort-optimizer", SHAPE1, 3.22, peer=True, ir_nodes=34, kernels=21, peak=p),
        _row("ort-cpu", "all", "standard", SHAPE1, 3.0, speedup=1.0, ir_nodes=34, kernels=20, peak=p),
        {"backend": "ort-cpu", "variant": "all", "form": "fused", "peer": False, "shape": dict(SHAPE1),
         "status": "error", "error": "ONNX Runtime: <b>Fusion</b> node com.microsoft:Attention has no kernel",
         "latency_ms": None, "speedup_vs_standard": None, "ir_nodes": 22, "kernels": None,
         "bytes_modelled": 12582912, "bandwidth_gbps": None, "fraction_of_peak": None, "max_abs_error": None},
        _row("ort-cpu", "basic", "standard", SHAPE2, 12.9, speedup=1.0, ir_nodes=34, kernels=30, peak=p),
        _row("ort-cpu", "basic", "fused", SHAPE2, 11.2, speedup=12.9 / 11.2, nbytes=50331648, peak=p),
        _row("ort-cpu", "basic", "ort-optimizer", SHAPE2, 11.9, peer=True, kernels=21, peak=p),
    ]
    kernels = [
        {"backend": "ort-cpu", "variant": "basic", "op": "add_layernorm", "shape": dict(SHAPE1), "node": "%19",
         "median_ms": 0.05, "bytes_modelled": 1181184, "flops_modelled": 393984, "bandwidth_gbps": 23.6},
        {"backend": "ort-cpu", "variant": "basic", "op": "attention", "shape": dict(SHAPE1), "node": "%14",
         "median_ms": 0.4, "bytes_modelled": 1572864, "flops_modelled": 50331648, "bandwidth_gbps": 3.93},
        {"backend": "ort-cpu", "variant": "basic", "op": "matmul_bias_act", "shape": dict(SHAPE1), "node": "%21",
         "median_ms": 1.5, "bytes_modelled": 11415552, "flops_modelled": 603979776, "bandwidth_gbps": 7.61},
        {"backend": "ort-cpu", "variant": "basic", "op": "masked_softmax", "shape": dict(SHAPE1), "node": "%12",
         "median_ms": None, "bytes_modelled": 1572864, "flops_modelled": None, "bandwidth_gbps": None},
    ]
    for k in kernels:
        k["fraction_of_peak"] = None if p is None or k["bandwidth_gbps"] is None else k["bandwidth_gbps"] / p
    return copy.deepcopy({
        "schema": "blockc.compare/2",
        "model": HOSTILE,
        "settings": {"layers": "2", "<i>key</i>": "<img src=x onerror=alert(1)>"},
        "dtype": "float32",
        "created": "2026-11-23T04:10:00Z",
        "command": "blockc compare --report out --set '<i>key</i>=...'",
        "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "memory_gib": 23.4, "os": "Linux-6.1-x86_64",
                    "python": "3.11.7", "gpu": None, "peak_gbps": p,
                    "peak_source": "--peak-gbps 40" if p else "unknown for a CPU; pass --peak-gbps"},
        "versions": {"blockc": "0.1.0", "numpy": "2.4.6", "onnxruntime": "1.31.0", "torch": None},
        "timing": {"blocks": 5, "rounds": 2, "warmup": 2, "min_repeats": 4, "min_time_s": 0.2, "threads": 2,
                   "clock": "time.perf_counter", "planned_s": 50.0, "elapsed_s": 47.0},
        "memory": {"budget_bytes": 12 << 30, "holding_bytes": 1 << 20, "largest_group_bytes": 5 << 20,
                   "peak_growth_bytes": 9 << 20, "peak_at": "checking ort-cpu/all/fused batch=1 seq=128"},
        "verdicts": [{"shape": dict(SHAPE1), "backend": "ort-cpu", "variant": "basic",
                      "fusion": _iv(1.08, 1.05, 1.11, "faster"), "aa": _iv(1.0, 0.98, 1.02, "no difference resolved"),
                      "resolved": True, "max_abs_error": {"fused": 1.9e-6, "standard": 2.0e-6}}],
        "shapes": [dict(SHAPE1), dict(SHAPE2)],
        "forms": {"standard": {"ir_nodes": 34, "ops": {"matmul": 8, "softmax": 1}},
                  "decomposed": {"ir_nodes": 61, "ops": {}},
                  "fused": {"ir_nodes": 22, "ops": {"add_layernorm": 1, "attention": 1, "matmul_bias_act": 1}}},
        "backends": [
            {"name": "reference", "available": True, "reason": "", "detail": "numpy float64 interpreter"},
            {"name": "ort-cpu", "available": True, "reason": "",
             "detail": "onnxruntime 1.31.0, CPUExecutionProvider, 2 intra-op threads, sequential execution"},
            {"name": "cuda", "available": False, "reason": "no NVIDIA GPU found (nvidia-smi not found)",
             "detail": ""}],
        "peers": [
            {"name": "ort-optimizer", "available": True, "reason": "",
             "detail": "onnxruntime.transformers.optimizer.optimize_model(model_type='gpt2') on blockc's unfused ONNX"},
            {"name": "torch-compile", "available": False,
             "reason": "torch is not installed (pip install torch) <script>x()</script>", "detail": ""}],
        "results": results,
        "ratios": [
            {"shape": dict(SHAPE1), "a": "ort-cpu/basic/fused", "b": "ort-cpu/basic/standard",
             **_iv(3.35 / 3.1, 1.05, 1.11, "faster")},
            {"shape": dict(SHAPE1), "a": "ort-cpu/basic/fused", "b": "ort-cpu/basic/ort-optimizer",
             **_iv(3.22 / 3.1, 0.99, 1.09, "no difference resolved", paired=False)}],
        "kernels": kernels,
    })


def _iv(speedup, low, high, verdict, paired=True) -> dict:
    return {"speedup": speedup, "low": low, "high": high, "blocks": 5, "verdict": verdict, "paired": paired}


class _Tables(html.parser.HTMLParser):
    """Every table of a page as rows of (class, [cell text])."""

    def __init__(self):
        super().__init__()
        self.tables, self._row, self._cell = [], None, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self._row = (dict(attrs).get("class") or "", [])
            self.tables[-1].append(self._row)
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row[1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables_of(page: str) -> list:
    parser = _Tables()
    parser.feed(page)
    return parser.tables


@pytest.fixture(scope="module")
def block_graphs():
    before = blockc.trace(blockc.build_model("gpt2-block"))
    return before, blockc.optimize(before).graph


@pytest.fixture(scope="module")
def written(tmp_path_factory, block_graphs):
    directory = tmp_path_factory.mktemp("report") / "out"
    index = write_html_report(make_report(), directory, before=block_graphs[0], after=block_graphs[1])
    return index


def results_table(page: str) -> list:
    return next(t for t in tables_of(page) if t and t[0][1][:3] == ["backend", "variant", "form"])


def test_results_table_has_every_row_and_reason(written):
    page = written.read_text()
    rows = results_table(page)[1:]
    report = make_report()
    assert len(rows) == len(report["results"]) + 2   # plus the skipped backend and the skipped peer
    fused = next(cells for cls, cells in rows if cells[:4] == ["ort-cpu", "basic", "fused", "batch=1, seq=128"])
    assert fused[4] == "3.1 [2.94–3.72]" and fused[5] == "161" and fused[6] == "1.08×"
    assert fused[7:10] == ["22", "19", "12 MiB"] and fused[11] == "10.1%" and fused[12] == "1.9e-06"
    error = next(cells for cls, cells in rows if "error" in cls)
    assert error[:3] == ["ort-cpu", "all", "fused"]
    assert error[4] == "error ONNX Runtime: <b>Fusion</b> node com.microsoft:Attention has no kernel"
    skipped = {cells[0]: cells for cls, cells in rows if "skipped" in cls}
    assert skipped["cuda"][1] == "skipped backend" and "nvidia-smi not found" in skipped["cuda"][2]
    assert skipped["torch-compile"][1] == "skipped peer" and "pip install torch" in skipped["torch-compile"][2]
    peers = [cells for cls, cells in rows if "peer" in cls]
    assert len(peers) == 2 and all(c[2] == "ort-optimizer peer" for c in peers)
    assert "2 backend(s) or" in page and "1 row(s) failed" in page


def test_other_tables_and_settings(written):
    page = written.read_text()
    cells = [c for t in tables_of(page) for _, row in t for c in row]
    assert "ort-cpu/basic/ort-optimizer (unpaired)" in cells and "1.04×" in cells     # ratios, with intervals
    assert "0.99–1.09" in cells and "no difference resolved" in cells
    verdict = next(t for t in tables_of(page) if t[0][1][:3] == ["backend", "shape", "fused vs standard"])
    assert verdict[1][1] == ["ort-cpu/basic", "batch=1, seq=128", "1.08×", "1.05–1.11", "5", "1.00× (0.98–1.02)",
                             "faster, resolved", "1.9e-06", "2e-06"]
    assert "not installed" in cells and "time.perf_counter" in cells       # versions, timing
    assert "40 GB/s" in cells and "--peak-gbps 40" in cells                # machine
    assert "add_layernorm 1, attention 1, matmul_bias_act 1" in cells      # forms
    kernels = next(t for t in tables_of(page) if t[0][1][:2] == ["backend", "op"])
    assert [row[1] for _, row in kernels[1:]] == ["add_layernorm", "attention", "matmul_bias_act", "masked_softmax"]
    assert "masked_softmax on ort-cpu/basic at batch=1, seq=128: no time measured" in page


def test_hostile_strings_are_escaped(written):
    page = written.read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page and "<i>" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "&lt;b&gt;Fusion&lt;/b&gt;" in page
    # every tag left is one the template wrote
    assert set(re.findall(r"<([a-z0-9]+)", page)) <= {
        "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "code", "div", "table", "caption", "tr",
        "th", "td", "span", "strong", "em", "figure", "img", "figcaption", "ul", "li"}


def test_pngs_are_valid_and_embedded(written):
    page = written.read_text()
    names = ["latency.png", "roofline.png", "graph_before.png", "graph_after.png"]
    assert sorted(p.name for p in written.parent.iterdir()) == sorted(names + ["index.html"])
    for name in names:
        data = (written.parent / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        pixels = matplotlib.image.imread(written.parent / name)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 300 and pixels.shape[2] in (3, 4), (name, pixels.shape)
        assert pixels[..., :3].std() > 0.05, f"{name} is blank"
        assert compare_html._data_uri(data) in page, f"{name} is not embedded"
    assert "src=\"http" not in page and "<link" not in page  # self-contained


def test_without_peak_the_roofline_is_omitted_and_says_why(tmp_path):
    index = write_html_report(make_report(peak_gbps=None), tmp_path / "r", before=None, after=None)
    page = index.read_text()
    assert not (tmp_path / "r" / "roofline.png").exists()
    assert "The roofline is omitted: the device&#39;s peak memory bandwidth is not known" in page
    assert "unknown for a CPU; pass --peak-gbps" in page
    assert "No block pictures: no graph was given" in page
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["index.html", "latency.png"]


def test_plots_on_their_own(block_graphs):
    report = make_report()
    assert plots.roofline_omission(report) is None
    points, left_off = plots.roofline_points(report)
    assert [p["op"] for p in points] == ["add_layernorm", "attention", "matmul_bias_act"] and len(left_off) == 1
    assert plots.roofline_omission(dict(report, kernels=[])).startswith("No fused kernels")
    assert plots.latency_chart_png(dict(report, results=[])) is None
    absorbed = plots.absorbed_nodes(*block_graphs)
    assert set(absorbed.values()) == {"qkv_attention", "add_layernorm", "matmul_bias_act"}
    assert {block_graphs[0].nodes[i].op for i, op in absorbed.items() if op == "qkv_attention"} >= {
        "softmax", "where", "transpose", "matmul"}
    for png in (plots.graph_png(block_graphs[1], HOSTILE), plots.before_after_png(*block_graphs)):
        assert png.startswith(PNG_SIGNATURE)


def test_unwritable_directory_is_a_blockc_error(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(BlockcError, match="cannot write the report to .*file.txt: it is a file, not a folder "
                                          r"\(give a new or existing folder with --report\)"):
        check_report_dir(a_file)
    with pytest.raises(BlockcError, match="cannot write the report to .*file.txt/sub: .*file.txt is a file, not a folder"):
        check_report_dir(a_file / "sub")
    with pytest.raises(BlockcError, match="cannot write the report"):
        write_html_report(make_report(), a_file / "sub", before=None, after=None)
    # checked, not made: the folder appears with the report, so a failed run leaves none
    assert check_report_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and not (tmp_path / "a").exists()


def test_a_report_into_a_new_folder_appears_whole_and_a_failed_one_leaves_no_folder(tmp_path, monkeypatch):
    index = write_html_report(make_report(), tmp_path / "a" / "b", before=None, after=None)
    assert index == tmp_path / "a" / "b" / "index.html" and index.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]   # no temporary folder beside it

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(pathlib.Path, "write_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_html_report(make_report(), tmp_path / "new" / "r", before=None, after=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_read_only_directory_is_a_blockc_error(tmp_path):
    tmp_path.joinpath("ro").mkdir(mode=0o500)
    with pytest.raises(BlockcError, match="is not writable"):
        check_report_dir(tmp_path / "ro")


def test_a_failed_write_leaves_no_page_and_no_temporary_files(tmp_path, monkeypatch):
    real_replace = os.replace

    def failing_replace(src, dst):
        if pathlib.Path(dst).name == "index.html":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(BlockcError, match="No space left on device"):
        write_html_report(make_report(), tmp_path, before=None, after=None)
    assert not (tmp_path / "index.html").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_write_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    # The page and its pictures are replaced together or not at all: a new
    # chart never sits beside the old page.
    (tmp_path / "index.html").write_bytes(b"old page")
    (tmp_path / "latency.png").write_bytes(b"old chart")
    real_replace = os.replace

    def failing_replace(src, dst):
        if pathlib.Path(dst).name == "index.html" and ".old." not in pathlib.Path(src).name:
            raise OSError(28, "No space left on device")  # the new page cannot be placed; the old one can come back
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(BlockcError, match="No space left on device"):
        write_html_report(make_report(), tmp_path, before=None, after=None)
    assert (tmp_path / "index.html").read_bytes() == b"old page"
    assert (tmp_path / "latency.png").read_bytes() == b"old chart"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html", "latency.png"]


def test_other_schema_is_refused(tmp_path):
    with pytest.raises(BlockcError, match="reads blockc.compare/2 results; this one says 'blockc.compare/1'"):
        write_html_report(dict(make_report(), schema="blockc.compare/1"), tmp_path, before=None, after=None)


# -- the page in a real browser ----------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
# Injected by the test, not shipped in the page: once everything has loaded,
# record each image's decoded width, and how many decoded at all.
IMAGE_PROBE = """<script>
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images), ok = 0;
  images.forEach(function (img) {
    img.setAttribute("data-natural-width", String(img.naturalWidth));
    if (img.complete && img.naturalWidth > 0) ok += 1;
  });
  document.body.setAttribute("data-images-decoded", ok + "/" + images.length);
});
</script>"""


def _chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="blockc-chromium-") as profile:
        command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--hide-scrollbars", f"--user-data-dir={profile}", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not found: apt-get update && apt-get install -y chromium "
                                             "(Debian's package; the binary is /usr/bin/chromium)")
def test_page_renders_in_headless_chromium(written, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(written.read_text().replace("</body>", IMAGE_PROBE + "\n</body>"))
    done = _chromium("--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-images-decoded="4/4"' in dom, dom[:2000]
    widths = [int(w) for w in re.findall(r'data-natural-width="(\d+)"', dom)]
    assert len(widths) == 4 and min(widths) >= 300, widths
    assert "blockc compare:" in dom and "&lt;script&gt;alert" in dom

    shot = tmp_path / "page.png"
    done = _chromium("--virtual-time-budget=10000", "--window-size=1400,2600", f"--screenshot={shot}",
                     written.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert shot.read_bytes().startswith(PNG_SIGNATURE)
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2600, 1400)
    ink = (pixels.min(axis=2) < 0.9).mean()
    assert ink > 0.02 and pixels.std() > 0.05, f"the screenshot looks blank ({ink:.1%} of pixels not white)"
    if os.environ.get("BLOCKC_KEEP_SCREENSHOT"):  # to look at it: BLOCKC_KEEP_SCREENSHOT=path pytest ...
        shutil.copy(shot, os.environ["BLOCKC_KEEP_SCREENSHOT"])


def test_a_row_over_the_memory_budget_shows_as_skipped_with_its_reason(tmp_path):
    report = make_report()
    report["results"][0].update(status="skipped", error="needs about 9 GiB of memory, more than the budget of "
                                "4 GiB (--max-memory)", latency_ms=None)
    page = write_html_report(report, tmp_path, before=None, after=None).read_text()
    skipped = [cells for cls, cells in results_table(page)[1:] if "skipped" in cls]
    assert any(c[1] == "skipped row" and "more than the budget of 4 GiB" in c[2] for c in skipped)


def test_compare_writes_its_json_inside_the_report_folder_it_makes(tmp_path, capsys):
    """``--json`` may name a file in the ``--report`` folder, which does not
    exist until the report is written: neither the up-front check nor the
    writing may need it before."""
    from blockc.cli import main
    out = tmp_path / "out"
    quick = ["--set", "layers=1", "--backends", "reference", "--peers", "none", "--no-kernels", "--no-progress",
             "--blocks", "1", "--rounds", "1", "--repeats", "1", "--warmup", "0", "--min-time", "0", "--seq", "8"]
    assert main(["compare", "tiny", *quick, "--report", str(out), "--json", str(out / "r.json")]) == 0, \
        capsys.readouterr()
    assert (out / "index.html").is_file() and json.loads((out / "r.json").read_text())["results"]
