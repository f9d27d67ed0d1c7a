"""Every `ATTNLAB_*` environment variable, declared once (`Setting`: name, default, meaning, parser, where it is
documented), and the one way to read one: `get("ATTNLAB_MODEL")`, from the environment at call time (tests and
chapters set variables after importing attnlab). `attnlab info --settings` prints them; scripts/settings_table.py
writes the README's table from `ALL`; tests/test_settings.py checks that no other module reads one.

Imports nothing but the standard library (no torch): the CLI and the book's Sphinx extension read it early.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional


def _path(raw: str) -> Path:
    return Path(raw).expanduser()


def _path_or_url(raw: str):
    """A path (`_path`), or a URL ("scheme://...", kept as text: `core.store` opens it with fsspec)."""
    return raw.strip() if "://" in raw else _path(raw)


def _book_fill(raw: str) -> Optional[str]:
    """"off", "serial", "auto" or "local:N" (N >= 1); None for "" (the default)."""
    chosen = raw.strip().lower()
    if not chosen:
        return None
    if chosen in ("0", "no", "none"):
        return "off"
    head, _, n = chosen.partition(":")
    if chosen in ("off", "serial", "auto") or (head == "local" and n.isdigit() and int(n) >= 1):
        return chosen
    raise ValueError(f"must be off, serial, auto or local:N, got {raw.strip()!r}")


def _path_or_none(raw: str) -> Optional[Path]:
    return Path(raw).expanduser() if raw else None


def _url_or_off(raw: str) -> Optional[str]:
    """A site root ending in "/", or None for "", "off", "0", "none" (never fetch)."""
    url = raw.strip()
    if not url or url.lower() in ("off", "0", "none"):
        return None
    return url if url.endswith("/") else url + "/"


def _user_cache() -> Path:
    """attnlab's folder in the user's cache (platformdirs: ~/.cache/attnlab on Linux, or $XDG_CACHE_HOME/attnlab;
    ~/Library/Caches/attnlab on macOS; %LOCALAPPDATA%\\attnlab\\Cache on Windows)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("attnlab", appauthor=False))


def _positive_int(raw: str) -> Optional[int]:
    chosen = raw.strip()
    if not chosen:
        return None
    if not chosen.isdigit() or int(chosen) < 1:
        raise ValueError(f"must be a positive integer (1: one chapter at a time), got {chosen!r}")
    return int(chosen)


@dataclass(frozen=True)
class Setting:
    """One variable. `default`: the raw value used when it is unset (parsed like a set one); where there is none,
    `get` returns `fallback()` (a default computed per platform) or None, and `unset` says what happens then.
    `documented`: the file that explains it further, or the README's section ("README.md#<its anchor>")."""

    name: str
    meaning: str = ""
    documented: str = ""
    default: Optional[str] = None
    unset: str = ""
    parse: Callable[[str], Any] = str
    fallback: Optional[Callable[[], Any]] = None

    def raw(self) -> Optional[str]:
        """The value as set in the environment now, None when unset."""
        return os.environ.get(self.name)

    def get(self) -> Any:
        """The parsed value now (None: unset without a default). An invalid value raises one line, ValueError
        "ATTNLAB_X must be ...". """
        raw = self.raw()
        raw = self.default if raw is None else raw
        if raw is None:
            return None if self.fallback is None else self.fallback()
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.name} {exc}") from None

    @property
    def shown_default(self) -> str:
        """The default as a person reads it: the raw default, else what unset means."""
        return self.unset if self.default is None else self.default


_README = "README.md#"

MODEL = Setting(
    "ATTNLAB_MODEL", default="auto", documented=_README + "running-on-a-gpu",
    meaning="the chapters' model (attnlab.book, the book build): auto (GPT-2 if available, else the offline models "
    "in the model table's order) or a named model (attnlab/core/model_table.py), a hub id, a folder or a .gguf "
    "file; the CLI takes --model")
DEVICE = Setting(
    "ATTNLAB_DEVICE", default="cpu", documented=_README + "running-on-a-gpu",
    meaning="the chapters' device: cpu, cuda or cuda:N; the CLI takes --device")
DATA_DIR = Setting(
    "ATTNLAB_DATA_DIR", unset="download, or the cache", parse=_path_or_none,
    documented=_README + "running-offline-the-data-directory",
    meaning="offline data folder (war_and_peace.txt, gpt2-tokenizer/, wikitext-2-raw/): corpora and the GPT-2 "
    "tokenizer are read there, never downloaded")
CACHE_DIR = Setting(
    "ATTNLAB_CACHE_DIR", unset="the user's cache folder (platformdirs): ~/.cache/attnlab on Linux", parse=_path,
    fallback=_user_cache, documented=_README + "where-things-live",
    meaning="attnlab's cache folder: downloaded corpora, Results (results/), the chapters' executions "
    "(book-execution/), compiled kernels (numba/), de-quantized models")
RESULTS_DIR = Setting(
    "ATTNLAB_RESULTS_DIR", unset="$ATTNLAB_CACHE_DIR/results", parse=_path_or_url, documented="attnlab/core/store.py",
    meaning="the results store: every computed Result under its key; a folder, or an fsspec URL (file://, s3://, "
    "...) that a cluster's workers, the CLI and the book share")
RESULTS_URL = Setting(
    "ATTNLAB_RESULTS_URL", unset="never fetch", parse=_url_or_off, documented=_README + "publishing-the-site",
    meaning="the site to fetch a missing Result from (sha256-checked) instead of computing it; \"off\": never fetch. "
    "The chapters' setup cell sets the book's site; the book build sets off")
RESULTS_LOG = Setting(
    "ATTNLAB_RESULTS_LOG", unset="no log", documented="attnlab/core/published.py",
    meaning="a file where every Result read or written is logged (the book build sets it for the chapters' kernels "
    "and publishes those Results)")
PROGRESS_LOG = Setting(
    "ATTNLAB_PROGRESS_LOG", unset="stderr", documented=_README + "where-things-live",
    meaning="a file where each computed Result's line (\"attnlab: computed ...\") is appended (the book build sets it "
    "and copies the lines to its terminal)")
KERNELS = Setting(
    "ATTNLAB_KERNELS", default="1", parse=lambda raw: raw != "0", documented="attnlab/normalization/metrics/engine.py",
    meaning="0: plain torch instead of the numba kernels on CPU (the path GPUs take)")
SYNC_DEBUG = Setting(
    "ATTNLAB_SYNC_DEBUG", default="0", parse=lambda raw: raw == "1", documented=_README + "running-on-a-gpu",
    meaning="1: the metric tiles raise on any host sync on CUDA (scripts/gpu_check.sh)")
BOOK_JOBS = Setting(
    "ATTNLAB_BOOK_JOBS", unset="1 or 2", parse=_positive_int, documented=_README + "where-things-live",
    meaning="how many chapters the book build executes at once, a positive integer (unset: 2 when the build's fill "
    "just ran or every Result the chapters read last time is stored, else 1)")
BOOK_FILL = Setting(
    "ATTNLAB_BOOK_FILL", unset="serial", parse=_book_fill, documented="scripts/attnlab_book.py",
    meaning="how the book build fills the chapters' Results before it executes them (`attnlab.results.book_plan`): "
    "serial (one process, every core), auto (a local Dask cluster of as many workers as cores and memory allow), "
    "local:N, or off (the chapters compute what they read)")
REPOSITORY_URL = Setting(
    "ATTNLAB_REPOSITORY_URL", unset="_config.yml's repository.url", documented=_README + "publishing-the-site",
    meaning="the repository the site's launch buttons and pages name (the pages workflow sets the one it runs in)")
INSTALL = Setting(
    "ATTNLAB_INSTALL", unset="_config.yml's repository", documented="scripts/setup_cells.py",
    meaning="what a chapter's setup cell installs when attnlab is missing: a wheel, a folder, any pip requirement "
    "(read by the cell itself: attnlab is not installed yet)")
BROWSER = Setting(
    "ATTNLAB_BROWSER", default="0", parse=lambda raw: raw == "1", documented="tests/browser/conftest.py",
    meaning="1: a plain pytest run collects the browser tests (tests/browser) too")
SITE = Setting(
    "ATTNLAB_SITE", unset="_build/html", parse=_path, documented="tests/browser/conftest.py",
    meaning="the built site the browser tests open")
SCREENSHOTS = Setting(
    "ATTNLAB_SCREENSHOTS", unset="_build/screenshots", parse=_path, documented="tests/browser/conftest.py",
    meaning="where the browser tests save screenshots")
COLAB_NOTEBOOK = Setting(
    "ATTNLAB_COLAB_NOTEBOOK", unset="book/01_vanishing.ipynb", parse=_path, documented="tests/colab/test_fresh_venv.py",
    meaning="the chapter the Colab-style test runs (make colab)")

FRESH_VENV_TEST = Setting(
    "ATTNLAB_FRESH_VENV_TEST", unset="the test is skipped", parse=lambda raw: raw.strip() == "1",
    documented="tests/test_cli.py", meaning="1: run the opt-in test of the README's researcher path in a fresh venv "
    "(pip installs the package with constraints.txt: minutes)")

CHECK_NOTEBOOKS = Setting(
    "ATTNLAB_CHECK_NOTEBOOKS", unset="the committed chapters in book/", parse=lambda raw: raw.strip() or None,
    documented="tests/test_exercise_checks.py", meaning="a folder of executed chapters (a build's copies) whose "
    "check cells and solutions tests/test_exercise_checks.py compares")

ALL = (MODEL, DEVICE, DATA_DIR, CACHE_DIR, RESULTS_DIR, RESULTS_URL, RESULTS_LOG, PROGRESS_LOG, KERNELS, SYNC_DEBUG,
       BOOK_JOBS, BOOK_FILL, REPOSITORY_URL, INSTALL, BROWSER, SITE, SCREENSHOTS, COLAB_NOTEBOOK, FRESH_VENV_TEST,
       CHECK_NOTEBOOKS)
BY_NAME = {s.name: s for s in ALL}


def get(name: str) -> Any:
    """The value of the declared variable `name` now (`Setting.get`); KeyError for an undeclared one."""
    return BY_NAME[name].get()
