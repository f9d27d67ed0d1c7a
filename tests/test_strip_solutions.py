"""The exercises' solutions: scripts/strip_solutions.py (`make book SOLUTIONS=0`) removes them, and every
chapter's solutions are tagged, labelled and placed so that it can (no notebook is executed)."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))

_spec = importlib.util.spec_from_file_location("strip_solutions", ROOT / "scripts" / "strip_solutions.py")
strip_solutions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(strip_solutions)


def _cell(kind, source, cid, tags=None, **meta):
    cell = {"cell_type": kind, "id": cid, "metadata": dict(meta, **({"tags": tags} if tags else {})),
            "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def _small_notebook() -> dict:
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3"}}, "cells": [
        _cell("markdown", "# A chapter", "title"),
        _cell("code", "x = 2", "setup", tags=["remove-input"]),
        _cell("markdown", "**Exercise 1.1.** What is x + 1?", "ex1"),
        _cell("code", "print(x + 1)", "sol1", tags=["hide-cell", "solution"],
              mystnb={"code_prompt_show": "Solution 1.1", "code_prompt_hide": "Hide solution 1.1"}),
        _cell("markdown", "**Exercise 1.2.** And x * 3?", "ex2"),
        _cell("code", "print(x * 3)", "sol2", tags=["hide-cell", "solution"]),
        _cell("code", "print('not a solution')", "plain", tags=["hide-cell"]),
    ]}


def test_strip_notebook():
    nb = _small_notebook()
    original = json.loads(json.dumps(nb))
    stripped, n = strip_solutions.strip_notebook(nb)
    assert n == 2
    assert nb == original                                   # the input is not modified
    assert not any("solution" in c["metadata"].get("tags", []) for c in stripped["cells"])
    assert "print(x + 1)" not in json.dumps(stripped) and "print(x * 3)" not in json.dumps(stripped)
    kept = [c for c in stripped["cells"] if c["id"] not in ("sol1", "sol2")]
    assert kept == [c for c in original["cells"] if c["id"] not in ("sol1", "sol2")]   # others unchanged
    notes = {c["id"]: c for c in stripped["cells"] if c["id"] in ("sol1", "sol2")}
    for note in notes.values():
        assert note["cell_type"] == "markdown" and "".join(note["source"]) == strip_solutions.NOTE
    assert [c["id"] for c in stripped["cells"]] == [c["id"] for c in original["cells"]]   # in place, ids unique


def test_copy_sources(tmp_path):
    root = tmp_path / "repo"
    (root / "book").mkdir(parents=True)
    (root / "_build").mkdir()
    (root / "_build" / "stale.txt").write_text("not copied")
    (root / "_config.yml").write_text("title: t\n")
    (root / "book" / "01_a.ipynb").write_text(json.dumps(_small_notebook()))
    (root / "book" / "intro.md").write_text("# Intro\n")
    removed = strip_solutions.copy_sources(root, root / "_build" / "no_solutions")
    dest = root / "_build" / "no_solutions"
    assert removed == {"book/01_a.ipynb": 2}
    assert (dest / "_config.yml").read_text() == "title: t\n" and (dest / "book" / "intro.md").exists()
    assert not (dest / "_build").exists()
    text = (dest / "book" / "01_a.ipynb").read_text()
    assert strip_solutions.NOTE in text and "print(x + 1)" not in text
    assert "print(x + 1)" in (root / "book" / "01_a.ipynb").read_text()        # the sources are untouched
    with pytest.raises(SystemExit):
        strip_solutions.copy_sources(root, root / "book" / "copy")          # never into the sources


def _source(cell) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_solutions_tagged_and_placed(path):
    """Each solution cell: tags hide-cell + solution, prompts "Solution C.k" / "Hide solution C.k", right after
    the markdown cell of Exercise C.k; exercises numbered 1, 2, ... with the chapter's number; nothing after the
    chapter's "Try this" heading is an unlabelled solution."""
    chapter = int(path.name[:2])
    cells = json.loads(path.read_text())["cells"]
    exercises = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                 and re.match(r"\*\*Exercise \d+\.\d+\.\*\*", _source(c))]
    solutions = [i for i, c in enumerate(cells) if "solution" in c["metadata"].get("tags", [])]
    has_try = any(c["cell_type"] == "markdown" and _source(c).startswith("## Try this") for c in cells)
    if not has_try:
        assert not exercises and not solutions
        pytest.skip(f"{path.name} has no exercises")
    assert exercises and len(exercises) == len(solutions)
    for k, (e, s) in enumerate(zip(exercises, solutions), 1):
        assert _source(cells[e]).startswith(f"**Exercise {chapter}.{k}.**")
        check = s == e + 2 and "check" in cells[e + 1]["metadata"].get("tags", [])   # the page's answer box between
        assert s == e + 1 or check, f"solution {chapter}.{k} is not right after its exercise (or its check)"
        cell = cells[s]
        assert cell["cell_type"] == "code"
        assert {"hide-cell", "solution"} <= set(cell["metadata"]["tags"])
        assert cell["metadata"]["mystnb"] == {"code_prompt_show": f"Solution {chapter}.{k}",
                                              "code_prompt_hide": f"Hide solution {chapter}.{k}"}
    # no chapter keeps one solutions cell for all its exercises
    assert not any(_source(c).startswith("# Solutions") for c in cells if c["cell_type"] == "code")
    ids = [c.get("id") for c in cells]
    assert len(ids) == len(set(ids))


def test_the_try_this_line_says_the_solutions_are_held_back():
    nb = _small_notebook()
    nb["cells"].insert(2, _cell("markdown", "## Try this\n\nEach exercise's solution is folded right below it.", "try"))
    stripped, _ = strip_solutions.strip_notebook(nb)
    text = "".join(next(c for c in stripped["cells"] if c["id"] == "try")["source"])
    assert text == "## Try this\n\nThe solutions are held back in this copy of the book."


def test_the_landing_page_tells_an_instructor_how_to_hold_the_solutions_back():
    """book/intro.md names the Makefile's switch and the script, and quotes the note the script writes."""
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    assert "make book SOLUTIONS=0" in intro and "ifeq ($(SOLUTIONS),0)" in (ROOT / "Makefile").read_text()
    assert "python scripts/strip_solutions.py" in intro
    assert f'"{strip_solutions.NOTE}"' in " ".join(intro.split())
