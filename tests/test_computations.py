"""The registry of computations (attnlab/computations.py): every name the package and the chapters cache is declared
there, once; the cache keys are those of the code before it (no stored Result is lost); `attnlab results list` and
`verify` read it."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import attnlab
from attnlab import book, computations, figures
from attnlab.computations import COMPUTATIONS
from attnlab.core import cache
from attnlab.core.result import Result

ROOT = Path(attnlab.__file__).parent.parent
CALLERS = ("cached", "cached_result", "result")   # the functions that ask the cache for a Result by name

# every computation's version as the code before the registry declared it (literals in figures.py, views/tokens.py,
# windows.py, core/perplexity.py, views/*.py and chapters 7-10, 2026-11-29): the registry must keep them, or every
# stored Result is a miss
BEFORE = {"fig1": 2, "fig2a": 2, "fig2b": 2, "fig2c": 1, "fig3": 2, "fig4": 2, "thm1_readings": 2,
          "separability_readings": 2, "gradient_readings": 1, "tsc_uniform": 1, "tsc_moments": 1, "tsc_hardmax": 1,
          "tsc_real": 1, "tsc_sample_reference_effect": 1, "tsc_authors_sphere_reference": 1, "perplexity": 1,
          "pooled_ks": 1, "reading_windows": 1, "fig4_without_repeats": 1, "head_separability": 1, "fig2c_ratio": 1,
          "sink_shares": 1, "compare_normalizers": 1, "compare_normalizers_each": 1,
          "bench_normalizers": 1, "diagnose": 1,
          "layer_kinds": 1,              # (declared in the registry from the start: Gemma 3's rows by layer kind)
          "critical_by_kind": 1,         # (likewise: Gemma 3's critical N by layer kind)
          "sink_claims": 2}              # (bumped since, 2026-11-30: no critical N on fewer heads than KS can reject)


def _calls(tree: ast.AST, where: str):
    """(name, literal version or None, where:line) of each call `cached("name", ...)` / `cached_result("name", ...)`
    in `tree` whose name is a literal."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if fn in CALLERS and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            v = next((k.value for k in node.keywords if k.arg == "version"), None)
            yield node.args[0].value, getattr(v, "value", v), f"{where}:{node.lineno}"


def _sources():
    """(where, parsed code) of every package module and every chapter's code cell (by its id; a MyST page's by its
    number)."""
    for path in sorted((ROOT / "attnlab").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                code = "\n".join(line for line in "".join(cell["source"]).splitlines()
                                 if not line.lstrip().startswith(("%", "!")))
                yield f"{path.relative_to(ROOT).as_posix()} cell {cell.get('id')}", ast.parse(code)
    for path in sorted((ROOT / "book").glob("*.md")):              # MyST notebooks: {code-cell} blocks
        for i, block in enumerate(re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", path.read_text(), re.S)):
            code = "\n".join(line for line in block.splitlines() if not line.lstrip().startswith(("%", "!", ":")))
            yield f"{path.relative_to(ROOT).as_posix()} code cell {i + 1}", ast.parse(code)


def used() -> list[tuple[str, object, str]]:
    """(name, version or None, where) of every computation the code asks the cache for: the figures, chapter 9's
    experiments and every literal `cached`/`cached_result` call of the package and the chapters."""
    from attnlab.views import tokens

    found = [(i, None, f"attnlab/figures.py FIGURES[{i!r}]") for i in figures.FIGURES]
    found += [(name, None, f"attnlab/views/tokens.py EXPERIMENTS[{e!r}]") for e, (name, _, _) in
              tokens.EXPERIMENTS.items()]
    for where, tree in _sources():
        found += list(_calls(tree, where))
    return found


def test_every_cached_computation_is_declared_in_the_registry():
    """A new inline computation (a `cached`/`cached_result` call with a new name, in the package or a chapter) fails
    here until it is declared in attnlab/computations.py; a version written beside a call must be the registry's."""
    found = used()
    undeclared = sorted({f"{n} ({w})" for n, _, w in found if n not in COMPUTATIONS})
    assert not undeclared, f"declare these in attnlab/computations.py: {undeclared}"
    wrong = [f"{w}: {n} version {v}, registry {COMPUTATIONS[n].version}" for n, v, w in found
             if v is not None and v != COMPUTATIONS[n].version]
    assert not wrong, wrong
    assert sorted(COMPUTATIONS) == sorted({n for n, _, _ in found}), "a declared computation nothing uses"


def test_the_registry_is_well_formed():
    assert len(COMPUTATIONS) == 29
    chapters = {p.stem for p in (ROOT / "book").glob("*.ip*")} | {p.stem for p in (ROOT / "book").glob("*.md")}
    for name, c in COMPUTATIONS.items():
        assert c.name == name and isinstance(c.version, int) and c.version >= 1
        assert c.cost in computations.COSTS and c.inputs and c.used_in and c.declared, name
        module, _, fn = c.compute.partition(":")
        assert module.startswith("attnlab.") and fn, c.compute
        stems = [u for u in c.used_in if u[:2].isdigit()]
        assert set(stems) <= chapters, (name, stems)
    for n, s in figures.FIGURES.items():
        assert s.version == COMPUTATIONS[n].version
    from attnlab import recompute

    assert all(callable(getattr(recompute, f"_{c.recompute}")) for c in COMPUTATIONS.values() if c.recompute)
    assert [n for n, c in COMPUTATIONS.items() if not c.recompute] == []       # 29 of 29 have a recipe


def test_every_version_is_the_one_before_the_registry():
    assert {n: c.version for n, c in COMPUTATIONS.items()} == BEFORE


def test_the_cache_keys_are_those_of_the_code_before(tmp_path, monkeypatch):
    """The key recipe of each path (a figure, chapter 9's `run`, `cached` and `cached_result` without a version) gives
    the folder the code before the registry stored under, so every stored Result is found."""
    from attnlab.views import tokens

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    # a synthetic figure: figures._cache_key as written before (the version literal in FIGURES)
    assert figures._cache_key("tsc_uniform", figures.Inputs("tiny-gpt2", "cpu"), True) == {
        "figure": "tsc_uniform", "version": 1, "quick": True, "device": "cpu", "max_length": None,
        "text_name": "war_and_peace", "text_start": 0}

    def never():
        raise AssertionError("computed: the key moved")

    class M:
        name, identity = "model-x", "abc"

    # the old calls' keys (their literal versions), a Result stored under each; the new calls must find it
    old = {"pooled_ks": {"windows": [["war_and_peace", 0]], "lengths": [64], "max_length": 512, "model": "m",
                         "identity": "i", "version": 1},
           "diagnose": {"device": "cpu", "params": "default", "model": "model-x", "identity": "abc", "text": "t",
                        "version": 1},
           "tsc_sample_reference_effect": {"experiment": "sample_reference_effect", "params": {"quick": True},
                                           "device": "cpu", "version": 1}}
    for name, key in old.items():
        cache.store(name, key, Result(name, [{"a": 1.0}]))
    got = cache.cached("pooled_ks", {k: v for k, v in old["pooled_ks"].items() if k != "version"}, never)
    assert got.rows == [{"a": 1.0}]
    got = book.cached_result("diagnose", {"device": "cpu", "params": "default"}, never, model=M(), text_sha256="t")
    assert got.rows == [{"a": 1.0}]
    assert tokens.run("sample_reference_effect", "cpu", quick=True).rows == [{"a": 1.0}]
    assert cache._entry("fig1", {"version": 2}) == cache._entry("fig1", {"version": computations.version("fig1")})


def test_a_stale_or_missing_version_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="version 1 in attnlab/computations.py, not 2"):
        cache.cached("diagnose", {}, lambda: Result("diagnose", [{"a": 1}]), version=2)
    with pytest.raises(ValueError, match="not a computation"):
        cache.cached("undeclared", {}, lambda: Result("undeclared", [{"a": 1}]))
    assert cache.cached("demo", {}, lambda: Result("demo", [{"a": 1}]), version=3).rows == [{"a": 1}]


def test_results_list(capsys):
    from attnlab.cli import main

    assert main(["results", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(COMPUTATIONS)
    assert {"name", "version", "inputs", "compute", "cost", "probes", "used_in", "declared"} <= set(rows[0])
    assert main(["results", "list"]) == 0
    assert "fig1 v2" in capsys.readouterr().out


def test_verify_recomputes_what_the_registry_declares(tmp_path, monkeypatch, capsys):
    """Stored Results of four kinds (paper 1's figures, a synthetic figure, perplexity, Fig. 4 without the repeats)
    computed again from their keys alone: the same numbers; a name the registry lacks: not recomputable."""
    from attnlab import windows
    from attnlab.cli import main
    from attnlab.core.perplexity import cached_perplexity
    from attnlab.core.text import load_corpus

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    inp = figures.Inputs("tiny-gpt2", "cpu", max_length=64)
    figures.cached_figures(["fig1", "fig2c", "tsc_hardmax"], inp, quick=True)
    cached_perplexity(inp.model, load_corpus("war_and_peace", allow_download=False), tokens=256, window=64,
                      stride=32)
    w = windows.text_windows(4, ("wikitext2",))[3]
    windows.repeats_result("tiny-gpt2", w, max_length=64)
    cache.cached("demo", {}, lambda: Result("demo", [{"a": 1.0}]), version=1)
    assert main(["results", "verify"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(["fig1: same", "fig2c: same", "tsc_hardmax: same", "perplexity: same",
                                    "fig4_without_repeats: same", "demo: not recomputable"])


def test_results_compute_stores_what_is_missing(tmp_path, monkeypatch, capsys):
    from attnlab.cli import main

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    args = ["results", "compute", "--models", "tiny-gpt2", "--windows", "1", "--quick"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines() == ["tiny-gpt2, W&P #1: 0 stored, 6 computed",
                                                    "tiny-gpt2, WikiText-2 #1: 0 stored, 6 computed"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines() == ["tiny-gpt2, W&P #1: 6 stored, 0 computed",
                                                    "tiny-gpt2, WikiText-2 #1: 6 stored, 0 computed"]


def test_verify_recomputes_the_views_and_chapters_own(tmp_path, monkeypatch, capsys):
    """The computations verify-results could not recompute before the registry, stored by their own callers on
    tiny-gpt2 (the views of chapters 3, 4 and 7; chapter 7's and 10's cells, as written there, smaller grids), then
    computed again from their keys alone: the same numbers (a minute on the 2-core CPU; compare_normalizers' default
    grid and diagnose, 2 more, were checked so on 2026-11-29, not here)."""
    from attnlab import windows
    from attnlab.cli import main
    from attnlab.core.models import load_model
    from attnlab.core.text import load_corpus
    from attnlab.views import separability, six_percent
    from attnlab.views import sinks as sink_views

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_MODEL", "tiny-gpt2")
    inp = book.inputs()
    model, corpus = inp.model, inp.corpus
    windows.pooled_result(model, windows.text_windows(1))
    windows.reading_result(model, windows.text_windows(1), "E1 / b / v")
    sink_views.shares(inp)
    sink_views.claims(inp)
    six_percent.ratio_curve()
    separability.head_separability()
    own = {"model": model, "corpus": corpus}          # chapters 7 and 10's calls, as written there (book.result)
    book.result("compare_normalizers", {"device": "cpu", "params": "peers", "lengths": [64, 128]}, **own)
    each = book.result("compare_normalizers_each", {"device": "cpu", "L": 64, "specs": ["sparsemax"],
                                                    "ssmax_ref_length": 64}, **own)
    assert each.unique("normalizer") and each.rows[0]["swap"] == 0
    book.result("bench_normalizers", {"device": "cpu", "lengths": [128, 256]}, **own)
    enc, params = load_model("minilm"), dict(quick=True, L=128, offset=0, seed=0, corpus="wikitext2")
    book.result("tsc_real", {"experiment": "real_encoder", "params": params, "device": "cpu"}, model=enc,
                corpus=load_corpus("wikitext2", allow_download=False))
    capsys.readouterr()
    assert main(["results", "verify"]) == 0
    got = {line.split(":")[0] for line in capsys.readouterr().out.splitlines() if not line.endswith(": same")}
    assert not got, f"not the same: {got}"


def test_the_figure_and_chapter_10_share_one_tsc_real(tmp_path, monkeypatch):
    """`attnlab figures tsc_real` and chapter 10 key the Result alike (one recipe, `real_tokens.real_params`): what
    one stores the other reads; its numbers are `real_encoder(quick=True)`'s, the golden probe's call."""
    from attnlab import results
    from attnlab.core.text import load_corpus
    from attnlab.sample_complexity import real_tokens

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    inp = figures.Inputs("minilm", "cpu")
    fig = figures.cached_figures(["tsc_real"], inp, quick=True)["tsc_real"]
    key = {"experiment": "real_encoder", "params": real_tokens.real_params(inp.encoder, quick=True), "device": "cpu"}
    again = results.result("tsc_real", key, model=inp.encoder, corpus=load_corpus("wikitext2", allow_download=False))
    stored = figures.cached_figures(["tsc_real"], inp, quick=True)["tsc_real"]
    assert again.provenance.get("loaded_from_cache") and again.rows == stored.rows
    direct = real_tokens.real_encoder(inp.encoder, quick=True)
    numbers = [(r["kind"], r["layer"], r.get("n"), r.get("err_mean"), r.get("beta")) for r in direct.rows]
    assert numbers == [(r["kind"], r["layer"], r.get("n"), r.get("err_mean"), r.get("beta")) for r in fig.rows]
    with pytest.raises(ValueError, match="does not know the key"):
        results.result("diagnose", {"device": "cpu", "params": "other"}, model=inp.encoder,
                       corpus=load_corpus("wikitext2", allow_download=False))
    with pytest.raises(ValueError, match="has no recipe"):
        results.result("nothing", {})
