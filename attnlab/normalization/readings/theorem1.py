"""Theorem 1 of arXiv 2508.17821 under every reading of its open formulas (`attnlab.normalization.readings`):
Fig. 2a's two curves and Fig. 2c's critical N for each E reading (E1-E5), d~ reading (a, b) and vector choice,
the same protocol as `experiments.fig2a` / `fig2c` otherwise, and the claim rows that say which reading satisfies
which statement of the paper (`reading_claims`).

    res = thm1_readings(model, ids)            # ids: one window [L_max]; Result "thm1_readings"

Rows (`kind`):
- "curve": per (vectors, L, N, layer, head): the token means of d~ (a, b), of every E reading (E4: the mean over
  `samples` random subsets per row, and `E4_*_se`, the standard error of the head mean), of sum_i ||a_i x_i||
  (`sum_y`, the limit of Corollary 2(i)) and of max_i ||x_i|| (`x_max`). N = 5 at every L of the curve grid
  (Fig. 2a), and N = L/2, L - 1 at the largest L (Corollary 2(ii)).
- "critical": per (vectors, L, e, d): the critical N of the KS scan (Alg. 3: every N from 1, alpha = 0.01,
  `six_percent.critical_n_readings`), its fraction of L, the p-value and the sample means there (where none is
  found: at the last N scanned, L - 1; computed exactly in both cases), how many N were scanned and how many computed
  exactly (the others: rejections certified by brackets), and E4's relative standard error at that N. Every column
  is the same on the CPU kernels and on the torch path (GPU, ATTNLAB_KERNELS=0): tests/test_paths_agree.py.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.core.util import progress as progress_bar
from attnlab.core.util import with_threads
from attnlab.core.verdicts import claim_row, holds_le, verdict
from attnlab.normalization import readings as R
from attnlab.normalization.claim_kinds import ALL_CLAIMS, claim_text, text, threshold
from attnlab.normalization.claims import linear_growth
from attnlab.normalization.experiments import Captures, as_windows, by_kind_groups, kind_of, length_grid
from attnlab.normalization.metrics.distance import distance_stats
from attnlab.normalization.metrics.engine import prefix_lengths, row_mean
from attnlab.normalization.paper import FIG2A_N, KS_ALPHA
from attnlab.normalization.readings.six_percent import ALL_PAIRS, DEFAULT_SAMPLES, check_pairs, critical_n_readings

NAME = "thm1_readings"
LENGTHS = (64, 128, 256, 512)             # the critical-N table (issue #14); capped by the model
QUICK_LENGTHS = (64, 128)


def cor2_ns(L: int) -> list[int]:
    """The N grid of Cor. 2(ii)'s curve E(N) at the largest L: 1, Fig. 2a's 5, eighths of L, L - 1."""
    return sorted({1, FIG2A_N, *(L * k // 8 for k in range(1, 8)), L - 1} - {0})


def expectation_bound(N: int, L: int) -> float:
    """[R] E1, E3 and E4 are at most this times max_i ||x_i|| in every row of L keys (any weights summing to 1):
    E1, E4 <= (1 + N) sum_i ||a_i x_i|| and E3 <= (1 + 2 N L / (L - 1)) max_i ||x_i|| (triangle inequality; chapter
    2 derives them). Cor. 2(i)'s limit sum_i ||a_i x_i|| <= max_i ||x_i|| is bounded in L too; E2 and E5 are not:
    they grow like (L - N) ||xbar||."""
    return 1 + 2 * N * L / (L - 1)
E_STATS = {"E1": "E", "E2": "E2", "E3": "E3", "E5": "E5"}
CURVE_DTYPE = torch.float32    # the curves' matrix products (CPU: squares and sums stay float64, `distance_stats`)


def reading_lengths(model, n_tokens: int, quick: bool, lengths: Optional[Sequence[int]] = None) -> list[int]:
    """L of the critical-N table: LENGTHS (quick: 64, 128) that fit the window and the model, or `lengths`."""
    top = min(int(n_tokens), int(model.max_positions))
    if lengths is not None:
        return length_grid(model, n_tokens, quick, lengths)
    grid = [L for L in (QUICK_LENGTHS if quick else LENGTHS) if L <= top]
    if not grid:
        raise ValueError(f"the readings need L >= {LENGTHS[0]}; this window/model allows only L <= {top}")
    return grid


def sample_orders(trace, seed: int, samples: int) -> list[torch.Tensor]:
    """E4's random orders of a trace's rows, [layer, head, Q, K] each (`readings.random_orders`, s < samples): they
    depend on the visible keys only, so one list serves every vector reading, the curves and the critical N."""
    return [R.random_orders(trace.probs.shape[:-2], trace.visible(), seed, s) for s in range(samples)]


def curve_rows(trace, vectors: str, L: int, ns: Sequence[int], seed: int, samples: int,
               window: int = 0, orders: Optional[list] = None, top_orders: Optional[dict] = None) -> list[dict]:
    """kind="curve" rows of one trace (L tokens) and vector reading: per (N, layer, head). `orders`: the trace's
    `sample_orders` (made here when None); `top_orders`: a dict kept for the trace's other vector readings at the same
    ns (`distance_stats`: each row block's top order made once)."""
    x = R.vectors(trace, vectors)
    vis = trace.visible()
    orders = sample_orders(trace, seed, samples) if orders is None else orders
    st = distance_stats(trace.probs, x, ns, vis, stats=("dtilde_a", "dtilde_b", *E_STATS.values()), dtype=CURVE_DTYPE,
                        top_orders=top_orders)
    vals = {"d_a": st["dtilde_a"], "d_b": st["dtilde_b"], **{e: st[k] for e, k in E_STATS.items()}}
    per_sample = [distance_stats(trace.probs, x, ns, vis, stats=("dtilde_a", "dtilde_b"),
                                 order=order, dtype=CURVE_DTYPE)
                  for order in orders]                                           # (both readings: one pass)
    for d in ("a", "b"):
        per = [st[f"dtilde_{d}"] for st in per_sample]
        means = torch.stack([row_mean(p, dim=-2) for p in per])                      # [S, layer, head, N]
        vals[f"E4_{d}"] = torch.stack(per).mean(0)
        se = means.std(0, unbiased=True) / samples ** 0.5 if samples > 1 else torch.full_like(means[0], np.nan)
        vals[f"E4_{d}_se"] = se.unsqueeze(-2)                                      # (a head value: no row axis)
    xn = x.double().norm(dim=-1)                                                     # [l, h | 1, K]
    sum_y = torch.matmul(trace.probs, xn.to(trace.probs.dtype).unsqueeze(-1)).squeeze(-1).double()   # [l, h, Q]
    # (sum_i a_i ||x_i||: probs are 0 on invisible keys)
    x_max = visible_max(xn, vis)                                                     # [l, h | 1, Q]
    means = {k: (v if k.endswith("_se") else row_mean(v, dim=-2)) for k, v in vals.items()}
    head_sum_y, head_x_max = sum_y.mean(-1), x_max.mean(-1).expand(sum_y.shape[:-1])
    rows = []
    for li, layer in enumerate(trace.layers):
        for hi, head in enumerate(trace.heads):
            for c, N in enumerate(ns):
                r = {"kind": "curve", "window": window, "vectors": vectors, "L": L, "N": int(N), "layer": int(layer),
                     "head": int(head), "sum_y": float(head_sum_y[li, hi]), "x_max": float(head_x_max[li, hi])}
                for k, v in means.items():
                    r[k] = float(v[li, hi, ..., c].reshape(-1)[0])
                rows.append(r)
    return rows


def visible_max(values: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    """max over each row's visible keys: values [..., K], vis bool [Q, K] -> [..., Q] (prefix-shaped visibility,
    causal or bidirectional: one running max; otherwise row by row)."""
    n = prefix_lengths(vis)
    if n is not None:
        return torch.cummax(values, dim=-1).values[..., (n - 1).clamp_min(0)]
    return torch.stack([values[..., vis[t]].amax(-1) for t in range(vis.shape[0])], dim=-1)


def critical_rows(trace, vectors: str, L: int, pairs, alpha: float, seed: int, samples: int,
                  window: int = 0, orders: Optional[list] = None, n_max: Optional[int] = None) -> list[dict]:
    """kind="critical" rows of one trace and vector reading: one per reading pair (e, d). `orders`: the trace's
    `sample_orders` (made by the scan when None); n_max: the largest N scanned (None: L - 1)."""
    more = {} if n_max is None else {"n_max": n_max}
    scans = critical_n_readings(trace.probs, R.vectors(trace, vectors), trace.visible(), pairs=pairs, alpha=alpha,
                                seed=seed, samples=samples, orders=orders, **more)
    rows = []
    for (e, d), res in scans.items():
        n = int(res["n"])
        at = res["ns"].index(n) if n > 0 else len(res["ns"]) - 1
        rows.append({"kind": "critical", "window": window, "vectors": vectors, "L": L, "e": e, "d": d,
                     "critical_n": n, "critical_frac": n / L if n > 0 else float("nan"),
                     "pvalue": res["pvalues"][at] if res["ns"] else float("nan"),
                     "d_mean": res["d_mean"][at] if res["ns"] else float("nan"),
                     "e_mean": res["e_mean"][at] if res["ns"] else float("nan"),
                     "e_rel_se": res["e_rel_se"][at] if res["ns"] else float("nan"),
                     "n_scanned": len(res["ns"]), "n_exact": int(sum(res["exact"]))})
    return rows


def critical_frac(row: dict, longest: int) -> dict:
    """A critical row with critical_frac = critical N / the longest row's keys (L; min(L, w) in a sliding layer)."""
    n = row["critical_n"]
    return row if longest == row["L"] else dict(row, critical_frac=n / longest if n > 0 else float("nan"))


@with_threads
def thm1_readings(model, ids, *, quick: bool = False, progress: bool = True, captures=None,
                  vectors: Optional[Sequence[str]] = None, pairs=None, lengths: Optional[Sequence[int]] = None,
                  curve_lengths: Optional[Sequence[int]] = None, seed: int = 0, samples: int = DEFAULT_SAMPLES,
                  alpha: float = KS_ALPHA, text: Optional[dict] = None, threads: Optional[int] = None) -> Result:
    """Fig. 2a's curves and Fig. 2c's critical N under every reading (module docstring): Result "thm1_readings".
    `vectors` (default every `readings.VECTORS` the model defines: `readings.model_vectors`), `pairs` (default
    every (E, d~) pair), `lengths` (critical N; default 64, 128, 256, 512 capped by the model), `curve_lengths`
    (Fig. 2a; default 32, 64, ... up to the model and `readings.MAX_LENGTH`), `seed`/`samples` (E4's random
    subsets), `alpha` (KS level)."""
    t0 = time.perf_counter()
    vectors = R.model_vectors(model, vectors or None)      # (default: every reading the model defines)
    pairs = check_pairs(pairs)
    if not 0 < float(alpha) < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    keep = {"probs"} | R.needs(vectors)
    caps = [Captures(model, w, keep) for w in as_windows(ids)] if captures is None else list(captures)
    for c in caps:
        c.require(keep)
    n_tokens = len(caps[0].ids)
    crit_L = reading_lengths(model, n_tokens, quick, lengths)
    curve_top = n_tokens if curve_lengths else min(n_tokens, R.MAX_LENGTH)
    curve_L = length_grid(model, curve_top, quick, curve_lengths)
    rows: list[dict] = []
    jobs = [(w, L) for w in range(len(caps)) for L in sorted(set(crit_L) | set(curve_L))]
    for w, L in progress_bar(jobs, progress, "readings (Theorem 1)"):
        subs = by_kind_groups(caps[w].get(L))      # sliding-window layers: each kind over its own keys, its own scan
        for trace in subs:
            longest = int(trace.visible()[L - 1].sum()) if len(subs) > 1 else L      # min(L, w) in a sliding layer
            tag = kind_of(trace) | {"longest_row": longest} if len(subs) > 1 else {}
            e4 = L in curve_L or any(e == "E4" for e, _ in pairs)        # the curves have E4, the scan where asked
            orders = sample_orders(trace, seed, samples) if e4 else None    # (one list for every vector reading)
            top_orders: dict = {}                        # (the curves' top orders: made once for every vector reading)
            for vec in vectors:
                ns = [n for n in (cor2_ns(L) if L == curve_L[-1] else [FIG2A_N]) if n < longest]
                if L in curve_L and ns:                  # (a sliding layer: none where every N >= w)
                    rows += [r | tag for r in curve_rows(trace, vec, L, ns, seed, samples, w, orders, top_orders)]
                if L in crit_L:
                    rows += [critical_frac(r, longest) | tag
                             for r in critical_rows(trace, vec, L, pairs, alpha, seed, samples, w, orders,
                                                    None if longest == L else longest - 1)]
        if not model.causal:
            caps[w].traces.pop(L, None)                                  # bidirectional: one pass per L, not kept
    first = caps[0].last
    text = text or {}
    prov = provenance(
        figure=NAME, model=model.name, causal=bool(model.causal), max_positions=int(model.max_positions),
        model_info=(model.provenance() if hasattr(model, "provenance") else None),
        text=text.get("text", text.get("name")),
        text_sha256=text.get("text_sha256") or (first.text_sha256 if first is not None else None), text_meta=text,
        n_windows=len(caps), window_tokens=n_tokens, vectors=vectors,
        vectors_meaning={v: R.describe(R.VECTORS, v) for v in vectors},
        **({"vectors_not_defined": R.undefined_vectors(model)} if R.undefined_vectors(model) else {}),
        pairs=[list(p) for p in pairs], e_readings={e: R.describe(R.E_READINGS, e) for e in R.E_READINGS},
        d_readings={d: R.describe(R.D_READINGS, d) for d in R.D_READINGS},
        keys="visible keys only; rows with L_t <= N skipped", alpha=alpha, seed=seed, samples=samples,
        grids={"critical_lengths": crit_L, "curve_lengths": curve_L, "curve_N": FIG2A_N,
               "corollary2_N": "L/2 and L-1 at the largest curve length", "n_scan": "every N from 1, stop at the "
               "first p > alpha, per pair"},
        quick=bool(quick), n_passes=sum(c.n_passes for c in caps),
        capture_seconds=round(sum(c.seconds for c in caps), 3), runtime_seconds=round(time.perf_counter() - t0, 3),
        torch_threads=torch.get_num_threads())
    return Result(name=NAME, rows=rows, provenance=prov)


# ------------------------------------------------------------------------------------------------ claims

def _head_means(res: Result, key: str, **where) -> tuple[np.ndarray, np.ndarray]:
    """L values and the mean over heads (and windows) of `key` among the rows matching `where`."""
    sel = res.select(**where)
    Ls = sorted({r["L"] for r in sel})
    return np.array(Ls, float), np.array([np.nanmean([r[key] for r in sel if r["L"] == L]) for L in Ls])


def _label(e: str, d: str, vectors: str) -> str:
    return f"{e} / {d} / {vectors}"


def reading_claims(results: dict) -> list[dict]:
    """Claim rows, one per reading, for the statements of Theorem 1's experiments that depend on the reading:
    p1-fig2c-critical (critical N <= 0.06 L at every L), p1-fig2a-linear (d~ and E both grow about linearly in L
    at N = 5), p1-cor2-i (E(N = 5) -> sum_i ||a_i x_i|| as L grows), p1-cor2-ii (E -> 0 as N -> L). `results`
    holds the Result under "thm1_readings"; missing gives no rows (the default readings' rows are in `claims`).
    The statements' texts, paper's words and thresholds are the claim registry's (`claim_kinds`)."""
    res = results.get(NAME)
    if res is None or not res.rows:
        return []
    prov = res.provenance
    model = f"{prov.get('model')}, {prov.get('n_windows', 1)} window(s)"
    out = []
    crit = [r for r in res.rows if r["kind"] == "critical"]
    for e, d in [tuple(p) for p in prov.get("pairs", ALL_PAIRS)]:
        for vec in prov.get("vectors", []):
            rs = sorted((r for r in crit if (r["e"], r["d"], r["vectors"]) == (e, d, vec)), key=lambda r: r["L"])
            if not rs:
                continue
            ok = all(0 < r["critical_n"] and holds_le(r["critical_n"], threshold("CRITICAL_FRAC") * r["L"])
                     for r in rs)
            meas = "; ".join(f"L={r['L']}: " + (f"N*={r['critical_n']} ({r['critical_frac']:.3f} L)"
                                                if r["critical_n"] > 0 else "none") for r in rs)
            out.append(claim_row("p1-fig2c-critical", claim_text("p1-fig2c-critical"),
                                 ALL_CLAIMS["p1-fig2c-critical"].paper, f"{meas} ({model})", verdict(ok),
                                 _label(e, d, vec),
                                 value=max(r["critical_n"] / r["L"] if r["critical_n"] > 0 else 1.0 for r in rs),
                                 unit=ALL_CLAIMS["p1-fig2c-critical"].unit))
    curve = [r for r in res.rows if r["kind"] == "curve" and r["N"] == FIG2A_N]
    cres = Result(NAME, curve, prov)
    for vec in prov.get("vectors", []):
        if len({r["L"] for r in curve if r["vectors"] == vec}) < 3:
            continue
        fits = {q: linear_growth(*_head_means(cres, q, vectors=vec))
                for q in ("d_a", "d_b", "E1", "E2", "E3", "E4_a", "E4_b", "E5")}
        for e, d in [tuple(p) for p in prov.get("pairs", ALL_PAIRS)]:
            fd, fe = fits[f"d_{d}"], fits[f"E4_{d}" if e == "E4" else e]
            out.append(claim_row(
                "p1-fig2a-linear", f"At N = 5 both d~ and E grow about linearly in L (each: {text('LINEAR_CLAIM')})",
                ALL_CLAIMS["p1-fig2a-linear"].paper,
                f"d~: {fd['text']}; E: {fe['text']} ({model})", verdict(fd["ok"] and fe["ok"]), _label(e, d, vec)))
        L_top = max(r["L"] for r in curve if r["vectors"] == vec)
        top = [r for r in res.rows if r["kind"] == "curve" and r["vectors"] == vec and r["L"] == L_top]
        sum_y = np.nanmean([r["sum_y"] for r in top if r["N"] == FIG2A_N])
        x_max = np.nanmean([r["x_max"] for r in top if r["N"] == FIG2A_N])
        Ls = sorted({r["L"] for r in curve if r["vectors"] == vec})
        bound = [expectation_bound(FIG2A_N, L) * np.nanmean([r["x_max"] for r in curve
                                                             if r["vectors"] == vec and r["L"] == L]) for L in Ls]
        for e in R.E_READINGS:
            for d in (("a", "b") if e == "E4" else ("",)):
                q = f"E4_{d}" if e == "E4" else e
                at = {N: np.nanmean([r[q] for r in top if r["N"] == N]) for N in sorted({r["N"] for r in top})}
                gap = abs(at[FIG2A_N] - sum_y) / sum_y
                lab = _label(e, d or "-", vec)
                out.append(claim_row(
                    "p1-cor2-i", claim_text("p1-cor2-i"), ALL_CLAIMS["p1-cor2-i"].paper,
                    f"E = {at[FIG2A_N]:.3g}, sum_i ||a_i x_i|| = {sum_y:.3g} (<= max_i ||x_i|| = {x_max:.3g}), gap "
                    f"{gap:.0%} at L = {L_top} ({model})", verdict(holds_le(gap, threshold("COR2_GAP"))), lab,
                    value=gap, unit=ALL_CLAIMS["p1-cor2-i"].unit))
                _, e_L = _head_means(cres, q, vectors=vec)
                over = [L for L, v, b in zip(Ls, e_L, bound) if not holds_le(v, b)]
                out.append(claim_row(
                    "p1-cor2-bounded", claim_text("p1-cor2-bounded"), ALL_CLAIMS["p1-cor2-bounded"].paper,
                    f"E / bound = {e_L[0] / bound[0]:.2f} at L = {Ls[0]} .. {e_L[-1] / bound[-1]:.2f} at L = {Ls[-1]}"
                    + (f"; above it at L = {over}" if over else "") + f" ({model})",
                    verdict(not over), lab))
                vanish = at[max(at)] / at[min(at)]
                out.append(claim_row(
                    "p1-cor2-ii", claim_text("p1-cor2-ii"), ALL_CLAIMS["p1-cor2-ii"].paper,
                    ", ".join(f"E(N={N}) = {v:.3g}" for N, v in at.items()) + f" at L = {L_top}: E(L - 1) / E(1) = "
                    f"{vanish:.2f} ({model})", verdict(holds_le(vanish, threshold("COR2_VANISH"))), lab, value=vanish,
                    unit=ALL_CLAIMS["p1-cor2-ii"].unit))
    return out
