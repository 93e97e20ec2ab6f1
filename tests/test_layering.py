"""The packages import downward only, in the order the README's Layout
section gives, and no package's modules import each other in a cycle.
Every import counts, including those inside functions: an import hidden in a
function body is still a dependency, and hiding one is how the cycles this
test forbids crept in. For the same reason a module is never imported by a
string (``importlib.import_module``, ``__import__``, ``sys.modules[...]``),
which no reading of the source can follow, with one exception this test
reads: a package importing each of its own modules by discovery
(``import_module(f"{__name__}.{name}")``, as ``blockc/ops`` does so that a
new op is one new file)."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import blockc

# Bottom to top. A module may import its own package and any package on a
# lower line; packages on one line are peers and may not import each other.
# "blockc" is the package's facade (blockc/__init__.py): only the CLI is above it.
LAYERS = [
    ("errors", "version", "progress", "process"),
    ("environment",),
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


DISCOVERY = "(discovery)"   # what a package's import of its own modules by name stands for


def _is_discovery(arg: ast.expr) -> bool:
    """``f"{__name__}.{...}"``: a package's own modules, found by listing it."""
    return (isinstance(arg, ast.JoinedStr) and len(arg.values) >= 2
            and isinstance(arg.values[0], ast.FormattedValue)
            and isinstance(arg.values[0].value, ast.Name) and arg.values[0].value.id == "__name__"
            and isinstance(arg.values[1], ast.Constant) and str(arg.values[1].value).startswith("."))


def string_imports(source: str) -> list[tuple[int, str]]:
    """(line, what) of every import by a string in ``source``; a package's
    discovery of its own modules is reported as ``DISCOVERY``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("import_module", "__import__"):
                found.append((node.lineno, DISCOVERY if node.args and _is_discovery(node.args[0])
                              else f"{name}({ast.unparse(node.args[0]) if node.args else ''})"))
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)   # a lookup, not a registration
              and isinstance(node.value, ast.Attribute)
              and node.value.attr == "modules" and isinstance(node.value.value, ast.Name)
              and node.value.value.id == "sys"):
            found.append((node.lineno, f"sys.modules[{ast.unparse(node.slice)}]"))
    return sorted(found)


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of blockc: its dotted name -> (file, is a package)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("blockc",) + path.relative_to(ROOT).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def import_graph(modules: dict[str, tuple[Path, bool]]) -> nx.DiGraph:
    """Module -> module it imports, within one layer unit (across units the
    layering already forbids a cycle). ``from pkg import name`` is an import
    of ``pkg.name`` where that is a module, else of ``pkg``; a package's
    discovery imports each of its modules."""
    g = nx.DiGraph()
    for module, (path, is_package) in modules.items():
        source = path.read_text()
        targets = [(line, t) for line, t in imported_modules(source, module, is_package)]
        if is_package and any(what == DISCOVERY for _, what in string_imports(source)):
            targets += [(0, m) for m in modules if m.rsplit(".", 1)[0] == module]
        for line, target in targets:
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != module and unit_of(target) == unit_of(module):
                g.add_edge(module, target, line=line)
    return g


def cycles(g: nx.DiGraph) -> list[str]:
    """Each cycle among modules, as ``a (line n) -> b ... -> a``."""
    out = []
    for scc in nx.strongly_connected_components(g):
        if len(scc) > 1:
            cycle = nx.find_cycle(g.subgraph(scc))
            out.append(" -> ".join(f"{a} (line {g[a][b]['line']})" for a, b in cycle) + f" -> {cycle[0][0]}")
    return sorted(out)


def test_no_module_is_imported_by_a_string():
    problems = [f"{path.relative_to(ROOT.parent)}: line {line}: imports by a string, {what}: "
                "import the module by name, so that the layering can see it"
                for path, _ in _modules().values()
                for line, what in string_imports(path.read_text()) if what != DISCOVERY]
    assert not problems, "\n".join(problems)


def test_no_package_imports_itself_in_a_cycle():
    found = cycles(import_graph(_modules()))
    assert not found, "modules that import each other:\n" + "\n".join(found)


def test_the_check_sees_string_imports_and_cycles(tmp_path):
    """Both ways around the rules that were once open: an import by a string
    (of a module in a higher layer, say) and a cycle inside a package made
    by an import at the bottom of a file."""
    source = ('import importlib, sys\n'
              'def f():\n    return importlib.import_module("blockc.runtime.reference")\n'
              'g = __import__("blockc.cli")\nh = sys.modules["blockc.compare"]\n'
              'sys.modules[spec.name] = module\n'
              'for m in names:\n    importlib.import_module(f"{__name__}.{m}")\n')
    assert string_imports(source) == [(3, 'import_module(\'blockc.runtime.reference\')'), (4, "__import__('blockc.cli')"),
                                      (5, "sys.modules['blockc.compare']"), (8, DISCOVERY)]
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from .b import helper\n")
    (tmp_path / "pkg" / "b.py").write_text("def helper():\n    pass\n\nfrom .a import TABLE  # noqa: E402\n")
    modules = {f"blockc.pkg.{p.stem}" if p.stem != "__init__" else "blockc.pkg": (p, p.stem == "__init__")
               for p in (tmp_path / "pkg").glob("*.py")}
    assert cycles(import_graph(modules)) == [
        "blockc.pkg.a (line 1) -> blockc.pkg.b (line 4) -> blockc.pkg.a"]
