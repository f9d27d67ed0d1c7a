"""Sphinx extension for the attnlab book (loaded by _config.yml: sphinx.local_extensions).

- One jupyter-cache per model, device, version of the package's code (comments and docstrings aside:
  `_code_digest`) and of the libraries the chapters run on
  (``<ATTNLAB_CACHE_DIR, default ~/.cache/attnlab>/book-execution/<ATTNLAB_MODEL>-<ATTNLAB_DEVICE>-<hash>``,
  beside the Results): jupyter-cache keys notebooks by their code cells only, so without this a build with
  ATTNLAB_MODEL=gpt2, or after a change in attnlab/ or an upgrade of torch, would reuse outputs computed with
  another model, older code or other libraries. Outside the clone, so that a fresh clone of the same sources (as
  CI makes) reuses the chapters' executions; delete the folder to run every chapter again.
- The footer says which model setting built the site.
- MPLBACKEND=Agg (exported by the Makefile for the CLI) is dropped, so notebook kernels keep the
  inline backend and show their figures.
- Launch buttons (Colab, Binder) only on pages that are notebooks (.ipynb): Colab cannot open the MyST
  markdown pages (the landing page, the closing chapter), which keep their download button.
- Progress in the terminal, not in the pages: a notebook kernel's stderr lands in its page, so the build points
  ``ATTNLAB_PROGRESS_LOG`` (which kernels inherit) at a file where ``attnlab.core.cache.announce`` writes one line
  per computed Result, and a thread copies the file's lines to this process's stderr (`_relay_progress`): it
  works without a terminal (CI), and a user who set ATTNLAB_PROGRESS_LOG follows that file instead.
- Chapters side by side (`_execute_ahead`): before Sphinx reads the pages, the chapters its execution cache lacks
  are executed two at a time (``ATTNLAB_BOOK_JOBS``, default 2 when the fill just ran or every Result the chapters
  used last time is stored, else 1: one at a time, by myst-nb as it reads each page) into that cache, as myst-nb would
  execute them;
  Sphinx then finds them cached. Two kernels never compute the same Result (`attnlab.core.cache.locked`).
- The Results first (`_fill_results`): before two or more chapters execute, `attnlab results compute --book` fills
  the Results of `attnlab.results.book_plan` (``ATTNLAB_BOOK_FILL``: serial, the default measured on 2 cores; auto
  or local:N on a local Dask cluster; off), so the chapters read them; they compute only a few cheap ones
  (`attnlab.results.BOOK_NOT_PLANNED`).
- After the build, ``_static/attnlab-build.json`` records the setting and the models the chapters
  reported (``attnlab.widgets.model_note`` tags pages with ``data-attnlab-model``);
  ``python scripts/book_info.py`` prints it.
"""
from __future__ import annotations

import ast
import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from attnlab.core import settings  # the ATTNLAB_* variables (standard library only: no torch)

_TAG = re.compile(r'data-attnlab-model="([^"]*)"')


#: `attnlab.core.cache.PROGRESS_ENV` (that module loads torch)
PROGRESS_ENV = settings.PROGRESS_LOG.name
#: the relay `setup` started: {"log": its file, "stop": its stop()}
_PROGRESS: dict = {}


def _relay_progress(log: Path, out=None, interval: float = 0.5):
    """Point PROGRESS_ENV at `log` (emptied) for this process and the kernels it starts, and copy each line
    written there to `out` (default stderr) from a daemon thread. Returns stop(): copies what is left, stops."""
    out = out or sys.stderr
    log.write_text("", encoding="utf-8")
    os.environ[PROGRESS_ENV] = str(log)
    done = threading.Event()
    src = open(log, encoding="utf-8")

    def copy() -> None:
        for line in iter(src.readline, ""):
            out.write(line)
        out.flush()

    def run() -> None:
        while not done.wait(interval):
            copy()

    thread = threading.Thread(target=run, name="attnlab-progress", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join()
        copy()
        src.close()

    return stop


def _setting() -> tuple[str, str]:
    return settings.get("ATTNLAB_MODEL"), settings.get("ATTNLAB_DEVICE")


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


def _code_digest(path: Path) -> bytes:
    """sha256 of a module's code: its syntax tree (`ast.dump`, which leaves out line numbers) without docstrings.
    A comment, a docstring, blank lines or a reformat keep it; any change to what the code does changes it."""
    tree = ast.parse(path.read_bytes())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).digest()


def _package_digest(root: Path) -> str:
    """Short hash of `_environment` and of the code of every attnlab module (path and `_code_digest`): chapter
    outputs depend on them, not on comments and docstrings (which no page shows)."""
    digest = hashlib.sha256(_environment().encode() + b"\0")
    for path in sorted((root / "attnlab").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + _code_digest(path))
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
            # a folder jupyter-cache has not set up yet (only the Results log: `_results_for_the_site`) is sound
            return "no global.db" if (path / "executed").exists() else ""
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
        # Caches of older package versions for this model/device are stale: drop them (what their chapters
        # read is kept for `_jobs`: the chapters of the new code most likely read the same Results).
        for old in caches.glob(f"{glob.escape(slug)}-*"):
            if old != current and old.is_dir() and re.fullmatch(r"[0-9a-f]{12}", old.name[len(slug) + 1:]):
                _USED_BEFORE.update(_results_used(old))
                shutil.rmtree(old, ignore_errors=True)
        config.nb_execution_cache_path = str(current)
        _set_aside_if_damaged(current)
    _results_for_the_site(Path(config.nb_execution_cache_path))
    options = dict(config.html_theme_options or {})
    # the models' full names replace the setting once the pages are built (`_name_models`)
    note = (f'Figures computed with <span class="attnlab-footer-models">ATTNLAB_MODEL=<code>{model}</code></span> '
            f"on <code>{device}</code>.")
    options["extra_footer"] = (options.get("extra_footer") or "") + f"<p>{note}</p>"
    config.html_theme_options = options
    # The repository, set once: _config.yml, or ATTNLAB_REPOSITORY_URL where the site is published (the
    # pages workflow sets it to the repository it runs in). {{ repository }} in the pages names it, and
    # says how to run the book without it when this build could not reach it.
    repo = settings.get("ATTNLAB_REPOSITORY_URL") or options.get("repository_url") or ""
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


def _results_for_the_site(execution_cache: Path) -> None:
    """The chapters' kernels (they inherit this process's environment) log the Results they read or write
    beside their execution cache, so a build that reuses the executions still knows which Results it shows
    (`_build_finished` publishes them); a build computes, it never fetches, unless ATTNLAB_RESULTS_URL is set."""
    from attnlab.core import published

    execution_cache.mkdir(parents=True, exist_ok=True)
    os.environ[published.LOG_ENV] = str(execution_cache / "results-used.txt")
    os.environ.setdefault(published.URL_ENV, "off")


# ------------------------------------------------------------------ chapters side by side (`_execute_ahead`)

#: how many chapters execute at once (`_jobs`)
JOBS_ENV = settings.BOOK_JOBS.name
#: the Results the chapters of this model/device's dropped execution caches read (`_config_inited`)
_USED_BEFORE: set = set()


def _results_used(execution_cache: Path) -> set:
    """The results-cache entries the chapters executed into `execution_cache` read or wrote (its Results log,
    `_results_for_the_site`); empty when there is none."""
    try:
        return set((execution_cache / "results-used.txt").read_text().split())
    except OSError:
        return set()


def _is_stored(store, entry: str) -> bool:
    """The results-store entry `<name>-<key hash>` holds its Result (`<name>.json`, what `core.cache.stored` reads;
    its key file may be missing where a run stopped between the two writes). `store`: a `core.store.Store`."""
    return store.exists(f"{entry}/{entry.rsplit('-', 1)[0]}.json")


def _jobs(used: set, results, cpus: int, filled: bool = False) -> tuple[int, str]:
    """(how many chapters to execute at once, why, for the terminal). JOBS_ENV when set (a positive integer; 1:
    one at a time, as myst-nb does alone); else min(2, `cpus`) when the fill just stored what the chapters read
    (`filled`: `_fill_results` finished; they compute only the cheap `attnlab.results.BOOK_NOT_PLANNED`), or when
    every Result in `used` (what the chapters read last time) is stored in the results store `results` (a path or
    URL): the chapters then read them and draw, on one torch thread each (`attnlab.book`), so two of them fill two
    cores. Else 1: a chapter that computes Results takes every free core (`attnlab.core.util.auto_threads`), and a
    second one beside it would only halve its speed."""
    chosen = settings.get(JOBS_ENV)             # a ValueError of one line when it is not a positive integer
    if chosen is not None:
        return chosen, f"{JOBS_ENV}={chosen}"
    if filled:
        from attnlab.results import BOOK_NOT_PLANNED

        return min(2, cpus), (f"the fill just stored the Results the chapters read; they compute only "
                              f"{', '.join(BOOK_NOT_PLANNED)}, seconds each")
    if not used:
        return 1, f"no record of the Results the chapters read (set {JOBS_ENV}=2 to run two at a time anyway)"
    from attnlab.core.store import Store

    store = Store(results)
    absent = sorted(entry for entry in used if not _is_stored(store, entry))
    if absent:
        return 1, (f"{len(absent)} of the {len(used)} Results the chapters read last time are not stored, e.g. "
                   f"{absent[0]} (set {JOBS_ENV}=2 to run two at a time anyway)")
    return min(2, cpus), f"the {len(used)} Results the chapters read last time are stored"


def _say(line: str) -> None:
    """One line for the terminal (stderr), or for the progress log a user chose instead (PROGRESS_ENV set before
    the build: `setup`)."""
    path = settings.get(PROGRESS_ENV)
    if path and path != _PROGRESS.get("log"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    else:
        print(line, file=sys.stderr, flush=True)


def _as_myst_nb_reads(path: Path, nb_config, md_config):
    """(the notebook, its read format for jupyter-cache) of the page at `path` as myst-nb hands it to its execution
    client (its reader for the file, .ipynb or MyST markdown with a kernel; the kernel aliases of its
    configuration), or None when myst-nb would not execute it from the cache: not a notebook, excluded from
    execution, or given its own settings in its metadata (a `mystnb` key)."""
    from pathlib import PurePosixPath

    from myst_nb.core.read import create_nb_reader

    if any(PurePosixPath(path.as_posix()).match(pattern) for pattern in nb_config.execution_excludepatterns):
        return None
    text = path.read_text(encoding="utf-8")
    reader = create_nb_reader(str(path), md_config, nb_config, text)
    if reader is None:
        return None
    notebook = reader.read(text)
    if nb_config.metadata_key in notebook.metadata:
        return None
    kernel = notebook.metadata.get("kernelspec", {}).get("name")
    for pattern, alias in nb_config.kernel_rgx_aliases.items():
        if kernel is not None and re.fullmatch(pattern, kernel):
            notebook.metadata["kernelspec"]["name"] = alias
            break
    return notebook, reader.read_fmt


def _stale(paths: list, nb_config, md_config) -> list:
    """[(path, notebook, read format)] of the pages at `paths` that myst-nb would execute (`_as_myst_nb_reads`) and
    whose execution is not in the jupyter-cache of `nb_config` (matched as myst-nb matches them: by their code
    cells and kernel)."""
    from jupyter_cache import get_cache

    cache = get_cache(nb_config.execution_cache_path)
    out = []
    for path in paths:
        read = _as_myst_nb_reads(path, nb_config, md_config)
        if read is None:
            continue
        try:
            cache.match_cache_notebook(read[0])
        except KeyError:
            out.append((path, *read))
    return out


def _kernel_config():
    """traitlets config for the chapters' kernels (`_execute_into_cache`): the kernel manager provisions CurveZMQ
    keys where the kernelspec declares support (jupyter_client's ``KernelManager.transport_encryption = "auto"``,
    the transport-encryption JEP), so ipykernel's "Kernel is running over TCP without encryption" warning, one per
    kernel, has no cause to print. Empty (TCP as before, with its warning) where pyzmq lacks CurveZMQ or
    jupyter_client lacks the setting."""
    import zmq
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    if not zmq.has("curve") or not KernelManager.class_traits().get("transport_encryption"):
        return Config()
    return Config({"KernelManager": {"transport_encryption": "auto"}})


def _execute_into_cache(stale: list, nb_config, jobs: int, root: Path) -> None:
    """Execute the [(path, notebook, read format)] of `stale` (`_stale`), `jobs` kernels at a time (nbclient's
    asynchronous client, one event loop), each as myst-nb's cache mode would (jupyter_cache's
    `single_nb_execution`: nbclient in the notebook's folder, or a temporary one, with myst-nb's timeout and
    allow_errors, which a notebook's own `execution` metadata overrides; CurveZMQ where the kernel offers it:
    `_kernel_config`), and store each success in the jupyter-cache as myst-nb does. One line per chapter as it
    starts and as it ends (`_say`). A chapter that fails is not stored: myst-nb runs it again as it reads the page,
    and reports its error there."""
    import asyncio
    import tempfile
    import time
    import traceback

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from jupyter_cache.cache.db import NbProjectRecord
    from nbclient import NotebookClient

    cache, kernels = get_cache(nb_config.execution_cache_path), _kernel_config()

    async def one(path: Path, notebook, read_fmt, slots: asyncio.Semaphore) -> None:
        async with slots:
            name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
            meta = notebook.metadata.get("execution", {})
            stage = cache.add_nb_to_project(str(path), **({"read_data": read_fmt} if read_fmt else {}))
            NbProjectRecord.remove_tracebacks([stage.pk], cache.db)
            _say(f"attnlab: executing {name}")
            t0, failed = time.perf_counter(), None
            with (tempfile.TemporaryDirectory() if nb_config.execution_in_temp
                  else contextlib.nullcontext(str(path.parent))) as cwd:
                client = NotebookClient(notebook, timeout=meta.get("timeout", nb_config.execution_timeout),
                                        allow_errors=meta.get("allow_errors", nb_config.execution_allow_errors),
                                        record_timing=False, resources={"metadata": {"path": os.path.abspath(cwd)}},
                                        config=kernels)
                try:
                    await client.async_execute()
                except Exception as exc:  # noqa: BLE001 - a cell's error, a timeout, a dead kernel: myst-nb's to report
                    failed = type(exc).__name__
                    NbProjectRecord.set_traceback(stage.uri, traceback.format_exc(), cache.db)
            seconds = time.perf_counter() - t0
            if failed:
                _say(f"attnlab: {name} failed ({failed}) after {seconds:.1f} s; Sphinx runs it again to report it")
                return
            cache.cache_notebook_bundle(CacheBundleIn(notebook, stage.uri, data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            _say(f"attnlab: executed {name} in {seconds:.1f} s")

    async def run_all() -> None:
        slots = asyncio.Semaphore(jobs)
        await asyncio.gather(*(one(path, notebook, read_fmt, slots) for path, notebook, read_fmt in stale))

    with _kernel_threads(jobs):
        asyncio.run(run_all())


#: the thread counts of kernels that run side by side (`_kernel_threads`)
SIDE_BY_SIDE_THREADS = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


@contextlib.contextmanager
def _kernel_threads(jobs: int):
    """With `jobs` > 1, the kernels started inside run torch and numba on one thread each (SIDE_BY_SIDE_THREADS, as
    the user's own OMP_NUM_THREADS / NUMBA_NUM_THREADS where set): what a chapter still computes (`book.heavy`, e.g.
    chapter 10's solutions) would else take two threads beside another kernel's two, and OpenMP's spinning waits on 2
    cores made it 3x slower than one thread each (BENCHMARKS.md). The build's own environment is restored after."""
    users = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
             "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS")}
    chosen = {k: v for k, v in SIDE_BY_SIDE_THREADS.items() if jobs > 1 and not users[k]}
    os.environ.update(chosen)
    try:
        yield
    finally:
        for k in chosen:
            os.environ.pop(k, None)


#: how the build fills the chapters' Results before it executes them (`_fill_results`): off, serial, auto, local:N
FILL_ENV = settings.BOOK_FILL.name
# Serial on this 2-core machine: one model's plan (MiniLM's book window set, 8 tasks, 48 Results) filled into an
# empty store took 6 min 19 s serially and 10 min 25 s on local:2 (BENCHMARKS.md, "The book's fill"): two one-thread
# workers do not beat one process on both cores here. `auto` (a worker per core, as memory allows) is for more cores.
DEFAULT_FILL = "serial"


def _fill_results(n_stale: int) -> bool:
    """Before `n_stale` (>= 2) chapters execute: compute the Results they read that `attnlab.results.book_plan`
    plans, into the results store (`attnlab results compute --book`, in a process of its own so that this one holds
    no model), serially or on a local Dask cluster (FILL_ENV); the chapters then read them. A fill that fails says
    so in one line and the chapters compute what is missing. True when the fill ran to its end."""
    import subprocess
    import time

    how = settings.get(FILL_ENV) or DEFAULT_FILL
    if how == "off":
        return False
    model, device = _setting()
    command = [sys.executable, "-m", "attnlab", "results", "compute", "--book", "--model", model, "--device",
               device, "--quiet"] + ([] if how == "serial" else ["--cluster", how])
    _say(f"attnlab: filling the Results the chapters read ({how}; {FILL_ENV}=off: no fill) before {n_stale} "
         "chapters execute")
    t0 = time.perf_counter()
    from attnlab.core import published

    env = {k: v for k, v in os.environ.items() if k != published.LOG_ENV}     # the record is what chapters read
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = done.stdout.splitlines()
    computed = sum(int(m.group(1)) for m in (re.search(r"(\d+) computed$", x) for x in lines) if m)
    took = time.perf_counter() - t0
    if done.returncode:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        _say(f"attnlab: the fill stopped after {took:.0f} s ({why}); the chapters compute what is missing")
        return False
    _say(f"attnlab: filled {len(lines)} tasks in {took:.0f} s ({computed} Results computed, the rest stored)")
    return True


def _execute_ahead(app, env, docnames) -> None:
    """Sphinx's env-before-read-docs: fill the chapters' Results first (`_fill_results`), then with `_jobs` > 1,
    execute the chapters among `docnames` that the execution cache lacks that many at a time
    (`_execute_into_cache`), so that myst-nb then finds every one cached."""
    nb_config = getattr(env, "mystnb_config", None)
    if nb_config is None or nb_config.execution_mode != "cache":
        return
    stale = _stale([Path(env.doc2path(name)) for name in docnames], nb_config, env.myst_config)
    if len(stale) < 2:
        return
    filled = _fill_results(len(stale))
    from attnlab.core.published import results_dir

    used = _USED_BEFORE | _results_used(Path(nb_config.execution_cache_path))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs, why = _jobs(used, results_dir(), cpus, filled)
    if jobs < 2:
        _say(f"attnlab: {len(stale)} notebooks to execute, one at a time ({why})")
        return
    _say(f"attnlab: {len(stale)} notebooks to execute, {jobs} at a time ({why}; {JOBS_ENV}=1: one at a time)")
    _execute_into_cache(stale, nb_config, jobs, Path(app.srcdir))


def _executed_copies(app, exception) -> None:
    """Make each executed copy myst-nb writes (``<outdir>/../jupyter_execute/<page>.ipynb``) hold the outputs its
    page shows. myst-nb writes the notebook it was handed: executed in place when it runs the notebook itself, but
    the *unexecuted* source when the jupyter-cache serves it (it merges the cached outputs into a copy it renders).
    So a build served from the cache (as `_execute_ahead` makes every build) left the committed outputs there, and
    scripts/check_outputs.py compared the committed notebooks with themselves. Here every page the cache holds is
    merged again, as myst-nb merges it, and written over its copy (Sphinx's build-finished, any builder)."""
    if exception is not None:
        return
    env = app.env
    nb_config = getattr(env, "mystnb_config", None)
    if nb_config is None or nb_config.execution_mode != "cache":
        return
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(nb_config.execution_cache_path)
    folder = Path(app.outdir).parent / "jupyter_execute"
    for docname in sorted(env.found_docs):
        copy = folder.joinpath(*docname.split("/")).with_suffix(".ipynb")
        read = _as_myst_nb_reads(Path(env.doc2path(docname)), nb_config, env.myst_config) if copy.is_file() else None
        if read is None:
            continue
        try:
            _, merged = cache.merge_match_into_notebook(read[0])
        except KeyError:            # not in the cache: myst-nb executed it in place, its copy has the outputs
            continue
        copy.write_text(nbformat.writes(merged), encoding="utf-8")


def _publish_results(outdir: Path) -> None:
    """Copy the Results the chapters used into the site (`attnlab.core.published`), and say how much."""
    from attnlab.core import published
    from attnlab.core.cache import results_dir

    log = settings.get(published.LOG_ENV)
    if log:
        print(published.publish_log(Path(log), results_dir(), outdir), file=sys.stderr)


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



def _stop_progress(app, exception) -> None:
    """Copy the last progress lines, stop the relay and remove its file."""
    stop, log = _PROGRESS.pop("stop", None), _PROGRESS.pop("log", None)
    if stop is not None:
        stop()
        os.environ.pop(PROGRESS_ENV, None)
        Path(log).unlink(missing_ok=True)


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
    _publish_results(outdir)


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
    if not settings.get(PROGRESS_ENV):
        fd, log = tempfile.mkstemp(prefix="attnlab-progress-", suffix=".log")
        os.close(fd)
        _PROGRESS.update(log=log, stop=_relay_progress(Path(log)))
    app.connect("config-inited", _config_inited)
    app.connect("env-before-read-docs", _execute_ahead)
    app.connect("build-finished", _stop_progress, priority=100)
    app.connect("build-finished", _build_finished)
    app.connect("build-finished", _executed_copies)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.connect("html-page-context", _launch_only_notebooks, priority=502)     # after the theme's (501)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def _launch_only_notebooks(app, pagename, templatename, context, doctree) -> None:
    """Remove the theme's launch buttons from pages whose source is not an .ipynb (Colab opens notebooks only)."""
    if ".ipynb" not in (context.get("sourcename") or "") and context.get("header_buttons"):
        context["header_buttons"] = [b for b in context["header_buttons"] if b.get("label") != "launch-buttons"]
