"""The book as a course on the built site (issue 40): a learner's path through each chapter fits about twenty phone
screens (what is for researchers folds behind one labelled control), each chapter shows its map and its recap, no
element runs past the right edge at 1280 px or on a 390 px phone (every fold and solution opened), and the
exercises' answers are prose with typeset maths. Run with `make browser` (needs `make book`)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
CHAPTERS = sorted(f"book/{p.stem}" for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
PHONE_SCREENS = 22          # the issue: a learner's path through a chapter fits about 20 phone screens
WIDTHS = (1280, 390)          # a desktop (conftest's DESKTOP) and a phone (conftest's PHONE)
# Elements that run past the window's right (or left) edge, unless a box that scrolls or clips them holds them.
_OVERFLOW = """() => {
  const W = window.innerWidth, out = [];
  const held = (e) => { for (let p = e.parentElement; p && p.tagName !== 'ARTICLE'; p = p.parentElement) {
      const s = getComputedStyle(p), r = p.getBoundingClientRect();
      if (s.overflowX !== 'visible' && r.right <= W + 1 && r.left >= -1) return true; } return false; };
  for (const e of document.querySelectorAll('article.bd-article *')) {
    if (e.closest('mjx-assistive-mml')) continue;     // MathJax's MathML for screen readers: clipped, not shown
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if ((r.right > W + 1 || r.left < -1) && !held(e))
      out.push(`${e.tagName}.${e.className} ${Math.round(r.left)}..${Math.round(r.right)} px`);
  }
  const wide = [...document.querySelectorAll('article .cell_output pre')]
      .filter(p => p.scrollWidth > p.clientWidth + 1)
      .map(p => `output <pre> ${p.scrollWidth} px in ${p.clientWidth} px: ${p.innerText.slice(0, 50)}`);
  return {page: document.documentElement.scrollWidth, out: out.slice(0, 10), wide: wide.slice(0, 10)};
}"""


@pytest.mark.parametrize("doc", CHAPTERS)
def test_a_chapter_fits_about_twenty_phone_screens(doc, site, server, new_page):
    """390 x 844: the page as it loads (folds closed) is at most PHONE_SCREENS screens long."""
    page = new_page(phone=True)
    page.goto(f"{server}/{doc}.html", wait_until="load")
    page.wait_for_timeout(300)
    height = page.evaluate("() => document.documentElement.scrollHeight")
    screens = height / page.viewport_size["height"]
    print(f"{doc}: {screens:.1f} phone screens")
    assert screens <= PHONE_SCREENS, f"{doc}: {screens:.1f} phone screens (at most {PHONE_SCREENS})"


@pytest.mark.parametrize("doc", CHAPTERS)
def test_a_chapter_shows_its_map_and_its_recap(doc, site, server, new_page):
    """The overview (learn, read first, time) is on the first phone screen under the title; the recap is there;
    sections for researchers are closed, each under one labelled control that opens."""
    page = new_page(phone=True)
    page.goto(f"{server}/{doc}.html", wait_until="load")
    page.wait_for_timeout(300)
    overview = page.locator(".attnlab-overview")
    assert overview.count() == 1, f"{doc}: no overview"
    text = overview.inner_text()
    assert all(w in text for w in ("You will learn", "Read first", "Time")), text
    assert overview.bounding_box()["y"] < page.viewport_size["height"], f"{doc}: the overview is below the first screen"
    recap = page.locator(".attnlab-recap li")
    assert recap.count() >= 2, f"{doc}: no recap"
    folds = page.locator("details.attnlab-fold-box")
    for k in range(folds.count()):
        fold = folds.nth(k)
        assert fold.get_attribute("open") is None, f"{doc}: fold {k} is open"
        label = fold.locator(":scope > summary").inner_text()
        assert label.startswith("For researchers: "), label
        fold.locator(":scope > summary").click()
        assert fold.evaluate("d => d.open && d.scrollHeight > 100"), f"{doc}: fold {k} ({label}) shows nothing"


def test_a_link_into_a_folded_section_opens_it(site, server, new_page):
    page = new_page(phone=True)
    page.goto(f"{server}/book/06_what_holds.html", wait_until="load")
    inner = page.evaluate("() => { const d = document.querySelector('details.attnlab-fold-box');"
                          " const e = d && d.querySelector('[id]'); return e && e.id; }")
    assert inner, "chapter 6 has no folded section with an anchor"
    page.goto(f"{server}/book/06_what_holds.html#{inner}", wait_until="load")
    page.wait_for_timeout(300)
    assert page.evaluate(f"() => document.getElementById({inner!r}).closest('details').open")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("doc", CHAPTERS)
def test_nothing_runs_off_the_right_edge(doc, width, site, server, new_page, open_folds):
    """Every fold and solution opened: the page is no wider than the window, no element runs past its edge (tables
    and code may scroll inside their own box), and no cell output scrolls sideways (outputs wrap)."""
    page = new_page(phone=width < WIDTHS[0])
    assert page.viewport_size["width"] == width, page.viewport_size
    page.goto(f"{server}/{doc}.html", wait_until="load")
    open_folds(page)
    page.wait_for_timeout(500)
    found = page.evaluate(_OVERFLOW)
    assert found["page"] <= width + 1, f"{doc} at {width} px: the page is {found['page']} px wide"
    assert not found["out"], f"{doc} at {width} px: past the edge: {found['out']}"
    assert not found["wide"], f"{doc} at {width} px: outputs that do not wrap: {found['wide']}"


def test_answers_are_prose_with_typeset_maths(site, server, new_page, open_folds):
    """Each solution's answer (above its code) is prose with typeset maths, not printed text."""
    page = new_page()
    bad = []
    for doc in CHAPTERS:
        page.goto(f"{server}/{doc}.html", wait_until="load")
        open_folds(page)
        page.evaluate("() => window.MathJax && window.MathJax.startup.promise")
        for k, cell in enumerate(page.locator(".cell.tag_solution").all()):
            output = cell.locator(".cell_output")
            text = output.inner_text() if output.count() else ""
            if not output.count() or output.locator("pre").count() or not re.match(r"\s*\d+\.", text):
                bad.append(f"{doc} solution {k + 1}: {text[:60]!r}")
        math = page.locator(".cell.tag_solution .cell_output mjx-container").count()
        if page.locator(".cell.tag_solution").count() and not math:
            bad.append(f"{doc}: no typeset maths in any answer")
    assert not bad, "answers that are not prose with maths:\n" + "\n".join(bad)
