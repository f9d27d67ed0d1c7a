"""Every reading of Theorem 2 / Fig. 3 and of Lemma 2 / Fig. 4 of arXiv 2508.17821, side by side (issue #14).

Two experiments in the style of `experiments.fig3` / `fig4` (one forward pass over the window, every reading of
`attnlab.normalization.readings` computed from it, each choice recorded in the provenance), the claim rows of
every reading (`reading` set; `thm2_reading_claims`) and their plots:

- `separability_readings(model, ids, ...)`: N_s/N per head (token mean) for N = 1..32 at the window's length,
  for every vectors x radius x rows reading (`VECTORS`, `RADII`, `ROW_SETS`), with the Theorem 2 bounds for each
  spread estimator (`XI_READINGS`) and upper form (`UPPER_FORMS`) on the unit readings;
- `gradient_readings(model, ids, ...)`: per direction (`DIRECTIONS`), T and eps, the token mean and the row
  maximum of g(T, eps) per head (every `G_AGGREGATES` curve); the worst direction (exact Jacobian norm) on
  sampled rows; the exact limit T -> 0 (`gradients.fd_grad_limit`: the plateau) and top-2 gap statistics.

Rows are tidy (one per reading, N or (T, eps), layer, head); the aggregates over heads (`SEP_AGGREGATES`,
`G_AGGREGATES`) are computed from them by the claims and plots (`sep_curve`, `g_curve`, `g_limit`).
"""
from __future__ import annotations

import hashlib
import math
import time

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.core.text import window_prefix
from attnlab.core.util import figure_row, with_threads
from attnlab.core.util import progress as progress_bar
from attnlab.core.verdicts import claim_row, percent, verdict
from attnlab.normalization import readings
from attnlab.normalization.claims import SLOPE_TOL, linear_fit
from attnlab.normalization.experiments import HOLD_ATOL, HOLD_RTOL, sep_token_id, temperature_grid, with_defaults
from attnlab.normalization.metrics import gradients, separability
from attnlab.normalization.metrics.engine import DEFAULT_CHUNK, row_mean, visible_scores
from attnlab.normalization.paper import EPSILONS, FIG3_NMAX, ONE_OVER_T_BELOW, SATURATION_N, SEPARABILITY_BAND
from attnlab.normalization.plots import title

SEP_NAME, GRAD_NAME = "separability_readings", "gradient_readings"
#: the book's default reading of each claim (its verdict is the one of `claims.paper1_claims`)
SEP_DEFAULT = ("median", "v_unit", "nearest", "positive_r")          # aggregate / vectors / radius / rows
G_DEFAULT = ("max_head_mean", "gaussian", EPSILONS[0])                # aggregate / direction / eps
JAC_ROWS = 64            # evenly spaced rows per head for the worst direction (exact Jacobian norm)
QUICK_L = 128            # quick: the first 128 tokens
BOUNDS = ("lower", "upper_B", "upper_R")
SEP_PROTOCOL = {"vectors": None, "ns": None, "M": 1.0, "L": None, "text": None, "chunk": DEFAULT_CHUNK,
                "threads": None}
GRAD_PROTOCOL = {"directions": None, "temperatures": None, "epsilons": None, "seed": 0, "jac_rows": None,
                 "L": None, "text": None, "chunk": DEFAULT_CHUNK, "threads": None}
_AGG = {"median": np.nanmedian, "mean": np.nanmean, "max": np.nanmax,
        "q75": lambda a, axis: np.nanpercentile(a, 75, axis=axis)}


# ------------------------------------------------------------------------------------------------ shared

def _capture(model, ids, quick: bool, L, keep: set):
    """One forward pass over the first L tokens of ids [L_max] (default all of them up to `readings.MAX_LENGTH`;
    quick: at most 128)."""
    ids = torch.as_tensor(ids).long()
    if ids.ndim != 1:
        raise ValueError(f"ids must be one window of token ids [L_max], got shape {tuple(ids.shape)}")
    L = int(L or min(len(ids), QUICK_L if quick else readings.MAX_LENGTH))
    if not 2 <= L <= len(ids):
        raise ValueError(f"L must be in [2, {len(ids)}] for this window, got {L}")
    t0 = time.perf_counter()
    trace = model.capture(window_prefix(ids, L, sep_token_id(model)), keep=sorted(keep))
    return trace, L, time.perf_counter() - t0


def _head_rows(trace, values: dict, **fixed) -> list[dict]:
    """One row per (layer, head) of the arrays values[name] [layer, head]."""
    values = {k: torch.as_tensor(v).double().tolist() for k, v in values.items()}
    return [dict(fixed, layer=int(layer), head=int(head), **{k: v[li][hi] for k, v in values.items()})
            for li, layer in enumerate(trace.layers) for hi, head in enumerate(trace.heads)]


def _holds(value: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Fraction of the rows (axis -2; NaN rows of either left out) where value <= bound (float tolerance of
    `experiments.HOLD_RTOL`, `HOLD_ATOL`)."""
    ok = ~torch.isnan(value) & ~torch.isnan(bound)
    holds = (value <= bound * (1 + HOLD_RTOL) + HOLD_ATOL) & ok
    return holds.sum(-2).double() / ok.sum(-2).clamp_min(1)


def _finish(name: str, model, trace, L: int, p: dict, extra: dict, rows: list[dict], t0: float,
            capture_s: float, quick: bool) -> Result:
    text = p["text"] or {}
    prov = provenance(
        figure=name, model=model.name, causal=bool(model.causal), max_positions=int(model.max_positions),
        device=str(getattr(model, "device", "cpu")),
        model_info=(model.provenance() if hasattr(model, "provenance") else None),
        text=text.get("text", text.get("name")), text_sha256=text.get("text_sha256") or trace.text_sha256,
        text_meta=text, window_tokens=L,
        token_ids_sha256=hashlib.sha256(trace.token_ids.numpy().astype(np.int64).tobytes()).hexdigest()[:16],
        scaling=trace.scaling, layers=trace.layers, heads=trace.heads, quick=bool(quick), n_passes=1,
        capture_seconds=round(capture_s, 3), runtime_seconds=round(time.perf_counter() - t0, 3),
        torch_threads=torch.get_num_threads(), **extra)
    return Result(name=name, rows=rows, provenance=prov)


# --------------------------------------------------------------------------------- Theorem 2 / Fig. 3

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
                rows += _head_rows(trace, {k: v[..., c] for k, v in vals.items()}, vectors=fixed["vectors"],
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

    ids: one window of token ids [L_max]. Protocol: `vectors` (names, default all), `ns`, `M` (1.0), `L`
    (default len(ids) up to `readings.MAX_LENGTH`), `text` (provenance dict), `chunk`, `threads`. Rows: vectors,
    radius, rows, N, layer, head, L, ns_frac, n_rows, n_r0 (rows with r = 0); rows "positive_r" add r; on the unit
    readings the rows "nearest" / "positive_r" add delta, xi_*, lower_* / upper_B_* / upper_R_* (token means) and
    *_holds (the fraction of rows where the bound holds against the strict count; the closed ball differs only at
    ties)."""
    t0 = time.perf_counter()
    p = with_defaults(SEP_PROTOCOL, protocol)
    names = list(p["vectors"] or readings.VECTORS)
    readings.check_names("vectors", names, readings.VECTORS)
    trace, L, cap_s = _capture(model, ids, quick, p["L"], {"probs"} | readings.needs(names))
    ns = [n for n in (p["ns"] or range(1, (8 if quick else FIG3_NMAX) + 1)) if n < L]
    vis = trace.visible()
    rows = []
    for name in progress_bar(names, progress, SEP_NAME):
        unit = name.endswith("_unit")
        x = readings.vectors(trace, name.removesuffix("_unit"))       # unit: put on the sphere in float64 below
        stats = (separability.SEPARABILITY_STATS if unit else ("r",)) + separability.RADIUS_STATS
        st = separability.separability_stats(trace.probs, x, ns, vis, M=p["M"], normalize=unit, stats=stats,
                                             rows="all", chunk=p["chunk"])
        rows += _sep_head_rows(trace, st, ns, unit, vectors=name, L=L)
    extra = {"grids": {"L": L, "ns": ns, "M": p["M"]}, "keys": "visible keys only; rows with L_t <= N skipped",
             "readings": {reg: {n: readings.describe(getattr(readings, reg), n) for n in getattr(readings, reg)}
                          for reg in ("VECTORS", "RADII", "ROW_SETS", "SEP_AGGREGATES", "XI_READINGS",
                                      "UPPER_FORMS")},
             "vectors": names, "bounds_on": f"unit readings only (Assumption 1: x on the sphere of radius M = "
                                            f"{p['M']}); the rows reading 'positive_r' (Theorem 2 needs r > 0)",
             "hold_tolerance": {"rtol": HOLD_RTOL, "atol": HOLD_ATOL}, "default_reading": " / ".join(SEP_DEFAULT)}
    return _finish(SEP_NAME, model, trace, L, p, extra, rows, t0, cap_s, quick)


def sep_table(result: Result, key: str = "ns_frac") -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """{(vectors, radius, rows): (N [n], values [n, heads])} of `key` from a `separability_readings` Result, in
    one pass over its rows (heads in row order)."""
    acc: dict[tuple, dict] = {}
    for r in result.rows:
        if r.get(key) is None:
            continue
        acc.setdefault((r["vectors"], r["radius"], r["rows"]), {}).setdefault(r["N"], []).append(r[key])
    return {k: (np.array(sorted(d), float), np.array([d[n] for n in sorted(d)], float)) for k, d in acc.items()}


def sep_curve(table: dict, vectors: str, radius: str, rows: str, aggregate: str) -> tuple[np.ndarray, np.ndarray]:
    """N and the aggregate over heads (`readings.SEP_AGGREGATES`) of the token-mean N_s/N, from `sep_table`."""
    ns, vals = table[(vectors, radius, rows)]
    return ns, _AGG[aggregate](vals, axis=1)


# ---------------------------------------------------------------------------------- Lemma 2 / Fig. 4

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
    trace, L, cap_s = _capture(model, ids, quick, p["L"], {"scores"})
    Ts = [float(t) for t in (p["temperatures"] or temperature_grid(quick))]
    Es = [float(e) for e in (p["epsilons"] or EPSILONS)]
    jac_rows = int(p["jac_rows"] or (16 if quick else JAC_ROWS))
    S, vis = trace.scores, trace.visible()
    gap, top = top2_gaps(S, vis)                                                 # [l, h, Q], [l, h, Q, 2]
    nan = float("nan")
    near = {T: row_mean((gap < T).double().masked_fill(torch.isnan(gap), nan), -1) for T in Ts}   # [l, h]
    rows = []
    for d in progress_bar(dirs, progress, GRAD_NAME):
        if d == "worst":
            Q = S.shape[-2]
            idx = torch.unique(torch.linspace(1, Q - 1, min(jac_rows, Q - 1)).round().long())
            sc = S[..., idx, :].double()
            vsub = visible_scores(sc, vis[idx])
            for T in Ts:
                a = torch.softmax((sc / T).masked_fill(~vsub, -math.inf), dim=-1)
                j = gradients.softmax_jacobian_norm(a, T, vsub, method="secular")    # [l, h, rows]
                rows += _head_rows(trace, {"g_mean": j.mean(-1), "g_max_row": j.amax(-1), "near_tie_frac": near[T]},
                                   direction=d, T=T, eps=0.0, L=L, n_rows=len(idx))
            continue
        g = gradients.fd_grad_norms(S, Ts, Es, vis, seed=p["seed"], direction=d, chunk=p["chunk"])  # [l,h,Q,T,E]
        gm, gx = row_mean(g, -3), _nanmax(g, -3)
        v12 = gradients.random_direction_entries(S.shape[:-2], visible_scores(S, vis), top, p["seed"], d)
        dv = row_mean((v12[..., 0] - v12[..., 1]).abs().masked_fill(torch.isnan(gap), nan), -1)     # [l, h]
        for ti, T in enumerate(Ts):
            for ei, eps in enumerate(Es):
                rows += _head_rows(trace, {"g_mean": gm[..., ti, ei], "g_max_row": gx[..., ti, ei],
                                           "g_near_tie": near[T] / T * dv / math.sqrt(2)},
                                   direction=d, T=T, eps=eps, L=L)
        lim = gradients.fd_grad_limit(S, Es, vis, seed=p["seed"], direction=d, chunk=p["chunk"])  # [l, h, Q, E]
        flip = (lim > 0).double().masked_fill(torch.isnan(lim), float("nan"))
        for ei, eps in enumerate(Es):
            rows += _head_rows(trace, {"g_mean": row_mean(lim[..., ei], -1), "g_max_row": _nanmax(lim[..., ei], -1),
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
    return _finish(GRAD_NAME, model, trace, L, p, extra, rows, t0, cap_s, quick)


_G_KEYS = ("g_mean", "g_max_row", "g_near_tie", "near_tie_frac")


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


# ------------------------------------------------------------------------------------------------- claims

def _model(res: Result) -> str:
    return f"L={res.provenance.get('window_tokens')}, {res.provenance.get('model')}"


def _sep_claims(res) -> list[dict]:
    lo, hi = SEPARABILITY_BAND
    cid = "p1-fig3-saturation"
    paper = "Fig. 3: 'declines up to N ~ 16 and then saturates between 0.7 and 0.85'; abstract: 'no more than ~80%'"
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
                        out.append(claim_row(cid, claim, paper, f"{SEP_NAME} not computed for this reading",
                                             "not applicable", reading))
                        continue
                    ns, v = sep_curve(table, name, radius, rows, agg)
                    big = ns >= SATURATION_N
                    if not big.any():
                        out.append(claim_row(cid, claim, paper, "no N >= 16 in the grid", "not applicable", reading))
                        continue
                    measured = (f"{agg} N_s/N: N={int(ns[0])}: {v[0]:.3f}, N=16..{int(ns[-1])}: "
                                f"{v[big].min():.3f}..{v[big].max():.3f} ({_model(res)})")
                    out.append(claim_row(cid, claim, paper, measured, verdict(bool(np.all((v[big] >= lo)
                                                                                          & (v[big] <= hi)))), reading))
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
                    out.append(claim_row(ids[b], claim, paper, f"{SEP_NAME} not computed for this reading",
                                         "not applicable", reading))
                    continue
                frac, worst = float(np.nanmean(vals)), float(np.nanmin(vals))
                note = notes.get((b, xi), "heuristic (Hoeffding-type)" if b != "lower" else "not a theorem row by "
                                 "row with this xi")
                out.append(claim_row(ids[b], claim, paper, f"{percent(frac)} of rows (worst head/N {percent(worst)}); "
                                     f"{note} ({_model(res)})", verdict(worst == 1.0), reading))
    return out


def _slope_claims(res) -> list[dict]:
    cid = "p1-fig4-slope"
    paper = "Fig. 4 / Sec. 3.3: 'for T < 0.1 the empirical curves follow the 1/T trend'"
    table = g_table(res) if res is not None else {}
    eps_grid = sorted({k[1] for k in table if k[0] != "worst"}) or list(EPSILONS)
    out = []
    for agg in readings.G_AGGREGATES:
        for d in readings.DIRECTIONS:
            for eps in ([0.0] if d == "worst" else eps_grid):
                e_txt = "eps->0" if d == "worst" else f"eps={eps:g}"
                reading = f"{agg} / {d} / {e_txt}"
                claim = (f"For T < 0.1 g follows 1/T: log-log slope within -1 -+ {SLOPE_TOL} ({agg}, {d} direction, "
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
                            f"({_model(res)})")
                out.append(claim_row(cid, claim, paper, measured, verdict(abs(slope + 1) <= SLOPE_TOL), reading))
    return out


def thm2_reading_claims(results: dict) -> list[dict]:
    """Claim rows of every reading (`reading` set) from Results keyed "separability_readings" and
    "gradient_readings" (either may be missing: its rows are then "not applicable"):

    - "p1-fig3-saturation", reading "<aggregate> / <vectors> / <radius> / <rows>": N_s/N in [0.70, 0.85] for
      every N >= 16 (aggregate over heads of the token means);
    - "p1-thm2-lower", "p1-thm2-upper-B", "p1-thm2-upper-R", reading "xi=<xi> / <unit vectors> / nearest /
      positive_r": the bound holds in every row (worst head and N);
    - "p1-fig4-slope", reading "<aggregate> / <direction> / eps=<eps>" (worst: "eps->0"): the log-log slope over
      T < 0.1 within -1 -+ SLOPE_TOL (the fit of `claims`).

    The default readings (`SEP_DEFAULT`, `G_DEFAULT`, xi=row / v_unit) measure what `claims.paper1_claims` does."""
    sep = results.get(SEP_NAME)
    grad = results.get(GRAD_NAME)
    sep = sep if sep is not None and sep.rows else None
    grad = grad if grad is not None and grad.rows else None
    return _sep_claims(sep) + _thm2_claims(sep) + _slope_claims(grad)


# -------------------------------------------------------------------------------------------------- plots

_COLORS = {"v": "tab:green", "k": "tab:blue", "hidden_head": "tab:orange", "hidden": "tab:purple"}
_EPS_COLORS = ("tab:purple", "tab:orange", "tab:green", "tab:blue", "tab:brown")


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
