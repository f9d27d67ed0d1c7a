#!/usr/bin/env python3
"""The book without the exercises' solutions (`make book SOLUTIONS=0`, for an instructor who hands the site out).

Copies the book's sources (the repository less .git, virtualenvs, node_modules, tests and _build) into DEST,
and in every chapter notebook there replaces each cell tagged `solution` by a markdown note, "Solution held
back by the instructor."; the Makefile then builds the site from DEST. The pages, and the notebooks their
download button serves (_build/html/_sources/), then hold no solution. The copies in the repository are
untouched (the Colab and Binder buttons still open those).

    python scripts/strip_solutions.py DEST            # copy of this repository, solutions removed
    python scripts/strip_solutions.py --root ROOT DEST
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = "solution"
NOTE = "Solution held back by the instructor."
TRY_THIS = "## Try this"
HELD = "The solutions are held back in this copy of the book."
# Not part of the book's sources: never copied.
SKIP = (".git", ".venv", "venv", "node_modules", "_build", "tests", ".pytest_cache", ".ruff_cache",
        "__pycache__", ".ipynb_checkpoints", "figures")


def is_solution(cell: dict) -> bool:
    return TAG in cell.get("metadata", {}).get("tags", [])


def strip_notebook(nb: dict) -> tuple[dict, int]:
    """(a copy of `nb` with every solution cell replaced by a markdown note, how many were replaced). The
    note keeps the cell's id (ids stay unique); every other cell is kept as it is."""
    cells, n = [], 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown" and "".join(cell.get("source", [])).startswith(TRY_THIS):
            cell = {**cell, "source": [TRY_THIS + "\n\n" + HELD]}      # it said where the solutions are folded
        if is_solution(cell):
            n += 1
            note = {"cell_type": "markdown", "metadata": {}, "source": [NOTE]}
            if "id" in cell:
                note = {"cell_type": "markdown", "id": cell["id"], "metadata": {}, "source": [NOTE]}
            cells.append(note)
        else:
            cells.append(cell)
    return {**nb, "cells": cells}, n


def copy_sources(root: Path, dest: Path) -> dict[str, int]:
    """Copy the book's sources from `root` to `dest` (replacing it), solutions stripped from every notebook.
    Returns {notebook path relative to dest: solution cells removed}."""
    root, dest = root.resolve(), dest.resolve()
    if dest == root or root in dest.parents and dest.relative_to(root).parts[0] not in SKIP:
        raise SystemExit(f"strip_solutions: {dest} must lie outside the book's sources (e.g. under _build/)")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(*SKIP), symlinks=True)
    removed = {}
    for path in sorted(dest.rglob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        stripped, n = strip_notebook(nb)
        if n:
            path.write_text(json.dumps(stripped, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        removed[path.relative_to(dest).as_posix()] = n
    return removed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to write the copy to (replaced), e.g. _build/no_solutions")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    removed = copy_sources(args.root, args.dest)
    held, notebooks = sum(removed.values()), sum(1 for n in removed.values() if n)
    print(f"strip_solutions: {held} solution cells held back in {notebooks} notebooks; sources in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
