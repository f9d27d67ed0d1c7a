"""Every text of every page readable in light and in dark mode: the contrast ratio (WCAG 2) of each visible
text element against the colour actually painted behind it is at least 4.5:1. Run with `make browser`.

(In dark mode the theme's light panel for HTML outputs once left the "Computed with ..." notice body at 1.0:1,
figure numbers at 1.0:1 and captions at 1.7:1: book/_assets/site/attnlab-site.css.)"""
from __future__ import annotations

import pytest
from test_site import PAGES

MIN_RATIO = 4.5          # WCAG 2 AA, normal text

# Each element with its own text (a non-blank text node), visible (laid out, `visibility: visible`, not under
# aria-hidden): its computed colour and the background behind it, composited over white from the first opaque
# background up the ancestors (semi-transparent ones blended in); the opacity of the element and of all its
# ancestors dims the text over that background; WCAG 2's relative luminance and contrast ratio.
_CONTRAST = """() => {
  const parse = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const v = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3])).concat([1]);
  const lum = (c) => { const v = c.slice(0, 3).map(x => x / 255)
      .map(x => x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4);
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const behind = (e) => {
    const layers = []; let opacity = 1;
    for (let b = e; b; b = b.parentElement) {
      const s = getComputedStyle(b); opacity *= Number(s.opacity);
      const c = parse(s.backgroundColor);
      if (c && c[3] > 0 && !(layers.length && layers[layers.length - 1][3] >= 1)) layers.push(c);
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return [bg, opacity];
  };
  const name = (e) => e.tagName.toLowerCase()
    + (typeof e.className === 'string' && e.className.trim() ? '.' + e.className.trim().split(/\\s+/).join('.') : '');
  const out = [], seen = new Set();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const e = n.parentElement;
    if (!n.nodeValue.trim() || !e || seen.has(e)) continue;
    seen.add(e);
    if (e.closest('script, style, noscript, template, [aria-hidden="true"]')) continue;
    const s = getComputedStyle(e);
    if (s.visibility !== 'visible') continue;
    const range = document.createRange(); range.selectNodeContents(n);
    const r = range.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    const [bg, opacity] = behind(e);
    if (opacity < 0.05) continue;                        // not shown (a fold's closed content)
    const c = parse(s.color), fg = over([c[0], c[1], c[2], c[3] * opacity], bg);
    const [l1, l2] = [lum(fg), lum(bg)];
    out.push({text: n.nodeValue.trim().slice(0, 40), element: name(e),
              parent: e.parentElement ? name(e.parentElement) : '',
              ratio: Math.round((Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05) * 100) / 100,
              color: s.color, background: 'rgb(' + bg.slice(0, 3).map(Math.round).join(', ') + ')'});
  }
  return out;
}"""
def contrasts(page, open_folds) -> list[dict]:
    """Every visible text element of `page` with every fold of the page opened (solutions, hidden code and outputs
    are text a reader opens; the sidebar's too), its opening animation finished: text, element, parent, ratio, color,
    background."""
    open_folds(page, "details")
    page.wait_for_timeout(100)
    page.evaluate("() => document.getAnimations().forEach(a => a.finish())")
    return page.evaluate(_CONTRAST)


@pytest.mark.parametrize("mode", ["light", "dark"])
@pytest.mark.parametrize("doc", PAGES)
def test_every_text_is_readable(doc, mode, site, server, new_page, open_folds, screenshots):
    """At 1280 px, in `mode`: every visible text element of the page (folds opened) at >= MIN_RATIO:1."""
    page = new_page(mode=mode)
    page.goto(f"{server}/{doc}.html", wait_until="load")
    assert page.evaluate("() => document.documentElement.dataset.theme") == mode
    found = contrasts(page, open_folds)
    if mode == "dark":
        page.screenshot(path=str(screenshots / f"{doc.replace('/', '__')}-dark.png"))
    assert len(found) >= 50, f"{doc}: only {len(found)} text elements found"
    low = sorted((f for f in found if f["ratio"] < MIN_RATIO), key=lambda f: f["ratio"])
    print(f"{doc} ({mode}): {len(found)} text elements, lowest {min(f['ratio'] for f in found):.2f}:1")
    assert not low, (f"{doc} ({mode} mode): {len(low)} of {len(found)} text elements below {MIN_RATIO}:1, e.g.\n"
                     + "\n".join(f"  {f['ratio']:.2f}:1 {f['element']} in {f['parent']}: {f['text']!r} "
                                 f"({f['color']} on {f['background']})" for f in low[:8]))


def test_the_contrast_measure_sees_a_hidden_notice(site, server, new_page, open_folds):
    """The measure itself: text coloured like its own box (the dark-mode bug) reads 1.0:1, and text dimmed by an
    ancestor's opacity counts dimmed."""
    page = new_page()
    page.goto(f"{server}/{PAGES[0]}.html", wait_until="load")
    page.evaluate("""() => { const d = document.createElement('div'); d.innerHTML =
        '<div style="background:#222832;color:#222832"><p id="t1">hidden notice</p></div>' +
        '<div style="opacity:0.3"><p id="t2" style="color:#000;background:#fff">dimmed</p></div>';
        document.querySelector('article').prepend(d); }""")
    found = {f["text"]: f["ratio"] for f in contrasts(page, open_folds)}
    assert found["hidden notice"] == 1.0, found.get("hidden notice")
    assert found["dimmed"] < MIN_RATIO, found.get("dimmed")
