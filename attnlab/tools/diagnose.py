"""Attention diagnostics for any model: which heads are saturated, in the sense of arXiv 2508.17821.

    attnlab diagnose --model M [--text FILE] [--lengths 64 128 ...] [--out DIR]
    diagnose(model, text, lengths=...) -> Result;  write_report(result, DIR);  print(summary(result))

Per head and length L (one window of L tokens from the start of the text):

- ``entropy`` (nats) of each attention row, and ``entropy_norm`` = H / log L_t (L_t = the row's
  visible keys; 1 = uniform), means over the rows;
- ``max_weight``: the row's largest weight, mean over the rows;
- ``ns_frac`` = N_s / N (paper Eq. 10, ``separability``: value vectors on the unit sphere,
  r = distance of the nearest non-selected token), N = ``n_sep`` (16: the paper's Fig. 3 saturates
  from N ~ 16 on), mean over a sample of rows;
- ``dtilde``: representation distance d~ (reading b, ``distance_stats``) at N = ``n_top``, and
  ``dtilde_ratio`` = d~ / E (E: the random-set main sum of Theorem 1);
- ``jac_norm``: exact spectral norm of the softmax Jacobian ``(diag(a) - a a^T) / T`` at the native
  temperature (T = 1 on the model's own scaled scores), mean over a sample of rows;

and per layer and for the whole model: the critical top-N of the paper's KS test (Alg. 3), pooling
heads (``kind="model"``: every head, the paper's protocol; ``kind="layer"``: the heads of one layer).
N is scanned on a grid (every N up to 8, then steps of 1% of L, up to 50% of L): the reported N is the
first grid N that is not rejected (exact when the step is 1); none up to the grid's end is "censored".

References (``reference_weights``): every statistic is also computed on the same head's sampled rows
and vectors with the weights replaced by the two ends of the row's temperature path: ``uniform``
(T -> inf: 1/L_t on the visible keys, ranked as the row ranks them) and ``sharp`` (T -> 0: one-hot on
the row's top key). Columns ``<stat>_uniform`` / ``<stat>_sharp``; the layer/model rows carry the
critical N of the uniform reference (``critical_n_uniform``).

Flags (``Thresholds``, the rules in one place): a statistic's saturation score (``saturation_score``)
is 0 at its unsaturated end and 1 at its uniform reference; a flag fires at score >= the cut (0.9).

- ``near_uniform`` (head): entropy, ends one-hot (0) and uniform (1): score = H / log L_t.
- ``low_separability`` (head): N_s/N, ends N_s/N = 1 and the head's own uniform reference; only for
  heads on the uniform side (entropy score >= ``sharp_gate``), because N_s/N is not monotone in
  saturation: it falls towards 1/N at the one-hot end as well.
- ``critical_n`` (layer, model): critical N, ends the scan's end (censored) and the critical N of
  the uniform reference of the same heads; None when that reference is censored or untestable.

The paper's numbers (N_s/N 0.70-0.85, critical N < 0.06 L) are kept as columns (``paper_*``) for
comparison; they measure GPT-2 and do not flag. Expensive per-row metrics (N_s/N, d~, critical N,
Jacobian, references) use ``max_rows`` evenly spaced query rows per head (all rows when L <= max_rows);
entropy and max weight use every row. Every choice is recorded in the Result's provenance.

Sliding-window layers (Gemma 3: window 512 on 15 of 18 layers): every statistic above runs over the keys each row
sees in its layer (`Trace.visible`: L_t = min(t + 1, w)), and the layer kinds are diagnosed apart (`kind_rows`): the
"model" critical N is one KS test per kind, over that kind's heads, on the grid of its longest row (min(L, w)); rows
carry `layer_kind` and `sliding_window`. A window of no more keys than n_top or n_sep is refused (`check_windows`):
no row of such a layer has more than N keys.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.capture import Trace, visible_mask
from attnlab.core.models import as_attn_model
from attnlab.core.result import Result, provenance
from attnlab.core.text import resolve_text
from attnlab.core.util import progress as progress_bar
from attnlab.normalization import paper
from attnlab.normalization.experiments import by_kind_groups, kind_of
from attnlab.normalization.metrics.critical_n import ks_first_indistinguishable
from attnlab.normalization.metrics.distance import distance_stats
from attnlab.normalization.metrics.engine import row_mean
from attnlab.normalization.metrics.gradients import softmax_jacobian_norm
from attnlab.normalization.metrics.rows import entropy, max_weight
from attnlab.normalization.metrics.separability import separability
from attnlab.tools.thresholds import ALPHA, DEFAULT_LENGTHS, MAX_ROWS, N_SEP, N_TOP, Thresholds  # noqa: F401

CRIT_MAX_FRAC = 0.5
CRIT_STEP_FRAC = 0.01
CRIT_DENSE = 8
REPORT_NAME = "diagnose"
HEAT_METRICS = (("entropy_norm", "entropy / log L"), ("max_weight", "max weight"),
                ("ns_frac", "N_s / N"), ("jac_norm", "Jacobian norm (T = 1)"))


REF_EPS = 1e-6      # share of the row's own weights kept in the uniform reference: its ranking, not its weights
PAPER = {"ns_band": paper.SEPARABILITY_BAND, "critical_frac": paper.CRITICAL_FRAC, "min_T": paper.ONE_OVER_T_BELOW}
# the per-head columns (statistics and references), the inputs of `head_flags`, the KS columns of a reference
HEAD_FLAG_INPUTS = ("entropy_norm", "entropy_norm_uniform", "entropy_norm_sharp", "ns_frac", "ns_frac_uniform")
HEAD_KEYS = ("entropy", "entropy_norm", "entropy_norm_uniform", "entropy_norm_sharp", "max_weight",
             "max_weight_uniform", "max_weight_sharp", "weight_sum", "ns_frac", "ns_frac_uniform", "ns_frac_sharp",
             "dtilde", "dtilde_ratio", "dtilde_ratio_uniform", "dtilde_ratio_sharp", "jac_norm")
CRIT_KEYS = ("critical_n", "critical_n_frac", "critical_n_censored", "critical_n_pvalue", "critical_n_testable")


# ------------------------------------------------------------------------------------------ inputs


def _n_text_tokens(model, text: str) -> int:
    return len(model.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _max_length(model, n_tokens: int) -> int:
    special = not model.causal and getattr(model.tokenizer, "cls_token_id", None) is not None
    return min(int(model.max_positions), n_tokens + (2 if special else 0))


def text_window(model, text: str, L: int, offset: int = 0) -> torch.Tensor:
    """ids [L] of `text` (model.window), with an error that says how long the text is and what to do."""
    try:
        return model.window(text, L, offset)
    except ValueError as exc:
        if "do not fit" not in str(exc) and "empty" not in str(exc):
            raise
        n = _n_text_tokens(model, text)
        raise ValueError(
            f"the text is too short for L={L}: it has {n} tokens for {model.name}'s tokenizer "
            f"(offset {offset}); pass a longer text or lengths <= {_max_length(model, n - offset)}"
        ) from None


def check_lengths(model, text: str, lengths: Optional[Sequence[int]], *, min_length: int) -> list[int]:
    """Sorted distinct L. Requested lengths must fit the model and exceed `min_length` (the largest N);
    without `lengths`, DEFAULT_LENGTHS that fit the model and the text (ValueError if none does). A model's
    layer kinds must have a visibility mask (`visible_mask`) and its sliding windows exceed `min_length` too."""
    check_windows(model, min_length)
    if lengths is not None:
        grid = sorted({int(L) for L in lengths})
        if not grid:
            raise ValueError("lengths must not be empty")
        if grid[0] <= min_length:
            raise ValueError(f"every L must exceed the largest top-N ({min_length}); got {grid}")
        if grid[-1] > model.max_positions:
            raise ValueError(
                f"L={grid[-1]} exceeds {model.name}'s {model.max_positions} positions; "
                f"use lengths <= {model.max_positions}"
            )
        return grid
    top = min(int(model.max_positions), max(DEFAULT_LENGTHS))
    n = _n_text_tokens(model, text[: 8 * top + 4096])
    top = min(top, _max_length(model, n))
    grid = [L for L in DEFAULT_LENGTHS if min_length < L <= top]
    if not grid:
        raise ValueError(
            f"the text is too short: {n} tokens for {model.name}'s tokenizer, the shortest default "
            f"L is {DEFAULT_LENGTHS[0]}; pass a longer text or explicit lengths > {min_length}"
        )
    return grid


def check_windows(model, min_length: int) -> None:
    """ValueError, one line, where a layer kind of `model` (`layer_kinds`) has no [query, key] mask (`visible_mask`:
    a bidirectional or chunked window) or a sliding window of at most `min_length` keys (the largest N: no row of
    such a layer has more than N keys, so its N_s/N, d~ and critical N would have no rows)."""
    for kind, window in sorted(set(getattr(model, "layer_kinds", None) or ()), key=str):
        visible_mask(1, model.causal, kind, window)
        if window is not None and window <= min_length:
            raise ValueError(f"{model.name}'s {kind} layers see at most {window} keys, not more than the largest "
                             f"top-N ({min_length}): pass --n-top and --n-sep below {window}")


# ------------------------------------------------------------------------------------ pure metrics


def row_sample(n_rows: int, max_rows: Optional[int]) -> torch.Tensor:
    """Query rows [R] for the per-row metrics: all rows when max_rows is None or >= n_rows, else
    max_rows evenly spaced rows from 0 to n_rows - 1 (both included)."""
    if max_rows is None or max_rows >= n_rows:
        return torch.arange(n_rows)
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    return torch.unique(torch.linspace(0, n_rows - 1, max_rows).round().long())


def critical_grid(
    L: int,
    *,
    n_top: int = N_TOP,
    max_frac: float = CRIT_MAX_FRAC,
    step_frac: float = CRIT_STEP_FRAC,
    dense: int = CRIT_DENSE,
) -> list[int]:
    """N grid of the critical-N scan: 1..dense, then multiples of max(1, round(step_frac L)) up to
    floor(max_frac L), plus n_top; all < L."""
    if not 0 < max_frac < 1 or not 0 < step_frac <= max_frac:
        raise ValueError(f"need 0 < step_frac <= max_frac < 1, got step_frac={step_frac}, max_frac={max_frac}")
    top = max(1, min(L - 1, int(math.floor(max_frac * L))))
    step = max(1, int(round(step_frac * L)))
    grid = set(range(1, min(dense, top) + 1)) | set(range(step, top + 1, step)) | {n_top}
    return sorted(n for n in grid if 1 <= n < L)


def row_weight_stats(probs: torch.Tensor, visible: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per query row of probs [..., Q, K] (visible bool [Q, K]) -> each [..., Q] float64: max_weight;
    entropy (nats) and entropy_norm = H / log L_t (NaN for rows with L_t < 2) of the row's weights
    renormalized to sum 1 (a no-op except for normalizers whose weights do not sum to 1, e.g.
    SA-Softmax); weight_sum = the row's total weight."""
    vis = visible.to(torch.bool)
    Lt = vis.sum(-1).double()  # [Q]
    total = (probs.double() * vis).sum(-1)  # [..., Q]
    a = probs.double() / total.clamp_min(1e-300).unsqueeze(-1)
    H = entropy(a, vis)
    del a
    Hn = torch.where(Lt > 1, H / Lt.clamp_min(2).log(), torch.full_like(H, float("nan")))
    return {"max_weight": max_weight(probs, vis), "entropy": H, "entropy_norm": Hn, "weight_sum": total}


def weight_stats(probs: torch.Tensor, visible: torch.Tensor) -> dict[str, torch.Tensor]:
    """Means over the query rows of `row_weight_stats` -> each [...] float64 (entropy_norm: rows with L_t >= 2)."""
    rows = row_weight_stats(probs, visible)
    return {k: torch.nanmean(v, dim=-1) if k == "entropy_norm" else v.mean(-1) for k, v in rows.items()}


def distance_heads(
    probs: torch.Tensor, x: torch.Tensor, visible: torch.Tensor, ns: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per-head token means of d~ (reading b) and E for each N: probs [..., Q, K], x [..., K, D]
    -> two arrays [..., len(ns)] (rows with L_t <= N skipped, `distance_stats`)."""
    st = distance_stats(probs, x, ns, visible, stats=("dtilde_b", "E"))
    return (row_mean(st["dtilde_b"], dim=-2).numpy(), row_mean(st["E"], dim=-2).numpy())


def pooled_critical_n(
    d_heads: np.ndarray, e_heads: np.ndarray, ns: Sequence[int], L: int, alpha: float = ALPHA
) -> dict:
    """Critical N of the heads pooled in d_heads / e_heads [..., len(ns)] (paper Alg. 3 on the grid ns):
    the first N whose per-head d~ and E samples a two-sample KS test does not reject (p > alpha).
    Returns critical_n (NaN if censored), critical_n_frac = N / L, censored, pvalue at that N, n_max."""
    nN = len(ns)
    n_heads = int(np.prod(np.shape(d_heads)[:-1]))
    if ks_min_pvalue(n_heads) > alpha:  # too few heads: the test can never reject
        return {
            "critical_n": float("nan"),
            "critical_n_frac": float("nan"),
            "critical_n_censored": False,
            "critical_n_pvalue": float("nan"),
            "critical_n_max": int(max(ns)),
            "n_pooled_heads": n_heads,
            "critical_n_testable": False,
        }
    n, ps, _ = ks_first_indistinguishable(np.reshape(d_heads, (-1, nN)), np.reshape(e_heads, (-1, nN)), list(ns), alpha)
    found = n > 0
    return {
        "critical_n": float(n) if found else float("nan"),
        "critical_n_frac": n / L if found else float("nan"),
        "critical_n_censored": not found,
        "critical_n_pvalue": ps[-1] if ps else float("nan"),
        "critical_n_max": int(max(ns)),
        "n_pooled_heads": n_heads,
        "critical_n_testable": True,
    }


def ks_min_pvalue(n: int) -> float:
    """Smallest p-value a two-sample KS test of two samples of n values can give (exact test: the
    samples fully separated, 2 / C(2n, n)). With n <= 4 heads it exceeds 0.01: no rejection possible."""
    return min(1.0, 2.0 / math.comb(2 * n, n)) if n > 0 else 1.0


def sample_view(probs: torch.Tensor, visible: torch.Tensor, rows: torch.Tensor):
    """probs[..., rows, :] and visible[rows] (the sampled query rows)."""
    return probs[..., rows, :], visible[rows]


def reference_weights(probs: torch.Tensor, visible: torch.Tensor, kind: str, eps: float = REF_EPS) -> torch.Tensor:
    """The two ends of each row's temperature path softmax(z / T), float64 [..., Q, K] like probs (0 on
    invisible keys; rows renormalized): "uniform" (T -> inf) = (1 - eps) / L_t + eps a, uniform weights
    ranked as the row ranks its keys (top-N stays the row's own); "sharp" (T -> 0) = one-hot on the
    row's top key (ties: the lower index)."""
    vis = visible.to(torch.bool)
    a = probs.double() * vis
    if kind == "uniform":
        u = vis.double() / vis.sum(-1, keepdim=True).clamp_min(1)
        return (1 - eps) * u + eps * a / a.sum(-1, keepdim=True).clamp_min(1e-300)
    if kind == "sharp":
        top = a.masked_fill(~vis, float("-inf")).argmax(-1, keepdim=True)
        return torch.zeros_like(a).scatter_(-1, top, 1.0) * vis
    raise ValueError(f"reference kind must be 'uniform' or 'sharp', got {kind!r}")


def ratio_at(d: np.ndarray, e: np.ndarray, ns: Sequence[int], n: int) -> torch.Tensor:
    """d~ / E at N = n from per-head arrays [..., len(ns)] -> [...] (NaN when n is not in ns)."""
    if n not in ns:
        return torch.full(np.shape(d)[:-1], float("nan"), dtype=torch.float64)
    i = list(ns).index(n)
    return torch.from_numpy(d[..., i] / e[..., i])


def mean_separability(probs: torch.Tensor, x: torch.Tensor, n: int, visible: torch.Tensor) -> torch.Tensor:
    """Row mean of N_s/N at N = n: probs [..., Q, K], x [..., K, D] -> [...] (NaN when n >= K)."""
    if n >= probs.shape[-1]:
        return torch.full(probs.shape[:-2], float("nan"), dtype=torch.float64)
    return torch.nanmean(separability(probs, x, n, visible), dim=-1)


def reference_stats(
    probs: torch.Tensor, x: torch.Tensor, visible: torch.Tensor, *, n_top: int, n_sep: int, ns: Sequence[int]
) -> dict:
    """The head statistics of both references (`reference_weights`) on the same rows and vectors:
    probs [..., Q, K] (the sampled rows), x [..., K, D] -> dict name -> [...] for name in
    entropy_norm_*, max_weight_*, ns_frac_*, dtilde_ratio_* (* = uniform, sharp), plus d_heads_uniform /
    e_heads_uniform [..., len(ns)] for the critical N of the uniform reference."""
    out = {}
    for kind in ("uniform", "sharp"):
        ref = reference_weights(probs, visible, kind)
        w = weight_stats(ref, visible)
        out[f"entropy_norm_{kind}"], out[f"max_weight_{kind}"] = w["entropy_norm"], w["max_weight"]
        out[f"ns_frac_{kind}"] = mean_separability(ref, x, n_sep, visible)
        grid = list(ns) if kind == "uniform" else [n_top]
        d, e = distance_heads(ref, x, visible, grid)
        out[f"dtilde_ratio_{kind}"] = ratio_at(d, e, grid, n_top)
        if kind == "uniform":
            out["d_heads_uniform"], out["e_heads_uniform"] = d, e
    return out


def head_stats(
    trace,
    *,
    n_top: int = N_TOP,
    n_sep: int = N_SEP,
    max_rows: Optional[int] = MAX_ROWS,
    ns: Optional[Sequence[int]] = None,
    jacobian: bool = True,
    references: bool = False,
) -> dict:
    """Every per-head quantity of one Trace (probs and v kept): dict name -> tensor [layer, head]
    (max_weight, entropy, entropy_norm, weight_sum, ns_frac, dtilde, dtilde_ratio, and jac_norm when
    `jacobian`, the exact softmax Jacobian at T = 1, meaningful for the native softmax only), plus
    "d_heads" / "e_heads" [layer, head, len(ns)] arrays for the critical-N tests and "ns" (the grid);
    with `references`, those of `reference_stats` on the same sampled rows."""
    if trace.probs is None or trace.v is None:
        raise ValueError("head_stats needs a trace with probs and v: capture(ids, keep=('probs', 'v'))")
    vis = trace.visible()
    out = weight_stats(trace.probs, vis)
    rows = row_sample(trace.probs.shape[-2], max_rows)
    ps, vs = sample_view(trace.probs, vis, rows)
    out["ns_frac"] = mean_separability(ps, trace.v, n_sep, vs)
    ns = list(ns) if ns is not None else critical_grid(trace.probs.shape[-1], n_top=n_top)
    d, e = distance_heads(ps, trace.v, vs, ns)
    out["dtilde"], out["dtilde_ratio"] = ratio_at(d, np.ones_like(d), ns, n_top), ratio_at(d, e, ns, n_top)
    out["d_heads"], out["e_heads"], out["ns"] = d, e, ns
    if jacobian:
        ok = vs.sum(-1) >= 2
        j = softmax_jacobian_norm(ps[..., ok, :], 1.0, vs[ok], method="secular")
        out["jac_norm"] = j.mean(-1)
    if references:
        out.update(reference_stats(ps, trace.v, vs, n_top=n_top, n_sep=n_sep, ns=ns))
    out["rows_sampled"] = int(len(rows))
    return out


def synthetic_trace(betas: Sequence[float], K: int = 64, D: int = 16, *, seed: int = 0, causal: bool = False):
    """A one-layer Trace (tests, the book) whose head h attends with softmax(betas[h] z), z ~ N(0, 1) per
    head [K, K]: beta -> 0 is near uniform (saturated), a large beta near one-hot; values v ~ N(0, I_D)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(1, len(betas), K, K, generator=g)
    vis = torch.tril(torch.ones(K, K, dtype=torch.bool)) if causal else torch.ones(K, K, dtype=torch.bool)
    probs = torch.softmax((torch.tensor(betas).view(1, -1, 1, 1) * z).masked_fill(~vis, float("-inf")), -1)
    v = torch.randn(1, len(betas), K, D, generator=g)
    return Trace("synthetic", torch.arange(K), [0], list(range(len(betas))), causal, 1.0, v=v, probs=probs)


# ------------------------------------------------------------------------------------------- flags


def saturation_score(x, uniform, unsaturated) -> np.ndarray:
    """(x - unsaturated) / (uniform - unsaturated), elementwise (numbers, arrays or tensors): 0 at the
    statistic's unsaturated end, 1 at its uniform reference, > 1 beyond it; NaN where the two ends
    coincide (|uniform - unsaturated| < 1e-9) or any input is NaN."""
    x, u, s = (np.asarray(v, dtype=float) for v in (x, uniform, unsaturated))
    span = u - s
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.abs(span) < 1e-9, np.nan, (x - s) / np.where(span == 0, 1.0, span))


def head_flags(entropy_norm, entropy_norm_uniform, entropy_norm_sharp, ns_frac, ns_frac_uniform,
               thr: Thresholds) -> dict[str, np.ndarray]:
    """The head rules of `thr`, elementwise over heads (numbers or arrays [...]): score_entropy,
    score_separability (floats), flag_near_uniform, flag_low_separability, flagged (bools; a NaN score
    never flags)."""
    s_h = saturation_score(entropy_norm, entropy_norm_uniform, entropy_norm_sharp)
    s_n = saturation_score(ns_frac, ns_frac_uniform, 1.0)
    uni = np.nan_to_num(s_h, nan=-np.inf) >= thr.entropy
    low = (np.nan_to_num(s_n, nan=-np.inf) >= thr.separability) & (np.nan_to_num(s_h, nan=-np.inf) >= thr.sharp_gate)
    return {"score_entropy": s_h, "score_separability": s_n, "flag_near_uniform": uni,
            "flag_low_separability": low, "flagged": uni | low}


def critical_flag(row: dict, thr: Thresholds) -> tuple[float, Optional[bool]]:
    """(score, flag) of a layer/model row (`pooled_critical_n` of the heads and of their uniform
    reference): score = `saturation_score` of N* with ends n_max (censored counts as n_max: score <= 0)
    and the reference's N*; flag None when either test is impossible or the reference is censored."""
    if not row.get("critical_n_testable", True) or not row.get("critical_n_uniform_testable", True):
        return float("nan"), None
    n_max = float(row["critical_n_max"])
    n = n_max if row["critical_n_censored"] else float(row["critical_n"])
    if row.get("critical_n_uniform_censored", True):
        return float("nan"), None
    score = float(saturation_score(n, float(row["critical_n_uniform"]), n_max)) + 0.0     # + 0.0: no "-0"
    return score, (None if math.isnan(score) else bool(score >= thr.critical))


def add_flags(rows: list[dict], thr: Thresholds) -> None:
    """Set the score and flag columns on every row (in place): heads score_entropy, score_separability,
    flag_near_uniform, flag_low_separability, flag_critical_n (that of their layer), flagged (either
    head flag); layer and model rows score_critical, flag_critical_n = flagged (None: not decidable)."""
    crit_layers = set()
    for r in rows:
        if r["kind"] in ("layer", "model"):
            r["score_critical"], r["flag_critical_n"] = critical_flag(r, thr)
            r["flagged"] = r["flag_critical_n"]
            if r["flag_critical_n"] and r["kind"] == "layer":
                crit_layers.add((r["L"], r["layer"]))
    for r in rows:
        if r["kind"] == "head":
            f = head_flags(*(r.get(k, float("nan")) for k in HEAD_FLAG_INPUTS), thr)
            r.update({k: float(v) if k.startswith("score") else bool(v) for k, v in f.items()})
            r["flag_critical_n"] = (r["L"], r["layer"]) in crit_layers



def critical_rows(st: dict, layer_index: Optional[int], ns: Sequence[int], L: int, alpha: float) -> dict:
    """Critical N of the heads of one layer (`layer_index`) or of all (None), of their uniform reference
    (keys critical_n_uniform*) and the paper's cut as a comparison (paper_critical_above, not a flag)."""
    pick = (lambda a: a) if layer_index is None else (lambda a: a[layer_index])
    out = pooled_critical_n(pick(st["d_heads"]), pick(st["e_heads"]), ns, L, alpha)
    ref = pooled_critical_n(pick(st["d_heads_uniform"]), pick(st["e_heads_uniform"]), ns, L, alpha)
    out.update({k.replace("critical_n", "critical_n_uniform"): ref[k] for k in CRIT_KEYS})
    above = bool(out["critical_n_censored"]) or out["critical_n_frac"] > PAPER["critical_frac"]
    out["paper_critical_above"] = above if out["critical_n_testable"] else None
    return out


WINDOW_NOTE = ("first L tokens of the text (encoders: [CLS] + L-2 tokens + [SEP]); causal models: one pass at the "
               "longest L, prefixes for the others")
X_NOTE = "per-head value vectors (unit sphere for N_s/N)"
KEYS_NOTE = "visible keys only; rows with L_t <= N skipped"
ENTROPY_NOTE = "Shannon entropy (nats) of each row's weights; entropy_norm = H / log L_t, rows with L_t >= 2"
JACOBIAN_NOTE = ("exact spectral norm of (diag(a) - a a^T)/T at T = 1 (the model's scaled scores), mean over the "
                 "sampled rows with >= 2 visible keys; references: uniform 1/L_t, one-hot 0 (not a flag)")
REFERENCES_NOTE = (
    "every statistic recomputed on the same sampled rows and value vectors with the weights replaced by "
    f"the ends of the row's temperature path: uniform (T -> inf: (1 - {REF_EPS:g}) / L_t + {REF_EPS:g} a, "
    "uniform weights ranked as the row ranks its keys) and sharp (T -> 0: one-hot on the row's top key); "
    "exact ends: entropy_norm 1 / 0, max_weight 1/L_t / 1, N_s/N at one-hot 1/N (strict <), d~/E at "
    "one-hot L_t/(N+1); critical_n_uniform: the KS scan on the uniform reference of the same heads")
CRITICAL_N_NOTE = (
    "KS two-sample test (alpha={alpha}) of per-head token-mean d~ (reading b) vs E; kind=model pools "
    "all heads (paper protocol), kind=layer the heads of one layer; N grid: every N up to "
    f"{CRIT_DENSE}, then steps of {{crit_step_frac:g}} L up to {{crit_max_frac:g}} L; reported N = first "
    "non-rejected grid N (an upper bound on the first N; exact when the step is 1); "
    "censored = none up to the grid's end")
PAPER_GUIDELINES_NOTE = (
    f"arXiv {paper.ARXIV} (GPT-2): N_s/N saturates at {PAPER['ns_band'][0]}-{PAPER['ns_band'][1]}, critical "
    f"N < {PAPER['critical_frac']} L, avoid T < {PAPER['min_T']}; shown as paper_ns_below_band (N_s/N < "
    f"{PAPER['ns_band'][0]}) and paper_critical_above (N*/L > {PAPER['critical_frac']} or censored), not flags")


def _length_rows(trace: Trace, L: int, st: dict, ns: Sequence[int], alpha: float, longest: int) -> list[dict]:
    """The rows of one length L: per head (``head_stats`` st, each ``[layer, head]``), per layer, the model (the
    trace's heads pooled); critical N / `longest` (the last row's visible keys: L, or min(L, w) in a sliding layer)."""
    rows = []
    for li, layer in enumerate(trace.layers):
        for hi, head in enumerate(trace.heads):
            r = {"kind": "head", "L": L, "layer": int(layer), "head": int(head),
                 **{k: float(st[k][li, hi]) for k in HEAD_KEYS}, "rows_sampled": st["rows_sampled"]}
            r["paper_ns_below_band"] = bool(r["ns_frac"] < PAPER["ns_band"][0])
            rows.append(r)
        rows.append({"kind": "layer", "L": L, "layer": int(layer), **critical_rows(st, li, ns, longest, alpha)})
    rows.append({"kind": "model", "L": L, **critical_rows(st, None, ns, longest, alpha)})
    return rows


def kind_rows(trace: Trace, L: int, *, n_top: int, n_sep: int, max_rows: Optional[int], alpha: float,
              crit_max_frac: float, crit_step_frac: float) -> list[dict]:
    """`_length_rows` of one length L, computed on each group of layers that see the same keys (`by_kind_groups`). A
    full-only model is one group: its rows as before. A model with sliding-window layers: each kind's statistics over
    the keys its rows see (`Trace.visible`), its critical N scanned over its own heads on the grid of its longest row
    (min(L, w), which critical_n_frac divides by), one "model" row per kind; every row carries `layer_kind` and
    `sliding_window` (the layer and model rows `longest_row`), the head and layer rows in layer order, the model rows
    last."""
    subs, rows = by_kind_groups(trace), []
    for sub in subs:
        longest = int(sub.visible()[L - 1].sum())              # L; min(L, w) in a sliding layer
        ns = critical_grid(longest, n_top=n_top, max_frac=crit_max_frac, step_frac=crit_step_frac)
        st = head_stats(sub, n_top=n_top, n_sep=n_sep, max_rows=max_rows, ns=ns, references=True)
        tag = kind_of(sub) if sub.kinds else {}
        rows += [dict(r, **tag, **({"longest_row": longest} if tag and r["kind"] != "head" else {}))
                 for r in _length_rows(sub, L, st, ns, alpha, longest)]
    return rows if len(subs) == 1 else sorted(rows, key=lambda r: (r["kind"] == "model", r.get("layer", 0)))


def _diagnose_provenance(model, tprov: dict, grid: list[int], thr: Thresholds, *, n_top: int, n_sep: int,
                         max_rows: Optional[int], alpha: float, crit_max_frac: float, crit_step_frac: float,
                         t0: float) -> dict:
    """The provenance of :func:`diagnose`'s Result (t0: its start, for the runtime)."""
    return provenance(
        experiment="diagnose",
        **model.provenance(),
        **tprov,
        lengths=grid,
        window=WINDOW_NOTE,
        n_top=n_top,
        n_sep=n_sep,
        max_rows=max_rows,
        alpha=alpha,
        thresholds=asdict(thr),
        flag_length=grid[-1],
        x=X_NOTE,
        keys=KEYS_NOTE,
        entropy=ENTROPY_NOTE,
        jacobian=JACOBIAN_NOTE,
        references=REFERENCES_NOTE,
        critical_n=CRITICAL_N_NOTE.format(alpha=alpha, crit_step_frac=crit_step_frac, crit_max_frac=crit_max_frac),
        flags=f"at every L (summary: L={grid[-1]}): " + "; ".join(f"{k}: {v}" for k, v in thr.rules().items()),
        flag_rules=thr.rules(),
        paper_guidelines=PAPER_GUIDELINES_NOTE,
        runtime_seconds=round(time.perf_counter() - t0, 3),
        torch_threads=torch.get_num_threads(),
    )


def check_options(*, n_top: int, n_sep: int, alpha: float, max_rows: Optional[int],
                  lengths: Optional[Sequence[int]] = None) -> None:
    """ValueError (one line) unless n_top, n_sep >= 1, 0 < alpha < 1 (NaN refused), max_rows None (all rows) or
    >= 1, and lengths None or a non-empty list of L >= 2: the checks `diagnose` and `attnlab diagnose` share, made
    before any model is loaded."""
    from attnlab.core.util import check_int

    check_int(n_top, "n_top (--n-top)", low=1)
    check_int(n_sep, "n_sep (--n-sep)", low=1)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha (--alpha) must be in (0, 1), got {alpha}")
    if max_rows is not None:
        check_int(max_rows, "max_rows (--max-rows; 0 on the command line: all rows)", low=1)
    if lengths is not None:
        if isinstance(lengths, (str, bytes)) or not list(lengths):
            raise ValueError(f"lengths (--lengths) must be a non-empty list of L >= 2, got {lengths!r}")
        for L in lengths:
            check_int(L, "every L of lengths (--lengths)", low=2)


def diagnose(
    model, text=None, *, lengths: Optional[Sequence[int]] = None, n_top: int = N_TOP, n_sep: int = N_SEP,
    thresholds: Optional[Thresholds] = None, max_rows: Optional[int] = MAX_ROWS, alpha: float = ALPHA,
    crit_max_frac: float = CRIT_MAX_FRAC, crit_step_frac: float = CRIT_STEP_FRAC, device: str = "cpu",
    tokenizer=None, text_info: Optional[dict] = None, progress: bool = True,
) -> Result:
    """Diagnose every head of `model` on `text` at each L in `lengths`: Result "diagnose" with rows

    kind="head"  (L, layer, head, HEAD_KEYS: the statistics and their uniform / sharp references,
                  paper_ns_below_band)
    kind="layer" (L, layer, critical_n, critical_n_frac, critical_n_censored, ..., critical_n_uniform*,
                  paper_critical_above)   heads of one layer
    kind="model" (L, the same)            all heads pooled
    and score / flag columns on every row (`add_flags`); the summary and the report's tables use the
    longest L.

    model: an AttnModel, a name for `load_model` or a transformers model (+ `tokenizer`); text: None
    (War and Peace), a Corpus, or a string (`text_info` adds provenance, e.g. from `read_text_file`).
    A model with sliding-window layers (Gemma 3): every statistic over the keys each row sees in its layer, the
    layer and model rows per layer kind (`kind_rows`: columns layer_kind, sliding_window; one "model" row per kind).
    Raises ValueError before any computation when the text is too short for a requested L, or the model
    does not use transformers' AttentionInterface, or a layer kind has no mask or a window <= the largest N
    (`check_windows`).
    """
    t0 = time.perf_counter()
    thr = (thresholds or Thresholds()).check()
    check_options(n_top=n_top, n_sep=n_sep, alpha=alpha, max_rows=max_rows, lengths=lengths)
    model = as_attn_model(model, device, tokenizer)
    text, tprov = resolve_text(text)
    tprov = {**tprov, **(text_info or {})}
    grid = check_lengths(model, text, lengths, min_length=max(n_top, n_sep))
    Lmax = grid[-1]
    # token windows first: a short text fails here, before any forward pass
    ids = {Lmax: text_window(model, text, Lmax)} if model.causal else {L: text_window(model, text, L) for L in grid}
    rows: list[dict] = []
    full = None
    for L in progress_bar(grid, progress, f"diagnose {model.name}"):
        if model.causal:
            if full is None:
                full = model.capture(ids[Lmax], keep=("probs", "v"), text_sha256=tprov.get("text_sha256"))
            trace = full if L == Lmax else full.prefix(L)
        else:
            trace = model.capture(ids[L], keep=("probs", "v"), text_sha256=tprov.get("text_sha256"))
        rows += kind_rows(trace, L, n_top=n_top, n_sep=n_sep, max_rows=max_rows, alpha=alpha,
                          crit_max_frac=crit_max_frac, crit_step_frac=crit_step_frac)
        del trace
    add_flags(rows, thr)
    prov = _diagnose_provenance(model, tprov, grid, thr, n_top=n_top, n_sep=n_sep, max_rows=max_rows, alpha=alpha,
                                crit_max_frac=crit_max_frac, crit_step_frac=crit_step_frac, t0=t0)
    return Result(REPORT_NAME, rows, prov)
