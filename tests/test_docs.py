"""The README and the docs/ pages hold together: every link and every
``docs/PAGE.md`` they name resolves (a ``#heading`` too), each docs/ page
names its one purpose in its first line and is reachable from the README,
the README stays a user's guide of at most 350 lines, and every test file
and test docs/ARCHITECTURE.md names as the proof of a claim exists.
(The commands in their code blocks are tests/test_readme.py's.)"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_LINES = 350

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")          # [text](target)
DOCS_NAME = re.compile(r"(?<![\w/.])docs/([\w.-]+\.md)")  # docs/PAGE.md, in a code span or prose
TEST_NAME = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")


def without_code_blocks(text: str) -> str:
    """``text`` with its ``` blocks left out: a link inside one is code, not a link."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in without_code_blocks(page.read_text()).splitlines()
            if line.startswith("#")}


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file, or heading, is not there."""
    bad = []
    for target in LINK.findall(without_code_blocks(page.read_text())):
        if re.match(r"[a-z]+:", target):            # https:, mailto: -- not this repository's
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            bad.append(f"{target}: no heading #{anchor} in {file.name}")
    return bad


def test_broken_links_are_found(tmp_path):
    page = tmp_path / "p.md"
    (tmp_path / "there.md").write_text("# There\n\n## A section, of `code`\n")
    page.write_text("[ok](there.md) [ok](there.md#a-section-of-code) [web](https://example.com)\n"
                    "[gone](missing.md) [bad anchor](there.md#nowhere)\n```\n[in code](not-a-link.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "there.md#nowhere: no heading #nowhere in there.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_docs_page_named_exists(page):
    named = set(DOCS_NAME.findall(page.read_text()))
    assert not [name for name in named if not (ROOT / "docs" / name).exists()], named


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_each_docs_page_names_its_purpose_in_its_first_line(page):
    first = page.read_text().splitlines()[0]
    assert first.startswith("# ") and len(first.split()) >= 3, f"{page.name}: {first!r}"


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for target in LINK.findall(without_code_blocks(README.read_text()))}
    assert [page.name for page in DOCS if page.resolve() not in linked] == []


def test_the_readme_is_a_users_guide_of_at_most_350_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md is {len(lines)} lines; move details to a docs/ page"
    headings = [line for line in lines if line.startswith("## ")]
    # What users do comes first, the layout near the top; generation opens with a Hugging Face directory.
    order = ["## Quickstart", "## Layout", "## Bring a model", "## Generate", "## Compare", "## Export",
             "## Parallel", "## CUDA"]
    assert [h for h in headings if h in order] == order
    code = re.findall(r"^```[^\n]*\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    commands = [line for block in code for line in block.splitlines() if line.startswith("blockc ")]
    assert commands[0].startswith('blockc generate path/to/hf-dir --prompt "'), commands[:2]


def functions_in(path: str) -> set[str]:
    return {node.name for node in ast.walk(ast.parse((ROOT / path).read_text()))
            if isinstance(node, ast.FunctionDef)}


def test_every_test_architecture_names_exists():
    named = TEST_NAME.findall((ROOT / "docs" / "ARCHITECTURE.md").read_text())
    assert len(named) >= 8
    missing = [f"{path}::{name}" if name else path for path, name in named
               if not (ROOT / path).exists() or (name and name not in functions_in(path))]
    assert missing == []


def layering_order() -> list[tuple[str, ...]]:
    """tests/test_layering.py's ``LAYERS``, read from its source (the one place the order is written)."""
    tree = ast.parse((ROOT / "tests" / "test_layering.py").read_text())
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "LAYERS" for t in node.targets)]
    return [tuple(names) for names in ast.literal_eval(value)]


def order_lines(page: Path) -> list[list[tuple[str, ...]]]:
    """Each ``a, b  <  c  <  ...`` line of ``page``, as layers of package names (a parenthesis dropped)."""
    lines = [line for line in page.read_text().splitlines() if line.startswith("errors, ")]
    return [[tuple(re.sub(r"\s*\(.*?\)", "", name).strip() for name in layer.split(","))
             for layer in line.split("<")] for line in lines]


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "ARCHITECTURE.md"], ids=lambda p: p.name)
def test_the_layer_order_shown_is_the_one_the_layering_test_holds(page):
    assert order_lines(page) == [layering_order()]


def test_the_readme_layout_lists_every_package():
    packages = sorted(p.parent.name for p in (ROOT / "blockc").glob("*/__init__.py"))
    layout = README.read_text()
    assert [name for name in packages if f"blockc/{name}/" not in layout] == []
