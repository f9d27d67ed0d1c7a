"""Table captions a reader can read (issue 50 item 5): at 1280 and 390 px, light and dark, every table's caption
spans the table's box above its rows (it once sat in a 44-102 px column on a phone, up to 808 px tall), and is
no taller than its text needs at that width. Run with `make browser`."""
from __future__ import annotations

import pytest
from test_site import PAGES

# Per captioned table in the article: caption width and height, the table box's width, the rows' width, and the
# height the caption's text takes set in one line per table-box width (its line count times its line height).
_CAPTIONS = """() => [...document.querySelectorAll('article table')].filter(t => t.querySelector(':scope > caption'))
  .map(t => { const c = t.querySelector(':scope > caption'), cs = getComputedStyle(c);
    const box = t.getBoundingClientRect(), cap = c.getBoundingClientRect();
    const body = t.tBodies.length ? t.tBodies[0].getBoundingClientRect() : box;
    const line = parseFloat(cs.lineHeight) || 1.5 * parseFloat(cs.fontSize);
    const ctx = document.createElement('canvas').getContext('2d'); ctx.font = cs.font;
    const words = Math.ceil(ctx.measureText(c.textContent.trim()).width / Math.max(box.width, 1)) + 1;
    return {text: c.textContent.trim().slice(0, 60), cap_w: cap.width, cap_h: cap.height, box_w: box.width,
            rows_w: Math.min(body.width, box.width), lines_h: words * line * 1.5 + 8}; })"""


@pytest.mark.parametrize("mode", ["light", "dark"])
@pytest.mark.parametrize("phone", [False, True], ids=["1280px", "390px"])
@pytest.mark.parametrize("doc", PAGES)
def test_a_caption_spans_its_table(doc, phone, mode, site, server, new_page):
    page = new_page(phone=phone, mode=mode)
    page.goto(f"{server}/{doc}.html", wait_until="load")
    page.wait_for_timeout(200)
    bad = [t for t in page.evaluate(_CAPTIONS) if t["cap_w"] + 1 < t["rows_w"] or t["cap_h"] > t["lines_h"]]
    assert not bad, f"{doc} ({page.viewport_size['width']} px, {mode}): captions narrower than their table or " \
                    f"taller than their text: {bad[:3]}"
