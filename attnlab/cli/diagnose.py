"""`attnlab diagnose`: parse, call `attnlab.tools.diagnose`, write the report, print the summary."""
from __future__ import annotations

from pathlib import Path

from attnlab.cli.options import model_args, quiet_arg
from attnlab.tools.thresholds import ALPHA, DEFAULT_LENGTHS, MAX_ROWS, N_SEP, N_TOP, Thresholds

# the first line of `attnlab.tools.diagnose`'s docstring (tests/test_cli.py checks it), without importing torch
DESCRIPTION = "Attention diagnostics for any model: which heads are saturated, in the sense of arXiv 2508.17821."


def add_cli(sub) -> None:
    p = sub.add_parser("diagnose", help="per-head saturation report (HTML, CSV, JSON) for any attention model",
                       description=DESCRIPTION)
    model_args(p)
    p.add_argument("--text", help="UTF-8 text file (default: War and Peace from ATTNLAB_DATA_DIR or the cache)")
    p.add_argument("--lengths", type=int, nargs="+", help=f"context lengths L (default {list(DEFAULT_LENGTHS)}, "
                                                          "those that fit the model and the text)")
    p.add_argument("--out", help="output directory (default: diagnose-<model>)")
    p.add_argument("--n-top", type=int, default=N_TOP, help="N of d~ (default %(default)s)")
    p.add_argument("--n-sep", type=int, default=N_SEP, help="N of N_s/N (default %(default)s)")
    p.add_argument("--max-rows", type=int, default=MAX_ROWS, help="query rows per head for the per-row metrics "
                                                                 "(default %(default)s; 0 = all)")
    p.add_argument("--alpha", type=float, default=ALPHA, help="KS level of the critical-N test (default %(default)s)")
    p.add_argument("--entropy-threshold", type=float, default=Thresholds.entropy,
                   help="flag a head near-uniform at entropy score H / log L >= this (default %(default)s)")
    p.add_argument("--separability-threshold", type=float, default=Thresholds.separability,
                   help="flag low separability at score (1 - N_s/N) / (1 - N_s/N of uniform attention) >= this "
                        "(default %(default)s)")
    p.add_argument("--sharp-gate", type=float, default=Thresholds.sharp_gate,
                   help="low separability only for heads with entropy score >= this (default %(default)s)")
    p.add_argument("--critical-threshold", type=float, default=Thresholds.critical,
                   help="flag a layer at critical-N score (n_max - N*) / (n_max - N* of uniform attention) >= this "
                        "(default %(default)s)")
    quiet_arg(p)
    p.set_defaults(func=run_cli)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name.strip("/").split("/")[-1]) or "model"


def run_cli(args) -> int:
    from attnlab.core.models import load_model
    from attnlab.core.text import read_text_file
    from attnlab.core.util import writable_dir
    from attnlab.tools.diagnose import check_options, diagnose
    from attnlab.tools.report import summary, write_report

    if args.out is not None:                      # a bad --out fails before any computation ('' too)
        if not args.out.strip():
            raise ValueError("--out '' names no folder: pass a directory, or leave --out out")
        out = Path(args.out).expanduser()
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {args.out!r} exists and is not a directory: choose another path")
        writable_dir(out if out.exists() else out.parent)
    text, info = read_text_file(args.text) if args.text is not None else (None, None)   # --text '' is an error
    thr = Thresholds(entropy=args.entropy_threshold, separability=args.separability_threshold,
                     sharp_gate=args.sharp_gate, critical=args.critical_threshold).check()
    if args.max_rows is not None and args.max_rows < 0:
        raise ValueError(f"--max-rows must be an integer >= 0 (0: all rows), got {args.max_rows}")
    check_options(n_top=args.n_top, n_sep=args.n_sep, alpha=args.alpha, max_rows=args.max_rows or None,
                  lengths=args.lengths)
    model = load_model(args.model, args.device)
    result = diagnose(
        model,
        text,
        lengths=args.lengths,
        n_top=args.n_top,
        n_sep=args.n_sep,
        thresholds=thr,
        max_rows=args.max_rows or None,
        alpha=args.alpha,
        text_info=info,
        progress=not args.quiet,
    )
    out = args.out or f"diagnose-{_safe_name(model.name)}"
    paths = write_report(result, out)
    print(summary(result))
    print("wrote " + ", ".join(str(paths[k]) for k in ("html", "csv", "json")))
    return 0
