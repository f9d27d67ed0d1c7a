"""Every page of the built book loads offline with no console errors, shows its images and math,
and every kernel-free slider changes the figure when moved. Run with `make browser`."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = Path(__file__).resolve().parent.parent.parent
CHAPTER = re.compile(r"^book/(\d\d_[^/]+|_demo)$")  # chapters, and the pipeline demo
KERNEL_FREE = ".attnlab-frames"  # attnlab.widgets.KERNEL_FREE_CLASS

# Known harmless console errors of jupyter-book 1.x pages, matched precisely:
# (kind, regular expression on the text, regular expression on the source URL or "").
# Console warnings are not failures (embed-amd.js logs ajv "strict mode: use allowUnionTypes ..."
# twice per widget page), except this project's own ("attnlab: ..." from widgets_setup.js).
ALLOWED = [
    # jupyter-book emits the sphinx-thebe inline script twice on notebook pages.
    ("pageerror", r"^Identifier 'THEBE_JS_URL' has already been declared$", r""),
    # pydata-sphinx-theme before a theme mode is stored in localStorage.
    ("error", r"^Got invalid theme mode: \. Resetting to auto\.$", r"/_static/scripts/pydata-sphinx-theme\.js"),
    # The browser asks for /favicon.ico; the book has none.
    ("error", r"^Failed to load resource: the server responded with a status of 404 \(File not found\)$",
     r"/favicon\.ico$"),
]


def _toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections"))
            for part in entry.get("parts", []):
                walk(part.get("chapters"))

    walk(toc.get("chapters"))
    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return [re.sub(r"\.(ipynb|md)$", "", p) for p in pages]


PAGES = _toc_pages()


def _allowed(kind: str, text: str, url: str) -> bool:
    return any(k == kind and re.search(t, text) and re.search(u, url or "") for k, t, u in ALLOWED)


def test_every_chapter_is_in_the_toc():
    chapters = sorted(p.relative_to(ROOT).with_suffix("").as_posix()
                      for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    missing = [c for c in chapters if c not in PAGES]
    assert not missing, f"chapters not listed in _toc.yml (so not built): {missing}"


@pytest.mark.parametrize("doc", PAGES)
def test_page(doc, site, server, browser, screenshots):
    html_file = site / f"{doc}.html"
    assert html_file.is_file(), f"{html_file} was not built"
    source = html_file.read_text(encoding="utf-8")
    has_widgets = "application/vnd.jupyter.widget-state+json" in source
    has_math = bool(re.search(r'class="[^"]*\bmath\b', source))
    is_chapter = bool(CHAPTER.match(doc))
    name = doc.replace("/", "__")

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    foreign, problems = [], []

    def route(route):
        url = route.request.url
        if urlparse(url).scheme in ("http", "https") and urlparse(url).hostname != "127.0.0.1":
            foreign.append(url)
            route.abort()
        else:
            route.continue_()

    context.route("**/*", route)
    page = context.new_page()

    def on_console(msg):
        if msg.type == "error" or (msg.type == "warning" and msg.text.startswith("attnlab:")):
            url = (msg.location or {}).get("url", "")
            if not _allowed(msg.type, msg.text, url):
                problems.append(f"console {msg.type}: {msg.text} ({url})")

    page.on("console", on_console)
    page.on("pageerror", lambda err: None if _allowed("pageerror", str(err.message), "")
            else problems.append(f"page error: {err.message}"))
    try:
        response = page.goto(f"{server}/{doc}.html", wait_until="load")
        assert response is not None and response.ok, f"{doc}: HTTP {response and response.status}"

        if has_math or is_chapter:
            page.wait_for_selector("mjx-container", state="attached", timeout=30_000)
            page.evaluate("() => window.MathJax.startup.promise")
            assert page.locator("mjx-merror").count() == 0, f"{doc}: MathJax reports errors"
            assert page.locator("mjx-container").count() > 0
        if has_widgets:
            page.wait_for_selector(".widget-slider .noUi-handle", timeout=30_000)

        images = page.evaluate("""() => Array.from(document.images).map(
            img => ({src: img.currentSrc.slice(0, 80), ok: img.complete && img.naturalWidth > 0}))""")
        broken = [i["src"] for i in images if not i["ok"]]
        assert not broken, f"{doc}: images that did not load: {broken}"
        if is_chapter:
            assert images, f"{doc}: a chapter without any figure"

        boxes = page.locator(KERNEL_FREE)
        if is_chapter:
            assert boxes.count() >= 1, (
                f"{doc}: every chapter needs at least one kernel-free slider "
                "(attnlab.widgets.frame_slider / frame_slider_2d)")
        for b in range(boxes.count()):
            box = boxes.nth(b)
            box.scroll_into_view_if_needed()
            handles = box.locator(".widget-slider .noUi-handle")
            assert handles.count() >= 1, f"{doc}: kernel-free slider {b} has no slider"
            for h in range(handles.count()):
                image = box.locator("img.widget-image").first
                before = image.get_attribute("src")
                readout = box.locator(".widget-readout").nth(h).inner_text()
                handles.nth(h).focus()
                page.keyboard.press("ArrowRight")
                try:
                    page.wait_for_function(
                        "([box, src]) => { const i = box.querySelector('img.widget-image');"
                        " return i && i.getAttribute('src') !== src && i.complete && i.naturalWidth > 0; }",
                        arg=[box.element_handle(), before], timeout=10_000)
                except PlaywrightTimeout:
                    pytest.fail(f"{doc}: moving slider {h} of kernel-free slider {b} "
                                f"(readout {readout!r}) did not change the figure")
                after = box.locator(".widget-readout").nth(h).inner_text()
                assert after != readout, f"{doc}: slider {b}.{h} readout stayed at {readout!r}"
            box.screenshot(path=str(screenshots / f"{name}-slider{b}.png"))

        page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }")
        page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
        assert not foreign, f"{doc}: requests to other hosts: {foreign}"
        assert not problems, f"{doc}:\n" + "\n".join(problems)
    finally:
        context.close()
