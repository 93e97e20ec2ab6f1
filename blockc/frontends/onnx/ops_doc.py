"""The supported-operators page (``docs/ONNX-OPS.md``), written from the
importer's own table so that it cannot say something the importer does not:

    python -m blockc.frontends.onnx.ops_doc > docs/ONNX-OPS.md

``tests/frontends/test_onnx_ops_doc.py`` fails when the checked-in page is not
what this prints.
"""
from __future__ import annotations

import onnx.defs

from . import contrib
from .rules import TABLE
from .functions import DEFAULT_DOMAINS

# rules.TABLE's rules are for the default domain (functions.DEFAULT_DOMAINS),
# shown by its name; contrib.RULES's for ONNX Runtime's com.microsoft.
DOMAIN = "ai.onnx"
assert "" in DEFAULT_DOMAINS and DOMAIN in DEFAULT_DOMAINS


def _introduced(op_type: str) -> int:
    """The opset that introduced ``op_type`` in the default domain."""
    return min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
               if s.name == op_type and s.domain == "")


def supported_ops_markdown() -> str:
    """The page: one row per operator in ``rules.TABLE``, its domain and opsets."""
    rows = []
    for op_type in sorted(TABLE):
        rule = TABLE[op_type]
        # a rule claims from opset 1 by default; the range shown starts where the operator exists
        since = max(rule.since, _introduced(op_type))
        rows.append(f"| {op_type} | {DOMAIN} | {since}–{rule.until} |")
    ours = len(rows)
    # ONNX Runtime's own ops in the default domain: no ONNX schema says where they start
    rows += [f"| {op_type} | {DOMAIN} (ONNX Runtime's) | {rule.since}–{rule.until} |"
             for op_type, rule in sorted(contrib.ONNX_DOMAIN_RULES.items())]
    runtimes = len(rows) - ours
    rows += [f"| {op_type} | {contrib.DOMAIN} | {contrib.VERSION} |" for op_type in sorted(contrib.RULES)]
    return "\n".join([
        "# ONNX operators blockc imports",
        "",
        "Generated from the importer's table (`blockc/frontends/onnx/rules.py`, `TABLE`) by",
        "`python -m blockc.frontends.onnx.ops_doc > docs/ONNX-OPS.md`; do not edit it by hand",
        "(`tests/frontends/test_onnx_ops_doc.py` fails when it is stale).",
        "",
        f"{len(rows)} operators: {ours} in the default domain, {runtimes} that ONNX Runtime registers there "
        f"(as GenAI's model builder writes them), and the {len(rows) - ours - runtimes} fused operators of ONNX "
        f"Runtime's `{contrib.DOMAIN}`",
        "domain that blockc's `contrib` encoding writes (`contrib.py`). A model's `ai.onnx` opset must lie in the",
        "range of every operator it uses; a model that uses an operator not listed, or one outside its",
        "range, is refused with one error that lists every such operator, with its domain and opset.",
        "A call of one of the model's local functions (`ModelProto.functions`) is inlined first: its",
        "body's operators must be listed here, each in range at the opset its function imports, and a",
        "call of a function the model does not define is listed in that error as an operator it lacks.",
        "Within a range, an attribute or input a rule cannot express (a strided `Slice`, a `Range` whose",
        "bounds are only known at run time) is refused by name when the model is imported.",
        "",
        "ONNX's own node tests for these operators run in `tests/frontends/test_onnx_conformance.py`;",
        "the cases blockc refuses, and why, are its `REFUSED` table.",
        "",
        "| Operator | Domain | Opsets |",
        "|---|---|---|",
        *rows,
        "",
    ])


if __name__ == "__main__":
    print(supported_ops_markdown(), end="")
