"""`attnlab results list | verify | compute`: the registry of computations (`attnlab.computations`) and the
results cache. `list [--json]`: every computation (name, version, inputs, probes, where it is used); `verify`:
every stored Result computed again from its key and compared (as `attnlab verify-results`); `compute --models
A,B [--windows K] [--cluster local:N]`: the Results the store lacks for those models (`attnlab.results.plan`): on the
book's window every figure, the perplexity on both corpora and the chapters' model-only Results; with --windows, paper
1's figures on K windows of each corpus; on a Dask cluster with --cluster (`attnlab.cluster`)."""
from __future__ import annotations

import json
import sys
from typing import Sequence

from attnlab.cli.options import model_args, quiet_arg


def add_cli(sub) -> None:
    p = sub.add_parser("results", help="the registry of computations and the results cache: list, verify, compute")
    what = p.add_subparsers(dest="action", required=True)
    ls = what.add_parser("list", help="every computation: name, version, inputs, golden probes, where it is used")
    ls.add_argument("--json", action="store_true", help="print the registry as JSON")
    quiet_arg(ls)
    ls.set_defaults(func=run_list)
    v = what.add_parser("verify", help="compute every stored Result again and compare it with the stored one")
    quiet_arg(v)
    v.set_defaults(func=run_verify)
    c = what.add_parser("compute", help="compute and store the Results the cache lacks for some models")
    model_args(c)
    c.add_argument("--models", default=None, metavar="A,B", help="comma-separated models (default: --model)")
    c.add_argument("--windows", type=int, default=None, metavar="K",
                   help="paper 1's figures on K windows of each corpus (`attnlab.windows`, L <= 512; default: the "
                        "book's window, War and Peace from its start, every figure)")
    c.add_argument("--lengths", default=None, metavar="L1,L2",
                   help="with --windows: the window lengths L the figures go to, one task per window and L "
                        "(default: 512; each L >= 32 and at most the model's positions)")
    c.add_argument("--book", action="store_true",
                   help="the Results the book's chapters read (`attnlab.results.book_plan`): --model's book window, "
                        "the in-book models' window set and the chapters' own Results (what `make book` fills before "
                        "the chapters)")
    c.add_argument("--quick", action="store_true", help="small grids, for smoke tests")
    c.add_argument("--cluster", default=None, metavar="local:N|auto|tcp://HOST:PORT",
                   help="run the tasks on a Dask cluster: N local worker processes (auto: as many as cores and "
                        "memory allow, serial when that is one), or a running scheduler (pip install "
                        "'attnlab[cluster]'); Results go to the one store, ATTNLAB_RESULTS_DIR")
    c.add_argument("--memory-per-worker", type=float, default=None, metavar="GiB",
                   help="memory a local worker may use (local:N starts at most memory / this workers; default: "
                        "estimated from the largest model's size and L, `attnlab.results.worker_memory`)")
    quiet_arg(c)
    c.set_defaults(func=run_compute)


def run_list(args) -> int:
    """One block per computation (or the registry as JSON); a reader that stops early (`| head`) is no error."""
    from attnlab.computations import listing

    rows = listing()
    if args.json:
        text = json.dumps(rows, indent=2)
    else:
        text = "\n".join(f"{r['name']} v{r['version']}  [{r['cost']}]  probes: {', '.join(r['probes']) or '-'}"
                         f"{'' if r['recomputable'] else '  (not recomputable from its key)'}\n"
                         f"  inputs   {', '.join(r['inputs'])}\n  compute  {r['compute']}\n"
                         f"  used in  {', '.join(r['used_in'])}\n  declared {r['declared']}" for r in rows)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def run_verify(args) -> int:
    from attnlab.cli.verify import run_verify as verify

    return verify(args)


def run_compute(args) -> int:
    """The Results of each model the results store lacks (`results.plan`, `results.fill`): serially, or as tasks of
    a Dask cluster (--cluster, `attnlab.cluster`). One line per model and window: how many were there and how many
    computed; exit 2 when a task failed (each said in one line as it failed)."""
    from attnlab import results

    lengths = None if args.lengths is None else [x.strip() for x in args.lengths.split(",") if x.strip()]
    if args.book:
        if args.models or args.windows or lengths or args.quick:
            raise ValueError("--book plans its own models and windows: drop --models, --windows, --lengths, --quick")
        tasks = results.book_plan(args.model, args.device)
    else:
        tasks = results.plan((args.models or args.model).split(","), args.windows, args.device, args.quick, lengths)
    if args.cluster and args.cluster != "auto":
        try:
            from attnlab import cluster
        except ImportError as exc:
            raise ValueError("--cluster needs dask.distributed: pip install 'attnlab[cluster]'") from exc

        rows = cluster.compute(tasks, args.cluster, progress=not args.quiet,
                               memory_per_worker_gib=args.memory_per_worker)
    else:                                   # serial (a model loaded once), or auto: `fill_all`
        rows = fill_all(tasks, args.cluster or "serial", progress=not args.quiet)
    for r in rows:
        if "error" not in r:
            print(f"{r['model']}, {r['label']}: {r['stored']} stored, {r['computed']} computed", flush=True)
    failed = [r for r in rows if "error" in r]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} tasks failed (each named above); run again to retry them")
    return 0


def fill_all(tasks: Sequence, how: str = "serial", *, progress: bool = True) -> list[dict]:
    """`fill` of every task: "serial" in this process (a model loaded once), "local:N" or "tcp://..." on a Dask
    cluster (`attnlab.cluster`), "auto" on a local cluster of `local_workers` workers, serial when that is one or the
    cluster extra (dask.distributed) is not installed. [fill's dict, or {"model", "label", "error"}] in task order.
    Here, not in `attnlab.results`, which `attnlab.cluster` imports."""
    from attnlab import results

    if how == "auto":
        n = results.local_workers(tasks)
        how = f"local:{n}" if n > 1 and _has_distributed() else "serial"
    if how == "serial":
        loaded: dict = {}
        return [results.fill(t, loaded) for t in tasks]
    from attnlab import cluster

    return cluster.compute(tasks, how, progress=progress)


def _has_distributed() -> bool:
    import importlib.util

    return importlib.util.find_spec("distributed") is not None
