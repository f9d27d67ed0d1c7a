"""Browser test of the built site (needs `make book` first and Debian's chromium).

Not part of `pytest tests` (the unit run): it is collected only when named explicitly
(`pytest tests/browser`, which `make browser` does) or with ATTNLAB_BROWSER=1.
Settings: ATTNLAB_SITE (default _build/html), CHROMIUM (default /usr/bin/chromium),
ATTNLAB_SCREENSHOTS (default _build/screenshots).
"""
from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest

from attnlab.core import settings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
# Opens every fold (`<details>`) under `selector` (solutions, hidden cells and outputs, sections for researchers) and
# finishes their opening animations.
_OPEN_FOLDS = ("(selector) => { document.querySelectorAll(selector).forEach(d => { d.open = true; }); "
               "document.getAnimations().forEach(a => a.finish()); }")


def _named_explicitly(config) -> bool:
    for arg in config.args:
        path = Path(str(arg).split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if settings.get("ATTNLAB_BROWSER") or _named_explicitly(config):
        return None
    return collection_path.name.startswith("test_") or None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def site() -> Path:
    path = (settings.get("ATTNLAB_SITE") or ROOT / "_build" / "html").resolve()
    if not (path / "index.html").is_file():
        pytest.fail(f"no built site at {path}: run `make book` first")
    return path


@pytest.fixture(scope="session")
def screenshots() -> Path:
    path = settings.get("ATTNLAB_SCREENSHOTS") or ROOT / "_build" / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="session")
def server(site):
    """The built site over HTTP on 127.0.0.1, a free port."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _GzipHandler(_QuietHandler):
    """Serves text files gzip-compressed, as a static host (GitHub Pages, Netlify, nginx) does."""

    TEXT = {".html", ".js", ".css", ".json", ".svg", ".txt", ".map"}
    protocol_version = "HTTP/1.1"      # keep-alive, as a static host

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if path.suffix not in self.TEXT or "gzip" not in self.headers.get("Accept-Encoding", "") or not path.is_file():
            return super().send_head()
        import gzip
        import io

        body = gzip.compress(path.read_bytes(), 6)
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


@pytest.fixture(scope="session")
def gzip_server(site):
    """The built site over HTTP on 127.0.0.1 with gzip, as a static host serves it."""
    handler = functools.partial(_GzipHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    executable = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not Path(executable).exists():
        pytest.fail(f"{executable} not found: `apt-get install -y chromium` (or set CHROMIUM)")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )
        yield browser
        browser.close()


@pytest.fixture
def new_page(browser):
    """new_page(phone=False, mode=None, **context options) -> a page in a browser context of its own: DESKTOP, or with
    phone=True a PHONE (mobile, touch); mode "light" or "dark" chosen before the page loads. Every context it opened
    is closed when the test ends, passed or failed."""
    contexts = []

    def make(phone: bool = False, mode: str | None = None, **options):
        shape = dict(viewport=PHONE, is_mobile=True, has_touch=True) if phone else dict(viewport=DESKTOP)
        context = browser.new_context(**{**shape, **options})
        contexts.append(context)
        if mode:
            context.add_init_script(f"localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}');")
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def open_folds():
    """open_folds(page, selector="article details"): open every fold under `selector` of the page as loaded (folds
    closed on load hold figures, sliders and text too)."""
    return lambda page, selector="article details": page.evaluate(_OPEN_FOLDS, selector)
