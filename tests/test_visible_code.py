"""Code a learner learns from stays visible (issue 50 item 3): a chapter cell that *computes* (a Result, a trace
of the model, a formula of the papers' packages) is shown, unless tagged `plumbing` on purpose; every chapter shows
at least one computing cell. Solution and check cells (an exercise's answer, computed where a learner does not
see it first) fold by design and are not counted."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
HIDDEN = {"hide-input", "remove-input", "hide-cell", "remove-cell"}
#: book's calls that compute: a Result from the cache or computed, the paper figures' Results, a model's trace
BOOK_CALLS = re.compile(r"\bbook\.(result|figure_results|trace)\(")
#: packages whose functions are the papers' formulas and measurements (their `plots` and claim registries draw or
#: list, they do not compute)
FORMULA_PACKAGES = ("attnlab.normalization", "attnlab.sample_complexity", "attnlab.tools")
NOT_FORMULAS = re.compile(r"(^|\.)(plots|claims|claim_kinds|experiments|report)$")


def cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def formula_names(path: Path) -> set[str]:
    """Local names a chapter imports from the formula packages (modules and functions, not plots or registries)."""
    names = set()
    for cell in cells(path):
        try:
            tree = ast.parse(re.sub(r"^\s*[%!].*$", "", source(cell), flags=re.M))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(FORMULA_PACKAGES):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if not NOT_FORMULAS.search(full) and not NOT_FORMULAS.search(node.module) \
                            and alias.name[0].islower():
                        names.add(alias.asname or alias.name)
    return names


def computes(cell: dict, names: set[str]) -> bool:
    """Whether the cell's code calls a computation: `BOOK_CALLS`, or a formula module's function / a formula."""
    src = source(cell)
    if BOOK_CALLS.search(src):
        return True
    return any(re.search(rf"(?<![\w.]){re.escape(n)}(\.\w+)*\(", src) for n in names)


def test_the_rule_sees_a_computing_cell():
    cell = {"source": ["x = bounds.softmax_upper(4.0, 128)\n"], "metadata": {"tags": ["hide-input"]}}
    assert computes(cell, {"bounds"}) and not computes({"source": ["plot_fig1(res)"]}, {"bounds"})
    assert computes({"source": ["r = book.result('fig1', key)"]}, set())


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_computing_cells_are_visible(path):
    names = formula_names(path)
    hidden = [i for i, c in enumerate(json.loads(path.read_text())["cells"])
              if c["cell_type"] == "code" and computes(c, names) and tags(c) & HIDDEN
              and not tags(c) & {"plumbing", "solution", "check"}]
    assert not hidden, (f"{path.name}: cells {hidden} compute (book.result/figure_results/trace or a formula of "
                        f"{sorted(names)}) but are hidden; show them, or tag `plumbing` if they are only plumbing")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_shows_a_computing_cell(path):
    names = formula_names(path)
    assert any(computes(c, names) and not tags(c) & HIDDEN for c in cells(path)), \
        f"{path.name} shows no cell that computes its result"
