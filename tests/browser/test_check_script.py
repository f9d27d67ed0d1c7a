"""attnlab-check.js on a page of its own (no built site needed): the blocks attnlab.book.checks renders, answered by
keyboard, right and wrong, at 1280 and 390 px, light and dark; the verdict is the rule of checks.verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.book import checks

SITE = Path(__file__).resolve().parents[2] / "book" / "_assets" / "site"
BOXES = [checks.number("1.1", 88.7, 3, prompt="Share of rows, in %?", hint="Read the histogram.", why="89%.",
                       wrong="Count again.", unit="%"),
         checks.choice("4.1", ["T = 0.1", "T = 2", "both the same"], 2, prompt="Which keeps more?", hint="Count.",
                       why="4 of 6 at both.", wrong="Count the points, not the ball.")]


@pytest.mark.parametrize("mode", ["light", "dark"])
@pytest.mark.parametrize("phone", [False, True], ids=["1280px", "390px"])
def test_the_script_says_right_or_wrong_and_why(phone, mode, tmp_path, new_page):
    for name in ("attnlab-check.js", "attnlab-site.css"):
        (tmp_path / name).write_text((SITE / name).read_text())
    body = "".join(b._repr_mimebundle_()["text/html"] for b in BOXES)
    (tmp_path / "index.html").write_text(
        '<!doctype html><html><head><meta name="viewport" content="width=device-width">'
        '<link rel="stylesheet" href="attnlab-site.css"><script src="attnlab-check.js"></script></head>'
        f"<body>{body}</body></html>")
    page = new_page(phone=phone, color_scheme=mode)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((tmp_path / "index.html").as_uri(), wait_until="load")
    for box, spec in zip([page.locator(f"#attnlab-check-{b.spec['exercise'].replace('.', '-')}") for b in BOXES],
                         [b.spec for b in BOXES]):
        verdict = box.locator("[aria-live=polite]")
        off = 10 * spec["tol"] if spec["kind"] == "number" else 1
        for given, right in ((spec["answer"] + off, False), (spec["answer"], True)):
            if spec["kind"] == "number":
                box.locator("input").fill(str(given))
                box.locator("input").press("Enter")
            else:
                box.locator(f"input[value='{int(given) % len(spec['options'])}']").check()
                box.locator("button").press("Enter")
            text = ("Right. " + spec["why"]) if right else ("Not quite. " + spec["wrong"])
            assert verdict.inner_text() == text
            assert checks.verdict(spec, given if spec["kind"] == "number" else int(given) % len(spec["options"])) \
                == (right, text)
        assert box.evaluate("b => b.getBoundingClientRect().right") <= (390 if phone else 1280)
    assert not errors, errors
