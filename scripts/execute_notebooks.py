#!/usr/bin/env python3
"""Execute book notebooks in place, from book/ (as jupyter-book and nbval run them), so that their
stored outputs (what the checks compare) are refreshed. No widget state is stored: the site shows the
sliders' own HTML (attnlab.widgets), and a reader's Jupyter redraws the widgets when it runs the chapter. Each
output is kept as a refresh keeps it (scripts/check_outputs.py `stored`: no phone versions of the figures, no
image/png copy of a figure its HTML holds), so a chapter stays under check_outputs.MAX_BYTES.

    python scripts/execute_notebooks.py               # every book/*.ipynb
    python scripts/execute_notebooks.py book/03_six_percent.ipynb

Model and device come from ATTNLAB_MODEL / ATTNLAB_DEVICE, like everywhere else.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from check_outputs import MAX_BYTES, META, package_digest, stored
from nbclient import NotebookClient

from attnlab.core.util import cpu_class

BOOK = Path(__file__).resolve().parent.parent / "book"


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    NotebookClient(
        nb, timeout=1800, kernel_name="python3", allow_errors=False, record_timing=False,
        store_widget_state=False, resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    nb.metadata.pop("widgets", None)      # no saved widget state (see the docstring)
    nb.metadata[META] = {"outputs_cpu": cpu_class(), "outputs_package": package_digest()}   # as a refresh records
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.from_dict(out) for out in stored(cell.outputs)]
    nbformat.write(nb, path)
    size = path.stat().st_size
    print(f"{path.relative_to(BOOK.parent)}: {time.time() - start:.1f} s, {size / 1e3:.0f} KB"
          + (f"  <-- over {MAX_BYTES / 1e6:g} MB: lighten its frames" if size > MAX_BYTES else ""), flush=True)


def main(argv: list[str]) -> int:
    # MPLBACKEND=Agg (the Makefile exports it for the CLI) would stop kernels showing figures.
    if os.environ.get("MPLBACKEND", "").lower() == "agg":
        del os.environ["MPLBACKEND"]
    paths = [Path(a).resolve() for a in argv] or sorted(BOOK.glob("*.ipynb"))
    for path in paths:
        execute(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
