"""The claim table of arXiv 2508.17821: each claim with its measured value and a verdict, from computed
Results (`paper1_claims`). Rows: `attnlab.core.verdicts.claim_row`; a missing Result or a grid that
does not reach the claim's range gives "not applicable". What each claim is (the paper's words, this book's
test, the unit of its number, its threshold) is the claim registry's (`claim_kinds`, claims.toml): the checks
read the thresholds there when they run (`claim_kinds.threshold`), so a `claim_kinds.trial` moves them. The
thresholds' old names (CRITICAL_FRAC, LINEAR_R2, ...; LINEAR_CLAIM) read the registry too (`__getattr__`).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from attnlab.core.result import Result
from attnlab.core.verdicts import claim_row, holds_le, percent, verdict, within
from attnlab.normalization.claim_kinds import ALL_CLAIMS, THRESHOLDS, claim_text, text, threshold
from attnlab.normalization.paper import EPSILONS, ONE_OVER_T_BELOW, PLATEAU_N, SATURATION_N
from attnlab.normalization.plots import KEYS_WORDS, X_WORDS

_v = verdict


def __getattr__(name: str):
    """The thresholds' old names (claims.PLATEAU_REL, ...) and LINEAR_CLAIM: the registry's, read when asked."""
    if name in THRESHOLDS:
        return threshold(name)
    if name == "LINEAR_CLAIM":
        return text(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def row(cid: str, measured: str, outcome: str, value: Optional[float] = None, **facts) -> dict:
    """A claim row of claim `cid`: its test (`claim_text`, with `facts`), the paper's words and the unit of `value`
    from the registry."""
    c = ALL_CLAIMS[cid]
    return claim_row(cid, claim_text(cid, **facts), c.paper, measured, outcome, value=value,
                     unit=c.unit if value is not None else "")


def _na(cid: str, why: str, **facts) -> dict:
    return row(cid, why, "not applicable", **facts)


def _get(results: dict, name: str) -> Optional[Result]:
    res = results.get(name) or results.get(f"paper1_{name}")
    return res if res is not None and res.rows else None


def _model(res: Result) -> str:
    p = res.provenance
    x, keys = X_WORDS.get(p.get("x"), p.get("x")), KEYS_WORDS.get(p.get("keys"), p.get("keys"))
    return f"{p.get('model')}; x = {x}, keys = {keys}"


def _weighted_frac(rows: list[dict], key: str, weight: str = "n_rows") -> tuple[float, float]:
    """Row-weighted fraction over per-head rows and the worst head's fraction."""
    w = np.array([r.get(weight, 1) for r in rows], float)
    f = np.array([r[key] for r in rows], float)
    ok = np.isfinite(f)
    if not ok.any():
        return float("nan"), float("nan")
    return float((f[ok] * w[ok]).sum() / max(w[ok].sum(), 1)), float(f[ok].min())


def _head_mean(res: Result, key: str, by: str, **where) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x values, mean over heads (then windows) of `key`, and spread over windows (std) per x."""
    xs = sorted({r[by] for r in res.select(**where)})
    means, spreads = [], []
    for x in xs:
        sel = res.select(**{by: x}, **where)
        per_window = {}
        for r in sel:
            per_window.setdefault(r.get("window", 0), []).append(r[key])
        wm = np.array([np.nanmean(v) for v in per_window.values()])
        means.append(float(np.mean(wm)))
        spreads.append(float(np.std(wm)))
    return np.array(xs, float), np.array(means), np.array(spreads)


def linear_growth(x, y) -> dict:
    """"Grows about linearly" (Fig. 2a), the one test of the book (the registry's LINEAR_CLAIM): a straight-line fit
    with slope > 0 and R^2 >= LINEAR_R2, and y(x_max) / y(x_min) >= LINEAR_RATIO * x_max / x_min (the registry's
    thresholds). dict(slope, r2, ratio, ok, text)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    slope, _, r2 = linear_fit(x, y)
    ratio = float(y[-1] / y[0]) if y[0] > 0 else float("nan")
    ok = bool(slope > 0 and holds_le(threshold("LINEAR_R2"), r2)
              and holds_le(threshold("LINEAR_RATIO") * x[-1] / x[0], ratio))
    return {"slope": slope, "r2": r2, "ratio": ratio, "ok": ok,
            "text": f"slope {slope:.3g} per token, R^2 = {r2:.3f}, x{ratio:.3g} from L = {int(x[0])} to {int(x[-1])}"}


def linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares line y = a + b x: (slope b, intercept a, R^2)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    b, a = np.polyfit(x, y, 1)
    ss_res = float(((y - (a + b * x)) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return float(b), float(a), (1.0 - ss_res / ss_tot) if ss_tot > 0 else 1.0


# -------------------------------------------------------------------------------------- paper 1

def _claims_cor1(results) -> list[dict]:
    cid = "p1-cor1"
    res = _get(results, "fig1")
    if res is None:
        return [_na(cid, "fig1 not computed")]
    frac, worst = _weighted_frac(res.rows, "cor1_holds")
    err = max(r["logit_err"] for r in res.rows)
    mw = _head_mean(res, "max_weight", "L")
    measured = (
        f"{percent(frac)} of rows inside (worst head {percent(worst)}); max |scores - scaling q.k| = {err:.2g}; "
        f"mean max weight {mw[1][0]:.3f} at L={int(mw[0][0])} -> {mw[1][-1]:.3f} at L={int(mw[0][-1])} ({_model(res)})"
    )
    return [row(cid, measured, _v(frac == 1.0), value=frac)]


def _dist_rows(results) -> list[dict]:
    rows = []
    for name in ("fig2a", "fig2b"):
        res = _get(results, name)
        if res is not None:
            rows += res.rows
    return rows


def _claims_thm1(results) -> list[dict]:
    out = []
    rows = _dist_rows(results)
    specs = [   # (claim id, Result column, a note on the claim's standing)
        ("p1-thm1-B", "holds_B", "[B] is not proof-level for N > 1 (drops a within-selected spread term)"),
        ("p1-thm1-R", "holds_R", "a theorem (triangle inequality): a failure would be a bug"),
        ("p1-thm1-a", "holds_a", "a theorem for reading (a)"),
    ]
    for cid, key, note in specs:
        if not rows:
            out.append(_na(cid, "fig2a / fig2b not computed"))
            continue
        frac, worst = _weighted_frac(rows, key)
        ratio = np.array(
            [
                r["dtilde_b"] / r[key.replace("holds_", "dmax_")]
                for r in rows
                if key != "holds_a" and r[key.replace("holds_", "dmax_")] > 0
            ]
        )
        extra = f"; median head-mean d~/d_max = {np.median(ratio):.3f}" if len(ratio) else ""
        out.append(
            row(cid, f"{percent(frac)} of rows (worst head {percent(worst)}){extra}; {note}", _v(frac == 1.0),
                value=frac)
        )
    return out


def _claims_fig2(results) -> list[dict]:
    out = []
    res = _get(results, "fig2a")
    cid = "p1-fig2a-linear"
    if res is None or len(res.unique("L")) < 3:
        out.append(_na(cid, "fig2a not computed or fewer than 3 lengths"))
    else:
        L, d, _ = _head_mean(res, "dtilde_b", "L", N=res.rows[0]["N"])
        _, e, _ = _head_mean(res, "E", "L", N=res.rows[0]["N"])
        gd, ge = linear_growth(L, d), linear_growth(L, e)
        measured = f"d~: {gd['text']}; E: {ge['text']} ({_model(res)})"
        out.append(row(cid, measured, _v(gd["ok"]), value=gd["r2"]))
    res = _get(results, "fig2b")
    cid = "p1-fig2b-plateau"
    ns = sorted(res.unique("N")) if res is not None else []
    if res is None or PLATEAU_N not in ns or ns[-1] <= PLATEAU_N:
        out.append(_na(cid, "fig2b not computed or its N grid does not go beyond 20"))
    else:
        N, d, _ = _head_mean(res, "dtilde_b", "N")
        _, dm, _ = _head_mean(res, "dmax_B", "N")
        d20, dN = d[list(N).index(PLATEAU_N)], d[-1]
        rel = abs(dN - d20) / d20
        measured = (
            f"d~ = {', '.join(f'{x:.3g} (N={int(n)})' for n, x in zip(N, d))}; relative change 20 -> "
            f"{int(N[-1])}: {rel:.3f}; d_max[B] {dm[0]:.3g} -> {dm[-1]:.3g} (L={res.rows[0]['L']}, {_model(res)})"
        )
        out.append(row(cid, measured, _v(holds_le(rel, threshold("PLATEAU_REL"))), value=rel))
    res = _get(results, "fig2c")
    cid = "p1-fig2c-critical"
    if res is None:
        out.append(_na(cid, "fig2c not computed"))
    else:
        crit = critical_ns(res)
        kinds = _kinds_of_critical_ns(res)
        frac_max = threshold("CRITICAL_FRAC")
        worst = []
        ok = True
        for L, vals in sorted(crit.items()):
            for c in vals:
                if c < 0 or not holds_le(c, frac_max * L):
                    ok = False
            named = kinds.get(L)                 # a model with sliding-window layers: each kind's N* named
            worst.append(
                f"L={L}: N*={'/'.join(str(c) for c in vals) if not named else ', '.join(named)} "
                f"({'/'.join(f'{c / L:.3f}' for c in vals if c > 0) or 'none'})"
            )
        out.append(row(cid, "; ".join(worst) + f" ({_model(res)})", _v(ok), value=max(critical_fracs(crit))))
    return out


def critical_ns(res: Result) -> dict[int, list[int]]:
    """{L: the distinct critical N of Fig. 2c's Result at that L (-1 where none was found)}, in the Result's order."""
    per: dict[int, list[int]] = {}
    for r in res.rows:
        per.setdefault(r["L"], []).append(r["critical_n"])
    return {L: sorted(set(v)) for L, v in per.items()}


def _kinds_of_critical_ns(res: Result) -> dict[int, list[str]]:
    """{L: ['398 sliding', '494 full']} where Fig. 2c's rows carry a `layer_kind` of more than one kind (a model with
    sliding-window layers: a critical N per kind), in `critical_ns`' order; {} otherwise."""
    if len(res.unique("layer_kind")) < 2:
        return {}
    per: dict[int, dict[int, list[str]]] = {}
    for r in res.rows:
        kinds = per.setdefault(r["L"], {}).setdefault(r["critical_n"], [])
        if r.get("layer_kind") not in kinds:
            kinds.append(r.get("layer_kind"))
    return {L: [f"{c} {'+'.join(map(str, k))}" for c, k in sorted(by_n.items())] for L, by_n in per.items()}


def critical_fracs(crit: dict[int, list[int]]) -> list[float]:
    """Every critical N / L of `critical_ns` (none found counts as 1: at least L)."""
    return [c / L if c > 0 else 1.0 for L, vals in crit.items() for c in vals]


def _claims_fig3(results) -> list[dict]:
    out = []
    res = _get(results, "fig3")
    lo, hi = threshold("SEPARABILITY_BAND")
    cid = "p1-fig3-saturation"
    ns = sorted(res.unique("N")) if res is not None else []
    if res is None or not [n for n in ns if n >= SATURATION_N]:
        out.append(_na(cid, "fig3 not computed or no N >= 16 in its grid"))
    else:
        med = {}
        for n in ns:
            med[n] = float(np.nanmedian(res.column("ns_frac", N=n)))
        big = {n: m for n, m in med.items() if n >= SATURATION_N}
        ok = all(within(m, lo, hi) for m in big.values())
        measured = (
            f"median N_s/N: N=1: {med[ns[0]]:.3f}, N=16..{ns[-1]}: {min(big.values()):.3f}..{max(big.values()):.3f} "
            f"(L={res.rows[0]['L']}, {_model(res)})"
        )
        far = max(big.values(), key=lambda m: max(lo - m, m - hi))   # the N >= 16 value farthest out of the band
        out.append(row(cid, measured, _v(ok), value=far))
    for cid, key, note in (    # (claim id, Result column, a note on the claim's standing)
        ("p1-thm2-lower", "lower_holds", "a theorem with this xi (1{X < r} >= 1 - X/r)"),
        ("p1-thm2-upper-B", "upper_B_holds", "heuristic (Hoeffding-type) bound"),
        ("p1-thm2-upper-R", "upper_R_holds", "reconstruction"),
    ):
        if res is None:
            out.append(_na(cid, "fig3 not computed"))
            continue
        frac = float(np.nanmean(res.column(key)))
        worst = float(np.nanmin(res.column(key)))
        if key == "lower_holds" and "lower_pair_holds" in res.rows[0]:
            note += (
                f"; with xi = mean pairwise spread of the selected it holds in "
                f"{float(np.nanmean(res.column('lower_pair_holds'))):.1%} of rows (not a theorem)"
            )
        measured = f"{percent(frac)} of rows (worst head/N {percent(worst)}); {note}"
        out.append(row(cid, measured, _v(worst == 1.0), value=frac))
    return out


def _fig4_series(res: Result, eps: float) -> tuple[np.ndarray, np.ndarray]:
    T, g, _ = _head_mean(res, "g_max", "T", eps=eps)
    return T, g


FIG4_IDS = ("p1-fig4-slope", "p1-fig4-drop", "p1-fig4-eps", "p1-cor3-paper", "p1-cor3-exact")
# Corollary 3's two readings: (claim id, Result column, a note on the claim's standing)
COR3_CLAIMS = (
    (FIG4_IDS[3], "holds_paper", "1/(4T) is the largest Jacobian entry; the spectral norm can reach 1/(2T)"),
    (FIG4_IDS[4], "holds_exact", "a theorem: a failure would be a bug"),
)


def _fig4_slope(res: Result, T: np.ndarray, g: np.ndarray, e0: float) -> dict:
    """"max g ~ 1/T" below T = 0.1: the log-log slope of the smallest eps's curve (T, g [temperatures])."""
    small = (T < ONE_OVER_T_BELOW) & (g > 0)
    if small.sum() < 2:
        return _na(FIG4_IDS[0], "fewer than 2 grid points with T < 0.1", eps=e0)
    slope, _, r2 = linear_fit(np.log10(T[small]), np.log10(g[small]))
    return row(FIG4_IDS[0],
               f"slope {slope:.3f} (R^2 {r2:.3f}) over {int(small.sum())} temperatures "
               f"{T[small].min():.3g}..{T[small].max():.3g}; "
               f"g = {g[small].min():.3g}..{g[small].max():.3g} ({_model(res)})",
               _v(holds_le(abs(slope + 1), threshold("SLOPE_TOL"))), value=slope, eps=e0)


def _fig4_drop(res: Result, eps: list, T: np.ndarray) -> dict:
    """"100x drop": g(T = 0.01) / max g(T >= 1) of each eps; the verdict reads the smallest eps."""
    if not (T >= 1).any() or T.min() > 0.01:
        return _na(FIG4_IDS[1], "the T grid does not span 0.01 .. 1", eps=eps[0])
    i01 = int(np.argmin(np.abs(np.log(T) - np.log(0.01))))
    ratios = {}
    for e in eps:
        Te, ge = _fig4_series(res, e)
        ratios[float(e)] = ge[i01] / max(ge[Te >= 1].max(), 1e-300)
    r0 = ratios[float(eps[0])]
    return row(FIG4_IDS[1],
               f"g(T={T[i01]:.3g}) / max g(T >= 1): " + ", ".join(f"{r:.3g} (eps={e:g})" for e, r in ratios.items()),
               _v(holds_le(threshold("DROP_FACTOR"), r0)), value=r0, eps=eps[0])


def _fig4_eps_order(res: Result, eps: list, T: np.ndarray) -> dict:
    """"Smaller eps, larger g": the share of temperatures T < 0.1 where the curves are ordered by eps."""
    sm = T < ONE_OVER_T_BELOW
    if len(eps) < 2 or not sm.any():
        return _na(FIG4_IDS[2], "one eps or no T < 0.1")
    curves = [_fig4_series(res, e)[1] for e in eps]
    frac = float(
        np.mean([all(holds_le(curves[i + 1][j], curves[i][j]) for i in range(len(eps) - 1))
                 for j in np.flatnonzero(sm)])
    )
    return row(FIG4_IDS[2],
               f"ordered at {frac:.0%} of the {int(sm.sum())} temperatures < 0.1 "
               f"(eps = {', '.join(f'{e:g}' for e in eps)}; "
               "note g <= sqrt(2)/eps caps large eps)",
               _v(frac == 1.0), value=frac)


def _cor3_row(res: Result, cid: str, key: str, note: str) -> dict:
    """Corollary 3 under one reading: the share of rows where the bound holds (column `key`)."""
    frac = float(np.mean(res.column(key)))
    worst = float(np.min(res.column(key)))
    return row(cid, f"{percent(frac)} of rows over the (T, eps) grid (worst point {percent(worst)}); {note}",
               _v(worst == 1.0), value=frac)


def _claims_fig4(results) -> list[dict]:
    res = _get(results, "fig4")
    if res is None:
        return [_na(i, "fig4 not computed", eps=EPSILONS[0]) for i in FIG4_IDS]
    eps = sorted(res.unique("eps"))
    T, g = _fig4_series(res, eps[0])
    return ([_fig4_slope(res, T, g, eps[0]), _fig4_drop(res, eps, T), _fig4_eps_order(res, eps, T)]
            + [_cor3_row(res, *c) for c in COR3_CLAIMS])


def paper1_claims(results: dict) -> list[dict]:
    """Claims of arXiv 2508.17821 from Results keyed "fig1", "fig2a", "fig2b", "fig2c", "fig3", "fig4"
    (as returned by `attnlab.normalization.experiments.run_figures`); missing Results give "not applicable"."""
    return (
        _claims_cor1(results)
        + _claims_thm1(results)
        + _claims_fig2(results)
        + _claims_fig3(results)
        + _claims_fig4(results)
    )
