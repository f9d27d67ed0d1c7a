"""`attnlab results compute --cluster local:N | tcp://HOST:PORT`: the tasks of `attnlab.results.plan` run on a Dask
cluster (`dask.distributed`, the optional extra `attnlab[cluster]`), into the one results store.

- Every worker holds a workspace (`Workspace`, a worker plugin): the models it loaded, each loaded once, and the
  client's results store and data folder, so that a remote worker writes where the serial CLI and the book read.
- A task is `results.fill` of one model on one window: it computes only what the store lacks (a Result already
  there is read, so a killed run resumes) and writes each Result atomically (a pair the reader checks by checksum:
  nothing half-written is read). Tasks are submitted one model's after another and not pinned (`_submit`).
- Faults: a worker killed mid-task -> Dask runs the task again elsewhere (`retries`); a task that raises -> one line
  naming it, the others go on; Ctrl-C -> the futures are cancelled and the cluster closed (with the client).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Optional, Sequence

from distributed import WorkerPlugin  # the optional extra: attnlab[cluster] (the CLI says so when it is missing)

from attnlab.results import Task, fill, memory_bytes

PLUGIN = "attnlab-workspace"
GIB = 1024 ** 3


class Workspace(WorkerPlugin):
    """A Dask worker plugin: the worker's loaded models ({(model, device): AttnModel}) and the client's settings
    (results store, data folder, cache folder), set in the worker's environment when it starts."""

    idempotent = True
    name = PLUGIN

    def __init__(self, env: dict):
        self.env, self.loaded = dict(env), {}

    def setup(self, worker) -> None:
        import torch

        os.environ.update(self.env)
        os.environ.setdefault("OMP_NUM_THREADS", "1")      # one thread a worker: workers are the parallelism
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))   # torch was imported before (this module's)
        self.loaded = {}
        logging.getLogger("distributed.worker.state_machine").addFilter(_not_cancelled)


def _not_cancelled(record: logging.LogRecord) -> bool:
    """False for a worker's "... ended with CancelledError" line: a task stopped because the cluster closes (after a
    Ctrl-C, `compute`), which the command has already said in one line."""
    return "ended with CancelledError" not in record.getMessage()


def _settings_env() -> dict:
    """The client's settings a worker must share: every ATTNLAB_* variable set here (`core.settings`: the data and
    cache folders, the kernels switch, ...), the results store resolved to a path, and HF_HUB_OFFLINE."""
    from attnlab.core import settings
    from attnlab.core.published import results_dir

    env = {s.name: s.raw() for s in settings.ALL if s.raw() is not None}
    env[settings.RESULTS_DIR.name] = str(results_dir())
    if os.environ.get("HF_HUB_OFFLINE"):
        env["HF_HUB_OFFLINE"] = os.environ["HF_HUB_OFFLINE"]
    return env


def run_on_worker(task: Task) -> dict:
    """`results.fill(task)` with the worker's workspace (its loaded models)."""
    from distributed import get_worker

    return fill(task, get_worker().plugins[PLUGIN].loaded)


def start(spec: str, memory_per_worker_gib: float = 6.0):
    """(client, cluster or None) for `spec`: "local:N" starts a LocalCluster of N one-thread worker processes on
    127.0.0.1 (at most as many as the memory gives `memory_per_worker_gib` each, Dask's memory limit of each: a
    worker holds its model, its captures and one Result's work; `results.worker_memory` estimates it);
    "tcp://HOST:PORT" connects to a running scheduler. ValueError otherwise."""
    from distributed import Client, LocalCluster

    if spec.startswith("tcp://"):
        return Client(spec, timeout="20s"), None
    head, _, count = spec.partition(":")
    if head != "local" or not count.isdigit() or int(count) < 1:
        raise ValueError(f"--cluster must be local:N (N >= 1) or tcp://HOST:PORT, got {spec!r}")
    n = min(int(count), max(1, int(memory_bytes() // (memory_per_worker_gib * GIB))))
    if n < int(count):
        print(f"attnlab: {n} workers, not {count}: {memory_per_worker_gib:.1f} GiB each is what this memory allows",
              file=sys.stderr)
    with _workers_ignore_ctrl_c():
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=":0" if _has_dashboard() else None,
                               memory_limit=int(memory_per_worker_gib * GIB))
    return Client(cluster), cluster


@contextlib.contextmanager
def _workers_ignore_ctrl_c():
    """Ctrl-C ignored while the block starts worker processes, which inherit that: a terminal sends Ctrl-C to the
    whole process group, and only this process should act on it (`compute` shuts the cluster down), not each
    worker logging its own broken connections. Off the main thread (where signals cannot be set): nothing.
    Known limit: a press during the block is lost (the run goes on). Blocking it in this thread instead is not
    enough: the process's other threads (torch's, numba's) take a process-wide signal and ignore it."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


def _has_dashboard() -> bool:
    try:
        import bokeh  # noqa: F401
    except ImportError:
        return False
    return True


def compute(tasks: Sequence[Task], spec: str, *, progress: bool = True, retries: int = 2,
            memory_per_worker_gib: Optional[float] = None) -> list[dict]:
    """Run `tasks` on the cluster `spec` (`start`; a local worker's memory: `memory_per_worker_gib`, else
    `results.plan_memory` of the tasks); [fill's dict, or {"model", "label", "error"}] in task order. A progress bar
    (done / total, per model) on stderr and the dashboard's address when there is one."""
    from attnlab.results import plan_memory

    client, cluster = start(spec, memory_per_worker_gib or plan_memory(tasks) / GIB)
    stopping = contextlib.nullcontext()
    try:
        client.register_plugin(Workspace(_settings_env()), name=PLUGIN)
        if client.dashboard_link and _has_dashboard():
            print(f"attnlab: dashboard {client.dashboard_link}", file=sys.stderr)
        futures = _submit(client, tasks, retries)
        return _gather(client, futures, tasks, progress)
    except KeyboardInterrupt:
        stopping = _dask_quiet()         # the CLI says "interrupted" in one line; Dask's shutdown noise is not news
        raise
    finally:
        with stopping:
            client.close()
            if cluster is not None:
                cluster.close()


@contextlib.contextmanager
def _dask_quiet():
    """Log lines off inside the block (a Ctrl-C's shutdown: `distributed` logs each worker killed mid-task and each
    cancelled future, with tracebacks, from loggers that set their own levels), back on after."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _submit(client, tasks: Sequence[Task], retries: int) -> list:
    """One future per task, in `tasks`' order (one model's after another, so a worker mostly meets the model it
    loaded last). Not pinned to workers: pinning each model to one worker left a worker idle while the other
    computed the dearer model's tasks (SmolLM2 and MiniLM on local:2: 205 s against 129 s serial, BENCHMARKS.md);
    a worker loads each model at most once (its `Workspace`)."""
    return [client.submit(run_on_worker, t, key=f"attnlab-{i}-{t.model}-{t.label}", retries=retries, pure=False,
                          priority=-i) for i, t in enumerate(tasks)]


def _gather(client, futures: list, tasks: Sequence[Task], progress: bool) -> list[dict]:
    """Wait for every future; a failed one gives one line on stderr and an "error" row."""
    from distributed import as_completed

    from attnlab.core.util import progress as progress_bar

    index = {f.key: i for i, f in enumerate(futures)}
    out: list[Optional[dict]] = [None] * len(futures)
    done: dict[str, int] = {}
    try:
        bar = progress_bar(as_completed(futures), progress, "Results (tasks)", total=len(futures))
        for fut in bar:
            t = tasks[index[fut.key]]
            try:
                out[index[fut.key]] = fut.result()
            except Exception as exc:       # noqa: BLE001 - a task's own error: one line, the others go on
                print(f"attnlab: {t.model}, {t.label}: failed: {type(exc).__name__}: {exc}".splitlines()[0],
                      file=sys.stderr)
                out[index[fut.key]] = {"model": t.model, "label": t.label, "error": str(exc).splitlines()[0]}
            done[t.model] = done.get(t.model, 0) + 1
            if hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(", ".join(f"{m} {n}" for m, n in done.items()))
    except KeyboardInterrupt:      # not cancelled one by one (each worker would log each): `compute` closes the
        raise                      # cluster, which stops them
    return out
