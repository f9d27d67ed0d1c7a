"""Each chapter as a course (issue 40): a map under its title (what you will learn, what to read first, how long it
takes), a recap at the end (what to keep), every exercise labelled with what it needs, answers built as prose with
maths from computed numbers, and what is for researchers folded behind a labelled control."""
import json
import re
from pathlib import Path

import pytest
import yaml

from attnlab import book

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
NEEDS = re.compile(r"\*\*Exercise \d+\.\d+\.\*\* \*Needs: (the page|a live kernel|code)[^*]*\.\*")
FOLD = re.compile(r'<div class="attnlab-fold" data-summary="([^"]+)"></div>')
HIDING = {"hide-cell", "hide-output"}


def _cells(path: Path) -> list[dict]:
    return [dict(c, text="".join(c["source"])) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_chapter_opens_with_a_map(path):
    """Under the title: an admonition (class attnlab-overview) naming what a reader learns, what to read first and
    how long it takes."""
    first = _cells(path)[0]["text"]
    title, rest = first.split("\n", 1)
    assert title.startswith("# ")
    box = re.match(r"\s*:::\{admonition\} This chapter at a glance\n:class: tip attnlab-overview\n(.*?)\n:::\n",
                   rest, re.S)
    assert box, f"{path.name}: no overview right under the title"
    for part in ("**You will learn** ", "**Read first** ", "**Time** about "):
        assert part in box.group(1), f"{path.name}: the overview lacks {part.strip()!r}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_chapter_ends_with_a_recap(path):
    """A "What to keep" section of at least two points, after every section of the chapter and before its
    exercises."""
    cells = _cells(path)
    heads = [(i, m.group(1)) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             for m in re.finditer(r"^## (.+)$", c["text"], re.M)]
    names = [h for _, h in heads]
    assert "What to keep" in names, f"{path.name}: no recap"
    after = names[names.index("What to keep") + 1:]
    assert after in ([], ["Try this"]), f"{path.name}: sections after the recap: {after}"
    recap = next(c["text"] for c in cells if c["text"].startswith("## What to keep"))
    assert len(re.findall(r"^- ", recap, re.M)) >= 2, f"{path.name}: a recap of fewer than two points"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_exercise_says_what_it_needs(path):
    exercises = [c["text"] for c in _cells(path) if c["cell_type"] == "markdown" and c["text"].startswith("**Exercise")]
    bad = [e[:60] for e in exercises if not NEEDS.match(e)]
    assert not bad, f"{path.name}: exercises without a 'Needs: the page / a live kernel / code' label: {bad}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_answers_are_prose_built_from_numbers(path):
    """A solution displays Markdown (book.answer), never print()ed text; the chapter's answers carry maths."""
    solutions = [c for c in _cells(path) if "solution" in c["metadata"].get("tags", [])]
    for c in solutions:
        assert "book.answer(" in c["text"] and "print(" not in c["text"], c["id"]
    assert not solutions or any("$" in c["text"] for c in solutions), f"{path.name}: answers without maths"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_what_is_folded_is_labelled(path):
    """A folded section says it is for researchers; a folded cell (hide-cell, hide-output) with outputs names what
    it holds ("Show ...", "For researchers: ..."), unless it is a checked cell or sits in a folded section."""
    in_fold = False
    for c in _cells(path):
        for label in FOLD.findall(c["text"]):
            assert label.startswith("For researchers: "), label
        if c["cell_type"] == "markdown" and re.search(r"^## ", c["text"], re.M):
            in_fold = bool(re.search(r'^## .*\n\n<div class="attnlab-fold"', c["text"], re.M))
        tags = set(c["metadata"].get("tags", []))
        if HIDING & tags and "solution" not in tags and c.get("outputs") and not in_fold:
            prompt = c["metadata"].get("mystnb", {}).get("code_prompt_show", "")
            checked = "nbval-check-output" in tags          # "Checked on every build: ..." above it says what
            assert prompt.startswith(("Show ", "For researchers: ")) or checked, f"{c['id']}: folded without a label"
    markers = "".join(c["text"] for c in _cells(path)).count('class="attnlab-fold"')
    assert markers == sum(len(FOLD.findall(c["text"])) for c in _cells(path)), f"{path.name}: a malformed fold"


def test_the_site_loads_the_fold_script_and_renders_markdown_answers():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
    assert "attnlab-fold.js" in config["html_js_files"]
    assert (ROOT / "book/_assets/site/attnlab-fold.js").is_file()
    assert config["nb_render_markdown_format"] == "myst"       # $..$ and tables in an answer


@pytest.mark.parametrize("x, expected", [(1.23e4, r"1.23 \times 10^{4}"), (-2.5e-7, r"-2.5 \times 10^{-7}"),
                                         (1e-12, "10^{-12}"), (0.5, "0.5"), (float("inf"), r"\infty"),
                                         (float("nan"), r"\text{n/a}")])
def test_tex_writes_numbers_for_maths(x, expected):
    assert book.tex(x) == expected
