"""Exercises answered on the page (issue 50): attnlab.book.checks' rule and markup, and the chapters' check cells.

Each check cell sits between its exercise and its solution, hands the check a computed value (never a literal), and
its answer is one the solution states: the numbers the check's verdict gives are numbers the solution prints.
The output tests read the notebooks' stored outputs (book/, or ATTNLAB_CHECK_NOTEBOOKS, e.g.
_build/jupyter_execute/book after a build)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from attnlab.book import checks
from attnlab.core import settings

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
CALLS = ("check_number", "check_choice")


def _number(**kw):
    return checks.number("9.9", 0.25, 0.01, prompt="p?", hint="h.", why="w.", wrong="x.", **kw)


def test_the_rule_says_right_or_wrong_and_why():
    spec = _number().spec
    assert checks.verdict(spec, "0.255") == (True, "Right. w.")
    assert checks.verdict(spec, " 0.3 ") == (False, "Not quite. x.")
    assert checks.verdict(spec, "25%")[0] is False                 # % is only stripped, not rescaled
    assert checks.verdict(spec, "a quarter") == (False, "Type a number (e.g. 0.25).")
    assert checks.verdict(spec, "nan")[0] is False
    pick = checks.choice("9.8", ["a", "b"], 1, prompt="p?", hint="h.", why="w.", wrong="x.").spec
    assert checks.verdict(pick, 1)[0] and not checks.verdict(pick, 0)[0]


@pytest.mark.parametrize("bad", [dict(value=float("nan")), dict(tol=0), dict(hint="")])
def test_bad_input_is_one_clear_error(bad):
    args = dict(value=0.25, tol=0.01, prompt="p?", hint="h.", why="w.", wrong="x.") | bad
    with pytest.raises(ValueError, match="check 9.9"):
        checks.number("9.9", args.pop("value"), args.pop("tol"), **args)
    with pytest.raises(ValueError, match="right index"):
        checks.choice("9.9", ["a", "b"], 2, prompt="p?", hint="h.", why="w.", wrong="x.")


def test_the_page_block_is_labelled_live_and_carries_the_computed_answer():
    box = _number(unit="%")
    page = box._repr_mimebundle_()["text/html"]
    assert 'data-attnlab-check="number"' in page and 'aria-live="polite"' in page
    field = re.search(r'<label for="([^"]+)">', page).group(1)
    assert f'id="{field}"' in page                                  # the input has its label
    assert page.index("Hint.") < page.index("<form")                # the hint comes first
    spec = json.loads(re.search(r'<script type="application/json">(.*?)</script>', page).group(1))
    assert spec == box.spec and spec["answer"] == 0.25
    pick = checks.choice("9.8", ["a <b>", "c"], 0, prompt="p?", hint="h.", why="w.", wrong="x.")
    html = pick._repr_mimebundle_()["text/html"]
    assert "<fieldset><legend>p?</legend>" in html and "a &lt;b&gt;" in html


def _cells(path):
    return nbformat.read(path, 4).cells


def _checks(path):
    """[(index, exercise id, the call)] of the chapter's check cells."""
    out = []
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type == "code" and "check" in cell.metadata.get("tags", []):
            calls = [n for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Attribute) and n.func.attr in CALLS]
            assert len(calls) == 1, f"{path.name} cell {i}: one check per check cell"
            out.append((i, calls[0].args[0].value, calls[0]))
    return out


def test_half_the_exercises_and_every_chapter_have_a_check():
    exercises = sum(len(re.findall(r"^\*\*Exercise \d+\.\d+\.\*\*", c.source, re.M))
                    for p in CHAPTERS for c in _cells(p) if c.cell_type == "markdown")
    per_chapter = {p.name: len(_checks(p)) for p in CHAPTERS}
    assert all(per_chapter.values()), f"chapters without a check: {per_chapter}"
    assert 2 * sum(per_chapter.values()) >= exercises, (sum(per_chapter.values()), exercises)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_checks_sit_between_exercise_and_solution_and_take_computed_answers(path):
    cells = _cells(path)
    for i, ex, call in _checks(path):
        assert cells[i - 1].source.startswith(f"**Exercise {ex}.**"), f"{path.name}: check {ex} after its exercise"
        assert cells[i + 1].source.startswith(f"# Solution {ex}\n"), f"{path.name}: check {ex} before its solution"
        assert "solution" in cells[i + 1].metadata.get("tags", [])
        answer = call.args[1] if call.func.attr == "check_number" else call.args[2]
        assert not isinstance(answer, ast.Constant), f"{path.name}: check {ex}'s answer is a literal, not computed"


def _floats(text: str) -> list[tuple[float, int]]:
    """The numbers of a text with their decimals: '8.93' -> (8.93, 2); '89%' -> (89.0, 0)."""
    return [(float(m.replace(",", "")), len(m.split(".")[1]) if "." in m else 0)
            for m in re.findall(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?", text)]


def _stated(x: float, decimals: int, text: str) -> bool:
    return any(abs(y - x) <= 0.5 * 10 ** -min(decimals, d) + 1e-9 for y, d in _floats(text))


def _outputs(path, cell) -> str:
    outs = cell.get("outputs", [])
    return ("\n".join(str(o.get("data", {}).get(k, "")) for o in outs for k in ("text/markdown", "text/html"))
            + "".join(o.get("text", "") for o in outs))


@pytest.mark.parametrize("name", [p.name for p in CHAPTERS], ids=lambda n: n[:2])
def test_each_check_states_what_its_solution_prints(name):
    folder = Path(settings.get("ATTNLAB_CHECK_NOTEBOOKS") or ROOT / "book")
    path = folder / name
    cells = _cells(path)
    for i, ex, _ in _checks(path):
        page = _outputs(path, cells[i])
        found = re.search(r'<script type="application/json">(.*?)</script>', page, re.S)
        assert found, f"{name}: check {ex} has no stored output (refresh the notebook's outputs)"
        spec = json.loads(found.group(1))
        solution = _outputs(path, cells[i + 1])
        if spec["kind"] == "number":
            assert any(abs(y - spec["answer"]) <= spec["tol"] for y, _ in _floats(solution)), (
                f"{name}: check {ex}'s answer {spec['answer']} is not a number Solution {ex} states")
        missing = [x for x, d in _floats(spec["why"]) if not _stated(x, d, solution)]
        assert not missing, f"{name}: check {ex} says {missing}, which Solution {ex} does not print"
