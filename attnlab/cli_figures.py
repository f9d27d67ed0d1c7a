"""`attnlab figures`, `attnlab check`, and the figure benchmarks: the registry of every figure.

A figure is (experiment function -> Result, plot function Result -> Figure). Paper-1 figures need a
model and a text window; the token-sample-complexity figures are synthetic except `tsc_real`, which
needs an encoder. Views only: every number comes from the experiment modules.
"""
from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from attnlab.result import Result


@dataclass(frozen=True)
class FigureSpec:
    paper: str          # "normalization" or "sample-complexity"
    compute: str        # "module:function"
    plot: str           # "module:function"
    needs: str          # "model+text" (paper 1), "none" (synthetic), "encoder" (real tokens)
    title: str


FIGURES: dict[str, FigureSpec] = {
    "fig1": FigureSpec("normalization", "attnlab.experiments:fig1", "attnlab.plots:plot_fig1", "model+text",
                       "Vanishing attention: max weight and entropy against L (Corollary 1)"),
    "fig2a": FigureSpec("normalization", "attnlab.experiments:fig2a", "attnlab.plots:plot_fig2a", "model+text",
                        "Distance against L at N=5 (Theorem 1)"),
    "fig2b": FigureSpec("normalization", "attnlab.experiments:fig2b", "attnlab.plots:plot_fig2b", "model+text",
                        "Distance against N at the largest L (Theorem 1)"),
    "fig2c": FigureSpec("normalization", "attnlab.experiments:fig2c", "attnlab.plots:plot_fig2c", "model+text",
                        "Critical N against L (the 6% rule)"),
    "fig3": FigureSpec("normalization", "attnlab.experiments:fig3", "attnlab.plots:plot_fig3", "model+text",
                       "Geometric separability N_s/N (Theorem 2)"),
    "fig4": FigureSpec("normalization", "attnlab.experiments:fig4", "attnlab.plots:plot_fig4", "model+text",
                       "Gradient sensitivity against T (Lemma 2)"),
    "tsc_uniform": FigureSpec("sample-complexity", "attnlab.tsc_experiments:uniform_map",
                              "attnlab.tsc_experiments:plot_uniform_map", "none",
                              "Uniform convergence of the attention map (C(R)/sqrt n)"),
    "tsc_moments": FigureSpec("sample-complexity", "attnlab.tsc_experiments:moment_convergence",
                              "attnlab.tsc_experiments:plot_moment_convergence", "none",
                              "Moment convergence: fitted |beta| against the horizon H"),
    "tsc_hardmax": FigureSpec("sample-complexity", "attnlab.tsc_experiments:hardmax",
                              "attnlab.tsc_experiments:plot_hardmax", "none",
                              "The hardmax regime: slower than any power law"),
    "tsc_real": FigureSpec("sample-complexity", "attnlab.tsc_experiments:real_encoder",
                           "attnlab.tsc_experiments:plot_real_encoder", "encoder",
                           "Real tokens: a pretrained encoder on WikiText-2"),
}


def _resolve(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class Inputs:
    """Loads the model and text once, lazily, for every figure of a run."""

    def __init__(self, model: str, device: str, text: str = "war_and_peace"):
        self.model_name, self.device, self.text_name = model, device, text
        self._model = self._corpus = self._encoder = None

    @property
    def model(self):
        if self._model is None:
            from attnlab.models import load_model

            self._model = load_model(self.model_name, self.device)
        return self._model

    @property
    def corpus(self):
        if self._corpus is None:
            from attnlab.text import load_corpus

            self._corpus = load_corpus(self.text_name)
        return self._corpus

    def ids(self, length: Optional[int] = None):
        """Token ids of the largest window the figures use: min(model positions, 1024)."""
        L = length or min(self.model.max_positions, 1024)
        return self.model.window(self.corpus.text, L)

    @property
    def encoder(self):
        """The model itself when it is an encoder; else MiniLM (the sample-complexity protocol is an encoder's)."""
        if self._encoder is None:
            if not self.model.causal:
                self._encoder = self.model
            else:
                from attnlab.models import load_model

                self._encoder = load_model("minilm", self.device)
        return self._encoder


def compute_figures(fig_ids, inputs: Inputs, *, quick: bool = False, progress: bool = True) -> dict[str, Result]:
    """Run the experiments of `fig_ids` and return {id: Result}. Paper-1 figures share forward passes."""
    unknown = [i for i in fig_ids if i not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure ids {unknown}; known: {', '.join(FIGURES)}")
    out: dict[str, Result] = {}
    paper1 = [i for i in fig_ids if FIGURES[i].needs == "model+text"]
    if paper1:
        from attnlab.experiments import run_figures

        t0 = time.perf_counter()
        text = dict(inputs.corpus.provenance(), offset=0)
        out.update(run_figures(inputs.model, inputs.ids(), quick=quick, progress=progress, figures=paper1,
                               text=text))
        for i in paper1:
            out[i].provenance.setdefault("runtime_s", round(time.perf_counter() - t0, 3))
    for fig_id in fig_ids:
        if fig_id in out:
            continue
        spec, t0 = FIGURES[fig_id], time.perf_counter()
        fn = _resolve(spec.compute)
        if spec.needs == "encoder":
            out[fig_id] = fn(inputs.encoder, quick=quick, device=inputs.device)
        else:
            out[fig_id] = fn(quick=quick, device=inputs.device)
        out[fig_id].provenance.setdefault("runtime_s", round(time.perf_counter() - t0, 3))
    for fig_id in fig_ids:
        spec = FIGURES[fig_id]
        out[fig_id].name = fig_id
        out[fig_id].provenance["figure_spec"] = {"id": fig_id, "title": spec.title, "paper": spec.paper,
                                                 "quick": quick}
    return {i: out[i] for i in fig_ids}


def save_figure(result: Result, out: Path) -> list[Path]:
    """<id>.csv, <id>.json (provenance) and <id>.png (titled with model and text by the plot function)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    paths = list(result.save(out).values())
    fig = _resolve(FIGURES[result.name].plot)(result)
    png = out / f"{result.name}.png"
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths + [png]


# ------------------------------------------------------------------------------------- CLI

def add_cli(sub) -> None:
    from attnlab.cli import model_args

    p = sub.add_parser("figures", help="regenerate figures: <id>.csv, <id>.png, <id>.json per figure")
    p.add_argument("ids", nargs="*", metavar="ID", help=f"figure ids (default all): {', '.join(FIGURES)}")
    model_args(p)
    p.add_argument("--out", default="figures", help="output directory (default: figures)")
    p.add_argument("--quick", action="store_true", help="small grids, for smoke tests")
    p.set_defaults(func=run_figures_cli)

    c = sub.add_parser("check", help="the table of paper claims: paper value, measured value, verdict")
    model_args(c)
    c.add_argument("--quick", action="store_true", help="small grids (verdicts on small grids are indicative)")
    c.add_argument("--json", action="store_true", help="print the table as JSON")
    c.add_argument("--strict", action="store_true", help="exit non-zero when a claim does not hold")
    c.add_argument("--paper", choices=["all", "normalization", "sample-complexity"], default="all")
    c.set_defaults(func=run_check_cli)


def _progress_print(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_figures_cli(args) -> int:
    ids = args.ids or list(FIGURES)
    inputs, out = Inputs(args.model, args.device), Path(args.out)
    t0 = time.perf_counter()
    results = compute_figures(ids, inputs, quick=args.quick)
    for fig_id, result in results.items():
        paths = save_figure(result, out)
        _progress_print(f"[{fig_id}] {FIGURES[fig_id].title}: model {result.provenance.get('model', 'synthetic')}"
                        f" -> " + ", ".join(p.name for p in paths))
    _progress_print(f"{len(results)} figures in {time.perf_counter() - t0:.1f} s, written to {out}/")
    return 0


def claim_rows(inputs: Inputs, *, quick: bool, paper: str = "all", progress: bool = True) -> list[dict]:
    """Compute the Results the claims need and return every claim row (id, claim, paper, measured, verdict)."""
    rows: list[dict] = []
    if paper in ("all", "normalization"):
        from attnlab.claims import paper1_claims

        ids = [i for i, s in FIGURES.items() if s.paper == "normalization"]
        rows += paper1_claims(compute_figures(ids, inputs, quick=quick, progress=progress))
    if paper in ("all", "sample-complexity"):
        from attnlab.tsc_experiments import tsc_claims

        keys = {"tsc_uniform": "uniform_map", "tsc_moments": "moment_convergence", "tsc_hardmax": "hardmax",
                "tsc_real": "real_encoder"}
        results = compute_figures(list(keys), inputs, quick=quick, progress=progress)
        rows += tsc_claims({keys[i]: r for i, r in results.items()})
    return rows


def format_table(rows: list[dict], widths=(18, 40, 34, 44, 14)) -> str:
    """A plain-text table; long cells wrap inside their column."""
    import textwrap

    cols = ["id", "claim", "paper", "measured", "verdict"]

    def lines(r):
        cells = [textwrap.wrap(str(r.get(c, "")), w) or [""] for c, w in zip(cols, widths)]
        return ["  ".join((cell[i] if i < len(cell) else "").ljust(w) for cell, w in zip(cells, widths)).rstrip()
                for i in range(max(map(len, cells)))]

    out = lines({c: c for c in cols}) + ["  ".join("-" * w for w in widths)]
    for r in rows:
        out += lines(r) + [""]
    return "\n".join(out)


def run_check_cli(args) -> int:
    rows = claim_rows(Inputs(args.model, args.device), quick=args.quick, paper=args.paper)
    if args.json:
        keys = ("id", "claim", "paper", "measured", "verdict")
        print(json.dumps([{k: r.get(k) for k in keys} for r in rows], indent=2))
    else:
        print(format_table(rows))
        counts = {v: sum(r["verdict"] == v for r in rows) for v in ("holds", "does not hold", "not applicable")}
        print("\n" + ", ".join(f"{n} {v}" for v, n in counts.items()))
    failed = [r["id"] for r in rows if r["verdict"] == "does not hold"]
    return 1 if (args.strict and failed) else 0


def bench_figures_cli(args) -> list[dict]:
    """Each paper-1 figure: vectorised vs the per-row oracle on the same traces; last line min speedup."""
    from attnlab.experiments import bench_figures

    inputs = Inputs(args.model, "cpu")
    rows = bench_figures(inputs.model, inputs.ids(), quick=args.quick, progress=False)
    for r in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    total = sum(r.get("vectorised_full_s", 0.0) for r in rows)
    print(f"total vectorised time, all figures, all layers: {total:.1f} s ({inputs.model.name})")
    print(f"min speedup: {min(r['speedup'] for r in rows):.1f}")
    return rows


def bench_montecarlo_cli(args) -> list[dict]:
    from attnlab.tsc_experiments import bench_monte_carlo

    result = bench_monte_carlo(repeats=2 if args.quick else 3)
    for r in result.rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    return result.rows
