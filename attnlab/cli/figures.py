"""`attnlab figures` and `attnlab check`: parse, call `attnlab.figures`, print."""
from __future__ import annotations

import json
import sys
import textwrap
import time

from attnlab.cli.options import max_length_type, model_args, quiet_arg

# `attnlab.figures`'s ids and papers, here so that --help imports no torch (tests/test_cli.py: the same as FIGURES's)
FIGURE_IDS = ("fig1", "fig2a", "fig2b", "fig2c", "fig3", "fig4", "thm1_readings", "separability_readings",
              "gradient_readings", "tsc_uniform", "tsc_moments", "tsc_hardmax", "tsc_real")
PAPERS = ("normalization", "sample-complexity")


def add_cli(sub) -> None:
    p = sub.add_parser("figures", help="regenerate figures: <id>.csv, <id>.png, <id>.json per figure")
    p.add_argument("ids", nargs="*", metavar="ID", help=f"figure ids (default all): {', '.join(FIGURE_IDS)}")
    model_args(p)
    p.add_argument("--out", default="figures", help="output directory (default: figures)")
    p.add_argument("--quick", action="store_true", help="small grids, for smoke tests")
    p.add_argument("--max-length", type=max_length_type("figures"), default=None, metavar="L",
                   help="the longest window of the paper-1 figures (default 1024, the paper's; up to the model's "
                        "positions: 8192 on smollm2); long windows stream the layers in blocks")
    quiet_arg(p)
    p.set_defaults(func=run_figures)

    c = sub.add_parser("check", help="the table of paper claims: paper value, measured value, verdict")
    model_args(c)
    c.add_argument("--quick", action="store_true", help="small grids (verdicts on small grids are indicative)")
    c.add_argument("--json", action="store_true",
                   help="every row as JSON: id, reading, claim, paper, measured, verdict, value, unit, model and "
                        "provenance")
    c.add_argument("--all", action="store_true",
                   help="the full table (every row, not applicable ones and other readings too; default: one line "
                        "per claim that applies, and the counts)")
    c.add_argument("--strict", action="store_true", help="exit non-zero when a claim does not hold")
    c.add_argument("--paper", choices=["all", *PAPERS], default="all",
                   help="normalization: arXiv 2508.17821 (the model's attention on War and Peace); sample-complexity: "
                        "arXiv 2512.10656 (synthetic tokens, and a pretrained encoder's: the model when it is one, "
                        "else MiniLM); default: all")
    c.add_argument("--readings", choices=["all", "default"], default=None,
                   help="all: also one row per reading of each open formula (reading column); default: the book's "
                        "readings only (default: all; with --windows: default, as every window computes them again)")
    c.add_argument("--models", default=None, metavar="A,B",
                   help="several models side by side (comma-separated names as --model takes): per claim, each "
                        "model's measured value and verdict, and whether the verdict changes with the model")
    c.add_argument("--windows", type=int, default=None, metavar="K",
                   help="paper-1 claims on K windows of War and Peace and K of the WikiText-2 test split (stated "
                        "offsets: `attnlab.windows`): each claim's verdict per window, the median and range of its "
                        "number, and whether the verdict is the same in every window; a window that starts on markup "
                        "(a heading line, a run of identical tokens) is flagged, with Fig. 4's verdicts there also "
                        "without the rows those tokens make degenerate")
    c.add_argument("--max-length", type=max_length_type("figures"), default=None, metavar="L",
                   help="with --windows: the longest window (default 512)")
    c.add_argument("--refresh", action="store_true",
                   help="recompute every Result (default: the results cache's, where the book or an earlier check "
                        "stored one for the same versions, model weights, text and libraries)")
    quiet_arg(c)
    c.set_defaults(func=run_check)


def _progress_print(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_figures(args) -> int:
    from attnlab.core.util import writable_dir
    from attnlab.figures import FIGURES, Inputs, compute_figures, write_figures

    ids = args.ids or list(FIGURES)
    unknown = [i for i in ids if i not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure ids {unknown}; known: {', '.join(FIGURES)}")
    out = writable_dir(args.out)                 # before any computation: a bad --out fails at once
    inputs = Inputs(args.model, args.device, max_length=args.max_length)
    t0 = time.perf_counter()
    results = compute_figures(ids, inputs, quick=args.quick)

    def report(fig_id, paths):
        model = results[fig_id].provenance.get("model", "synthetic")
        _progress_print(f"[{fig_id}] {FIGURES[fig_id].title}: model {model} -> " + ", ".join(p.name for p in paths))

    write_figures(out, results, report=report)
    _progress_print(f"{len(results)} figures in {time.perf_counter() - t0:.1f} s, written to {out}/ "
                    "(manifest.json names the run)")
    return 0


def format_table(rows: list[dict], widths=(18, 16, 36, 30, 40, 14), cols=None) -> str:
    """A plain-text table; long cells wrap inside their column. `reading` names the reading of an open formula a
    row was measured under ("" = the book's defaults; `attnlab.normalization.readings`)."""
    cols = cols or ["id", "reading", "claim", "paper", "measured", "verdict"]

    def lines(r):
        cells = [textwrap.wrap(str(r.get(c, "")), w) or [""] for c, w in zip(cols, widths)]
        return ["  ".join((cell[i] if i < len(cell) else "").ljust(w) for cell, w in zip(cells, widths)).rstrip()
                for i in range(max(map(len, cells)))]

    out = lines({c: c for c in cols}) + ["  ".join("-" * w for w in widths)]
    for r in rows:
        out += lines(r) + [""]
    return "\n".join(out)


def run_check_models(args) -> int:
    """`check --models A,B`: the claim table with one measured/verdict pair per model."""
    from attnlab.figures import claims_by_model, compare_rows

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if len(models) < 2 or len(set(models)) != len(models):
        raise ValueError(f"--models needs two or more different model names, comma-separated, got {args.models!r}")
    by_model = claims_by_model(models, args.device, quick=args.quick, paper=args.paper,
                               readings=args.readings == "all", refresh=args.refresh)
    rows = [r for r in compare_rows(by_model) if args.readings == "all" or not r["reading"]]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    flat = [{"id": r["id"], "reading": r["reading"], "claim": r["claim"], "paper": r["paper"],
             **{m: f"{r['verdict'][m]}: {r['measured'][m]}" for m in models},
             "same": "same" if r["same"] else "differs"} for r in rows]
    print("models: " + "; ".join(f"{m} = {by_model[m][0]['model_kind']}" for m in models if by_model[m]))
    width = max(24, 60 // len(models))
    print(format_table(flat, cols=["id", "reading", "claim", "paper", *models, "same"],
                       widths=(18, 12, 30, 24, *([width] * len(models)), 8)))
    print(f"\n{sum(not r['same'] for r in rows)} of {len(rows)} claims get a different verdict on "
          + " and ".join(models))
    failed = any(v == "does not hold" for r in rows for v in r["verdict"].values())
    return 1 if (args.strict and failed) else 0


def run_check_windows(args) -> int:
    """`check --windows K`: per model, each paper-1 claim's verdict per text window and the summary."""
    from attnlab import windows as W
    from attnlab.windows import BOOK_MAX_LENGTH, claims_over_windows, spread_text, text_windows, window_summary

    if args.windows < 1:
        raise ValueError(f"--windows must be at least 1, got {args.windows}")
    if args.paper == "sample-complexity":
        raise ValueError("--windows applies to the first paper's claims (--paper normalization)")
    models = [m.strip() for m in (args.model if args.models is None else args.models).split(",") if m.strip()]
    if not models:
        raise ValueError(f"--models names no model, got {args.models!r}: comma-separated names as --model takes")
    windows = text_windows(args.windows)
    readings = args.readings == "all"
    length = BOOK_MAX_LENGTH if args.max_length is None else args.max_length     # 0 is refused, not the default
    out, notes, failed = {}, {}, False
    for model in models:
        per = claims_over_windows(model, windows, device=args.device, max_length=length,
                                  readings=readings, refresh=args.refresh)
        out[model] = window_summary(per)
        notes[model] = W.markup_over_windows(model, windows, device=args.device, max_length=length)
        for s in out[model]:             # a window that starts on repeated tokens: the claim without those rows
            without = {lab: r for lab, n in notes[model].items() for r in n["without"]
                       if r["id"] == s["id"] and not s["reading"]}
            if without:
                s["without_repeats"] = {lab: {"value": r.get("value"), "verdict": r["verdict"],
                                              "degenerate_share": notes[model][lab]["degenerate_share"]}
                                        for lab, r in without.items()}
        failed |= any(s["verdict"] != "holds" and s["verdict"] != "not applicable" for s in out[model])
    if args.json:
        print(json.dumps({m: rows for m, rows in out.items()}, indent=2, default=float))
        return 1 if (args.strict and failed) else 0
    print("windows (L up to %d): " % length + "; ".join(f"{w.label} = {w.corpus} from character {w.start}"
                                                         for w in windows))
    for model, rows in out.items():
        print(f"\n== model {model} ==")
        for lab, n in notes[model].items():
            if n["flagged"]:
                print(f"flagged: {lab} {n['why']} ({model}'s tokens)" + (
                    f"; rows whose two largest logits fall on those repeated tokens: {n['degenerate_share']:.1%}"
                    if n["run"] >= 2 else ""))
        for s in rows:
            print(f"\n{s['id']}" + (f" [{s['reading']}]" if s["reading"] else "") + f"  {s['claim']}")
            print(textwrap.indent(textwrap.fill(spread_text(s), 100), "  "))
            for lab, v in s["values"].items():
                extra = W.without_text(notes[model][lab], s["id"]) if not s["reading"] else ""
                print(f"    {lab:<16}{'-' if v is None else f'{v:.3g}':>10}  {s['verdicts'][lab]}"
                      + (f"  ({extra})" if extra else ""))
        changed = [s["id"] + (f" [{s['reading']}]" if s["reading"] else "") for s in rows if s["verdict"] == "mixed"]
        print(f"\n{len(changed)} of {len(rows)} claims depend on the window on {model}"
              + (": " + ", ".join(changed) if changed else ""))
        driven = W.driven_by_repeats(rows, notes[model])
        if driven:
            print("verdicts that the rows on a window's leading repeated tokens decide: "
                  + "; ".join(W.driven_text(d) for d in driven))
    return 1 if (args.strict and failed) else 0


def encoder_line(inputs, paper: str) -> str:
    """Before computing: which model paper 2's real-token claim reads (an encoder: the model itself, else MiniLM);
    ValueError in one line when no encoder is available, before paper 1 spends minutes."""
    from attnlab.core.model_files import ModelUnavailable

    if paper == "normalization":
        return ""
    try:
        encoder = inputs.encoder
    except ModelUnavailable as exc:
        raise ValueError(f"paper 2's real-token claim needs an encoder: {inputs.model.name} is causal and MiniLM is "
                         f"not available ({exc}); pass --paper normalization, or an encoder as --model") from None
    if encoder is inputs.model:
        return f"[check] paper 2's real-token claim reads {encoder.name} (an encoder)"
    return (f"[check] paper 2's real-token claim reads {encoder.name}: {inputs.model.name} is causal, the claim needs "
            "an encoder")


def rows_with_provenance(results: dict) -> list[dict]:
    """Every claim row of `claim_results`' Results (as `claim_table`), each with `provenance`: what the Results of
    its paper and model share (model identity, text and its sha256, versions, ...)."""
    from attnlab.figures import CLAIMS

    rows = []
    for name, res in results.items():
        for r in CLAIMS[name](res):
            provs = [x.provenance for x in res.values() if x.provenance.get("model") == r.get("model")]
            shared = {k: v for k, v in (provs[0] if provs else {}).items()
                      if all(p.get(k) == v for p in provs) and not isinstance(v, (dict, list))}
            rows.append(dict(r, paper_id=name, provenance=shared))
    return rows


def summary_lines(rows: list[dict]) -> list[str]:
    """The default `check` output: one line per claim at the book's readings that applies (verdict, the number
    it turns on and its unit), then the counts and what --all adds."""
    shown = [r for r in rows if not r["reading"] and r["verdict"] != "not applicable"]
    width = max([len(r["id"]) for r in shown] + [2])
    out = []
    for r in shown:
        value = "" if r.get("value") is None else f"{r['value']:.4g} {r.get('unit') or ''}".rstrip()
        out.append(f"{r['id']:<{width}}  {r['verdict']:<13}  {value or r['measured'][:40]}")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("holds", "does not hold", "not applicable")}
    readings = sum(bool(r["reading"]) for r in rows)
    out.append("\n" + ", ".join(f"{n} {v}" for v, n in counts.items())
               + f" ({len(rows)} rows, {readings} of them other readings of an open formula); "
               "--all: the full table, --json: every row with its value, unit, model and provenance")
    return out


def run_check(args) -> int:
    from attnlab.core.cache import results_dir
    from attnlab.figures import Inputs, claim_results

    if args.windows is not None:
        return run_check_windows(args)
    args.readings = args.readings or "all"
    if args.max_length is not None:
        raise ValueError("--max-length goes with --windows (the claim table itself uses the paper's L <= 1024)")
    if args.models is not None:                   # --models '' is an error, not the single-model table
        return run_check_models(args)
    inputs = Inputs(args.model, args.device)
    said = encoder_line(inputs, args.paper)
    if said:
        _progress_print(said)
    results = claim_results(inputs, quick=args.quick, paper=args.paper,
                            readings=args.readings == "all", refresh=args.refresh)
    every = [r for res in results.values() for r in res.values()]
    site = sum(bool(r.provenance.get("fetched_from_site")) for r in every)
    stored = sum(bool(r.provenance.get("loaded_from_cache")) for r in every) - site
    _progress_print(f"[check] {len(every)} Results: {stored} from the results cache ({results_dir()}), "
                    f"{site} from the site, {len(every) - stored - site} computed now"
                    + ("" if args.refresh else "; --refresh recomputes all"))
    rows = [r for r in rows_with_provenance(results) if args.readings == "all" or not r["reading"]]
    model = next((r.provenance.get("model_info") for res in results.values() for r in res.values()
                  if r.provenance.get("model_info")), None)
    if model:
        kind = "causal decoder" if model["causal"] else "bidirectional encoder"
        note = f"; {model['model_note']}" if model.get("model_note") else ""
        _progress_print(f"[check] model: {model['model']} ({kind}{note})")
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    elif args.all:
        print(format_table(rows))
        counts = {v: sum(r["verdict"] == v for r in rows) for v in ("holds", "does not hold", "not applicable")}
        print("\n" + ", ".join(f"{n} {v}" for v, n in counts.items()))
    else:
        print("\n".join(summary_lines(rows)))
    failed = [r["id"] for r in rows if r["verdict"] == "does not hold"]
    return 1 if (args.strict and failed) else 0
