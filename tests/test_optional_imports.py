"""Collection never fails for want of a test extra: a test module imports
an optional package (one of pyproject's ``test`` extras, other than pytest)
at module level only after ``pytest.importorskip`` of it, so a machine
without torch, transformers, hypothesis... skips those tests instead of
erroring at collection."""
import ast
import re
import tomllib
from pathlib import Path

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def optional_packages() -> set[str]:
    """The import names of pyproject's ``test`` extras (``nvidia-cublas`` -> ``nvidia_cublas``), less pytest."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    names = {re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower().replace("-", "_") for spec in extras}
    return names - {"pytest"}


def _skipped(node: ast.stmt) -> str | None:
    """The package a module-level ``[x =] pytest.importorskip("pkg...")`` skips on, if ``node`` is one."""
    call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "importorskip"
            and call.args and isinstance(call.args[0], ast.Constant)):
        return call.args[0].value.split(".")[0]
    return None


def unguarded_imports(source: str, optional: set[str]) -> list[str]:
    """``line: package`` for each module-level import of an optional package not importorskipped above it."""
    guarded, bad = set(), []
    for node in ast.parse(source).body:
        if (package := _skipped(node)) is not None:
            guarded.add(package)
            continue
        if isinstance(node, ast.Import):
            packages = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            packages = [node.module.split(".")[0]]
        else:
            continue
        bad += [f"{node.lineno}: {p}" for p in packages if p in optional and p not in guarded]
    return bad


def test_the_extras_are_read():
    assert {"torch", "transformers", "hypothesis"} <= optional_packages()


def test_the_check_sees_a_bare_import_and_accepts_a_guarded_one():
    optional = {"torch"}
    assert unguarded_imports("import torch\n", optional) == ["1: torch"]
    assert unguarded_imports("from torch.nn import functional\n", optional) == ["1: torch"]
    assert unguarded_imports("import pytest\ntorch = pytest.importorskip('torch')\nimport torch.nn\n", optional) == []
    assert unguarded_imports("def f():\n    import torch\n", optional) == []


def test_no_test_module_imports_an_extra_without_importorskip():
    optional = optional_packages()
    bad = [f"{path.relative_to(ROOT)}:{where}" for path in sorted(TESTS.rglob("*.py"))
           for where in unguarded_imports(path.read_text(), optional)]
    assert not bad, "import these with pytest.importorskip first: " + ", ".join(bad)
