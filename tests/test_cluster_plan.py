"""`attnlab results compute`'s plan without a cluster: --lengths and the memory a worker is given (no Dask here)."""
from __future__ import annotations

import pytest

from attnlab import results
from attnlab.cli import main
from attnlab.core.costs import COSTS

GB = 1e9
# the peaks measured on this machine (`core.costs`, BENCHMARKS.md); `dearest`: the dearest figure of a task at that
# L (the pooled fig2c where it runs, the streamed ones where the pooled ones refuse L)
@pytest.mark.parametrize("cost", COSTS, ids=lambda c: f"{c.model}-{c.length}-{c.what.replace(' ', '+')}")
def test_the_memory_estimate_covers_each_measured_peak_and_the_dearest_closely(cost):
    estimate = results.worker_memory(cost.model, cost.length, cost.readings) / GB
    what = f"{cost.model} at L = {cost.length} ({cost.what})"
    assert cost.peak_gb <= estimate, f"{what}: estimate {estimate:.2f} GB < peak {cost.peak_gb} GB"
    assert not cost.dearest or estimate <= 1.5 * cost.peak_gb, f"{what}: {estimate:.2f} GB for {cost.peak_gb} GB"


def test_an_unsized_model_gets_the_default_and_a_plan_its_dearest_task(tmp_path):
    assert results.worker_memory(str(tmp_path), 512) == results.DEFAULT_WORKER_BYTES
    tasks = results.plan(["tiny-gpt2", "smollm2"], windows=1, lengths=[64, 1024])
    assert results.plan_memory(tasks) == results.worker_memory("smollm2", 1024)


def test_a_task_that_computes_the_readings_is_sized_for_them():
    """SmolLM2's book window peaked at 10.74 GB (its thm1_readings alone 8.81) where the estimate gave 5.5 GB: a
    cluster sized by it would have put two such workers on a 16 GB machine. The book's window (and the build's
    chapter task) computes the readings; a window of `windows.BOOK_WINDOWS`, a quick run and another model's chapter
    task do not."""
    book = results.plan(["smollm2"])
    assert [results.computes_readings(t) for t in book] == [True]
    assert results.plan_memory(book) == results.worker_memory("smollm2", 1024, readings=True) > \
        results.worker_memory("smollm2", 1024)
    assert not any(results.computes_readings(t) for t in results.plan(["smollm2"], windows=1))
    assert not any(results.computes_readings(t) for t in results.plan(["smollm2"], quick=True))
    chapters = results._chapter_tasks("smollm2", ["smollm2", "minilm"], "cpu")
    got = {t.model: results.computes_readings(t) for t in chapters}
    assert got.pop("smollm2") and got and not any(got.values())


def test_lengths_make_one_task_per_window_and_length():
    tasks = results.plan(["tiny-gpt2"], windows=1, lengths=[512, 64, 64])
    assert [(t.label, t.length) for t in tasks] == [("W&P #1", 512), ("WikiText-2 #1", 512),
                                                    ("W&P #1, L = 64", 64), ("WikiText-2 #1, L = 64", 64)]
    assert {t.length for t in results.plan(["tiny-gpt2"], windows=1)} == {512}


@pytest.mark.parametrize("lengths,says", [("16", "--lengths must be an integer >= 32, got '16'"),
                                          ("64,x", "--lengths must be an integer >= 32, got 'x'"),
                                          ("2048", "--lengths 2048 exceeds tiny-gpt2's 1024 positions")])
def test_bad_lengths_are_one_line_before_any_work(lengths, says, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    assert main(["results", "compute", "--models", "tiny-gpt2", "--windows", "1", "--lengths", lengths]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert main(["results", "compute", "--models", "tiny-gpt2", "--lengths", "64"]) == 2
    assert "--lengths goes with --windows" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.csv"))


def test_a_length_reaches_the_figures(tmp_path, monkeypatch, capsys):
    """--lengths 64: the window's figures are keyed (and computed) at L = 64."""
    import json

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    assert main(["results", "compute", "--models", "tiny-gpt2", "--windows", "1", "--lengths", "64", "--quick",
                 "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "tiny-gpt2, W&P #1, L = 64: 0 stored, 6 computed"
    keys = [json.loads(p.read_text()) for p in tmp_path.glob("*/key.json")]
    assert keys and {k["max_length"] for k in keys} == {64}


# ------------------------------------------------------------------ the book's fill (`results.book_plan`)

def _compare_with_a_build(read: set, build_model: str, whole: bool = True) -> None:
    """`book_plan` against what a build read: every Result it fills is read (a `whole` build's record), and what
    else is read is declared (`BOOK_NOT_PLANNED`, the few cheap Results the chapters compute themselves)."""
    planned = results.describe_planned(results.book_plan("auto", "cpu"), auto=build_model)
    assert planned, "an empty plan"
    # fig4 without the repeated tokens is stored only for a model whose windows start on repeated tokens (Gemma 3's
    # start on its BOS token and none): planned for each model, read where it exists
    unread = {d for d in planned - read if d[0] != "fig4_without_repeats"}
    assert not whole or not unread, f"the fill computes Results no chapter read: {sorted(unread, key=str)[:3]}"
    undeclared = {d[0] for d in read - planned} - set(results.BOOK_NOT_PLANNED)
    assert not undeclared, f"chapters read Results neither planned nor declared: {sorted(undeclared)}"


def test_the_book_plan_is_what_a_recorded_build_read(monkeypatch):
    """tests/book_reads.json: the record of a build (ATTNLAB_MODEL=auto, which was SmolLM2 there; Gemma 3 installed
    and in the book) as `describe_key` describes each Result; 190 of its 194 Results are `book_plan`'s, the rest
    `BOOK_NOT_PLANNED`."""
    import json
    from pathlib import Path

    from attnlab.core import model_table

    monkeypatch.setattr(model_table, "installed", lambda name: True)       # as in the recorded build
    snapshot = json.loads((Path(__file__).parent / "book_reads.json").read_text())
    read = {tuple(d) for d in snapshot["read"]}
    _compare_with_a_build(read, snapshot["build_model"])
    planned = results.describe_planned(results.book_plan("auto", "cpu"), auto=snapshot["build_model"])
    assert len(planned) == 191 and len(read) == 194 and len(planned & read) == 190


def test_the_book_plan_is_what_this_machines_last_build_read():
    """The same against this checkout's own record (scripts/attnlab_book.py: results-used.txt beside the chapters'
    execution cache of these sources, `_package_digest`; each entry's key in the results store), which may be a
    stopped build's: only that every Result read is planned or declared. Skipped where these sources were not built
    yet (another checkout's build, of other sources, is not this plan's record)."""
    import importlib.util
    import json
    from pathlib import Path

    from attnlab.core.store import results_store
    from attnlab.core.text import cache_dir

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("attnlab_book", root / "scripts" / "attnlab_book.py")
    book_ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(book_ext)
    record = cache_dir() / "book-execution" / f"auto-cpu-{book_ext._package_digest(root)}" / "results-used.txt"
    if not record.is_file():
        pytest.skip("these sources have no book build recorded here yet")
    store, read = results_store(), set()
    for entry in set(record.read_text().split()):
        try:
            key = json.loads(store.read(f"{entry}/key.json", "key", 1 << 20))
        except OSError:
            continue
        read.add(results.describe_key(entry.rsplit("-", 1)[0], key))
    perplexity = [d[1] for d in read if d[0] == "perplexity"]
    if not perplexity:
        pytest.skip("the recorded build read no perplexity: its model is not known here")
    _compare_with_a_build(read, perplexity[0], whole=False)


def test_auto_is_serial_on_one_worker_or_without_dask(monkeypatch):
    """`fill_all(..., "auto")`: a local cluster only with two workers or more and dask.distributed installed."""
    from attnlab.cli import results as cli_results

    done = []
    monkeypatch.setattr(results, "fill", lambda t, loaded=None: done.append(t) or {"model": t.model})
    tasks = results.plan(["tiny-gpt2"], windows=1)
    monkeypatch.setattr(results, "local_workers", lambda tasks: 1)
    assert len(cli_results.fill_all(tasks, "auto")) == 2 and len(done) == 2
    monkeypatch.setattr(results, "local_workers", lambda tasks: 2)
    monkeypatch.setattr(cli_results, "_has_distributed", lambda: False)
    assert len(cli_results.fill_all(tasks, "auto")) == 2 and len(done) == 4


def test_book_takes_no_models_or_windows(capsys):
    assert main(["results", "compute", "--book", "--windows", "2"]) == 2
    assert "--book plans its own models and windows" in capsys.readouterr().err
    assert [t.label for t in results.book_plan("smollm2", "cpu")][:2] == ["the book's window", "W&P #1"]


def test_the_plan_describes_each_chapter_result(monkeypatch):
    """The chapters' own Results (`results.CHAPTER_PARTS`) are tasks of the plan, each described: the build's
    model's (chapters 3, 7, 9), each in-book model's (chapters 3, 5-7), chapter 1's long window, and Gemma 3's (in the
    book, and its layer kinds) only where it is installed. What stays with the chapters is a computation of the
    registry, said why."""
    from attnlab.computations import COMPUTATIONS
    from attnlab.core import model_table
    from attnlab.views import tokens

    monkeypatch.setattr(model_table, "installed", lambda name: True)
    assert {t.model: t.chapters for t in results.book_plan("auto", "cpu") if t.chapters} == {
        "auto": ("build",), "minilm": ("in_book",), "smollm2": ("in_book", "long_context"),
        "gemma3": ("in_book", "layer_kinds")}
    monkeypatch.setattr(model_table, "installed", lambda name: name != "gemma3")
    assert not any(t.model == "gemma3" for t in results.book_plan("auto", "cpu"))
    tasks = results.book_plan("auto", "cpu")
    assert {t.model: t.chapters for t in tasks if t.chapters} == {
        "auto": ("build",), "minilm": ("in_book",), "smollm2": ("in_book", "long_context")}
    assert [t.label for t in tasks if t.chapters] == ["the chapters' Results"] * 3 and tasks[-1].chapters
    assert [t.length for t in tasks if t.chapters] == [None, None, 4096]          # chapter 1's long window
    planned = results.describe_planned(tasks, auto="smollm2")
    for name, model in [("fig2c_ratio", "smollm2"), ("reading_windows", "smollm2"), ("bench_normalizers", "smollm2"),
                        ("compare_normalizers_each", "smollm2"), ("pooled_ks", "minilm"), ("sink_claims", "minilm"),
                        ("fig4_without_repeats", "smollm2"), ("tsc_authors_sphere_reference", None)]:
        assert any(d[:2] == (name, model) for d in planned), (name, model)
    assert ("compare_normalizers", "smollm2", None, None, None, "peers") in planned
    assert ("fig1", "smollm2", "war_and_peace", 0, 4096, None) in planned
    assert {(tokens.EXPERIMENTS[e][0], e) for e, _ in tokens.CHAPTER_RUNS} <= {(d[0], d[5]) for d in planned}
    assert not any(d[0] in ("layer_kinds", "critical_by_kind") for d in planned)
    monkeypatch.setattr(model_table, "installed", lambda name: True)
    tasks = results.book_plan("auto", "cpu")
    assert (tasks[-1].model, tasks[-1].chapters, tasks[-1].length) == ("gemma3", ("in_book", "layer_kinds"), 8192)
    assert results.plan_memory(tasks[-1:]) == results.worker_memory("gemma3", 8192)     # its longest window
    planned_kinds = results.describe_planned(tasks, auto="smollm2")
    assert {("layer_kinds", "gemma3", None, None, None, None),
            ("critical_by_kind", "gemma3", None, None, None, None)} <= planned_kinds
    assert set(results.BOOK_NOT_PLANNED) <= set(COMPUTATIONS) and all(results.BOOK_NOT_PLANNED.values())


def test_installed_reads_the_wheels_metadata(monkeypatch):
    """`model_table.installed`: True for an entry that needs no wheel, False where one of its wheels is missing."""
    from attnlab.core import model_table

    assert model_table.installed("tiny-gpt2")
    gemma = model_table.entry("gemma3")
    monkeypatch.setattr(type(gemma), "pins", property(lambda e: ["attnlab-no-such-wheel==1.0"]))
    assert not model_table.installed("gemma3")


def test_the_cli_book_fill_stores_the_chapters_results_it_describes(tmp_path, monkeypatch, capsys):
    """`attnlab results compute --book` with tiny-gpt2 as the build's and the only in-book model (no Gemma 3; the
    figures of its windows left to the figures' own tests, chapter 9's Monte Carlo runs left out, chapter 7's
    comparison on its quick grid): its chapter tasks store what `describe_planned` says, through the chapters'
    functions, and a second run finds every one stored."""
    import json
    from functools import partial

    from attnlab.core import model_table
    from attnlab.tools import compare
    from attnlab.views import tokens

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(model_table, "offline_in_book", lambda: ("tiny-gpt2",))
    monkeypatch.setattr(model_table, "installed", lambda name: name != "gemma3")
    monkeypatch.setattr(tokens, "CHAPTER_RUNS", ())
    monkeypatch.setattr(results, "_book_window", lambda inp, task: [])
    monkeypatch.setattr(results, "_figures", lambda ids, inp, quick: [])
    monkeypatch.setattr(compare, "compare_normalizers", partial(compare.compare_normalizers, quick=True))
    assert main(["results", "compute", "--book", "--model", "tiny-gpt2", "--quiet"]) == 0
    first = capsys.readouterr().out.splitlines()
    assert first[0] == "tiny-gpt2, the book's window: 0 stored, 0 computed" and len(first) == 1 + 8 + 1
    assert first[-1].startswith("tiny-gpt2, the chapters' Results: 0 stored, ")
    stored = {results.describe_key(p.parent.name.rsplit("-", 1)[0], json.loads(p.read_text()))
              for p in tmp_path.glob("*/key.json")}
    planned = results.describe_chapters("tiny-gpt2", ("build", "in_book"))
    read_first = {("thm1_readings", "tiny-gpt2", "war_and_peace", 0, 1024, None),      # what the parts read first
                  ("fig3", "tiny-gpt2", "war_and_peace", 0, 512, None)}
    assert stored - planned == read_first
    # one reading_windows per reading that meets the rule on the book's window, one fig4_without_repeats per window
    # that starts on repeated tokens: none may hold on a random model
    assert planned - stored <= {("reading_windows", "tiny-gpt2", None, None, None, None),
                                ("fig4_without_repeats", "tiny-gpt2", None, None, 512, None)}
    assert main(["results", "compute", "--book", "--model", "tiny-gpt2", "--quiet"]) == 0
    again = capsys.readouterr().out.splitlines()[-1]
    assert again.startswith("tiny-gpt2, the chapters' Results: ") and again.endswith(" stored, 0 computed")


def test_other_in_book_models_claims_window_is_planned_at_the_papers_length(monkeypatch):
    """Chapter 6 and the chapter map read each other in-book model's claims on the book's window at the paper's L
    (`book.claims_per_model`); the windows of `windows.BOOK_WINDOWS` stop at L = 512, so a model with more positions
    gets that window as a task of its own (a build on MiniLM once computed SmolLM2's inside chapter 6); MiniLM (512
    positions) needs none."""
    from attnlab.core import model_table

    monkeypatch.setattr(model_table, "installed", lambda name: name != "gemma3")
    tasks = results.book_plan("minilm", "cpu")
    extra = [t for t in tasks if t.label.startswith("the book's window, L =")]
    assert [(t.model, t.window, t.length) for t in extra] == [("smollm2", ("war_and_peace", 0), 1024)]
    planned = results.describe_planned(tasks, auto="minilm")
    assert {(f, "smollm2", "war_and_peace", 0, 1024, None) for f in ("fig1", "fig2b", "fig3", "fig4")} <= planned
    monkeypatch.setattr(model_table, "installed", lambda name: True)
    extra = [t for t in results.book_plan("smollm2", "cpu") if t.label.startswith("the book's window, L =")]
    assert [(t.model, t.length) for t in extra] == [("gemma3", 1024)]
