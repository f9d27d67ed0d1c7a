"""The one registry of figures: id -> (compute, plot, needs, paper, title), the inputs a run shares,
and computing, saving and claim-checking a set of figures. The CLI, the book and the benchmarks all
read `FIGURES`.

A figure is (experiment function -> Result, plot function Result -> Figure). Paper-1 figures need a
model and a text window ("model+text", computed together so that they share forward passes); the
token-sample-complexity figures are synthetic ("none") except `tsc_real`, which needs an encoder.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from attnlab.computations import version
from attnlab.core.result import Result
from attnlab.core.util import atomic_write
from attnlab.core.verdicts import with_model
from attnlab.normalization import claims as normalization_claims
from attnlab.normalization import experiments as normalization
from attnlab.normalization import plots as normalization_plots
from attnlab.normalization.readings import lemma2, theorem1, theorem2
from attnlab.sample_complexity import claims as sample_complexity_claims
from attnlab.sample_complexity import experiments as sample_complexity
from attnlab.sample_complexity import plots as sample_complexity_plots
from attnlab.sample_complexity import real_tokens, sphere
from attnlab.workspace import Workspace

PAPERS = ("normalization", "sample-complexity")
NEEDS = ("model+text", "none", "encoder")


@dataclass(frozen=True)
class FigureSpec:
    paper: str              # one of PAPERS
    compute: Callable       # (model, ids, ...) for "model+text"; (encoder, quick=, device=) or (quick=, device=)
    plot: Callable          # Result -> matplotlib Figure
    needs: str              # one of NEEDS
    title: str              # the id (the key of FIGURES) is also the Result's name and the claims' key
    version: int            # declared in attnlab/computations.py (`version`; the cache key holds it;
                            # tests/test_golden.py fails when they move without a bump), never for a refactor


# Version history (what moved, so that a reader of an old Result knows why it differs):
# fig1, fig2a, fig2b, fig3, fig4, separability_readings v2: every `*_holds` column tests its inequality with
#   core.verdicts.holds_le (relative to the size of the terms, so rows that meet a bound with equality, e.g.
#   Theorem 1 [B] at N = 1 with x0 = x1, hold; before, rounding failed 13 of 654,480 rows in WikiText-2 #4).
# thm1_readings v2 (2026-11-27): a reading pair that finds no critical N reports the exact p-value and means at its
#   last N (before, on the CPU kernels: a NaN p-value and bracket midpoints, e_mean up to 33% off the exact value in
#   113 of SmolLM2's 320 rows on War and Peace #1; the torch path had the exact values), and the torch path
#   certifies the same N as the kernels (before: none, so its n_exact counted every N). Both paths now give the
#   same rows (tests/test_paths_agree.py); critical N and every row that finds one are unchanged.
FIGURES: dict[str, FigureSpec] = {
    "fig1": FigureSpec("normalization", normalization.fig1, normalization_plots.plot_fig1, "model+text",
                       "Vanishing attention: max weight and entropy against L (Corollary 1)", version=version("fig1")),
    "fig2a": FigureSpec("normalization", normalization.fig2a, normalization_plots.plot_fig2a, "model+text",
                        "Distance against L at N=5 (Theorem 1)", version=version("fig2a")),
    "fig2b": FigureSpec("normalization", normalization.fig2b, normalization_plots.plot_fig2b, "model+text",
                        "Distance against N at the largest L (Theorem 1)", version=version("fig2b")),
    "fig2c": FigureSpec("normalization", normalization.fig2c, normalization_plots.plot_fig2c, "model+text",
                        "Critical N against L (the 6% rule)", version=version("fig2c")),
    "fig3": FigureSpec("normalization", normalization.fig3, normalization_plots.plot_fig3, "model+text",
                       "Geometric separability N_s/N (Theorem 2)", version=version("fig3")),
    "fig4": FigureSpec("normalization", normalization.fig4, normalization_plots.plot_fig4, "model+text",
                       "Gradient sensitivity against T (Lemma 2)", version=version("fig4")),
    "thm1_readings": FigureSpec("normalization", theorem1.thm1_readings, normalization_plots.plot_thm1_readings,
                                "model+text", "Theorem 1 under every reading: Fig. 2a's curves and the critical N",
                                version=version("thm1_readings")),
    "separability_readings": FigureSpec("normalization", theorem2.separability_readings,
                                        theorem2.plot_separability_readings, "model+text",
                                        "Theorem 2 under every reading: N_s/N per vectors, radius and rows",
                                        version=version("separability_readings")),
    "gradient_readings": FigureSpec("normalization", lemma2.gradient_readings,
                                    lemma2.plot_gradient_readings, "model+text",
                                    "Fig. 4 under every reading: g(T, eps) per aggregate and direction, T -> 0",
                                    version=version("gradient_readings")),
    "tsc_uniform": FigureSpec("sample-complexity", sample_complexity.uniform_map,
                              sample_complexity_plots.plot_uniform_map, "none",
                              "Uniform convergence of the attention map (C(R)/sqrt n)", version=version("tsc_uniform")),
    "tsc_moments": FigureSpec("sample-complexity", sample_complexity.moment_convergence,
                              sample_complexity_plots.plot_moment_convergence, "none",
                              "Moment convergence: fitted |beta| against the horizon H",
                              version=version("tsc_moments")),
    "tsc_hardmax": FigureSpec("sample-complexity", sphere.hardmax, sample_complexity_plots.plot_hardmax,
                              "none", "The hardmax regime: slower than any power law", version=version("tsc_hardmax")),
    "tsc_real": FigureSpec("sample-complexity", real_tokens.real_encoder,
                           sample_complexity_plots.plot_real_encoder, "encoder",
                           "Real tokens: a pretrained encoder on WikiText-2", version=version("tsc_real")),
}

def paper1_all_claims(results: dict) -> list[dict]:
    """The paper-1 claim rows at the book's default readings, then one row per reading where the reading matters;
    each with `model`, the one model of `results` (their provenance: `with_model`)."""
    return with_model(normalization_claims.paper1_claims(results) + theorem1.reading_claims(results)
                      + theorem2.reading_claims(results) + lemma2.reading_claims(results), *results.values())


# every reading of an open formula, side by side (their claim rows carry a reading)
READING_FIGURES = ("thm1_readings", "separability_readings", "gradient_readings")

CLAIMS: dict[str, Callable[[dict], list[dict]]] = {
    "normalization": paper1_all_claims,
    "sample-complexity": sample_complexity_claims.tsc_claims,
}


def figure_ids(paper: str = "all") -> list[str]:
    """Ids of every figure, or of one paper's ("normalization", "sample-complexity")."""
    if paper != "all" and paper not in PAPERS:
        raise ValueError(f"paper must be 'all' or one of {PAPERS}, got {paper!r}")
    return [i for i, s in FIGURES.items() if paper in ("all", s.paper)]


#: the older name of the run's workspace (chapters, CLI and tests say `figures.Inputs`)
Inputs = Workspace


def compute_figures(fig_ids, inputs: Workspace, *, quick: bool = False, progress: bool = True) -> dict[str, Result]:
    """Run the experiments of `fig_ids` and return {id: Result}, under the workspace's thread count
    (`Workspace.thread_count`). Paper-1 figures share forward passes."""
    with inputs.thread_count():
        return _compute_figures(fig_ids, inputs, quick=quick, progress=progress)


def _compute_figures(fig_ids, inputs: Workspace, *, quick: bool, progress: bool) -> dict[str, Result]:
    unknown = [i for i in fig_ids if i not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure ids {unknown}; known: {', '.join(FIGURES)}")
    out: dict[str, Result] = {}
    paper1 = [i for i in fig_ids if i in normalization.FIGURE_FUNCS]    # one shared pass per length
    if paper1:
        t0 = time.perf_counter()
        out.update(normalization.run_figures(inputs.model, inputs.ids(), quick=quick, progress=progress,
                                             figures=paper1, text=_text(inputs)))
        for i in paper1:
            out[i].provenance.setdefault("runtime_s", round(time.perf_counter() - t0, 3))
    for fig_id in fig_ids:
        if fig_id in out:
            continue
        spec, t0 = FIGURES[fig_id], time.perf_counter()
        if spec.needs == "model+text":
            out[fig_id] = spec.compute(inputs.model, inputs.ids(), quick=quick, progress=progress,
                                       text=_text(inputs))
        elif spec.needs == "encoder":          # its parameters spelled out, as its key has them (`_cache_key`)
            out[fig_id] = spec.compute(inputs.encoder, device=inputs.device,
                                       **real_tokens.real_params(inputs.encoder, quick))
        else:
            out[fig_id] = spec.compute(quick=quick, device=inputs.device)
        out[fig_id].provenance.setdefault("runtime_s", round(time.perf_counter() - t0, 3))
    for fig_id in fig_ids:
        spec = FIGURES[fig_id]
        out[fig_id].name = fig_id
        out[fig_id].provenance["figure_spec"] = {"id": fig_id, "title": spec.title, "paper": spec.paper,
                                                 "quick": quick}
    return {i: out[i] for i in fig_ids}


def _cache_key(fig_id: str, inputs: Workspace, quick: bool) -> dict:
    """What a figure's Result depends on besides the libraries (`core.cache.full_key` adds them): its id, its
    declared version (`FigureSpec.version`) and its inputs."""
    from attnlab.core.cache import model_key

    spec = FIGURES[fig_id]
    key = {"figure": fig_id, "version": spec.version, "quick": quick, "device": inputs.device,
           "max_length": inputs.max_length, "text_name": inputs.text_name, "text_start": inputs.start}
    if spec.needs == "model+text":          # (the window's length, not how it was asked: MiniLM's None and 512 agree)
        key.update(model_key(inputs.model), text=inputs.corpus.sha256, max_length=inputs.window_length)
    elif spec.needs == "encoder":           # chapter 10's key of the same Result (`attnlab.results`)
        from attnlab.core.text import load_corpus

        params = real_tokens.real_params(inputs.encoder, quick)
        key = {"experiment": "real_encoder", "params": params, "device": inputs.device, "version": spec.version,
               **model_key(inputs.encoder), "text": load_corpus(params["corpus"]).sha256}
    return key


def recompute(name: str, key: dict) -> Optional[Result]:
    """The figure stored as (name, key) (`_cache_key`) computed again, or None when the key is not a figure's
    (`core.cache.verify`)."""
    if key.get("figure") != name or name not in FIGURES:
        return None
    model = key.get("model") or "tiny-gpt2"      # a synthetic figure's key names no model: it loads none
    inputs = Workspace(model, key["device"], text=key["text_name"], max_length=key["max_length"],
                    start=key["text_start"])
    return compute_figures([name], inputs, quick=key["quick"], progress=False)[name]


def cached_figures(fig_ids, inputs: Workspace, *, quick: bool = False, refresh: bool = False,
                   progress: bool = False) -> dict[str, Result]:
    """Like `compute_figures`, from the results cache when a Result is there (`core.cache`: same declared
    version, model weights, text, grids, libraries; provenance says `loaded_from_cache`); the missing ones are
    computed together (sharing forward passes), announced (`core.cache.announce`) and stored. refresh=True:
    compute all and store. Another process computing one of them (`core.cache.locked`): this one waits for it and
    reads what it stored."""
    from attnlab.core.cache import announce, locked, store, stored

    keys = {i: _cache_key(i, inputs, quick) for i in fig_ids}
    with locked(list(keys.items())):
        out = {} if refresh else {i: stored(i, keys[i]) for i in fig_ids}
        missing = [i for i in fig_ids if out.get(i) is None]
        if missing:
            fresh = compute_figures(missing, inputs, quick=quick, progress=progress)
            for i, r in fresh.items():
                announce(i, keys[i], r.provenance.get("runtime_s", 0.0))
                out[i] = store(i, keys[i], r)
    return {i: out[i] for i in fig_ids}


def _text(inputs: Workspace) -> dict:
    return dict(inputs.corpus.provenance(), offset=0, start_char=inputs.start)


def figure_png(result: Result) -> bytes:
    """The PNG of a figure (titled with model and text by the plot function)."""
    import io

    buf = io.BytesIO()
    FIGURES[result.name].plot(result).savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return buf.getvalue()


def save_figure(result: Result, out: Path, png: Optional[bytes] = None) -> dict[Path, str]:
    """<id>.csv, <id>.json (provenance) and <id>.png (`png`, else `figure_png`, drawn before anything is
    written), each written atomically (a kill leaves the previous file, never half of one). Returns
    {path: sha256 of the bytes written}."""
    png = figure_png(result) if png is None else png
    written = result.save(out)
    path = Path(out) / f"{result.name}.png"
    written[path] = atomic_write(path, png)
    return written


def write_figures(out: Path, results: dict[str, Result], *, report: Optional[Callable[[str, list[Path]], None]] = None
                  ) -> Path:
    """Save every figure of `results` into `out` (`save_figure`), then manifest.json (`write_manifest`),
    all under one lock on `out` (`folder_lock`): two runs on one folder take turns, so the folder ends
    as one run's set. Every figure is drawn before the first file is written: a figure that cannot be
    drawn leaves `out` as it was. report(fig_id, paths) is called after each figure. Returns the
    manifest's path."""
    from attnlab.core.util import folder_lock

    pngs = {fig_id: figure_png(result) for fig_id, result in results.items()}
    written: dict[Path, str] = {}
    with folder_lock(out):
        for fig_id, result in results.items():
            files = save_figure(result, out, pngs[fig_id])
            written.update(files)
            if report is not None:
                report(fig_id, list(files))
        return write_manifest(out, results, written)


def write_manifest(out: Path, results: dict[str, Result], written: dict[Path, str]) -> Path:
    """manifest.json, written last: the run (time, model, text) and every file it wrote with the sha256
    of the bytes it wrote (not of what is on disk now). A file of the folder that the manifest does not
    list, or whose bytes differ from its sha256, is from another run (`verify_manifest`)."""
    import json

    first = next(iter(results.values()), None)
    prov = first.provenance if first is not None else {}
    run = {"created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": prov.get("model"),
           "text_sha256": prov.get("text_sha256"), "figures": list(results),
           "files": {Path(p).name: sha for p, sha in written.items()}}
    path = Path(out) / "manifest.json"
    atomic_write(path, json.dumps(run, indent=2).encode())
    return path


def verify_manifest(out: Path) -> list[str]:
    """The problems of folder `out` against its manifest.json, one line each ([] = every listed file
    holds the bytes its run wrote)."""
    import hashlib
    import json

    try:
        files = json.loads((Path(out) / "manifest.json").read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{out}/manifest.json: unreadable ({type(exc).__name__})"]
    problems = []
    for name, sha in files.items():
        path = Path(out) / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            problems.append(f"{name}: not the bytes this run wrote (another run replaced it)")
    return problems


def claim_results(inputs: Workspace, *, quick: bool, paper: str = "all", progress: bool = True, readings: bool = True,
                  refresh: bool = False) -> dict[str, dict[str, Result]]:
    """{paper: {figure id: Result}}: the Results the claims of `paper` ("all" or one of PAPERS) need, from
    the results cache where there (`cached_figures`; refresh=True: computed now and stored);
    `readings=False` leaves out the Results of the other readings (`READING_FIGURES`)."""
    out = {}
    for name in PAPERS:
        if paper not in ("all", name):
            continue
        ids = [i for i in figure_ids(name) if readings or i not in READING_FIGURES]
        out[name] = cached_figures(ids, inputs, quick=quick, refresh=refresh, progress=progress)
    return out


def claim_table(results: dict[str, dict[str, Result]]) -> list[dict]:
    """Every claim row (id, reading, claim, paper, measured, verdict) of `claim_results`' Results."""
    rows: list[dict] = []
    for name, res in results.items():
        rows += CLAIMS[name](res)
    return rows


def claim_rows(inputs: Workspace, **options) -> list[dict]:
    """`claim_table(claim_results(inputs, **options))`: the claim checker's table."""
    return claim_table(claim_results(inputs, **options))


def model_kind(model) -> str:
    """'causal decoder' or 'bidirectional encoder', with what a reader must know of the weights (random, 4-bit)."""
    kind = "causal decoder" if model.causal else "bidirectional encoder"
    if getattr(model, "random_weights", False):
        return kind + ", random weights"
    note = getattr(model, "note", None) or ""
    return kind + (", 4-bit weights" if "4-bit" in note else "")


def claims_by_model(models, device: str = "cpu", **options) -> dict[str, list[dict]]:
    """{model name: claim rows} (`claim_rows` for each model, options as there), each from its own cached
    Results; the text and everything else the same. Every row gains `model_kind` (`model_kind`)."""
    out = {}
    for name in models:
        inputs = Workspace(name, device)
        out[name] = [dict(r, model_kind=model_kind(inputs.model)) for r in claim_rows(inputs, **options)]
    return out


def compare_rows(by_model: dict[str, list[dict]]) -> list[dict]:
    """One row per claim (id, reading) of every model's rows, in first-seen order: id, reading, claim, paper, and
    per model `measured[m]`, `verdict[m]` ('not computed' where a model has no such row); `same` tells whether
    every model got the same verdict."""
    out: dict[tuple, dict] = {}
    for name, rows in by_model.items():
        for r in rows:
            row = out.setdefault((r["id"], r.get("reading", "")), {
                "id": r["id"], "reading": r.get("reading", ""), "claim": r["claim"], "paper": r["paper"],
                "measured": {}, "verdict": {}})
            row["measured"][name], row["verdict"][name] = r["measured"], r["verdict"]
    for row in out.values():
        for name in by_model:
            row["verdict"].setdefault(name, "not computed")
            row["measured"].setdefault(name, "")
        row["same"] = len(set(row["verdict"].values())) == 1
    return list(out.values())
