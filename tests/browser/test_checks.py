"""Exercises answered on the page (issue 50): every checkable exercise carries data-attnlab-check; the hint comes
before the box and the solution; a right answer says right, a wrong one says wrong and why, in an aria-live
verdict, by keyboard, at 1280 and 390 px in both themes, with no console error. The right answer is read from the
block's own JSON (what the chapter computed at build time)."""
from __future__ import annotations

import json

import pytest

PAGES = ["01_vanishing", "04_separability", "07_beyond_softmax", "08_diagnose"]   # a number and a choice each kind
_SPEC = "(box) => JSON.parse(box.querySelector(\"script[type='application/json']\").textContent)"


def _answer(page, box, spec: dict, right: bool) -> str:
    """Answers the check in `box` (right or wrong) from the keyboard and returns the verdict's text."""
    if spec["kind"] == "number":
        value = spec["answer"] if right else spec["answer"] + 10 * spec["tol"] + 1
        field = box.locator("input[type=text]")
        field.fill(repr(value))
        field.press("Enter")
    else:
        index = spec["answer"] if right else (spec["answer"] + 1) % len(spec["options"])
        box.locator(f"input[type=radio][value='{index}']").check()
        box.locator("button").press("Enter")
    verdict = box.locator(".attnlab-check-verdict")
    page.wait_for_function("(v) => v.textContent.length > 0", arg=verdict.element_handle(), timeout=5_000)
    return verdict.inner_text()


@pytest.mark.parametrize("mode", ["light", "dark"])
@pytest.mark.parametrize("phone", [False, True], ids=["1280px", "390px"])
@pytest.mark.parametrize("chapter", PAGES)
def test_a_check_says_right_or_wrong_and_why(chapter, phone, mode, site, server, new_page):
    page = new_page(phone=phone, mode=mode)
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server}/book/{chapter}.html", wait_until="load")
    boxes = page.locator("[data-attnlab-check]")
    assert boxes.count(), f"{chapter}: no checkable exercise"
    for k in range(boxes.count()):
        box = boxes.nth(k)
        spec = page.evaluate(_SPEC, box.element_handle())
        assert box.get_attribute("data-attnlab-check") == spec["kind"]
        assert box.locator("[aria-live=polite]").count() == 1
        order = page.evaluate("""([box, ex]) => {
            const hint = box.querySelector('.attnlab-check-hint'), form = box.querySelector('form');
            const sol = [...document.querySelectorAll('.cell')].find(c => c.textContent.includes('# Solution ' + ex));
            return [!!(hint.compareDocumentPosition(form) & Node.DOCUMENT_POSITION_FOLLOWING),
                    !!sol && !!(box.compareDocumentPosition(sol) & Node.DOCUMENT_POSITION_FOLLOWING)]; }""",
                              [box.element_handle(), spec["exercise"]])
        assert all(order), f"{chapter} check {spec['exercise']}: the hint, then the box, then the solution: {order}"
        box.scroll_into_view_if_needed()
        wrong = _answer(page, box, spec, right=False)
        assert wrong.startswith("Not quite.") and wrong.endswith(spec["wrong"]), wrong
        right = _answer(page, box, spec, right=True)
        assert right.startswith("Right.") and right.endswith(spec["why"]), right
        width = page.evaluate("(b) => [b.getBoundingClientRect().right, window.innerWidth]", box.element_handle())
        assert width[0] <= width[1] + 1, f"{chapter} check {spec['exercise']} overflows the page: {width}"
        colour = page.evaluate("(b) => getComputedStyle(b.querySelector('.attnlab-check-verdict')).color",
                               box.element_handle())
        background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        assert colour != background, f"{chapter}: the verdict is invisible in {mode} mode"
    assert not errors, f"{chapter}: console errors {json.dumps(errors)[:500]}"
