"""The committed chapters as nbval reads them (`make nbval`, the publishing workflow), without executing them."""
import json
import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parent.parent / "book"
CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
MARK, TAG = "# NBVAL_CHECK_OUTPUT", "nbval-check-output"
# A checked line states a claim and its verdict: a theorem, an identity or a count that holds on any model.
CLAIM = re.compile(r".*: (True|holds)")


def _code_cells(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def _checked(cell: dict) -> bool:
    return "".join(cell["source"]).lstrip().startswith(MARK) or TAG in cell.get("metadata", {}).get("tags", [])


def test_the_book_has_chapters_with_checked_cells():
    assert len(CHAPTERS) >= 10
    assert sum(_checked(c) for path in CHAPTERS for _, c in _code_cells(path)) >= 20


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_cell_has_outputs_without_an_execution_count(path):
    """nbval stops on such a cell ("Unrun reference cell has outputs"): outputs come from a run."""
    bad = [f"cell {i} ({c.get('id')})" for i, c in _code_cells(path)
           if c.get("outputs") and c.get("execution_count") is None]
    assert not bad, f"{path.name}: outputs without an execution count in {', '.join(bad)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_stored_outputs_say_which_cpu_class_and_package_made_them(path):
    """scripts/check_outputs.py reads another CPU class's last digits (tests/outputs/) only beside outputs that say
    what made them, and `--cpu-variant` only for the same package: a refresh records both."""
    made = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("attnlab", {})
    assert made.get("outputs_cpu") and made.get("outputs_package"), \
        f"{path.name}: no record of what made its outputs (make refresh-outputs)"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_checked_cells_print_only_claims_that_hold_on_any_model(path):
    """nbval (`make nbval`, on GPT-2 in the publishing workflow) compares a checked cell's output with the
    stored one, which came from another model: so a checked cell prints only lines `claim: True` (or
    `id: holds`), never a number, length or layer of the model that ran."""
    bad = []
    for i, cell in _code_cells(path):
        if not _checked(cell):
            continue
        outs = cell.get("outputs", [])
        text = "".join("".join(o.get("text", "")) for o in outs)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines or any(o.get("output_type") != "stream" or o.get("name") != "stdout" for o in outs):
            bad.append(f"cell {i} ({cell.get('id')}): stores no printed claim, or other outputs")
        bad += [f"cell {i} ({cell.get('id')}): {ln!r}" for ln in lines if not CLAIM.fullmatch(ln)]
    assert not bad, f"{path.name}: checked cells must print model-independent claims:\n" + "\n".join(bad)


def _check_outputs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_outputs", BOOK.parent / "scripts" / "check_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_opens_quickly_each_figure_stored_once(path):
    """Every committed chapter under check_outputs.MAX_BYTES (1 MB), holding each figure once, at its desktop size:
    the phone versions are drawn at build time and served by the site, never stored here (`stored`)."""
    check_outputs = _check_outputs()
    size, limit = path.stat().st_size, check_outputs.MAX_BYTES
    assert size < limit, f"{path.name}: {size / 1e3:.0f} KB (the limit: {limit / 1e3:.0f} KB)"
    extra = [f"cell {i} ({c.get('id')})" for i, c in _code_cells(path)
             if check_outputs.stored(c.get("outputs", [])) != c.get("outputs", [])]
    assert not extra, f"{path.name}: phone versions or a second copy of a figure stored in {', '.join(extra)}"
