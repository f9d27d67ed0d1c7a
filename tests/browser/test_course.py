"""The book as a course (issue 40): each claim of the landing page's chapter map and of the closing summary under
the model its Result was computed with (read from the Results the site publishes), every figure numbered, captioned
with what it shows and drawn for a phone, and the landing page telling an instructor how to hold the solutions back.
Run with `make browser`."""
from __future__ import annotations

import json
import re

import pytest
from test_site import PAGES

from attnlab.core.names import display_name

# chapter page -> the Results its claims are read from (attnlab.sample_complexity.claims.tsc_claims)
SOURCES = {"09_infinite_tokens": ("tsc_uniform", "tsc_moments", "tsc_hardmax"), "10_real_tokens": ("tsc_real",)}
NO_MODEL = "synthetic tokens"          # the chapter map's column of claims computed with no model (book.NO_MODEL)


def _published_model(site, names) -> str | None:
    """The one model (provenance `model`; None: no model) of every Result named in `names` the site publishes."""
    registry = json.loads((site / "results" / "registry.json").read_text())["results"]
    models = set()
    for entry in registry.values():
        if entry["name"] in names:
            meta = json.loads((site / "results" / "files" / entry["files"][f"{entry['name']}.json"]).read_text())
            models.add(meta["provenance"].get("model"))
    assert len(models) == 1, f"published Results {names}: models {models}"
    return models.pop()


_MAP = """() => {
  const table = Array.from(document.querySelectorAll('article table'))
    .find(t => t.querySelector('th') && t.querySelector('th').innerText.trim().startsWith('chapter and claim'));
  if (!table) return null;
  const heads = Array.from(table.querySelectorAll('thead th')).map(th => th.innerText.replace(/\\s+/g, ' ').trim());
  let chapter = null;
  const rows = Array.from(table.querySelectorAll('tbody tr')).map(tr => {
    const cells = Array.from(tr.querySelectorAll('td'));
    const link = cells[0].querySelector('a');
    if (link) chapter = link.getAttribute('href').replace(/\\.html.*/, '');
    return {chapter, claim: cells[0].innerText.trim(), cells: cells.slice(1).map(c => c.innerText.trim())};
  });
  return {heads, rows};
}"""


def test_chapter_map_puts_each_claim_under_the_model_of_its_result(site, server, new_page):
    page = new_page()
    page.goto(f"{server}/book/intro.html", wait_until="load")
    found = page.evaluate(_MAP)
    assert found, "no chapter map (a table headed 'chapter and claim') on the landing page"
    heads = found["heads"][1:]
    for chapter, names in SOURCES.items():
        model = _published_model(site, names)
        column = next((i for i, h in enumerate(heads)
                       if (h.startswith(NO_MODEL) if model is None else h.split()[0] == model)), None)
        assert column is not None, f"chapter map: no column for {model or NO_MODEL}: {heads}"
        rows = [r for r in found["rows"] if r["chapter"] == chapter and r["cells"]]
        assert rows, f"chapter map: no row of {chapter}"
        for r in rows:
            filled = [heads[i] for i, c in enumerate(r["cells"]) if c not in ("", "—")]
            assert filled == [heads[column]], (f"{chapter} '{r['claim'][:40]}': verdict under {filled}, its Results "
                                               f"were computed with {model or 'no model (synthetic tokens)'}")


def test_closing_summary_groups_each_claim_under_the_model_of_its_result(site, server, new_page):
    page = new_page()
    page.goto(f"{server}/book/11_conclusion.html", wait_until="load")
    groups = page.evaluate("""() => Array.from(document.querySelectorAll('p.attnlab-model-group')).map(p => {
        const links = []; let e = p.nextElementSibling;
        while (e && !e.matches('p.attnlab-model-group')) {
          e.querySelectorAll('a').forEach(a => links.push(a.getAttribute('href').replace(/\\.html.*/, '')));
          e = e.nextElementSibling; }
        return {title: p.innerText.trim(), chapters: links}; })""")
    assert groups, "the closing chapter's summary has no groups by model"
    for chapter, names in SOURCES.items():
        model = _published_model(site, names)
        title = "Computed on synthetic tokens (no model)" if model is None else f"Computed with {display_name(model)}"
        where = [g["title"] for g in groups if chapter in g["chapters"]]
        assert where == [title], f"{chapter}'s claims listed under {where}, its Results: {title}"


# Every figure of a page's article: its number, its caption (without the number), whether it is an attnlab
# figure, and on a phone whether the browser took its phone version.
_FIGURES = """() => Array.from(document.querySelectorAll('article .cell_output img')).map(img => {
  const fig = img.closest('figure.attnlab-fig'), cap = fig && fig.querySelector('figcaption');
  const number = cap && cap.querySelector('.attnlab-fig-number');
  const source = img.parentElement.tagName === 'PICTURE' && img.parentElement.querySelector('source[media]');
  return {alt: (img.alt || '').slice(0, 60), figure: !!fig, number: number ? number.innerText.trim() : null,
          caption: cap ? cap.innerText.replace(number ? number.innerText : '', '').trim() : null,
          phone: !!source && !!img.currentSrc && img.currentSrc !== img.src};
})"""
# a caption that does not say what the figure shows: the widgets' old default, a bare word
GENERIC = re.compile(r"^(figure|live figure|one precomputed figure per value of .*: move the sliders?)$", re.I)
MIN_CAPTION_WORDS = 5


@pytest.mark.parametrize("doc", PAGES)
def test_every_figure_is_numbered_captioned_and_drawn_for_a_phone(doc, site, server, new_page, open_folds):
    page = new_page(phone=True, device_scale_factor=3)
    page.goto(f"{server}/{doc}.html", wait_until="load")
    open_folds(page)          # a section for researchers, a hidden output: a figure inside one is a figure too
    page.wait_for_timeout(500)
    figures = page.evaluate(_FIGURES)
    chapter = re.match(r"book/(\d+)_", doc)
    prefix = f"{int(chapter.group(1))}." if chapter else ""
    problems = []
    for k, f in enumerate(figures, start=1):
        what = f"figure {k} ({f['alt']!r})"
        if not f["figure"]:
            problems.append(f"{what}: not a numbered figure (attnlab.widgets)")
            continue
        if f["number"] != f"Figure {prefix}{k}.":
            problems.append(f"{what}: numbered {f['number']!r}, expected 'Figure {prefix}{k}.'")
        caption = f["caption"] or ""
        if GENERIC.match(caption) or len(caption.split()) < MIN_CAPTION_WORDS:
            problems.append(f"{what}: caption {caption!r} does not say what it shows")
        if not f["phone"]:
            problems.append(f"{what}: no phone version taken on a {page.viewport_size['width']} px phone")
    print(f"{doc}: {len(figures)} figures, {len(problems)} problems")
    assert not problems, f"{doc}:\n" + "\n".join(problems)


def test_the_landing_page_says_how_to_get_the_book_without_solutions(site, server, new_page):
    page = new_page()
    page.goto(f"{server}/book/intro.html", wait_until="load")
    text = page.locator("article").inner_text()
    assert "make book SOLUTIONS=0" in text and "scripts/strip_solutions.py" in text, "no word on a solution-free copy"
