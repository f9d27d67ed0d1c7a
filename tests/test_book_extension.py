"""scripts/attnlab_book.py, the site's Sphinx extension: the repository set once and checked, the footer's
model names."""
import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("attnlab_book", ROOT / "scripts" / "attnlab_book.py")
ext = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ext)


def _config(url):
    # an execution cache path already set: _config_inited then leaves the cache alone (no app needed)
    return SimpleNamespace(nb_execution_cache_path="set-by-the-test", myst_substitutions={},
                           html_theme_options={"repository_url": url})


def test_an_unreachable_repository_is_said_once_on_stderr_and_on_the_page(monkeypatch, capsys):
    monkeypatch.setattr(ext, "_reachable", lambda url, timeout=4.0: False)
    monkeypatch.delenv("ATTNLAB_REPOSITORY_URL", raising=False)
    config = _config("https://github.com/someone/attnlab")
    ext._config_inited(None, config)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attnlab: warning: the repository https://github.com/someone/attnlab" in err
    assert "could not reach" in config.myst_substitutions["repository"]


def test_the_publish_step_sets_the_repository(monkeypatch, capsys):
    monkeypatch.setattr(ext, "_reachable", lambda url, timeout=4.0: url == "https://github.com/me/fork")
    monkeypatch.setenv("ATTNLAB_REPOSITORY_URL", "https://github.com/me/fork")
    config = _config("https://github.com/someone/attnlab")
    ext._config_inited(None, config)
    assert config.html_theme_options["repository_url"] == "https://github.com/me/fork"   # the launch buttons
    assert config.myst_substitutions["repository"] == "[https://github.com/me/fork](https://github.com/me/fork)"
    assert capsys.readouterr().err == ""


def test_reachable_refuses_what_is_not_an_https_url_and_gives_up_quickly():
    assert not ext._reachable("") and not ext._reachable("http://example.com")
    t0 = time.perf_counter()
    assert not ext._reachable("https://nothing-here.invalid", timeout=2.0)     # .invalid never resolves
    assert time.perf_counter() - t0 < 30


def test_the_footer_names_the_models_the_pages_were_computed_with(tmp_path):
    page = tmp_path / "a.html"
    page.write_text('<p>Figures computed with <span class="attnlab-footer-models">ATTNLAB_MODEL=<code>auto</code>'
                    "</span> on <code>cpu</code>.</p>")
    ext._name_models(tmp_path, ["minilm", "smollm2"], "auto")
    text = page.read_text()
    assert ("all-MiniLM-L6-v2 (sentence encoder) and SmolLM2-135M-Instruct (causal decoder, 4-bit weights) "
            "(model setting <code>auto</code>)") in text and "ATTNLAB_MODEL=" not in text


def test_figures_are_numbered_per_chapter(tmp_path):
    (tmp_path / "book").mkdir()
    cap = '<figure class="attnlab-fig"><img><figcaption class="attnlab-caption">{}</figcaption></figure>'
    page = tmp_path / "book" / "04_separability.html"
    page.write_text(cap.format("first") + "<p>text</p>" + cap.format("second"))
    ext._number_figures(page, tmp_path)
    text = page.read_text()
    assert "Figure 4.1.</span> first" in text and "Figure 4.2.</span> second" in text
    intro = tmp_path / "intro.html"
    intro.write_text(cap.format("only"))
    ext._number_figures(intro, tmp_path)
    assert "Figure 1.</span> only" in intro.read_text()


def test_embedded_pngs_become_files_a_browser_fetches_when_shown(tmp_path):
    import base64

    (tmp_path / "book").mkdir()
    png = b"\x89PNG\r\n\x1a\n a figure"
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    page = tmp_path / "book" / "01_x.html"
    page.write_text(f'<picture><source srcset="{uri} 1.25x"><img src="{uri}"></picture>'
                    f'<script type="application/json">{{"frames": [null, "{uri}"]}}</script>')
    ext._images_as_files(page, tmp_path)
    text = page.read_text()
    files = list((tmp_path / ext.IMAGES).glob("*.png"))
    assert len(files) == 1 and files[0].read_bytes() == png                  # one file per distinct image
    link = f"../{ext.IMAGES}/{files[0].name}"
    assert "data:image" not in text and text.count(link) == 3 and f'srcset="{link} 1.25x"' in text


def test_the_execution_cache_lives_outside_the_clone_keyed_by_sources_and_libraries(monkeypatch, tmp_path):
    """A fresh clone of the same sources finds the chapters' executions (ATTNLAB_CACHE_DIR/book-execution); another
    model, package source or library version gets its own cache, and a stale one of the same setting is dropped."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_MODEL", "auto")
    monkeypatch.setattr(ext, "_reachable", lambda url, timeout=4.0: True)
    app = SimpleNamespace(srcdir=str(ROOT))

    def path():
        config = SimpleNamespace(nb_execution_cache_path="", myst_substitutions={}, html_theme_options={})
        ext._config_inited(app, config)
        return Path(config.nb_execution_cache_path)

    stale = tmp_path / "book-execution" / "auto-cpu-0123456789ab"
    stale.mkdir(parents=True)
    first = path()
    assert first.parent == tmp_path / "book-execution" and first.name.startswith("auto-cpu-")
    assert path() == first and not stale.exists()
    monkeypatch.setattr(ext, "_environment", lambda: "3.11.7 torch=9.9")
    assert path() != first                                          # another torch: other outputs
    assert "torch" in ext._LIBRARIES and "transformers" in ext._LIBRARIES


def test_the_build_relays_each_computed_result_to_its_terminal_and_not_to_the_kernels_stderr(tmp_path, monkeypatch):
    """A notebook kernel's stderr lands in its page: announce() writes to the relayed file instead."""
    import io
    import os
    import subprocess
    import sys

    from attnlab.core import cache

    assert ext.PROGRESS_ENV == cache.PROGRESS_ENV
    monkeypatch.delenv(ext.PROGRESS_ENV, raising=False)
    out = io.StringIO()
    stop = ext._relay_progress(tmp_path / "progress.log", out, interval=0.05)
    try:
        kernel = subprocess.run(          # a kernel: a child process that inherits the build's environment
            [sys.executable, "-c", "from attnlab.core.cache import announce; announce('fig2a', {'model': 'smollm2', "
             "'max_length': 512}, 41.23)"], capture_output=True, text=True, check=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        stop()
        os.environ.pop(ext.PROGRESS_ENV, None)
    assert kernel.stderr == ""
    assert out.getvalue() == "attnlab: computed fig2a (smollm2, L=512) in 41.2 s\n"


def test_the_execution_cache_survives_a_comment_or_docstring_but_not_a_code_change(tmp_path):
    """Keyed by every source byte, a comment re-executed every chapter (620 s on the 2-core CPU)."""
    pkg = tmp_path / "attnlab"
    pkg.mkdir()
    module = pkg / "engine.py"
    module.write_text('"""Blocks."""\nimport math\n\n\ndef f(x):\n    """Twice x."""\n    return 2 * x\n')
    base = ext._package_digest(tmp_path)
    module.write_text('"""Blocks, reworded."""\nimport math\n\n\n# a comment\ndef f(x):\n    """Two x."""\n\n'
                      '    return 2 * x  # twice\n')
    assert ext._package_digest(tmp_path) == base
    module.write_text('"""Blocks."""\nimport math\n\n\ndef f(x):\n    """Twice x."""\n    return 3 * x\n')
    assert ext._package_digest(tmp_path) != base
    module.write_text('"""Blocks."""\nimport math\n\n\ndef f(x):\n    """Twice x."""\n    return 2 * x\n')
    (pkg / "new.py").write_text("y = 1\n")
    assert ext._package_digest(tmp_path) != base


def _execution_cache(path: Path) -> None:
    """A real jupyter-cache folder at `path` holding one executed notebook (made by jupyter_cache's API)."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cell = nbformat.v4.new_code_cell("1 + 1", execution_count=1,
                                     outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "2"},
                                                                     execution_count=1)])
    notebook = nbformat.v4.new_notebook(cells=[cell], metadata={"kernelspec": {"name": "python3",
                                                                               "display_name": "Python 3"}})
    get_cache(path).cache_notebook_bundle(CacheBundleIn(notebook, "chapter.ipynb"), check_validity=False)


def _damage_cache(path: Path, how: str) -> None:
    import shutil

    if how == "emptied notebook":                 # what a kill during a cache write leaves
        next(path.glob("executed/*/base.ipynb")).write_text("")
    elif how == "garbage db":
        (path / "global.db").write_bytes(b"not a database " * 100)
    elif how == "executed deleted":
        shutil.rmtree(path / "executed")


@pytest.mark.parametrize("how", ["emptied notebook", "garbage db", "executed deleted"])
def test_a_damaged_execution_cache_is_moved_aside_with_one_warning(monkeypatch, tmp_path, capsys, how):
    """Was: every later `make book` failed with a Sphinx exception that did not name the folder."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_MODEL", "auto")
    monkeypatch.setattr(ext, "_reachable", lambda url, timeout=4.0: True)
    config = SimpleNamespace(nb_execution_cache_path="", myst_substitutions={}, html_theme_options={})
    ext._config_inited(SimpleNamespace(srcdir=str(ROOT)), config)
    current = Path(config.nb_execution_cache_path)
    _execution_cache(current)
    config.nb_execution_cache_path = ""                               # a sound cache is kept as it is
    ext._config_inited(SimpleNamespace(srcdir=str(ROOT)), config)
    assert current.is_dir() and not list(current.parent.glob("*.damaged-*"))
    _damage_cache(current, how)
    capsys.readouterr()
    config.nb_execution_cache_path = ""
    ext._config_inited(SimpleNamespace(srcdir=str(ROOT)), config)
    aside = list(current.parent.glob(f"{current.name}.damaged-*"))
    # the damaged cache is aside; the folder in its place holds no jupyter-cache (only the build's Results log)
    assert not (current / "global.db").exists() and not (current / "executed").exists() and len(aside) == 1
    warned = [line for line in capsys.readouterr().err.splitlines() if "execution cache" in line]
    assert len(warned) == 1 and str(current) in warned[0] and "damaged" in warned[0]
    _execution_cache(current)                                          # the next build caches afresh
