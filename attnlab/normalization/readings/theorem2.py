"""Every reading of Theorem 2 / Fig. 3 of arXiv 2508.17821, side by side (issue #14): the experiment, its claim
rows and its plot.

`separability_readings(model, ids, ...)`, in the style of `experiments.fig3` (one forward pass over the window,
every reading of `attnlab.normalization.readings` computed from it, each choice recorded in the provenance):
N_s/N per head (token mean) for N = 1..32 at the window's length, for every vectors x radius x rows reading
(`VECTORS`, `RADII`, `ROW_SETS`), with the Theorem 2 bounds for each spread estimator (`XI_READINGS`) and upper
form (`UPPER_FORMS`) on the unit readings. Rows are tidy (one per reading, N, layer, head); the aggregates over
heads (`SEP_AGGREGATES`) are computed from them by the claims and plots (`sep_curve`). `reading_claims` gives
every reading its verdict.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from attnlab.core.result import Result
from attnlab.core.util import figure_row, with_threads
from attnlab.core.util import progress as progress_bar
from attnlab.core.verdicts import RTOL, claim_row, holds_le, percent, verdict, within
from attnlab.normalization import readings
from attnlab.normalization.claim_kinds import ALL_CLAIMS, threshold
from attnlab.normalization.experiments import by_kind_groups, head_rows, with_defaults
from attnlab.normalization.metrics import separability
from attnlab.normalization.metrics.engine import DEFAULT_CHUNK, row_mean
from attnlab.normalization.paper import FIG3_NMAX, SATURATION_N, SEPARABILITY_BAND
from attnlab.normalization.plots import title
from attnlab.normalization.readings.runs import capture_window, reading_result, window_label

SEP_NAME = "separability_readings"
#: the book's default reading of each claim (its verdict is the one of `claims.paper1_claims`)
SEP_DEFAULT = ("median", "v_unit", "nearest", "positive_r")          # aggregate / vectors / radius / rows
BOUNDS = ("lower", "upper_B", "upper_R")
SEP_PROTOCOL = {"vectors": None, "ns": None, "M": 1.0, "L": None, "text": None, "chunk": DEFAULT_CHUNK,
                "threads": None}
_AGG = {"median": np.nanmedian, "mean": np.nanmean, "max": np.nanmax,
        "q75": lambda a, axis: np.nanpercentile(a, 75, axis=axis)}
_COLORS = {"v": "tab:green", "k": "tab:blue", "hidden_head": "tab:orange", "hidden": "tab:purple"}


def _holds(value: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Fraction of the rows (axis -2; NaN rows of either left out) where value <= bound up to rounding
    (`core.verdicts.holds_le`; both are shares, from terms of magnitude 1)."""
    ok = ~torch.isnan(value) & ~torch.isnan(bound)
    holds = holds_le(value, bound, 1.0) & ok
    return holds.sum(-2).double() / ok.sum(-2).clamp_min(1)


def _sep_head_rows(trace, st: dict, ns, unit: bool, **fixed) -> list[dict]:
    """Rows of one vectors reading (`fixed`: vectors, L): per rows set, radius, N and head the token mean of
    N_s/N; on the unit readings, in the rows of the default radius and rows set, the bounds for each spread
    estimator with the fraction of rows where each holds."""
    nan = float("nan")
    r = st["r"]                                                     # [l, h, Q, n]; NaN where L_t <= N
    rows = []
    for rows_name in readings.ROW_SETS:
        keep = (r > 0) if rows_name == "positive_r" else ~torch.isnan(r)
        for radius in readings.RADII:
            f = st[f"ns_frac_{radius}"].masked_fill(~keep, nan)
            vals = {"ns_frac": row_mean(f, -2), "n_rows": keep.sum(-2), "n_r0": ((r == 0) & keep).sum(-2)}
            if rows_name == "positive_r":
                vals["r"] = row_mean(r.masked_fill(~keep, nan), -2)
            if unit and (radius, rows_name) == SEP_DEFAULT[2:]:    # the bounds need r > 0; against the strict count
                vals["delta"] = row_mean(st["delta"].masked_fill(~keep, nan), -2)
                for xi in readings.XI_READINGS:
                    vals[f"xi_{xi}"] = row_mean(st[f"xi_{xi}"].masked_fill(~keep, nan), -2)
                    for b in BOUNDS:
                        bound = st[f"{b}_{xi}"]
                        vals[f"{b}_{xi}"] = row_mean(bound, -2)
                        vals[f"{b}_{xi}_holds"] = _holds(bound, f) if b == "lower" else _holds(f, bound)
            for c, N in enumerate(ns):
                rows += head_rows(trace, {k: v[..., c] for k, v in vals.items()}, vectors=fixed["vectors"],
                                   radius=radius, rows=rows_name, N=int(N), L=fixed["L"])
    for row in rows:
        row["n_rows"], row["n_r0"] = int(row["n_rows"]), int(row["n_r0"])
    return rows


@with_threads
def separability_readings(model, ids, *, quick: bool = False, progress: bool = True, **protocol) -> Result:
    """Fig. 3 under every reading: N_s/N per head (token mean) for N = 1..32 (quick: 1..8, L <= 128) at the
    window's length, for every vectors (`readings.VECTORS`) x radius (`RADII`) x rows (`ROW_SETS`) reading;
    on the unit readings (Assumption 1: the sphere of radius M) the Theorem 2 bounds of each spread estimator
    (`XI_READINGS`) and upper form (`UPPER_FORMS`), and the fraction of rows where each holds.

    ids: one window of token ids [L_max]. Protocol: `vectors` (names, default every one the model defines), `ns`,
    `M` (1.0), `L` (default len(ids) up to `readings.MAX_LENGTH`), `text` (provenance dict), `chunk`, `threads`.
    Rows: vectors, radius, rows, N, layer, head, L, ns_frac, n_rows, n_r0 (rows with r = 0); rows "positive_r" add
    r; on the unit readings the rows "nearest" / "positive_r" add delta, xi_*, lower_* / upper_B_* / upper_R_*
    (token means) and *_holds (the fraction of rows where the bound holds against the strict count; the closed ball
    differs only at ties)."""
    t0 = time.perf_counter()
    p = with_defaults(SEP_PROTOCOL, protocol)
    names = readings.model_vectors(model, p["vectors"] or None)   # (default: every reading the model defines)
    trace, L, cap_s = capture_window(model, ids, quick, p["L"], {"probs"} | readings.needs(names))
    ns = [n for n in (p["ns"] or range(1, (8 if quick else FIG3_NMAX) + 1)) if n < L]
    rows = []
    for sub in by_kind_groups(trace):       # sliding-window layers: each kind over its own keys, N below min(L, w)
        vis = sub.visible()
        sub_ns = [n for n in ns if n < int(vis[L - 1].sum())]
        for name in progress_bar(names, progress, SEP_NAME):
            unit = name.endswith("_unit")
            x = readings.vectors(sub, name.removesuffix("_unit"))       # unit: put on the sphere in float64 below
            stats = (separability.SEPARABILITY_STATS if unit else ("r",)) + separability.RADIUS_STATS
            st = separability.separability_stats(sub.probs, x, sub_ns, vis, M=p["M"], normalize=unit, stats=stats,
                                                 rows="all", chunk=p["chunk"])
            rows += _sep_head_rows(sub, st, sub_ns, unit, vectors=name, L=L)
    extra = {"grids": {"L": L, "ns": ns, "M": p["M"]}, "keys": "visible keys only; rows with L_t <= N skipped",
             "readings": {reg: {n: readings.describe(getattr(readings, reg), n) for n in getattr(readings, reg)}
                          for reg in ("VECTORS", "RADII", "ROW_SETS", "SEP_AGGREGATES", "XI_READINGS",
                                      "UPPER_FORMS")},
             "vectors": names, "bounds_on": f"unit readings only (Assumption 1: x on the sphere of radius M = "
                                            f"{p['M']}); the rows reading 'positive_r' (Theorem 2 needs r > 0)",
             "hold_tolerance": {"rtol": RTOL, "atol": RTOL, "rule": "value <= bound + rtol * max(|value|, |bound|, 1)"},
             "default_reading": " / ".join(SEP_DEFAULT)}
    if readings.undefined_vectors(model):
        extra["vectors_not_defined"] = readings.undefined_vectors(model)
    return reading_result(SEP_NAME, model, trace, L, p, extra, rows, t0, cap_s, quick)


def sep_table(result: Result, key: str = "ns_frac") -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """{(vectors, radius, rows): (N [n], values [n, heads])} of `key` from a `separability_readings` Result, in
    one pass over its rows (heads in row order; NaN after the last where an N has fewer heads: a sliding layer's N
    stop below its window)."""
    acc: dict[tuple, dict] = {}
    for r in result.rows:
        if r.get(key) is None:
            continue
        acc.setdefault((r["vectors"], r["radius"], r["rows"]), {}).setdefault(r["N"], []).append(r[key])
    out = {}
    for k, d in acc.items():
        ns = sorted(d)
        width = max(len(d[n]) for n in ns)
        out[k] = (np.array(ns, float), np.array([d[n] + [np.nan] * (width - len(d[n])) for n in ns], float))
    return out


def sep_curve(table: dict, vectors: str, radius: str, rows: str, aggregate: str) -> tuple[np.ndarray, np.ndarray]:
    """N and the aggregate over heads (`readings.SEP_AGGREGATES`) of the token-mean N_s/N, from `sep_table`."""
    ns, vals = table[(vectors, radius, rows)]
    return ns, _AGG[aggregate](vals, axis=1)


def _not_computed(res, vectors: str) -> str:
    """Why a reading has no rows: its vectors are not defined on the model (`readings.undefined_vectors`), or it
    was not computed."""
    why = ({} if res is None else res.provenance.get("vectors_not_defined") or {}).get(vectors)
    return f"{vectors} not defined on this model: {why}" if why else f"{SEP_NAME} not computed for this reading"


def _sep_claims(res) -> list[dict]:
    """p1-fig3-saturation under every reading: the band and the paper's words are the claim registry's."""
    lo, hi = threshold("SEPARABILITY_BAND")
    cid = "p1-fig3-saturation"
    paper = ALL_CLAIMS[cid].paper
    out = []
    table = sep_table(res) if res is not None else {}
    for agg in readings.SEP_AGGREGATES:
        claim = (f"N_s/N lies in [{lo}, {hi}] for N >= 16 ({agg} over heads of the token-mean, every N >= 16 of "
                 "the grid)")
        for name in readings.VECTORS:
            for radius in readings.RADII:
                for rows in readings.ROW_SETS:
                    reading = f"{agg} / {name} / {radius} / {rows}"
                    if (name, radius, rows) not in table:
                        out.append(claim_row(cid, claim, paper, _not_computed(res, name), "not applicable", reading))
                        continue
                    ns, v = sep_curve(table, name, radius, rows, agg)
                    big = ns >= SATURATION_N
                    if not big.any():
                        out.append(claim_row(cid, claim, paper, "no N >= 16 in the grid", "not applicable", reading))
                        continue
                    measured = (f"{agg} N_s/N: N={int(ns[0])}: {v[0]:.3f}, N=16..{int(ns[-1])}: "
                                f"{v[big].min():.3f}..{v[big].max():.3f} ({window_label(res)})")
                    out.append(claim_row(cid, claim, paper, measured, verdict(bool(np.all(within(v[big], lo, hi)))),
                                         reading))
    return out


def _thm2_claims(res) -> list[dict]:
    paper = "Theorem 2 (Eq. 11): lower <= E[N_s]/N <= upper"
    ids = {"lower": "p1-thm2-lower", "upper_B": "p1-thm2-upper-B", "upper_R": "p1-thm2-upper-R"}
    what = {"lower": "lower bound 1 - sum xi/(rN) below N_s/N", "upper_B": "upper bound, [B] (16 M^2), above N_s/N",
            "upper_R": "upper bound, [R] (2 M^2), above N_s/N"}
    notes = {("lower", "row"): "a theorem with this xi (1{X < r} >= 1 - X/r)"}
    out = []
    units = [n for n in readings.VECTORS if n.endswith("_unit")]
    for b in BOUNDS:
        for xi in readings.XI_READINGS:
            claim = f"Theorem 2 {what[b]} in every row (xi = {readings.XI_READINGS[xi].label})"
            for name in units:
                reading = f"xi={xi} / {name} / {SEP_DEFAULT[2]} / {SEP_DEFAULT[3]}"
                sel = [] if res is None else [r for r in res.rows if r["vectors"] == name and r["radius"] ==
                                              SEP_DEFAULT[2] and r["rows"] == SEP_DEFAULT[3]]
                vals = np.array([r.get(f"{b}_{xi}_holds") for r in sel], float)
                if not np.isfinite(vals).any():
                    out.append(claim_row(ids[b], claim, paper, _not_computed(res, name), "not applicable", reading))
                    continue
                frac, worst = float(np.nanmean(vals)), float(np.nanmin(vals))
                note = notes.get((b, xi), "heuristic (Hoeffding-type)" if b != "lower" else "not a theorem row by "
                                 "row with this xi")
                out.append(claim_row(ids[b], claim, paper, f"{percent(frac)} of rows (worst head/N {percent(worst)}); "
                                     f"{note} ({window_label(res)})", verdict(worst == 1.0), reading))
    return out


def plot_separability_readings(result: Result, *, aggregate: str = "median", radius: str = "nearest",
                               rows: str = "positive_r", table: dict | None = None):
    """N_s/N against N for every vectors reading (solid: unit, dashed: raw), one aggregate over heads, one
    radius and rows reading, with the paper's band. `table`: a `sep_table` of the Result (reused by sliders)."""
    table = table if table is not None else sep_table(result)
    fig, (ax,) = figure_row(1, 6.0, 3.4)
    lo, hi = SEPARABILITY_BAND
    ax.axhspan(lo, hi, color="0.85", alpha=0.7, lw=0, label=f"paper: {lo}-{hi}")
    for name in readings.VECTORS:
        if (name, radius, rows) not in table:
            continue
        ns, v = sep_curve(table, name, radius, rows, aggregate)
        unit = name.endswith("_unit")
        ax.plot(ns, v, ls="-" if unit else "--", lw=1.6,
                color=_COLORS[name.removesuffix("_unit")], label=name)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("top-N")
    ax.set_ylabel(f"{aggregate} over heads of N_s/N")
    ax.legend(ncol=3, loc="lower left")
    fig.suptitle(title(result, f"Fig. 3, every vectors reading: {aggregate}, radius {radius}, rows {rows}"),
                 fontsize=9)
    return fig


def reading_claims(results: dict) -> list[dict]:
    """Claim rows of every reading (`reading` set) from the Result keyed "separability_readings" (missing or empty:
    "not applicable"):

    - "p1-fig3-saturation", reading "<aggregate> / <vectors> / <radius> / <rows>": N_s/N in [0.70, 0.85] for
      every N >= 16 (aggregate over heads of the token means);
    - "p1-thm2-lower", "p1-thm2-upper-B", "p1-thm2-upper-R", reading "xi=<xi> / <unit vectors> / nearest /
      positive_r": the bound holds in every row (worst head and N).

    The default readings (`SEP_DEFAULT`, xi=row / v_unit) measure what `claims.paper1_claims` does."""
    sep = results.get(SEP_NAME)
    sep = sep if sep is not None and sep.rows else None
    return _sep_claims(sep) + _thm2_claims(sep)
