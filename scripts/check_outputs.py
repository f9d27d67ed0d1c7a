#!/usr/bin/env python3
"""Compare the checked cells of every chapter with the outputs the book build just produced, so that a
test run executes each chapter once (the strict book build) instead of twice (nbval, then the build).

A cell is checked when its first line is `# NBVAL_CHECK_OUTPUT` or it carries the tag
`nbval-check-output` (nbval's own markers). Its outputs in the committed notebook (book/NAME.ipynb)
must equal those of the executed copy the build wrote (_build/jupyter_execute/book/NAME.ipynb), with
nbval's rules: every output key and every mime type compared, except metadata, tracebacks, execution
counts, stream names, images and widget model ids; consecutive stream outputs are merged (the build
merges them, nbclient does not).

    python scripts/check_outputs.py [_build]       # exit 1 and a diff on any difference
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK, TAG = "# NBVAL_CHECK_OUTPUT", "nbval-check-output"
SKIP = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count", "image/png",
        "image/jpeg", "application/vnd.jupyter.widget-view+json"}


def checked(cell: dict) -> bool:
    source = "".join(cell.get("source", "")).lstrip()
    return cell["cell_type"] == "code" and (source.startswith(MARK) or TAG in cell.get("metadata", {}).get("tags", []))


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def normalized(outputs: list[dict]) -> list[dict]:
    """Outputs as nbval compares them: streams merged, skipped keys dropped, text joined."""
    merged: list[dict] = []
    for out in outputs:
        if out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                and merged[-1].get("name") == out.get("name"):
            merged[-1] = dict(merged[-1], text=_text(merged[-1]["text"]) + _text(out["text"]))
        else:
            merged.append(out)
    flat = []
    for out in merged:
        item = {k: _text(v) for k, v in out.items() if k not in SKIP and k != "data"}
        item.update({k: _text(v) for k, v in out.get("data", {}).items() if k not in SKIP})
        flat.append(item)
    return flat


def compare(reference: Path, executed: Path) -> list[str]:
    ref, new = (json.loads(p.read_text()) for p in (reference, executed))
    new_cells = {c.get("id"): c for c in new["cells"]}
    problems = []
    for i, cell in enumerate(ref["cells"]):
        if not checked(cell):
            continue
        got = new_cells.get(cell.get("id"))
        if got is None:
            problems.append(f"{reference.name} cell {i}: missing from the executed notebook")
        elif normalized(cell.get("outputs", [])) != normalized(got.get("outputs", [])):
            problems.append(f"{reference.name} cell {i} ({cell.get('id')}):\n  stored:   "
                            f"{normalized(cell.get('outputs', []))}\n  executed: {normalized(got.get('outputs', []))}")
    return problems


def main(argv: list[str]) -> int:
    build = Path(argv[0]) if argv else ROOT / "_build"
    problems, n = [], 0
    for reference in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
        executed = build / "jupyter_execute" / "book" / reference.name
        if not executed.is_file():
            problems.append(f"{reference.name}: no executed copy at {executed} (run the book build first)")
            continue
        n += sum(checked(c) for c in json.loads(reference.read_text())["cells"])
        problems += compare(reference, executed)
    if problems:
        print("\n".join(problems))
        return 1
    print(f"check_outputs: {n} checked cells equal their stored outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
