"""`attnlab results compute --cluster`: the registry's Results as Dask tasks on 127.0.0.1, into the one store."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from attnlab import results
from attnlab.cli import main

distributed = pytest.importorskip("distributed")

ARGS = ["results", "compute", "--models", "tiny-gpt2", "--windows", "1", "--quick", "--quiet"]


def _stored(folder: Path) -> dict[str, bytes]:
    """{Result folder / file: its CSV bytes} of a results store (the numbers, not the provenance's timings)."""
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in sorted(folder.rglob("*.csv"))}


def test_a_cluster_stores_what_the_serial_path_stores(tmp_path, monkeypatch, capsys):
    """local:2 and the serial path fill two stores (a folder; a file:// URL, `core.store`) with the same Results,
    byte for byte; a second run finds them."""
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path / "serial"))
    assert main(ARGS) == 0
    serial = capsys.readouterr().out.splitlines()
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", f"file://{tmp_path / 'cluster'}")
    assert main(ARGS + ["--cluster", "local:2"]) == 0
    assert capsys.readouterr().out.splitlines() == serial == ["tiny-gpt2, W&P #1: 0 stored, 6 computed",
                                                              "tiny-gpt2, WikiText-2 #1: 0 stored, 6 computed"]
    one, two = _stored(tmp_path / "serial"), _stored(tmp_path / "cluster")
    assert len(one) == 12 and one == two
    assert main(ARGS + ["--cluster", "local:2"]) == 0          # resumed: nothing computed again
    assert capsys.readouterr().out.splitlines() == ["tiny-gpt2, W&P #1: 6 stored, 0 computed",
                                                    "tiny-gpt2, WikiText-2 #1: 6 stored, 0 computed"]


def test_a_killed_worker_and_a_resumed_run(tmp_path, monkeypatch):
    """One window computed serially before (a run killed half-way); then on a running cluster of 2 workers, one
    worker is killed while it computes: its task runs again on the other (or on its restarted self), and the store
    holds every Result, each a complete pair."""
    from distributed import Client, LocalCluster

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    tasks = results.plan(["tiny-gpt2"], windows=2, quick=True)
    assert results.fill(tasks[0])["computed"] == 6                # the part a killed run had done
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as watcher:
        killed = []

        def kill_one_busy_worker():
            for _ in range(600):
                busy = [w for w, keys in watcher.processing().items() if keys]
                if busy:
                    pids = watcher.run(os.getpid, workers=busy[:1])
                    os.kill(next(iter(pids.values())), signal.SIGKILL)
                    killed.append(busy[0])
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=kill_one_busy_worker)
        thread.start()
        from attnlab import cluster as C

        rows = C.compute(tasks, cluster.scheduler_address, progress=False)
        thread.join()
    assert killed, "no worker was busy long enough to be killed"
    assert [r.get("error") for r in rows] == [None] * 4
    assert rows[0] == {"model": "tiny-gpt2", "label": "W&P #1", "stored": 6, "computed": 0}
    assert len(_stored(tmp_path)) == 24
    assert not list(tmp_path.rglob("*.part")), "a half-written file was left"


def test_bad_input_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    assert main(["results", "compute", "--models", "tiny-gpt2,no-such-model", "--cluster", "local:2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'no-such-model'" in err[0]
    for spec in ("local:0", "local", "remote:2"):
        assert main(ARGS + ["--cluster", spec]) == 2
        assert "--cluster must be local:N" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.csv"))


def test_a_task_that_raises_is_one_line_and_the_others_go_on(tmp_path, monkeypatch, capsys):
    """A model folder that exists but holds no model: its task fails in one line, tiny-gpt2's is stored."""
    from attnlab import cluster as C

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    empty = tmp_path / "empty-model"
    empty.mkdir()
    tasks = results.plan(["tiny-gpt2", str(empty)], windows=1, quick=True)[::2]
    rows = C.compute(tasks, "local:2", progress=False)
    assert rows[0]["computed"] == 6 and "error" in rows[1]
    err = [line for line in capsys.readouterr().err.splitlines() if "failed" in line]
    assert len(err) == 1 and str(empty) in err[0]


def test_ctrl_c_stops_the_cluster_with_one_line_and_no_orphans(tmp_path):
    """Ctrl-C in a terminal (SIGINT to the whole foreground process group) while the workers compute: the command
    says "interrupted" in one line, exits 130, and no process it started (scheduler, nannies, workers) outlives it.
    (Not while the cluster starts: a press then is lost, the workers' start ignores Ctrl-C; see cluster.py.)"""
    import subprocess
    import sys

    import psutil

    env = {**os.environ, "ATTNLAB_RESULTS_DIR": str(tmp_path), "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "attnlab", "results", "compute", "--models", "tiny-gpt2", "--windows", "8",
           "--cluster", "local:2"]
    # its own process group, as a shell job is, with Ctrl-C's default action: a pytest worker may ignore it (an
    # in-process `main` that was interrupted leaves it ignored), and an ignored signal is inherited (the press was lost)
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        started = psutil.Process(run.pid)
        for _ in range(1200):                                       # until both workers have begun a task
            computing = any(not p.name.startswith(".") for p in tmp_path.glob("*/"))     # a Result's folder
            if computing and len(started.children(recursive=True)) >= 2:
                break
            assert run.poll() is None, run.communicate()[1][-2000:]
            time.sleep(0.1)
        else:
            pytest.fail("no worker started a task within 120 s")
        family = started.children(recursive=True)
        os.killpg(run.pid, signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == "attnlab results: interrupted"
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, f"left running after Ctrl-C: {[p.pid for p in alive]}"
