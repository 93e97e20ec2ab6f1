"""compare's result rows: a ``Row`` writes the ``results`` entry the JSON
document has always had (docs/compare-report.md, schema.json)."""
from __future__ import annotations

import json
from importlib import resources

import pytest

from blockc.compare.results import Row

jsonschema = pytest.importorskip("jsonschema")


def test_a_row_writes_the_documents_entry():
    row = Row("ort-cpu", "basic", "fused", False, {"batch": 1, "seq": 8}, ir_nodes=22, bytes_modelled=1024)
    row.fail("failed while timing: boom")
    assert row.key == "ort-cpu/basic/fused" and not row.ok
    assert row.to_json() == {
        "backend": "ort-cpu", "variant": "basic", "form": "fused", "peer": False, "shape": {"batch": 1, "seq": 8},
        "status": "error", "error": "failed while timing: boom", "latency_ms": None, "speedup_vs_standard": None,
        "ir_nodes": 22, "kernels": None, "bytes_modelled": 1024, "bandwidth_gbps": None, "fraction_of_peak": None,
        "max_abs_error": None}
    assert list(row.to_json()) == list(_schema()["$defs"]["row"]["required"])   # the order the document had


def test_a_rows_entry_follows_the_schema():
    row = Row("reference", "", "standard", False, {"batch": 2}, ir_nodes=30, kernels=30, max_abs_error=1e-6)
    row.latency_ms = {"median": 1.0, "min": 0.9, "max": 1.2, "repeats": 4, "round_medians": [1.0, 1.0]}
    jsonschema.validate(row.to_json(), {**_schema()["$defs"]["row"], "$defs": _schema()["$defs"]})


def test_a_copy_does_not_share_its_shape():
    row = Row("reference", "", "standard", False, {"batch": 2})
    other = row.copy()
    other.shape["batch"] = 3
    other.skip("over the budget")
    assert row.shape == {"batch": 2} and row.ok and other.status == "skipped"


def _schema() -> dict:
    return json.loads(resources.files("blockc.compare").joinpath("schema.json").read_text())
