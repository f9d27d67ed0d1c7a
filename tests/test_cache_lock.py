"""core.cache.locked: two processes (two chapters' kernels side by side) asking for the same Result compute it
once; the second waits for the first, says so, and reads what the first stored."""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ASK = """
import sys, time
from pathlib import Path
from attnlab.core import cache
from attnlab.core.result import Result

tmp = Path(sys.argv[1])

def compute():
    with open(tmp / "computations", "a") as fh:      # one line per computation
        fh.write("computed\\n")
    while not (tmp / "release").exists():             # hold the lock until the test releases it
        time.sleep(0.05)
    return Result("slow", [{"a": 1.5}])

result = cache.cached("slow", {"model": "smollm2", "max_length": 64}, compute, version=1)
print(result.rows[0]["a"], bool(result.provenance.get("loaded_from_cache")))
"""


def _wait_for(path: Path, text: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < end, f"{text!r} never appeared in {path.name}"
        time.sleep(0.05)


def test_two_processes_asking_the_same_result_compute_it_once(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), ATTNLAB_RESULTS_DIR=str(tmp_path / "results"),
               ATTNLAB_PROGRESS_LOG=str(tmp_path / "progress.log"), ATTNLAB_RESULTS_URL="off")
    ask = [sys.executable, "-c", ASK, str(tmp_path)]
    first = subprocess.Popen(ask, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        _wait_for(tmp_path / "computations", "computed")            # the first holds the lock, computing
        second = subprocess.Popen(ask, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(tmp_path / "progress.log", "attnlab: waiting for slow (smollm2, L=64): another process is "
                                             "computing or reading it")
        (tmp_path / "release").touch()
        outs = [p.communicate(timeout=120) for p in (first, second)]
    finally:
        (tmp_path / "release").touch()
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
    assert [p.returncode for p in (first, second)] == [0, 0], [err for _, err in outs]
    assert (tmp_path / "computations").read_text() == "computed\n"
    assert [out for out, _ in outs] == ["1.5 False\n", "1.5 True\n"]        # the second read the stored Result
    assert (tmp_path / "progress.log").read_text().count("attnlab: computed slow") == 1


def test_overlapping_sets_asked_in_either_order_take_turns_without_deadlock(tmp_path, monkeypatch):
    """cached_figures locks a set of Results: taken in one order (by folder name), two sets that overlap never
    wait for each other forever, and one holder's turn ends before the other's starts."""
    import threading

    from attnlab.core import cache

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    x, y = ("x", {"version": 1}), ("y", {"version": 1})
    turns = []

    def hold(wanted, who):
        with cache.locked(wanted):
            turns.append((who, "in"))
            time.sleep(0.3)
            turns.append((who, "out"))

    threads = [threading.Thread(target=hold, args=(w, who)) for w, who in (([x, y], "a"), ([y, x], "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert [step for _, step in turns] == ["in", "out", "in", "out"] and turns[0][0] == turns[1][0]
    assert sorted(p.name for p in (tmp_path / cache.LOCKS).iterdir()) == sorted(
        f"{cache._entry(n, k)}.lock" for n, k in (x, y))


def test_a_result_asked_twice_in_one_set_is_locked_once(tmp_path, monkeypatch):
    """A second lock on the same file from the same process would wait for itself forever."""
    from attnlab.core import cache

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    with cache.locked([("x", {"version": 1}), ("x", {"version": 1})], patience=0.1):
        pass
