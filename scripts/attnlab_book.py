"""Sphinx extension for the attnlab book (loaded by _config.yml: sphinx.local_extensions).

- One jupyter-cache per model, device, version of the package sources and of the libraries the chapters run
  on (``<ATTNLAB_CACHE_DIR, default ~/.cache/attnlab>/book-execution/<ATTNLAB_MODEL>-<ATTNLAB_DEVICE>-<hash>``,
  beside the Results): jupyter-cache keys notebooks by their code cells only, so without this a build with
  ATTNLAB_MODEL=gpt2, or after a change in attnlab/ or an upgrade of torch, would reuse outputs computed with
  another model, older code or other libraries. Outside the clone, so that a fresh clone of the same sources (as
  CI makes) reuses the chapters' executions; delete the folder to run every chapter again.
- The footer says which model setting built the site.
- MPLBACKEND=Agg (exported by the Makefile for the CLI) is dropped, so notebook kernels keep the
  inline backend and show their figures.
- Launch buttons (Colab, Binder) only on pages that are notebooks (.ipynb): Colab cannot open the MyST
  markdown pages (the landing page, the closing chapter), which keep their download button.
- After the build, ``_static/attnlab-build.json`` records the setting and the models the chapters
  reported (``attnlab.widgets.model_note`` tags pages with ``data-attnlab-model``);
  ``python scripts/book_info.py`` prints it.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

_TAG = re.compile(r'data-attnlab-model="([^"]*)"')


def _setting() -> tuple[str, str]:
    return os.environ.get("ATTNLAB_MODEL", "auto"), os.environ.get("ATTNLAB_DEVICE", "cpu")


# the libraries whose version can change what a chapter prints or draws (with Python's own version)
_LIBRARIES = ("torch", "transformers", "numpy", "scipy", "matplotlib", "numba", "entmax", "gguf", "accelerate",
              "tokenizers", "safetensors", "ipywidgets", "ipykernel", "myst-nb", "jupyter-cache")


def _environment() -> str:
    """Python's version and those of `_LIBRARIES` ("-" where one is not installed), one line."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "-"

    return " ".join([sys.version.split()[0], *(f"{name}={version(name)}" for name in _LIBRARIES)])


def _package_digest(root: Path) -> str:
    """Short hash of the attnlab package sources and `_environment`: chapter outputs depend on them too."""
    digest = hashlib.sha256(_environment().encode() + b"\0")
    for path in sorted((root / "attnlab").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _execution_caches() -> Path:
    """The folder of the chapters' execution caches: book-execution/ in attnlab's cache folder
    (`attnlab.core.text.cache_dir`: ATTNLAB_CACHE_DIR, default ~/.cache/attnlab; importing it loads no torch)."""
    from attnlab.core.text import cache_dir

    return cache_dir() / "book-execution"


def _cache_damage(path: Path) -> str:
    """What is wrong with the jupyter-cache folder `path`, "" when it is sound or absent: its database opened and
    read with jupyter_cache's API, and every cached record's notebook (executed/<hash>/base.ipynb) a regular file
    that reads as a valid notebook. A kill during a cache write, a garbage global.db or a deleted executed/ folder
    would otherwise fail every later build with a Sphinx exception that does not name the folder."""
    if not path.exists():
        return ""
    try:
        import nbformat
        from jupyter_cache import get_cache

        if not (path / "global.db").is_file():
            return "no global.db"
        cache = get_cache(path)
        for record in cache.list_cache_records():
            notebook = path / "executed" / record.hashkey / "base.ipynb"
            if not notebook.is_file():
                return f"{notebook.relative_to(path)} is missing"
            nbformat.validate(nbformat.reads(notebook.read_text(encoding="utf8"), nbformat.NO_CONVERT))
    except Exception as exc:  # noqa: BLE001 - any failure to read the cache is damage
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
    return ""


def _set_aside_if_damaged(path: Path) -> None:
    """Rename a damaged execution cache (`_cache_damage`) to <name>.damaged-<UTC time>, with one warning: the build
    then runs the chapters again into a fresh cache, and the damaged one is kept to look at."""
    why = _cache_damage(path)
    if not why:
        return
    import time

    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        path.rename(aside)
    except OSError as exc:
        raise RuntimeError(f"the book's execution cache {path} is damaged ({why}) and cannot be moved aside "
                           f"({exc.strerror or exc}): delete it") from None
    print(f"attnlab: warning: the book's execution cache {path} was damaged ({why}); moved it to {aside.name}, so "
          "every chapter runs again", file=sys.stderr)


def _config_inited(app, config) -> None:
    model, device = _setting()
    if not config.nb_execution_cache_path:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}-{device}")
        caches = _execution_caches()
        current = caches / f"{slug}-{_package_digest(Path(app.srcdir))}"
        # Caches of older package versions for this model/device are stale: drop them.
        for old in caches.glob(f"{glob.escape(slug)}-*"):
            if old != current and old.is_dir() and re.fullmatch(r"[0-9a-f]{12}", old.name[len(slug) + 1:]):
                shutil.rmtree(old, ignore_errors=True)
        config.nb_execution_cache_path = str(current)
        _set_aside_if_damaged(current)
    options = dict(config.html_theme_options or {})
    # the models' full names replace the setting once the pages are built (`_name_models`)
    note = (f'Figures computed with <span class="attnlab-footer-models">ATTNLAB_MODEL=<code>{model}</code></span> '
            f"on <code>{device}</code>.")
    options["extra_footer"] = (options.get("extra_footer") or "") + f"<p>{note}</p>"
    config.html_theme_options = options
    # The repository, set once: _config.yml, or ATTNLAB_REPOSITORY_URL where the site is published (the
    # pages workflow sets it to the repository it runs in). {{ repository }} in the pages names it, and
    # says how to run the book without it when this build could not reach it.
    repo = os.environ.get("ATTNLAB_REPOSITORY_URL") or options.get("repository_url") or ""
    options["repository_url"] = repo
    config.html_theme_options = options
    reached = _reachable(repo)
    if not reached:
        print(f"attnlab: warning: the repository {repo or '(none set)'} could not be reached from this build "
              "(no network, or not a public repository): the launch buttons and the chapters' setup cells "
              "point at it. Set ATTNLAB_REPOSITORY_URL, or repository.url in _config.yml, to the public "
              "repository the site is published from.", file=sys.stderr)
    shown = f"[{repo}]({repo})" if reached else (
        f"`{repo}`, which this build could not reach: if it does not answer, download each chapter with its "
        "download button, or ask whoever gave you this site for a copy")
    config.myst_substitutions = {**(config.myst_substitutions or {}), "repository": shown}


def _reachable(url: str, timeout: float = 4.0) -> bool:
    """True when `url` answers an HTTP HEAD request with a status below 400 within `timeout` seconds."""
    import urllib.error
    import urllib.request

    if not url.startswith("https://"):
        return False
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as r:
            return r.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


# The theme's template loads Font Awesome twice, as CSS + web fonts (what draws the icons) and as a
# 1.5 MB JavaScript that redraws them as SVG, and preloads three fonts whether a page uses them or not.
_HEAVY = re.compile(r'\s*<script src="[^"]*/fontawesome/[^"]*/js/all\.min\.js[^"]*"></script>'
                    r'|\s*<link rel="preload" as="font" type="font/woff2" crossorigin '
                    r'href="[^"]*/fontawesome/[^"]*" />')


def _lighten(page: Path) -> None:
    """Drop Font Awesome's JavaScript and font preloads from a built page (the CSS still draws the icons)."""
    text = page.read_text(encoding="utf-8")
    light = _HEAVY.sub("", text)
    if light != text:
        page.write_text(light, encoding="utf-8")


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    for page in outdir.rglob("*.html"):
        _lighten(page)
    pages = {}
    for page in sorted(outdir.rglob("*.html")):
        found = sorted(set(_TAG.findall(page.read_text(encoding="utf-8", errors="replace"))))
        if found:
            pages[page.relative_to(outdir).as_posix()] = found
    for page in outdir.rglob("*.html"):
        _number_figures(page, outdir)
        _images_as_files(page, outdir)
    model, device = _setting()
    _name_models(outdir, sorted({m for found in pages.values() for m in found}), model)
    info = {
        "model_setting": model,
        "device": device,
        "models_in_pages": pages,
        "models": sorted({m for found in pages.values() for m in found}),
    }
    static = outdir / "_static"
    static.mkdir(exist_ok=True)
    (static / "attnlab-build.json").write_text(json.dumps(info, indent=1) + "\n")


_CAPTION = '<figcaption class="attnlab-caption">'


def _number_figures(page: Path, outdir: Path) -> None:
    """Number the captions of attnlab's figures in page order: "Figure 4.2." in chapter 4 (book/04_*.html),
    "Figure 2." on pages outside the chapters."""
    text = page.read_text(encoding="utf-8")
    if _CAPTION not in text:
        return
    chapter = re.match(r"book/(\d+)_", page.relative_to(outdir).as_posix())
    prefix = f"{int(chapter.group(1))}." if chapter else ""
    parts = text.split(_CAPTION)
    numbered = parts[0] + "".join(
        f'{_CAPTION}<span class="attnlab-fig-number">Figure {prefix}{k}.</span> {rest}'
        for k, rest in enumerate(parts[1:], start=1))
    page.write_text(numbered, encoding="utf-8")


_DATA_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")
IMAGES = "_images/attnlab"


def _images_as_files(page: Path, outdir: Path) -> None:
    """Each PNG embedded in the page as a data URI (figures, their phone versions, slider frames) becomes a
    file, `_images/attnlab/<sha256>.png`, named by its content: a browser then fetches only the images it
    shows (a phone the phone versions, a slider the frames it is moved to), not every one at first load."""
    import base64

    text = page.read_text(encoding="utf-8")
    if "data:image/png;base64," not in text:
        return
    folder = outdir / IMAGES
    folder.mkdir(parents=True, exist_ok=True)
    up = "../" * (len(page.relative_to(outdir).parts) - 1)

    def to_file(match: re.Match) -> str:
        data = base64.b64decode(match.group(1))
        name = hashlib.sha256(data).hexdigest()[:20] + ".png"
        if not (folder / name).exists():
            (folder / name).write_bytes(data)
        return f"{up}{IMAGES}/{name}"

    page.write_text(_DATA_PNG.sub(to_file, text), encoding="utf-8")


_FOOTER_MODELS = re.compile(r'<span class="attnlab-footer-models">.*?</span>', re.S)


def _name_models(outdir: Path, models: list[str], setting: str) -> None:
    """The footer of every page names the models the pages were computed with, by their full names
    (the setting, e.g. auto, in brackets)."""
    from html import escape

    from attnlab.core.names import display_name

    if not models:
        return
    names = " and ".join(escape(display_name(m)) for m in models)
    span = f'<span class="attnlab-footer-models">{names} (model setting <code>{escape(setting)}</code>)</span>'
    for page in outdir.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        named = _FOOTER_MODELS.sub(span, text)
        if named != text:
            page.write_text(named, encoding="utf-8")


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated scripts (an inline one has filename None or ''): jupyter-book registers sphinx-thebe's
    configuration twice, and the second `const THEBE_JS_URL` is a JavaScript error on every page. Drop
    the saved ipywidgets state too: the site shows attnlab's own HTML sliders."""
    seen, kept = set(), []
    for script in context.get("script_files", []):
        if getattr(script, "attributes", {}).get("type") == "application/vnd.jupyter.widget-state+json":
            continue            # saved widget state: the site shows attnlab's HTML sliders instead
        name = (script.filename or "") if hasattr(script, "filename") else str(script)
        key = (name, tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    # A Makefile's MPLBACKEND=Agg would reach the notebook kernels and stop the inline backend
    # from showing figures; kernels started by myst-nb inherit this process's environment.
    if os.environ.get("MPLBACKEND", "").lower() == "agg":
        del os.environ["MPLBACKEND"]
    app.connect("config-inited", _config_inited)
    app.connect("build-finished", _build_finished)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.connect("html-page-context", _launch_only_notebooks, priority=502)     # after the theme's (501)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def _launch_only_notebooks(app, pagename, templatename, context, doctree) -> None:
    """Remove the theme's launch buttons from pages whose source is not an .ipynb (Colab opens notebooks only)."""
    if ".ipynb" not in (context.get("sourcename") or "") and context.get("header_buttons"):
        context["header_buttons"] = [b for b in context["header_buttons"] if b.get("label") != "launch-buttons"]
