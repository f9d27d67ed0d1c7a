"""What the chapters say about their figures holds on a phone, where a figure's panels are stacked one per row
(attnlab.widgets.phone_layout): panels are named by their order ("first panel") or their title, never by a side."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
# "Left: ...", "right, the ...", "(right panel", "on the left", "top right", "(left the mean": a panel by its side
SIDE = re.compile(r"(?i)\b(?:left|right|middle)\s*(?::|,|panel)|\bon the (?:left|right)\b"
                  r"|\b(?:top|bottom)[ -](?:left|right)\b|\((?:left|right)\b")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_panel_is_named_by_its_side(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    text += [s for c in cells if c["cell_type"] == "code" for s in re.findall(r'(?:alt|caption)=\(?"([^"]*)"',
                                                                               "".join(c["source"]))]
    found = [m.group(0) for t in text for m in SIDE.finditer(re.sub(r"\\(?:left|right)\b", "", t))]
    assert not found, f"{path.name}: panels named by their side (stacked on a phone): {found}"


def test_the_side_pattern_finds_what_it_must():
    for said in ("Left: the points", "right, the same", "(right panel; the", "on the right, the", "Top right, each",
                 "(left the mean, right the covariance"):
        assert SIDE.search(said), said
    for fine in ("right below it", "left-out tokens", "to the right of its ×", "\\left( x \\right)", "the right end"):
        assert not SIDE.search(re.sub(r"\\(?:left|right)\b", "", fine)), fine
