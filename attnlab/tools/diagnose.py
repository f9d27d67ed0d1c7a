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
- ``dtilde``: representation distance d~ (reading b, ``distance_stats``) at N = ``n_top``;
- ``jac_norm``: exact spectral norm of the softmax Jacobian ``(diag(a) - a a^T) / T`` at the native
  temperature (T = 1 on the model's own scaled scores), mean over a sample of rows
  (``softmax_jacobian_norm``);

and per layer and for the whole model: the critical top-N of the paper's KS test (Alg. 3). The KS
test compares per-head samples, so it pools heads: ``kind="model"`` rows pool every head of the
model (the paper's protocol, 144 GPT-2 heads), ``kind="layer"`` rows pool the heads of one layer
(a weaker test: 12 samples). N is scanned on a grid (every N up to 8, then steps of 1% of L, up to
50% of L): the reported N is the first grid N that is not rejected, an upper bound on the paper's
first N (equal when the step is 1, i.e. L <= 150); none up to the grid's end is "censored".

Flags, from the paper's guidelines (its Discussion), at every L (the summary reports the longest L,
where the limits bite): a head is flagged ``low_separability`` when N_s/N < 0.7, ``near_uniform`` when
H / log L >= 0.9; a layer (and the model) is flagged ``critical_n`` when its critical N / L > 0.06
(censored counts as above). Thresholds are options (``Thresholds``).

Expensive per-row metrics (N_s/N, d~, critical N, Jacobian) use ``max_rows`` evenly spaced query
rows per head (all rows when L <= max_rows); entropy and max weight use every row. The choices are
recorded in the Result's provenance.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.models import as_attn_model
from attnlab.core.result import Result, provenance
from attnlab.core.text import resolve_text
from attnlab.core.util import progress as progress_bar
from attnlab.normalization import paper
from attnlab.normalization.critical_n import ks_first_indistinguishable
from attnlab.normalization.distance import distance_stats
from attnlab.normalization.engine import row_mean
from attnlab.normalization.gradients import softmax_jacobian_norm
from attnlab.normalization.rows import entropy, max_weight
from attnlab.normalization.separability import separability

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024)   # powers of two up to the paper's 1024, capped by the model
N_TOP = paper.FIG2A_N          # d~ at N = 5, as in the paper's Fig. 2a
N_SEP = paper.SATURATION_N     # N_s/N at N = 16: the paper's Fig. 3 saturates from N ~ 16 on
MAX_ROWS = 64
CRIT_MAX_FRAC = 0.5
CRIT_STEP_FRAC = 0.01
CRIT_DENSE = 8
ALPHA = paper.KS_ALPHA
REPORT_NAME = "diagnose"
HEAT_METRICS = (("entropy_norm", "entropy / log L"), ("max_weight", "max weight"),
                ("ns_frac", "N_s / N"), ("jac_norm", "Jacobian norm (T = 1)"))


@dataclass(frozen=True)
class Thresholds:
    """The paper's guidelines as flag thresholds (all options)."""

    ns_frac: float = paper.SEPARABILITY_BAND[0]  # head flagged when N_s/N < ns_frac   (paper: saturates at 0.70-0.85)
    entropy_norm: float = 0.9  # head flagged when H / log L >= entropy_norm   (near uniform)
    critical_frac: float = paper.CRITICAL_FRAC  # layer/model flagged when critical N / L > critical_frac   (paper: ~6%)

    def check(self) -> "Thresholds":
        if not 0 < self.ns_frac <= 1 or not 0 < self.entropy_norm <= 1 or not 0 < self.critical_frac < 1:
            raise ValueError(
                f"thresholds out of range: {self} (ns_frac, entropy_norm in (0, 1], critical_frac in (0, 1))"
            )
        return self


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
    without `lengths`, DEFAULT_LENGTHS that fit the model and the text (ValueError if none does)."""
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


def weight_stats(probs: torch.Tensor, visible: torch.Tensor) -> dict[str, torch.Tensor]:
    """Means over the query rows of probs [..., Q, K] (visible bool [Q, K]) -> each [...] float64:
    max_weight; entropy (nats) and entropy_norm = H / log L_t (rows with L_t >= 2) of the row's weights
    renormalised to sum 1 (a no-op except for normalizers whose weights do not sum to 1, e.g.
    SA-Softmax); weight_sum = the row's total weight."""
    vis = visible.to(torch.bool)
    Lt = vis.sum(-1).double()  # [Q]
    total = (probs.double() * vis).sum(-1)  # [..., Q]
    a = probs.double() / total.clamp_min(1e-300).unsqueeze(-1)
    H = entropy(a, vis)
    del a
    Hn = torch.where(Lt > 1, H / Lt.clamp_min(2).log(), torch.full_like(H, float("nan")))
    return {
        "max_weight": max_weight(probs, vis).mean(-1),
        "entropy": H.mean(-1),
        "entropy_norm": torch.nanmean(Hn, dim=-1),
        "weight_sum": total.mean(-1),
    }


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


def head_stats(
    trace,
    *,
    n_top: int = N_TOP,
    n_sep: int = N_SEP,
    max_rows: Optional[int] = MAX_ROWS,
    ns: Optional[Sequence[int]] = None,
    jacobian: bool = True,
) -> dict:
    """Every per-head quantity of one Trace (probs and v kept): dict name -> tensor [layer, head]
    (max_weight, entropy, entropy_norm, weight_sum, ns_frac, dtilde, and jac_norm when `jacobian`, the
    exact softmax Jacobian at T = 1, meaningful for the native softmax only), plus "d_heads" /
    "e_heads" [layer, head, len(ns)] arrays for the critical-N tests and "ns" (the grid)."""
    if trace.probs is None or trace.v is None:
        raise ValueError("head_stats needs a trace with probs and v: capture(ids, keep=('probs', 'v'))")
    L = trace.probs.shape[-1]
    vis = trace.visible()
    out = weight_stats(trace.probs, vis)
    rows = row_sample(trace.probs.shape[-2], max_rows)
    ps, vs = sample_view(trace.probs, vis, rows)
    out["ns_frac"] = (
        torch.nanmean(separability(ps, trace.v, n_sep, vs), dim=-1)
        if n_sep < L
        else torch.full(ps.shape[:-2], float("nan"), dtype=torch.float64)
    )
    ns = list(ns) if ns is not None else critical_grid(L, n_top=n_top)
    d, e = distance_heads(ps, trace.v, vs, ns)
    out["dtilde"] = (
        torch.from_numpy(d[..., ns.index(n_top)]) if n_top in ns else torch.full(ps.shape[:-2], float("nan"))
    )
    out["d_heads"], out["e_heads"], out["ns"] = d, e, ns
    if jacobian:
        ok = vs.sum(-1) >= 2
        j = softmax_jacobian_norm(ps[..., ok, :], 1.0, vs[ok], method="secular")
        out["jac_norm"] = j.mean(-1)
    out["rows_sampled"] = int(len(rows))
    return out


def diagnose(
    model,
    text=None,
    *,
    lengths: Optional[Sequence[int]] = None,
    n_top: int = N_TOP,
    n_sep: int = N_SEP,
    thresholds: Optional[Thresholds] = None,
    max_rows: Optional[int] = MAX_ROWS,
    alpha: float = ALPHA,
    crit_max_frac: float = CRIT_MAX_FRAC,
    crit_step_frac: float = CRIT_STEP_FRAC,
    device: str = "cpu",
    tokenizer=None,
    text_info: Optional[dict] = None,
    progress: bool = True,
) -> Result:
    """Diagnose every head of `model` on `text` at each L in `lengths`: Result "diagnose" with rows

    kind="head"  (L, layer, head, entropy, entropy_norm, max_weight, weight_sum, ns_frac, dtilde, jac_norm)
    kind="layer" (L, layer, critical_n, critical_n_frac, critical_n_censored, ...)   heads of one layer
    kind="model" (L, critical_n, ...)                                                 all heads pooled
    and flag columns (flag_low_separability, flag_near_uniform, flag_critical_n, flagged) on every row
    (`add_flags`); the summary and the report's tables use the longest L.

    model: an AttnModel, a name for `load_model` or a transformers model (+ `tokenizer`); text: None
    (War and Peace), a Corpus, or a string (`text_info` adds provenance, e.g. from `read_text_file`).
    Raises ValueError before any computation when the text is too short for a requested L, or the model
    does not use transformers' AttentionInterface.
    """
    t0 = time.perf_counter()
    thr = (thresholds or Thresholds()).check()
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_top < 1 or n_sep < 1:
        raise ValueError(f"n_top and n_sep must be >= 1, got {n_top}, {n_sep}")
    model = as_attn_model(model, device, tokenizer)
    text, tprov = resolve_text(text)
    tprov = {**tprov, **(text_info or {})}
    grid = check_lengths(model, text, lengths, min_length=max(n_top, n_sep))
    Lmax = grid[-1]
    # token windows first: a short text fails here, before any forward pass
    if model.causal:
        ids = {Lmax: text_window(model, text, Lmax)}
    else:
        ids = {L: text_window(model, text, L) for L in grid}
    rows: list[dict] = []
    full = None
    for L in progress_bar(grid, progress, f"diagnose {model.name}"):
        if model.causal:
            if full is None:
                full = model.capture(ids[Lmax], keep=("probs", "v"), text_sha256=tprov.get("text_sha256"))
            trace = full if L == Lmax else full.prefix(L)
        else:
            trace = model.capture(ids[L], keep=("probs", "v"), text_sha256=tprov.get("text_sha256"))
        ns = critical_grid(L, n_top=n_top, max_frac=crit_max_frac, step_frac=crit_step_frac)
        st = head_stats(trace, n_top=n_top, n_sep=n_sep, max_rows=max_rows, ns=ns)
        for li, layer in enumerate(trace.layers):
            for hi, head in enumerate(trace.heads):
                rows.append(
                    {
                        "kind": "head",
                        "L": L,
                        "layer": int(layer),
                        "head": int(head),
                        **{
                            k: float(st[k][li, hi])
                            for k in (
                                "entropy",
                                "entropy_norm",
                                "max_weight",
                                "weight_sum",
                                "ns_frac",
                                "dtilde",
                                "jac_norm",
                            )
                        },
                        "rows_sampled": st["rows_sampled"],
                    }
                )
            rows.append(
                {
                    "kind": "layer",
                    "L": L,
                    "layer": int(layer),
                    **pooled_critical_n(st["d_heads"][li], st["e_heads"][li], ns, L, alpha),
                }
            )
        rows.append({"kind": "model", "L": L, **pooled_critical_n(st["d_heads"], st["e_heads"], ns, L, alpha)})
        del trace
    add_flags(rows, thr)
    prov = provenance(
        experiment="diagnose",
        **model.provenance(),
        **tprov,
        lengths=grid,
        window="first L tokens of the text "
        "(encoders: [CLS] + L-2 tokens + [SEP]); causal models: one pass at the longest L, prefixes for the others",
        n_top=n_top,
        n_sep=n_sep,
        max_rows=max_rows,
        alpha=alpha,
        thresholds=asdict(thr),
        flag_length=Lmax,
        x="per-head value vectors (unit sphere for N_s/N)",
        keys="visible keys only; rows with L_t <= N skipped",
        entropy="Shannon entropy (nats) of each row's weights; entropy_norm = H / log L_t, rows with L_t >= 2",
        jacobian="exact spectral norm of (diag(a) - a a^T)/T at T = 1 (the model's scaled scores), "
        "mean over the sampled rows with >= 2 visible keys",
        critical_n=(
            f"KS two-sample test (alpha={alpha}) of per-head token-mean d~ (reading b) vs E; kind=model pools "
            "all heads (paper protocol), kind=layer the heads of one layer; N grid: every N up to "
            f"{CRIT_DENSE}, then steps of {crit_step_frac:g} L up to {crit_max_frac:g} L; reported N = first "
            "non-rejected grid N (an upper bound on the first N; exact when the step is 1); "
            "censored = none up to the grid's end"
        ),
        flags=(
            f"at every L (summary: L={Lmax}): head low_separability if ns_frac < {thr.ns_frac}, "
            f"near_uniform if entropy_norm >= "
            f"{thr.entropy_norm}; layer/model critical_n if critical N / L > {thr.critical_frac} or censored"
        ),
        runtime_seconds=round(time.perf_counter() - t0, 3),
        torch_threads=torch.get_num_threads(),
    )
    return Result(REPORT_NAME, rows, prov)


def add_flags(rows: list[dict], thr: Thresholds) -> None:
    """Set the flag columns on every row (in place): heads flag_low_separability, flag_near_uniform,
    flag_critical_n (that of their layer), flagged (either of the first two); layer and model rows
    flag_critical_n (None when too few heads for the KS test). The summary reads the longest L."""
    crit_layers = set()
    for r in rows:
        if r["kind"] in ("layer", "model"):
            flag = None
            if r.get("critical_n_testable", True):
                flag = bool(r["critical_n_censored"]) or r["critical_n_frac"] > thr.critical_frac
            r["flag_critical_n"] = r["flagged"] = flag
            if flag and r["kind"] == "layer":
                crit_layers.add((r["L"], r["layer"]))
    for r in rows:
        if r["kind"] != "head":
            continue
        low = not math.isnan(r["ns_frac"]) and r["ns_frac"] < thr.ns_frac
        uni = not math.isnan(r["entropy_norm"]) and r["entropy_norm"] >= thr.entropy_norm
        r["flag_low_separability"], r["flag_near_uniform"] = low, uni
        r["flag_critical_n"] = (r["L"], r["layer"]) in crit_layers
        r["flagged"] = low or uni
