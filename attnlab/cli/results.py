"""`attnlab results list | verify | compute`: the registry of computations (`attnlab.computations`) and the
results cache. `list [--json]`: every computation (name, version, inputs, probes, where it is used); `verify`:
every stored Result computed again from its key and compared (as `attnlab verify-results`); `compute --models
A,B [--windows K]`: the figure Results the cache lacks for those models (on K windows of each corpus)."""
from __future__ import annotations

import json
import sys

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
    c = what.add_parser("compute", help="compute and store the figure Results the cache lacks")
    model_args(c)
    c.add_argument("--models", default=None, metavar="A,B", help="comma-separated models (default: --model)")
    c.add_argument("--windows", type=int, default=None, metavar="K",
                   help="paper 1's figures on K windows of each corpus (`attnlab.windows`, L <= 512; default: the "
                        "book's window, War and Peace from its start, every figure)")
    c.add_argument("--quick", action="store_true", help="small grids, for smoke tests")
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
    """The figure Results of each model the results cache lacks, computed and stored (`figures.cached_figures`):
    with --windows, paper 1's figures (default readings) on `windows.text_windows(K)`; else every figure on the
    book's window. One line per model and window: how many were there and how many computed."""
    from attnlab import windows as W
    from attnlab.figures import READING_FIGURES, Inputs, cached_figures, figure_ids

    models = [m.strip() for m in (args.models or args.model).split(",") if m.strip()]
    if not models:
        raise ValueError(f"--models names no model, got {args.models!r}")
    if args.windows is not None and args.windows < 1:
        raise ValueError(f"--windows must be at least 1, got {args.windows}")
    for model in models:
        if args.windows is None:
            ids, runs = figure_ids(), [("the book's window", Inputs(model, args.device))]
        else:
            ids = [i for i in figure_ids("normalization") if i not in READING_FIGURES]
            ws = W.text_windows(args.windows)
            runs = list(zip((w.label for w in ws), W.window_inputs(model, args.device, ws, W.BOOK_MAX_LENGTH)))
        for label, inp in runs:
            res = cached_figures(ids, inp, quick=args.quick)
            fresh = sum(not r.provenance.get("loaded_from_cache") for r in res.values())
            print(f"{model}, {label}: {len(res) - fresh} stored, {fresh} computed", flush=True)
    return 0
