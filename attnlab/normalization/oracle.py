"""Plain per-row reference implementation of the paper's Algorithms 1-5 (test oracle, benchmark baseline).

Python loops over heads and query rows; numpy (float64) within a row, straight from the formulas
(no expansion tricks, no reuse across rows). Same signatures and outputs as the vectorised functions
in `attnlab.normalization` (engine and the modules built on it), which the tests check against this
module to 1e-5 relative.

Do not use it for real work: at L = 1024 on GPT-2 it takes hours (the paper reports 17 h for Alg. 3).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from scipy.spatial.distance import cdist, pdist
from scipy.stats import ks_2samp

from attnlab.normalization.metrics.engine import check_inputs, check_ns, flatten_heads, visible_scores
from attnlab.normalization.metrics.gradients import random_directions

NAME = "oracle"


def _rows(probs, x, visible):
    """Flattened numpy views and a per-row iterator helper."""
    probs = probs.cpu()
    x = None if x is None else x.cpu()
    vis = check_inputs(probs, x, None if visible is None else visible.cpu()).numpy()
    lead, P, X, xmap = flatten_heads(probs, x)
    return (
        lead,
        P.double().numpy(),
        (None if X is None else X.double().numpy()),
        (None if xmap is None else xmap.numpy()),
        vis,
    )


def _top(a: np.ndarray, N: int):
    order = np.argsort(-a, kind="stable")  # descending, ties -> lower index
    return order[:N], order[N:]


# ----------------------------------------------------------------------------- Algorithms 1, 2, 3


def row_distance(a: np.ndarray, X: np.ndarray, N: int, keys: Optional[np.ndarray] = None) -> dict[str, float]:
    """All Theorem-1 quantities of one row (its visible keys only): a [L], X [L, D]. `keys` (optional): the row's
    keys in the order of selection (positions into a), instead of the top N by weight (random subsets: E4)."""
    L = len(a)
    sel, out = _top(a, N) if keys is None else (keys[:N], np.setdiff1d(np.arange(L), keys[:N]))
    y = a[:, None] * X
    s = y[sel].sum(0)
    res = {
        "dtilde_b": float(np.linalg.norm(y[out] - s, axis=1).sum()),
        "dtilde_a": float(np.linalg.norm(y[out].sum(0) - s)),
    }
    o = y.sum(0)
    others = o - y  # sum_{j != i} y_j, one row per i
    c = N / (L - 1)
    res["E"] = float((L - N) / L * np.linalg.norm(y - c * others, axis=1).sum())
    lam = (a + c)[:, None] * X                        # the printed form read literally: (a_i + c) x_i - xbar
    for name, xbar in (("E2", X.mean(0)), ("E3", c * o), ("E5", o)):
        res[name] = float((L - N) / L * np.linalg.norm(lam - xbar, axis=1).sum())
    if L > 2:
        mu = others / (L - 1)
        y2 = (y * y).sum(1)
        spread = (y2.sum() - y2) - (L - 1) * (mu * mu).sum(1)  # sum_{j != i} ||y_j - mu_i||^2
        coef = N * (L - 1 - N) / ((L - 1) * (L - 2))
        res["jensen"] = float((L - N) / L * np.sqrt(np.maximum(coef * spread, 0)).sum())
    else:
        res["jensen"] = 0.0
    abar = float(a[sel].sum())
    R = float(np.linalg.norm(X[sel], axis=1).max())
    d1 = float(cdist(X[out], X[sel]).max())
    res.update(
        abar=abar,
        R=R,
        d1=d1,
        dmax_B=(1 - abar) * d1 + R * (abar * (L - N) - (1 - abar)),
        dmax_R=(1 - abar) * d1 + ((1 - abar) + (L - N) * abar) * R,
        dmax_a=(1 - abar) * d1 + R,
    )
    return res


def distance_stats(
    probs,
    x,
    ns: Sequence[int],
    visible=None,
    *,
    stats=("dtilde_b", "dtilde_a", "E", "jensen", "dmax_B", "dmax_R"),
    order=None,
    **_ignored,
) -> dict[str, torch.Tensor]:
    """Per-row loop version of `distance_stats` (same output; `order` [..., Q, k]: select each row's first N keys
    in that order instead of its top N)."""
    lead, P, X, xmap, vis = _rows(probs, x, visible)
    ns = check_ns(ns, P.shape[-1])
    B, Q, _ = P.shape
    orders = None if order is None else order.reshape(B, Q, -1).long().numpy()
    out = {k: np.full((B, Q, len(ns)), np.nan) for k in stats}
    for b in range(B):
        Xh = X[xmap[b]]
        for t in range(Q):
            idx = np.flatnonzero(vis[t])
            a, Xr = P[b, t, idx], Xh[idx]
            keys = None
            if orders is not None:                       # key index -> position among the visible keys
                where = {int(k): p for p, k in enumerate(idx)}
                keys = np.array([where[int(k)] for k in orders[b, t] if int(k) in where])
            for c, N in enumerate(ns):
                if len(idx) <= N:
                    continue
                res = row_distance(a, Xr, N, keys)
                for k in stats:
                    out[k][b, t, c] = res[k]
    return {k: torch.from_numpy(v).reshape(*lead, Q, len(ns)) for k, v in out.items()}


def critical_n(
    probs, x, visible=None, *, alpha: float = 0.01, n_max: Optional[int] = None, reading: str = "b", **_ignored
) -> dict:
    """Alg. 3: for N = 1, 2, ...: per head, token means of d~ and E; first N with KS p > alpha."""
    lead, P, X, xmap, vis = _rows(probs, x, visible)
    B, Q, K = P.shape
    n_max = K - 1 if n_max is None else min(n_max, K - 1)
    res = {"n": -1, "ns": [], "pvalues": [], "ks": [], "d_mean": [], "e_mean": []}
    for N in range(1, n_max + 1):
        d_heads, e_heads = [], []
        for b in range(B):
            ds, es = [], []
            for t in range(Q):
                idx = np.flatnonzero(vis[t])
                if len(idx) <= N:
                    continue
                r = row_distance(P[b, t, idx], X[xmap[b]][idx], N)
                ds.append(r[f"dtilde_{reading}"])
                es.append(r["E"])
            if ds:
                d_heads.append(np.mean(ds))
                e_heads.append(np.mean(es))
        if not d_heads:
            break
        if _ks_record(res, N, d_heads, e_heads, alpha):
            break
    return res


def _ks_record(res: dict, N: int, d_heads, e_heads, alpha: float) -> bool:
    """Append the KS test of the two per-head samples at N to the scan `res`; True (and res["n"] = N) when it does
    not reject."""
    test = ks_2samp(d_heads, e_heads)
    res["ns"].append(N)
    res["pvalues"].append(float(test.pvalue))
    res["ks"].append(float(test.statistic))
    res["d_mean"].append(float(np.mean(d_heads)))
    res["e_mean"].append(float(np.mean(e_heads)))
    if test.pvalue > alpha:
        res["n"] = N
        return True
    return False


def critical_n_readings(probs, x, visible=None, *, pairs=None, alpha: float = 0.01, n_max: Optional[int] = None,
                        seed: int = 0, samples: int = 2, **_ignored) -> dict:
    """Alg. 3 under every reading pair (e, d) (`six_percent.critical_n_readings`, same output but e_rel_se):
    per N, per head, the token means of d~ (reading d) of the top N and of E (reading e; E4: d~ of the first N keys
    of each of the `samples` seeded random orders of `readings.random_orders`, averaged); per pair the first N with
    KS p > alpha."""
    from attnlab.normalization.readings import random_orders

    lead, P, X, xmap, vis = _rows(probs, x, visible)
    B, Q, K = P.shape
    n_max = K - 1 if n_max is None else min(n_max, K - 1)
    pairs = list(pairs)
    orders = [random_orders(probs.shape[:-2], torch.from_numpy(vis), seed, s).reshape(B, Q, K).long().numpy()
              for s in range(samples)]
    out = {p: {"n": -1, "ns": [], "pvalues": [], "ks": [], "d_mean": [], "e_mean": []} for p in pairs}
    todo = list(pairs)
    for N in range(1, n_max + 1):
        if not todo:
            break
        heads = []                                                      # per head: {quantity: token mean}
        for b in range(B):
            acc: dict = {}
            for t in range(Q):
                idx = np.flatnonzero(vis[t])
                if len(idx) <= N:
                    continue
                a, Xr = P[b, t, idx], X[xmap[b]][idx]
                top = row_distance(a, Xr, N)
                vals = {"d_a": top["dtilde_a"], "d_b": top["dtilde_b"], "E1": top["E"], "E2": top["E2"],
                        "E3": top["E3"], "E5": top["E5"]}
                where = {int(k): p for p, k in enumerate(idx)}
                rand = [row_distance(a, Xr, N, np.array([where[int(k)] for k in o[b, t] if int(k) in where]))
                        for o in orders]
                vals["E4_a"] = float(np.mean([r["dtilde_a"] for r in rand]))
                vals["E4_b"] = float(np.mean([r["dtilde_b"] for r in rand]))
                for k, v in vals.items():
                    acc.setdefault(k, []).append(v)
            if acc:
                heads.append({k: np.mean(v) for k, v in acc.items()})
        if not heads:
            break
        for p in list(todo):
            e, d = p
            dk, ek = f"d_{d}", (f"E4_{d}" if e == "E4" else e)
            if _ks_record(out[p], N, [h[dk] for h in heads], [h[ek] for h in heads], alpha):
                todo.remove(p)
    return out


# ------------------------------------------------------------------------------------- Algorithm 4


def row_separability(a: np.ndarray, Xn: np.ndarray, N: int, delta: float, M: float = 1.0,
                     radius: str = "nearest") -> dict[str, float]:
    """Theorem-2 quantities of one row; Xn [L, D] already on the sphere of radius M (radius: see
    `row_ns_fracs`)."""
    sel, out = _top(a, N)
    y = a[:, None] * Xn
    s = y[sel].sum(0)
    dist = np.linalg.norm(y - s, axis=1)
    r = float(dist[out].min())
    res = {"r": r, "delta": delta, **row_ns_fracs(dist[sel], r, N)}
    res["ns_frac"] = res[f"ns_frac_{radius}"]
    xis = {"row": dist[sel]}
    xis["pair"] = np.zeros(N) if N == 1 else cdist(y[sel], y[sel]).sum(1) / (N - 1)
    asel = a[sel]
    A = asel.sum() - asel
    A2 = (asel * asel).sum() - asel * asel
    xis["delta"] = np.sqrt(np.maximum(M * M * A2 + (M * M - delta * delta / 2) * (A * A - A2), 0))
    for name, xi in xis.items():
        res[f"xi_{name}"] = float(xi.mean())
        res[f"lower_{name}"] = float(1 - xi.sum() / (r * N)) if r > 0 else np.nan
        res[f"upper_B_{name}"] = float(np.mean(np.exp(-((r - xi) ** 2) / (16 * M * M)))) if r > 0 else np.nan
        res[f"upper_R_{name}"] = (float(np.mean(np.exp(-(np.maximum(xi - r, 0) ** 2) / (2 * M * M))))
                                  if r > 0 else np.nan)
    return res


def separability_stats(
    probs,
    x,
    ns: Sequence[int],
    visible=None,
    *,
    M: float = 1.0,
    normalize: bool = True,
    stats=("ns_frac", "r", "lower_row", "upper_B_row", "upper_R_row"),
    radius: str = "nearest",
    rows: str = "positive_r",
    **_ignored,
):
    """Per-row loop version of `separability_stats` (same output, same `radius` and `rows` readings)."""
    lead, P, X, xmap, vis = _rows(probs, x, visible)
    ns = check_ns(ns, P.shape[-1])
    B, Q, _ = P.shape
    out = {k: np.full((B, Q, len(ns)), np.nan) for k in stats}
    for b in range(B):
        Xh = X[xmap[b]]
        if normalize:
            nrm = np.linalg.norm(Xh, axis=1, keepdims=True)
            Xh = np.where(nrm > 0, Xh / np.where(nrm > 0, nrm, 1), 0) * M
        for t in range(Q):
            idx = np.flatnonzero(vis[t])
            Xr = Xh[idx]
            delta = float(pdist(Xr).min()) if len(idx) > 1 else np.nan
            for c, N in enumerate(ns):
                if len(idx) <= N:
                    continue
                res = row_separability(P[b, t, idx], Xr, N, delta, M, radius)
                if not res["r"] > 0 and rows == "positive_r":
                    continue
                for k in stats:
                    out[k][b, t, c] = res[k]
    return {k: torch.from_numpy(v).reshape(*lead, Q, len(ns)) for k, v in out.items()}


# ------------------------------------------------------------------------------------- Algorithm 5


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def fd_grad_norms(scores, temperatures, epsilons, visible=None, *, seed: int = 0, direction: str = "gaussian",
                  **_ignored) -> torch.Tensor:
    """Per-row loop version of `fd_grad_norms` (same directions, same output)."""
    lead, Q = scores.shape[:-2], scores.shape[-2]
    out = np.full((int(np.prod(lead)), Q, len(temperatures), len(epsilons)), np.nan)
    for b, t, l, v in _perturbed_rows(scores, visible, seed, direction):
        for ti, T in enumerate(temperatures):
            base = _softmax(l / T)
            for ei, eps in enumerate(epsilons):
                out[b, t, ti, ei] = np.linalg.norm(_softmax((l + eps * v) / T) - base) / eps
    return torch.from_numpy(out).reshape(*lead, Q, len(temperatures), len(epsilons))


def _perturbed_rows(scores, visible, seed: int, direction: str):
    """(head b, row t, the row's visible logits l, its direction v) for every row with >= 2 visible keys."""
    vis_t = visible_scores(scores, visible)
    S = scores.reshape(-1, *scores.shape[-2:]).double().numpy()
    V = random_directions((S.shape[0],), vis_t, seed, direction).numpy()
    vis = vis_t.numpy()
    for b in range(S.shape[0]):
        for t in range(S.shape[1]):
            idx = np.flatnonzero(vis[t])
            if len(idx) >= 2:
                yield b, t, S[b, t, idx], V[b, t, idx]


def softmax_jacobian_norm(probs, T: float = 1.0, visible=None, **_ignored) -> torch.Tensor:
    """Largest eigenvalue of (diag(a) - a a^T)/T for each row (numpy eigvalsh per row)."""
    vis = check_inputs(probs, None, visible).numpy()
    lead = probs.shape[:-1]
    P = probs.reshape(-1, probs.shape[-1]).double().numpy()
    Qn = probs.shape[-2]
    out = np.empty(P.shape[0])
    for i, a in enumerate(P):
        a = a[vis[i % Qn]]
        out[i] = np.linalg.eigvalsh(np.diag(a) - np.outer(a, a))[-1] / T
    return torch.from_numpy(out).reshape(lead)


# ------------------------------- readings of Theorem 2 and Fig. 4 (issue #14; `readings.theorem2`, `readings.lemma2`)


def row_ns_fracs(dist_sel: np.ndarray, r: float, N: int) -> dict[str, float]:
    """N_s/N of one row under each radius reading: "nearest" counts dist_i < r (strict), "closed" dist_i <= r;
    a row with r = 0 (kept only under the rows reading "all") counts N_s = 0."""
    if not r > 0:
        return {"ns_frac_nearest": 0.0, "ns_frac_closed": 0.0}
    return {"ns_frac_nearest": float((dist_sel < r).sum()) / N, "ns_frac_closed": float((dist_sel <= r).sum()) / N}


def _uniform_argmax(z: np.ndarray) -> np.ndarray:
    """The limit T -> 0 of softmax(z / T): uniform on the argmax set of z."""
    top = z == z.max()
    return top / top.sum()


def fd_grad_limit(scores, epsilons, visible=None, *, seed: int = 0, direction: str = "gaussian",
                  **_ignored) -> torch.Tensor:
    """Per-row loop version of `fd_grad_limit`: ||u(l + eps v) - u(l)|| / eps, u = uniform on the argmax set."""
    lead, Q = scores.shape[:-2], scores.shape[-2]
    out = np.full((int(np.prod(lead)), Q, len(epsilons)), np.nan)
    for b, t, l, v in _perturbed_rows(scores, visible, seed, direction):
        for ei, eps in enumerate(epsilons):
            out[b, t, ei] = np.linalg.norm(_uniform_argmax(l + eps * v) - _uniform_argmax(l)) / eps
    return torch.from_numpy(out).reshape(*lead, Q, len(epsilons))


# ------------------------------------------------------------------------------------- Fig. 1 rows


def row_summary(scores, probs, q, k, scaling: float, visible=None) -> dict[str, torch.Tensor]:
    """Per-row loop version of `row_summary`."""
    vis = (check_inputs(probs, None, visible) & visible_scores(scores, visible)).numpy()
    lead = probs.shape[:-2]
    Q, K = probs.shape[-2:]
    S = scores.reshape(-1, Q, K).double().numpy()
    P = probs.reshape(-1, Q, K).double().numpy()
    Qv = q.reshape(-1, Q, q.shape[-1]).double().numpy()
    Kv = k.reshape(-1, K, k.shape[-1]).double().numpy()
    keys = (
        "max_weight",
        "entropy",
        "entropy_norm",
        "log_min_w",
        "log_max_w",
        "cor1_lo",
        "cor1_hi",
        "lemma1_lo",
        "lemma1_hi",
        "L",
        "logit_err",
    )
    out = {key: np.full((P.shape[0], Q), np.nan) for key in keys}
    for b in range(P.shape[0]):
        for t in range(Q):
            idx = np.flatnonzero(vis[t])
            L = len(idx)
            a, l = P[b, t, idx], S[b, t, idx]
            lw = l - (np.log(np.exp(l - l.max()).sum()) + l.max())
            nz = a[a > 0]
            ent = float(-(nz * np.log(nz)).sum())
            delta = np.linalg.norm(Qv[b, t]) * np.linalg.norm(Kv[b, idx], axis=1).max()
            amax = np.abs(l).max()
            vals = {
                "max_weight": a.max(),
                "entropy": ent,
                "entropy_norm": ent / np.log(L) if L > 1 else 0.0,
                "log_min_w": lw.min(),
                "log_max_w": lw.max(),
                "cor1_lo": -np.log(L) - 2 * delta * scaling,
                "cor1_hi": -np.log(L) + 2 * delta * scaling,
                "lemma1_lo": -np.log(L) - 2 * amax,
                "lemma1_hi": -np.log(L) + 2 * amax,
                "L": L,
                "logit_err": np.abs(scaling * Kv[b, idx] @ Qv[b, t] - l).max(),
            }
            for key, val in vals.items():
                out[key][b, t] = val
    return {key: torch.from_numpy(v).reshape(*lead, Q) for key, v in out.items()}
