"""The packages import downward only, in the order the README's Layout
section gives. Every import counts, including those inside functions: an
import hidden in a function body is still a dependency, and hiding one is
how the cycles this test now forbids crept in."""
from __future__ import annotations

import ast
from pathlib import Path

import blockc

# Bottom to top. A module may import its own package and any package on a
# lower line; packages on one line are peers and may not import each other.
# "blockc" is the package's facade (blockc/__init__.py): only the CLI is above it.
LAYERS = [
    ("errors", "version", "progress"),
    ("files",),
    ("ir",),
    ("ops",),
    ("passes", "frontends"),
    ("codegen",),
    ("runtime",),
    ("report", "generate"),
    ("parallel",),
    ("compare",),
    ("blockc",),
    ("cli",),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
ROOT = Path(blockc.__file__).parent


def unit_of(module: str) -> str:
    """``blockc.passes.dce`` -> ``passes``; ``blockc`` -> ``blockc`` (the facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "blockc"


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every blockc import in ``source``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                # `from . import x` names submodules: each is an import of its own
                names = [f"{target}.{a.name}" for a in node.names] if not node.module else [target]
            else:
                names = [node.module]
            found += [(node.lineno, n) for n in names]
    return [(line, name) for line, name in found if name == "blockc" or name.startswith("blockc.")]


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    here = unit_of(module)
    bad = []
    for line, target in imported_modules(source, module, is_package):
        there = unit_of(target)
        if there == here:
            continue
        if there not in RANK:
            bad.append(f"line {line}: imports {target}, which is in no layer (add it to LAYERS and the README)")
        elif RANK[there] >= RANK[here]:
            bad.append(f"line {line}: {here} imports {target} ({there} is not below {here})")
    return bad


def test_every_module_belongs_to_a_layer():
    units = {unit_of(".".join(("blockc",) + p.relative_to(ROOT).with_suffix("").parts))
             for p in ROOT.rglob("*.py")}
    units.discard("__init__")
    assert units <= set(RANK), f"modules in no layer: {sorted(units - set(RANK))}"


def test_packages_import_downward_only():
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("blockc",) + path.relative_to(ROOT).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        problems += [f"{path.relative_to(ROOT.parent)}: {v}"
                     for v in violations(path.read_text(), module, is_package)]
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def test_the_check_sees_imports_inside_functions():
    source = "def f():\n    from ..runtime.reference import Env\n    return Env\n"
    assert violations(source, "blockc.passes.constant_fold") == \
        ["line 2: passes imports blockc.runtime.reference (runtime is not below passes)"]
    assert violations("from .. import ops\n", "blockc.ir.graph") == \
        ["line 1: ir imports blockc.ops (ops is not below ir)"]
    assert violations("import blockc\n", "blockc.compare.machine") == \
        ["line 1: compare imports blockc (blockc is not below compare)"]
    assert violations("from ..frontends import trace\n", "blockc.passes.x") == \
        ["line 1: passes imports blockc.frontends (frontends is not below passes)"]
    assert violations("from ..ir.graph import Graph\nfrom . import rewrite\n", "blockc.passes.x") == []
