#!/usr/bin/env python3
"""The first cell of every chapter: install attnlab when it is missing (Colab, Binder, a fresh Jupyter),
silently do nothing when it is present. The source is the repository set once in _config.yml (or
$ATTNLAB_INSTALL: a wheel, a folder, any pip requirement); pip keeps the torch already installed.

    python scripts/setup_cells.py          # write the cell into every chapter (idempotent)
    python scripts/setup_cells.py --check  # exit 1 if a chapter's first cell differs (make test)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CELL_ID = "attnlab-setup"


def setup_source() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo, results = config["repository"], config["attnlab"]["results_url"]
    url, branch = repo["url"].rstrip("/"), repo.get("branch", "main")
    return (
        "# Setup for Colab, Binder or a fresh Jupyter: installs attnlab when it is missing, keeping your torch;\n"
        "# does nothing when attnlab is installed. ATTNLAB_INSTALL may name a wheel or a folder instead.\n"
        "# Results the published site holds are fetched (sha256-checked) instead of computed: ATTNLAB_RESULTS_URL.\n"
        "import importlib.util, os, subprocess, sys\n"
        f"os.environ.setdefault(\"ATTNLAB_RESULTS_URL\", \"{results}\")\n"
        "if importlib.util.find_spec(\"attnlab\") is None:\n"
        f"    source = os.environ.get(\"ATTNLAB_INSTALL\", \"attnlab @ git+{url}@{branch}\")\n"
        "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", source], check=True)"
    )


def setup_cell() -> dict:
    lines = setup_source().split("\n")
    return {"cell_type": "code", "execution_count": None, "id": CELL_ID,
            "metadata": {"tags": ["remove-cell"]}, "outputs": [],
            "source": [line + "\n" for line in lines[:-1]] + [lines[-1]]}


def chapters() -> list[Path]:
    return sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def first_code_cell(nb: dict) -> dict | None:
    return next((c for c in nb["cells"] if c["cell_type"] == "code"), None)


def main(argv: list[str]) -> int:
    want = setup_source()
    stale = []
    for path in chapters():
        nb = json.loads(path.read_text())
        first = first_code_cell(nb)
        if first is not None and "".join(first["source"]) == want and first.get("id") == CELL_ID:
            continue
        stale.append(path.name)
        if "--check" in argv:
            continue
        nb["cells"] = [c for c in nb["cells"] if c.get("id") != CELL_ID]
        at = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code")
        nb["cells"].insert(at, setup_cell())
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    if "--check" in argv and stale:
        print("chapters whose setup cell is missing or stale (run scripts/setup_cells.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
