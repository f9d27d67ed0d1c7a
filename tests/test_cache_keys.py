"""The results cache's key: the computation's declared version, its inputs and the libraries that compute it,
not the bytes of the package's sources; and the line each computed Result announces."""
from pathlib import Path

import pytest

import attnlab
from attnlab.core import cache
from attnlab.core.result import Result

PKG = Path(attnlab.__file__).parent
KEY = {"figure": "fig1", "model": "m", "weights": "w", "version": 1}


def test_the_key_holds_the_declared_version_and_the_inputs():
    base = cache.key_hash(KEY)
    assert cache.key_hash(dict(KEY, model="other")) != base
    assert cache.key_hash(dict(KEY, version=2)) != base
    for bad in (None, 0, "1", True):
        with pytest.raises(ValueError, match="needs a version"):
            cache.key_hash(dict(KEY, version=bad))


def test_an_upgrade_of_a_library_or_the_kernels_switch_changes_the_key(monkeypatch):
    """Every stored Result was served as computed by whatever torch/numpy/... is installed now."""
    base = cache.key_hash(KEY)
    installed = cache.library_versions()
    assert set(installed) == {"torch", "transformers", "numpy", "scipy", "numba"}
    for lib in installed:
        monkeypatch.setattr(cache, "library_versions", lambda lib=lib: dict(installed, **{lib: "999.0"}))
        assert cache.key_hash(KEY) != base, f"an upgrade of {lib} must change the key"
        monkeypatch.undo()
    monkeypatch.setenv("ATTNLAB_KERNELS", "0")
    assert cache.key_hash(KEY) != base, "the numba kernels switched off must change the key"


def test_an_edit_to_a_source_file_keeps_the_key(monkeypatch):
    """A comment in metrics/engine.py recomputed every paper-1 Result (40-60 min on a 2-core CPU)."""
    base = cache.key_hash(KEY)
    engine = PKG / "normalization" / "metrics" / "engine.py"
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + (b"# a comment\n" if self == engine else b""))
    if hasattr(cache, "source_hash"):              # (the recipe before: a hash of the sources' bytes)
        cache.source_hash.cache_clear()
    assert cache.key_hash(KEY) == base


def test_a_result_stored_under_another_name_is_refused(tmp_path, monkeypatch):
    """Stored as "tsc_uniform_map" but named "tsc_uniform": saved where the lookup never looked (a miss forever)."""
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="returned a Result named 'tsc_uniform'"):
        cache.cached("tsc_uniform_map", {}, lambda: Result("tsc_uniform", [{"a": 1}]), version=1)


def test_each_computed_result_is_announced_once_on_stderr_or_in_the_progress_log(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.delenv(cache.PROGRESS_ENV, raising=False)
    key = {"model": "smollm2", "max_length": 512}
    cache.cached("demo", key, lambda: Result("demo", [{"a": 1}]), version=1)
    cache.cached("demo", key, lambda: Result("demo", [{"a": 1}]), version=1)          # a hit: no line
    err = capfd.readouterr().err
    assert err.count("attnlab: computed demo (smollm2, L=512) in ") == 1 and err.endswith(" s\n")
    log = tmp_path / "progress.log"
    monkeypatch.setenv(cache.PROGRESS_ENV, str(log))
    cache.cached("other", {}, lambda: Result("other", [{"a": 1}]), version=1)
    assert capfd.readouterr().err == ""
    assert log.read_text().startswith("attnlab: computed other in ")


def test_verify_results_computes_each_stored_result_again_and_names_what_moved(tmp_path, monkeypatch, capsys):
    """`attnlab verify-results` on a tiny cache: a figure and a chapter 9 experiment as stored are "same"; a stored
    Result whose numbers differ from what its code computes now is "differs" (exit 1); a chapter's own experiment
    is "not recomputable"; one stored under other library versions is not compared."""
    from attnlab import figures
    from attnlab.cli import main
    from attnlab.views import tokens

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    figures.cached_figures(["tsc_hardmax"], figures.Inputs("tiny-gpt2", "cpu"), quick=True)
    tokens.run("uniform_map", "cpu", quick=True)
    cache.cached("chapter_own", {}, lambda: Result("chapter_own", [{"a": 1.0}]), version=1)
    assert main(["verify-results"]) == 0
    out = capsys.readouterr().out
    assert sorted(out.splitlines()) == ["chapter_own: not recomputable", "tsc_hardmax: same", "tsc_uniform: same"]

    key = figures._cache_key("tsc_hardmax", figures.Inputs("tiny-gpt2", "cpu"), True)
    stored = cache.stored("tsc_hardmax", key)
    rows = [dict(r, slope=r["slope"] + 0.01) if r.get("slope") is not None else r for r in stored.rows]
    cache.store("tsc_hardmax", key, Result("tsc_hardmax", rows, stored.provenance))
    monkeypatch.setattr(cache, "library_versions", lambda: {"torch": "0.0"})
    cache.cached("old_torch", {}, lambda: Result("old_torch", [{"a": 1.0}]), version=1)
    monkeypatch.undo()
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    assert main(["verify-results"]) == 1
    lines = sorted(capsys.readouterr().out.splitlines())
    assert lines[1] == "old_torch: other environment"
    assert lines[2].startswith("tsc_hardmax: differs (") and ".slope: " in lines[2]
