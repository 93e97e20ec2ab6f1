"""docs/ONNX-OPS.md is what the importer's table says, so the list of
supported operators cannot go stale beside it."""
from pathlib import Path

from blockc.frontends.onnx.rules import TABLE
from blockc.frontends.onnx.ops_doc import supported_ops_markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "ONNX-OPS.md"


def test_page_is_current():
    assert PAGE.read_text() == supported_ops_markdown(), \
        "docs/ONNX-OPS.md is stale: python -m blockc.frontends.onnx.ops_doc > docs/ONNX-OPS.md"


def test_page_lists_every_rule():
    text = supported_ops_markdown()
    assert all(f"| {op} | ai.onnx |" in text for op in TABLE)
