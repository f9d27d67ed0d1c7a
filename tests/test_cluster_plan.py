"""`attnlab results compute`'s plan without a cluster: --lengths and the memory a worker is given (no Dask here)."""
from __future__ import annotations

import pytest

from attnlab import results
from attnlab.cli import main

GB = 1e9
# Peaks measured on this machine (BENCHMARKS.md): (model, L, peak resident GB, what ran, whether it was the dearest
# figure of a task at that L: the pooled fig2c where it runs, the streamed ones where the pooled ones refuse L)
MEASURED = [("smollm2", 1024, 3.95, "Long context: fig1 + fig2a", False),
            ("smollm2", 2048, 4.89, "Long context: fig1 + fig2a", False),
            ("smollm2", 4096, 4.58, "Long context: fig1 + fig2a", False),
            ("smollm2", 8192, 6.52, "Long context: fig1 + fig2a (fig2c and fig4 refuse L = 8192)", True),
            ("gpt2-random", 1024, 2.60, "Long context: fig1 + fig2a", False),
            ("smollm2", 2048, 9.9, "fig2c (pooled), L = 2048", True),
            ("smollm2", 1024, 5.49, "the six paper-1 figures, L <= 1024", True)]


@pytest.mark.parametrize("model,L,peak,what,dearest", MEASURED)
def test_the_memory_estimate_covers_each_measured_peak_and_the_dearest_closely(model, L, peak, what, dearest):
    estimate = results.worker_memory(model, L) / GB
    assert peak <= estimate, f"{model} at L = {L} ({what}): estimate {estimate:.2f} GB < peak {peak} GB"
    assert not dearest or estimate <= 1.5 * peak, f"{model} at L = {L} ({what}): {estimate:.2f} GB for {peak} GB"


def test_an_unsized_model_gets_the_default_and_a_plan_its_dearest_task(tmp_path):
    assert results.worker_memory(str(tmp_path), 512) == results.DEFAULT_WORKER_BYTES
    tasks = results.plan(["tiny-gpt2", "smollm2"], windows=1, lengths=[64, 1024])
    assert results.plan_memory(tasks) == results.worker_memory("smollm2", 1024)


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
