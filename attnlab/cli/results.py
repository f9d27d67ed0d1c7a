"""`attnlab results list | verify | compute`: the registry of computations (`attnlab.computations`) and the
results cache. `list [--json]`: every computation (name, version, inputs, probes, where it is used); `verify`:
every stored Result computed again from its key and compared (as `attnlab verify-results`); `compute --models
A,B [--windows K]`: the Results the cache lacks for those models: on the book's window every figure, the perplexity
on both corpora and the chapters' model-only Results (`BOOK_WINDOW_RESULTS`); with --windows, paper 1's figures on
K windows of each corpus."""
from __future__ import annotations

import json
import sys

from attnlab.cli.options import model_args


def add_cli(sub) -> None:
    p = sub.add_parser("results", help="the registry of computations and the results cache: list, verify, compute")
    what = p.add_subparsers(dest="action", required=True)
    ls = what.add_parser("list", help="every computation: name, version, inputs, golden probes, where it is used")
    ls.add_argument("--json", action="store_true", help="print the registry as JSON")
    ls.set_defaults(func=run_list)
    v = what.add_parser("verify", help="compute every stored Result again and compare it with the stored one")
    v.set_defaults(func=run_verify)
    c = what.add_parser("compute", help="compute and store the Results the cache lacks for some models")
    model_args(c)
    c.add_argument("--models", default=None, metavar="A,B", help="comma-separated models (default: --model)")
    c.add_argument("--windows", type=int, default=None, metavar="K",
                   help="paper 1's figures on K windows of each corpus (`attnlab.windows`, L <= 512; default: the "
                        "book's window, War and Peace from its start, every figure)")
    c.add_argument("--quick", action="store_true", help="small grids, for smoke tests")
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


# the chapters' Results that need only a model and the book's window: (name, key without the model and text)
BOOK_WINDOW_RESULTS = (("compare_normalizers", {"params": "default"}),     # chapter 7, cell baa9369c
                       ("diagnose", {"params": "default"}))                # chapter 8, cell 8b431e04


def run_compute(args) -> int:
    """The Results of each model the results cache lacks, computed and stored. With --windows, paper 1's figures
    (default readings) on `windows.text_windows(K)`; else on the book's window every figure, the perplexity on both
    corpora, chapter 4's head separability and `BOOK_WINDOW_RESULTS` (causal models). One line per model and
    window: how many were there and how many computed."""
    from attnlab import windows as W
    from attnlab.figures import READING_FIGURES, Inputs, figure_ids

    models = [m.strip() for m in (args.models or args.model).split(",") if m.strip()]
    if not models:
        raise ValueError(f"--models names no model, got {args.models!r}")
    if args.windows is not None and args.windows < 1:
        raise ValueError(f"--windows must be at least 1, got {args.windows}")
    for model in models:
        if args.windows is None:
            _report(model, "the book's window", _book_window(Inputs(model, args.device), args.quick))
            continue
        ids, ws = [i for i in figure_ids("normalization") if i not in READING_FIGURES], W.text_windows(args.windows)
        for w, inp in zip(ws, W.window_inputs(model, args.device, ws, W.BOOK_MAX_LENGTH)):
            _report(model, w.label, _figures(ids, inp, args.quick))
    return 0


def _figures(ids, inp, quick: bool) -> list:
    from attnlab.figures import cached_figures

    return list(cached_figures(ids, inp, quick=quick).values())


def _book_window(inp, quick: bool) -> list:
    """Every figure of `inp`'s model on the book's window, then (not with --quick) its perplexity on both corpora,
    chapter 4's head separability and, for a causal model, `BOOK_WINDOW_RESULTS`."""
    from attnlab.figures import figure_ids

    out = _figures(figure_ids(), inp, quick)
    if quick:
        return out
    from attnlab import results
    from attnlab.core.perplexity import cached_perplexity
    from attnlab.core.text import load_corpus
    from attnlab.views import separability

    model = inp.model
    out += [cached_perplexity(model, load_corpus(c)) for c in ("war_and_peace", "wikitext2") if model.causal]
    out.append(separability.head_separability(model.name))
    if model.causal:
        out += [results.result(name, dict(key, device=inp.device), model=model, corpus=inp.corpus)
                for name, key in BOOK_WINDOW_RESULTS]
    return out


def _report(model: str, label: str, res: list) -> None:
    fresh = sum(not r.provenance.get("loaded_from_cache") for r in res)
    print(f"{model}, {label}: {len(res) - fresh} stored, {fresh} computed", flush=True)
