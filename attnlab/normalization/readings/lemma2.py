"""Every reading of Lemma 2 / Fig. 4 of arXiv 2508.17821, side by side (issue #14): the experiment, its claim
rows and its plot.

`gradient_readings(model, ids, ...)`, in the style of `experiments.fig4` (one forward pass over the window,
every reading of `attnlab.normalization.readings` computed from it, each choice recorded in the provenance):
per direction (`DIRECTIONS`), T and eps, the token mean and the row maximum of g(T, eps) per head (every
`G_AGGREGATES` curve); the worst direction (exact Jacobian norm) on sampled rows; the exact limit T -> 0
(`gradients.fd_grad_limit`: the plateau) and top-2 gap statistics. Rows are tidy (one per reading, (T, eps),
layer, head); the aggregates over heads are computed from them by the claims and plots (`g_curve`, `g_limit`).
`reading_claims` gives every reading its verdict.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from attnlab.core.result import Result
from attnlab.core.util import figure_row, with_threads
from attnlab.core.util import progress as progress_bar
from attnlab.core.verdicts import claim_row, holds_le, verdict
from attnlab.normalization import readings
from attnlab.normalization.claim_kinds import ALL_CLAIMS, threshold
from attnlab.normalization.claims import linear_fit
from attnlab.normalization.experiments import by_kind_groups, head_rows, temperature_grid, with_defaults
from attnlab.normalization.metrics import gradients
from attnlab.normalization.metrics.engine import DEFAULT_CHUNK, row_mean, visible_scores
from attnlab.normalization.paper import EPSILONS, ONE_OVER_T_BELOW
from attnlab.normalization.plots import title
from attnlab.normalization.readings.runs import capture_window, reading_result, window_label

GRAD_NAME = "gradient_readings"
#: the book's default reading of the claim (its verdict is the one of `claims.paper1_claims`)
G_DEFAULT = ("max_head_mean", "gaussian", EPSILONS[0])                # aggregate / direction / eps
JAC_ROWS = 64            # evenly spaced rows per head for the worst direction (exact Jacobian norm)
GRAD_PROTOCOL = {"directions": None, "temperatures": None, "epsilons": None, "seed": 0, "jac_rows": None,
                 "L": None, "text": None, "chunk": DEFAULT_CHUNK, "threads": None}
_G_KEYS = ("g_mean", "g_max_row", "g_near_tie", "near_tie_frac")
_EPS_COLORS = ("tab:purple", "tab:orange", "tab:green", "tab:blue", "tab:brown")


def _nanmax(t: torch.Tensor, dim: int) -> torch.Tensor:
    m = t.nan_to_num(nan=-math.inf).amax(dim)
    return m.masked_fill(m == -math.inf, float("nan"))


def top2_gaps(scores: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gap between the two largest visible logits of each row, float64 [..., Q] (NaN for rows with < 2 keys),
    and the two keys, long [..., Q, 2]."""
    vis = visible_scores(scores, visible)
    top2 = scores.double().masked_fill(~vis, -math.inf).topk(2, dim=-1)
    gap = top2.values[..., 0] - top2.values[..., 1]
    return gap.masked_fill((vis.sum(-1) < 2).expand_as(gap), float("nan")), top2.indices


@with_threads
def gradient_readings(model, ids, *, quick: bool = False, progress: bool = True, **protocol) -> Result:
    """Fig. 4 under every reading: for T in logspace(-3, 2, 26) (quick: 6 values, L <= 128) and eps in the
    paper's grid, per direction reading (`readings.DIRECTIONS`) and head: the token mean `g_mean` and the row
    maximum `g_max_row` of g(T, eps), so that every `G_AGGREGATES` x direction x eps curve can be drawn.

    - "gaussian", "rademacher": `gradients.fd_grad_norms` on every row (one seeded direction per row, shared by
      all (T, eps)), with `g_near_tie` = (near-tie share / T) * mean|v_1 - v_2| / sqrt 2, the token mean that
      rows with two near-tied top logits give when their gaps have a flat density near 0 ([R]; v_1, v_2: the
      direction on the row's two largest logits); their exact limit T -> 0 (`gradients.fd_grad_limit`) in rows
      with T = 0.0, with `flip_frac` (share of rows whose argmax a step eps v moves), `dv_top2` and the head's
      top-2 logit gaps;
    - "worst": the exact spectral norm of the Jacobian (the limit eps -> 0 of the worst direction; eps = 0.0) on
      `jac_rows` (64; quick 16) evenly spaced rows per head, with `near_tie_frac` = share of all the head's rows
      whose two largest logits are less than T apart.

    Logits: the model's own pre-softmax scores over the visible keys (T = 1 is the native model). Protocol:
    `directions`, `temperatures`, `epsilons`, `seed` (0), `jac_rows`, `L`, `text`, `chunk`, `threads`."""
    t0 = time.perf_counter()
    p = with_defaults(GRAD_PROTOCOL, protocol)
    dirs = list(p["directions"] or readings.DIRECTIONS)
    readings.check_names("directions", dirs, readings.DIRECTIONS)
    trace, L, cap_s = capture_window(model, ids, quick, p["L"], {"scores"})
    Ts = [float(t) for t in (p["temperatures"] or temperature_grid(quick))]
    Es = [float(e) for e in (p["epsilons"] or EPSILONS)]
    jac_rows = int(p["jac_rows"] or (16 if quick else JAC_ROWS))
    rows = []
    for sub in by_kind_groups(trace):       # sliding-window layers: each kind over its own keys
        S, vis = sub.scores, sub.visible()
        gap, top = top2_gaps(S, vis)                                                 # [l, h, Q], [l, h, Q, 2]
        nan = float("nan")
        near = {T: row_mean((gap < T).double().masked_fill(torch.isnan(gap), nan), -1) for T in Ts}   # [l, h]
        for d in progress_bar(dirs, progress, GRAD_NAME):
            if d == "worst":
                Q = S.shape[-2]
                idx = torch.unique(torch.linspace(1, Q - 1, min(jac_rows, Q - 1)).round().long())
                sc = S[..., idx, :].double()
                vsub = visible_scores(sc, vis[idx])
                for T in Ts:
                    a = torch.softmax((sc / T).masked_fill(~vsub, -math.inf), dim=-1)
                    j = gradients.softmax_jacobian_norm(a, T, vsub, method="secular")    # [l, h, rows]
                    rows += head_rows(sub, {"g_mean": j.mean(-1), "g_max_row": j.amax(-1), "near_tie_frac": near[T]},
                                       direction=d, T=T, eps=0.0, L=L, n_rows=len(idx))
                continue
            g = gradients.fd_grad_norms(S, Ts, Es, vis, seed=p["seed"], direction=d, chunk=p["chunk"])  # [l,h,Q,T,E]
            gm, gx = row_mean(g, -3), _nanmax(g, -3)
            v12 = gradients.random_direction_entries(S.shape[:-2], visible_scores(S, vis), top, p["seed"], d)
            dv = row_mean((v12[..., 0] - v12[..., 1]).abs().masked_fill(torch.isnan(gap), nan), -1)     # [l, h]
            for ti, T in enumerate(Ts):
                for ei, eps in enumerate(Es):
                    rows += head_rows(sub, {"g_mean": gm[..., ti, ei], "g_max_row": gx[..., ti, ei],
                                               "g_near_tie": near[T] / T * dv / math.sqrt(2)},
                                       direction=d, T=T, eps=eps, L=L)
            lim = gradients.fd_grad_limit(S, Es, vis, seed=p["seed"], direction=d, chunk=p["chunk"])  # [l, h, Q, E]
            flip = (lim > 0).double().masked_fill(torch.isnan(lim), float("nan"))
            for ei, eps in enumerate(Es):
                rows += head_rows(sub, {"g_mean": row_mean(lim[..., ei], -1), "g_max_row": _nanmax(lim[..., ei], -1),
                                           "flip_frac": row_mean(flip[..., ei], -1), "dv_top2": dv,
                                           "gap_min": _nanmax(-gap, -1).neg(),
                                           "gap_median": gap.nanmedian(-1).values},
                                   direction=d, T=0.0, eps=eps, L=L)
    extra = {"grids": {"L": L, "temperatures": Ts, "epsilons": Es}, "seed": p["seed"], "jac_rows": jac_rows,
             "directions": dirs, "logits": "the model's pre-softmax scores over the visible keys (T = 1 = native)",
             "readings": {reg: {n: readings.describe(getattr(readings, reg), n) for n in getattr(readings, reg)}
                          for reg in ("G_AGGREGATES", "DIRECTIONS")},
             "limit_rows": "T = 0.0: the exact limit T -> 0 (gradients.fd_grad_limit); eps = 0.0: the worst "
                           "direction (exact Jacobian norm, the limit eps -> 0)",
             "default_reading": " / ".join(map(str, G_DEFAULT))}
    return reading_result(GRAD_NAME, model, trace, L, p, extra, rows, t0, cap_s, quick)


def g_table(result: Result) -> dict[tuple, dict[str, np.ndarray]]:
    """{(direction, eps): {"T": [n], "g_mean": [n, heads], "g_max_row": ..., "g_near_tie" or "near_tie_frac": ...}}
    of a `gradient_readings` Result (T > 0 only; the limit rows T = 0 are read by `g_limit`), in one pass."""
    acc: dict[tuple, dict] = {}
    for r in result.rows:
        if r["T"] > 0:
            acc.setdefault((r["direction"], r["eps"]), {}).setdefault(r["T"], []).append(
                [np.nan if r.get(k) is None else r[k] for k in _G_KEYS])
    out = {}
    for k, d in acc.items():
        Ts = sorted(d)
        arr = np.array([d[T] for T in Ts], float)                                # [n, heads, keys]
        out[k] = {"T": np.array(Ts), **{key: arr[..., i] for i, key in enumerate(_G_KEYS)}}
    return out


def g_curve(table: dict, direction: str, eps: float, aggregate: str, key: str = "") -> tuple[np.ndarray, np.ndarray]:
    """T and one `readings.G_AGGREGATES` curve of g(T, eps), from `g_table` (worst direction: eps = 0.0); `key`
    "g_near_tie": the near-tie prediction of the token-mean aggregates instead (NaN for "max_row")."""
    t = table[(direction, 0.0 if direction == "worst" else eps)]
    if key:
        vals = t[key]
        return t["T"], (np.full(len(t["T"]), np.nan) if aggregate == "max_row" else _g_agg(vals, vals, aggregate))
    return t["T"], _g_agg(t["g_mean"], t["g_max_row"], aggregate)


def _g_agg(gm: np.ndarray, gx: np.ndarray, aggregate: str) -> np.ndarray:
    if aggregate == "max_head_mean":
        return np.nanmax(gm, axis=-1)
    if aggregate == "median_head_mean":
        return np.nanmedian(gm, axis=-1)
    if aggregate == "max_row":
        return np.nanmax(gx, axis=-1)
    raise ValueError(f"aggregate must be one of {', '.join(readings.G_AGGREGATES)}, got {aggregate!r}")


def g_limit(result: Result, direction: str, eps: float, aggregate: str, key: str = "") -> float:
    """The T -> 0 limit of an aggregate curve (the predicted plateau), or with `key` the mean over heads of that
    column of the limit rows ("flip_frac", "gap_median", ...). NaN for the worst direction (its limit is 0 on
    rows with a unique argmax)."""
    sel = [r for r in result.rows if r["T"] == 0.0 and r["direction"] == direction and r["eps"] == eps]
    if not sel:
        return float("nan")
    if key:
        return float(np.nanmean([r[key] for r in sel]))
    gm, gx = (np.array([r[k] for r in sel], float) for k in ("g_mean", "g_max_row"))
    return float(_g_agg(gm, gx, aggregate))


def g_slope(T: np.ndarray, g: np.ndarray) -> tuple[float, float, int]:
    """Log-log slope, R^2 and point count over T < 0.1 (g > 0): the fit of `claims` (p1-fig4-slope)."""
    small = (T < ONE_OVER_T_BELOW) & (g > 0)
    if small.sum() < 2:
        return float("nan"), float("nan"), int(small.sum())
    slope, _, r2 = linear_fit(np.log10(T[small]), np.log10(g[small]))
    return slope, r2, int(small.sum())


def _slope_claims(res) -> list[dict]:
    cid = "p1-fig4-slope"
    paper, tol = ALL_CLAIMS[cid].paper, threshold("SLOPE_TOL")     # the claim registry's
    table = g_table(res) if res is not None else {}
    eps_grid = sorted({k[1] for k in table if k[0] != "worst"}) or list(EPSILONS)
    out = []
    for agg in readings.G_AGGREGATES:
        for d in readings.DIRECTIONS:
            for eps in ([0.0] if d == "worst" else eps_grid):
                e_txt = "eps->0" if d == "worst" else f"eps={eps:g}"
                reading = f"{agg} / {d} / {e_txt}"
                claim = (f"For T < 0.1 g follows 1/T: log-log slope within -1 -+ {tol} ({agg}, {d} direction, "
                         f"{e_txt.replace('eps=', 'eps = ')})")
                if (d, eps) not in table:
                    out.append(claim_row(cid, claim, paper, f"{GRAD_NAME} not computed for this reading",
                                         "not applicable", reading))
                    continue
                T, g = g_curve(table, d, eps, agg)
                slope, r2, n = g_slope(T, g)
                if n < 2:
                    out.append(claim_row(cid, claim, paper, "fewer than 2 grid points with T < 0.1 and g > 0",
                                         "not applicable", reading))
                    continue
                small = (T < ONE_OVER_T_BELOW) & (g > 0)
                lim = g_limit(res, d, eps, agg)
                plateau = "" if d == "worst" else f"; T -> 0 limit {lim:.3g}"
                measured = (f"slope {slope:.3f} (R^2 {r2:.3f}) over {n} temperatures {T[small].min():.3g}.."
                            f"{T[small].max():.3g}; g = {g[small].min():.3g}..{g[small].max():.3g}{plateau} "
                            f"({window_label(res)})")
                ok = holds_le(abs(slope + 1), tol)
                out.append(claim_row(cid, claim, paper, measured, verdict(ok), reading))
    return out


def plot_gradient_readings(result: Result, *, aggregate: str = "max_head_mean", direction: str = "gaussian",
                           table: dict | None = None):
    """g(T, eps) against T (log-log) for one aggregate and direction reading: one curve per eps with its
    log-log slope below T = 0.1 and its exact T -> 0 limit (dotted, same colour), the near-tie level of the
    token means (grey), the paper's curve min{1/(4T), sqrt 2} and the exact bound 1/(2T). `table`: a
    `g_table` of the Result."""
    table = table if table is not None else g_table(result)
    fig, (ax,) = figure_row(1, 6.4, 4.4)
    eps_grid = [0.0] if direction == "worst" else sorted({k[1] for k in table if k[0] == direction})
    ys = []
    T = np.array([])
    for i, eps in enumerate(eps_grid):
        T, g = g_curve(table, direction, eps, aggregate)
        slope = g_slope(T, g)[0]
        c = _EPS_COLORS[i % len(_EPS_COLORS)]
        lab = "exact ||J|| (eps -> 0)" if direction == "worst" else f"eps = {eps:g}"
        pos = g > 0
        ax.plot(T[pos], g[pos], "o-", ms=3, color=c, label=f"{lab}: slope {slope:.2f}")
        ys.append(g[pos])
        lim = g_limit(result, direction, eps, aggregate)
        if np.isfinite(lim) and lim > 0:
            ax.axhline(lim, color=c, ls=":", lw=1.3)
            ys.append([lim])
    if direction != "worst" and aggregate != "max_row" and eps_grid:
        Tn, pred = g_curve(table, direction, eps_grid[0], aggregate, key="g_near_tie")
        ok = np.isfinite(pred) & (pred > 0) & (Tn <= ONE_OVER_T_BELOW)         # a small-T approximation
        ax.plot(Tn[ok], pred[ok], "-", color="0.45", lw=2.2, alpha=0.6, label="near-tie level [R]")
        ys.append(pred[ok])
    if len(T):
        ax.plot(T, np.minimum(1 / (4 * T), math.sqrt(2)), "k--", lw=1, label="min{1/(4T), sqrt 2}")
        ax.plot(T, 1 / (2 * T), "k:", lw=1, label="1/(2T)")
        ax.axvspan(T.min(), ONE_OVER_T_BELOW, color="0.93", lw=0)
    vals = np.concatenate([np.ravel(y) for y in ys]) if ys else np.array([1.0])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    ax.set_ylim(max(vals.min() / 3, 1e-12) if len(vals) else 1e-6, 1 / (2 * T.min()) * 2 if len(T) else 10)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("temperature T (shaded: T < 0.1, the fit)")
    ax.set_ylabel(f"g: {aggregate}")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3)
    what = (f"{result.provenance.get('jac_rows')} rows per head" if direction == "worst"
            else "dotted: exact T -> 0 limit")
    fig.suptitle(title(result, f"Fig. 4 reading: {aggregate}, {direction} direction ({what})"), fontsize=9)
    return fig


def reading_claims(results: dict) -> list[dict]:
    """Claim rows of every reading (`reading` set) from the Result keyed "gradient_readings" (missing or empty:
    "not applicable"): "p1-fig4-slope", reading "<aggregate> / <direction> / eps=<eps>" (worst: "eps->0"): the
    log-log slope over T < 0.1 within -1 -+ the registry's SLOPE_TOL (the fit of `claims`). The default reading
    (`G_DEFAULT`) measures what `claims.paper1_claims` does."""
    grad = results.get(GRAD_NAME)
    grad = grad if grad is not None and grad.rows else None
    return _slope_claims(grad)
