"""Attention diagnostics for any model: which heads are saturated, in the sense of arXiv 2508.17821.

    attnlab diagnose --model M [--text FILE] [--lengths 64 128 ...] [--out DIR]
    diagnose(model, text, lengths=...) -> Result;  write_report(result, DIR);  print(summary(result))

Per head and length L (one window of L tokens from the start of the text):

- ``entropy`` (nats) of each attention row, and ``entropy_norm`` = H / log L_t (L_t = the row's
  visible keys; 1 = uniform), means over the rows;
- ``max_weight``: the row's largest weight, mean over the rows;
- ``ns_frac`` = N_s / N (paper Eq. 10, ``metrics.separability``: value vectors on the unit sphere,
  r = distance of the nearest non-selected token), N = ``n_sep`` (16: the paper's Fig. 3 saturates
  from N ~ 16 on), mean over a sample of rows;
- ``dtilde``: representation distance d~ (reading b, ``metrics.distance_stats``) at N = ``n_top``;
- ``jac_norm``: exact spectral norm of the softmax Jacobian ``(diag(a) - a a^T) / T`` at the native
  temperature (T = 1 on the model's own scaled scores), mean over a sample of rows
  (``metrics.softmax_jacobian_norm``);

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

import base64
import hashlib
import html
import io
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab import metrics
from attnlab.result import Result, provenance

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024)   # powers of two up to the paper's 1024, capped by the model
N_TOP = 5             # d~ at N = 5, as in the paper's Fig. 2a
N_SEP = 16            # N_s/N at N = 16: the paper's Fig. 3 saturates from N ~ 16 on
MAX_ROWS = 64
CRIT_MAX_FRAC = 0.5
CRIT_STEP_FRAC = 0.01
CRIT_DENSE = 8
ALPHA = 0.01
REPORT_NAME = "diagnose"
HEAT_METRICS = (("entropy_norm", "entropy / log L"), ("max_weight", "max weight"),
                ("ns_frac", "N_s / N"), ("jac_norm", "Jacobian norm (T = 1)"))


@dataclass(frozen=True)
class Thresholds:
    """The paper's guidelines as flag thresholds (all options)."""

    ns_frac: float = 0.7          # head flagged when N_s/N < ns_frac   (paper: saturates at 0.70-0.85)
    entropy_norm: float = 0.9     # head flagged when H / log L >= entropy_norm   (near uniform)
    critical_frac: float = 0.06   # layer/model flagged when critical N / L > critical_frac   (paper: ~6%)

    def check(self) -> "Thresholds":
        if not 0 < self.ns_frac <= 1 or not 0 < self.entropy_norm <= 1 or not 0 < self.critical_frac < 1:
            raise ValueError(f"thresholds out of range: {self} (ns_frac, entropy_norm in (0, 1], "
                             "critical_frac in (0, 1))")
        return self


# ------------------------------------------------------------------------------------------ inputs

def text_provenance(text: str, name: str = "text", **extra) -> dict:
    """Provenance of a text given as a string: sha256 of its UTF-8 bytes, length."""
    return {"text": name, "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "text_chars": len(text), **extra}


def resolve_text(text=None) -> tuple[str, dict]:
    """(text, provenance) from None (War and Peace, via ATTNLAB_DATA_DIR or the cache), a
    `attnlab.text.Corpus`, or a string."""
    from attnlab.text import Corpus, load_corpus

    if text is None:
        text = load_corpus("war_and_peace")
    if isinstance(text, Corpus):
        return text.text, text.provenance()
    if isinstance(text, str):
        if not text.strip():
            raise ValueError("the text is empty: pass a text with at least as many tokens as the longest L")
        return text, text_provenance(text)
    raise ValueError(f"text must be None, a Corpus or a string, got {type(text).__name__}")


def read_text_file(path) -> tuple[str, dict]:
    """(text, provenance) of a UTF-8 text file (CRLF -> LF). FileNotFoundError / ValueError say what to do."""
    from attnlab.text import normalise_newlines

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"text file {str(path)!r} does not exist: pass --text with a readable UTF-8 text file")
    if p.is_dir():
        raise ValueError(f"text file {str(path)!r} is a directory: pass a UTF-8 text file")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read text file {str(path)!r} ({exc.strerror or exc}): check its permissions") from exc
    try:
        text = normalise_newlines(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"text file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                         "convert it to UTF-8") from exc
    if not text.strip():
        raise ValueError(f"text file {str(path)!r} is empty: pass a text with at least as many tokens as the longest L")
    return text, {"text": p.name, "text_sha256": hashlib.sha256(raw).hexdigest(), "text_source": f"file {p.name}",
                  "text_chars": len(text), "line_endings": "LF (CRLF normalised)"}


def as_attn_model(model, device: str = "cpu", tokenizer=None):
    """An `AttnModel` from an AttnModel, a name for `load_model`, or a Hugging Face model (+ tokenizer).
    A model whose attention does not go through transformers' AttentionInterface raises ValueError."""
    from attnlab.models import AttnModel, load_model

    if isinstance(model, AttnModel):
        return model
    if isinstance(model, str):
        return load_model(model, device)
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        if tokenizer is None:
            raise ValueError("a Hugging Face model needs its tokenizer: diagnose(model, text, tokenizer=...)")
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        return AttnModel(name, model, tokenizer, source=f"{type(model).__name__} object", device=device)
    raise ValueError(f"model must be an AttnModel, a model name or a transformers PreTrainedModel, "
                     f"got {type(model).__name__}")


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
        raise ValueError(f"the text is too short for L={L}: it has {n} tokens for {model.name}'s tokenizer "
                         f"(offset {offset}); pass a longer text or lengths <= {_max_length(model, n - offset)}") from None


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
            raise ValueError(f"L={grid[-1]} exceeds {model.name}'s {model.max_positions} positions; "
                             f"use lengths <= {model.max_positions}")
        return grid
    top = min(int(model.max_positions), max(DEFAULT_LENGTHS))
    n = _n_text_tokens(model, text[: 8 * top + 4096])
    top = min(top, _max_length(model, n))
    grid = [L for L in DEFAULT_LENGTHS if min_length < L <= top]
    if not grid:
        raise ValueError(f"the text is too short: {n} tokens for {model.name}'s tokenizer, the shortest default "
                         f"L is {DEFAULT_LENGTHS[0]}; pass a longer text or explicit lengths > {min_length}")
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


def critical_grid(L: int, *, n_top: int = N_TOP, max_frac: float = CRIT_MAX_FRAC, step_frac: float = CRIT_STEP_FRAC,
                  dense: int = CRIT_DENSE) -> list[int]:
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
    Lt = vis.sum(-1).double()                                       # [Q]
    total = (probs.double() * vis).sum(-1)                          # [..., Q]
    a = probs.double() / total.clamp_min(1e-300).unsqueeze(-1)
    H = metrics.entropy(a, vis)
    del a
    Hn = torch.where(Lt > 1, H / Lt.clamp_min(2).log(), torch.full_like(H, float("nan")))
    return {"max_weight": metrics.max_weight(probs, vis).mean(-1), "entropy": H.mean(-1),
            "entropy_norm": torch.nanmean(Hn, dim=-1), "weight_sum": total.mean(-1)}


def distance_heads(probs: torch.Tensor, x: torch.Tensor, visible: torch.Tensor,
                   ns: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-head token means of d~ (reading b) and E for each N: probs [..., Q, K], x [..., K, D]
    -> two arrays [..., len(ns)] (rows with L_t <= N skipped, `metrics.distance_stats`)."""
    st = metrics.distance_stats(probs, x, ns, visible, stats=("dtilde_b", "E"))
    return (metrics.row_mean(st["dtilde_b"], dim=-2).numpy(), metrics.row_mean(st["E"], dim=-2).numpy())


def pooled_critical_n(d_heads: np.ndarray, e_heads: np.ndarray, ns: Sequence[int], L: int,
                      alpha: float = ALPHA) -> dict:
    """Critical N of the heads pooled in d_heads / e_heads [..., len(ns)] (paper Alg. 3 on the grid ns):
    the first N whose per-head d~ and E samples a two-sample KS test does not reject (p > alpha).
    Returns critical_n (NaN if censored), critical_n_frac = N / L, censored, pvalue at that N, n_max."""
    nN = len(ns)
    n_heads = int(np.prod(np.shape(d_heads)[:-1]))
    if ks_min_pvalue(n_heads) > alpha:     # too few heads: the test can never reject
        return {"critical_n": float("nan"), "critical_n_frac": float("nan"), "critical_n_censored": False,
                "critical_n_pvalue": float("nan"), "critical_n_max": int(max(ns)), "n_pooled_heads": n_heads,
                "critical_n_testable": False}
    n, ps, _ = metrics.ks_first_indistinguishable(np.reshape(d_heads, (-1, nN)), np.reshape(e_heads, (-1, nN)),
                                                  list(ns), alpha)
    found = n > 0
    return {"critical_n": float(n) if found else float("nan"),
            "critical_n_frac": n / L if found else float("nan"),
            "critical_n_censored": not found, "critical_n_pvalue": ps[-1] if ps else float("nan"),
            "critical_n_max": int(max(ns)), "n_pooled_heads": n_heads, "critical_n_testable": True}


def ks_min_pvalue(n: int) -> float:
    """Smallest p-value a two-sample KS test of two samples of n values can give (exact test: the
    samples fully separated, 2 / C(2n, n)). With n <= 4 heads it exceeds 0.01: no rejection possible."""
    return min(1.0, 2.0 / math.comb(2 * n, n)) if n > 0 else 1.0


def sample_view(probs: torch.Tensor, visible: torch.Tensor, rows: torch.Tensor):
    """probs[..., rows, :] and visible[rows] (the sampled query rows)."""
    return probs[..., rows, :], visible[rows]


def head_stats(trace, *, n_top: int = N_TOP, n_sep: int = N_SEP, max_rows: Optional[int] = MAX_ROWS,
               ns: Optional[Sequence[int]] = None, jacobian: bool = True) -> dict:
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
    out["ns_frac"] = (torch.nanmean(metrics.separability(ps, trace.v, n_sep, vs), dim=-1) if n_sep < L
                      else torch.full(ps.shape[:-2], float("nan"), dtype=torch.float64))
    ns = list(ns) if ns is not None else critical_grid(L, n_top=n_top)
    d, e = distance_heads(ps, trace.v, vs, ns)
    out["dtilde"] = torch.from_numpy(d[..., ns.index(n_top)]) if n_top in ns else torch.full(ps.shape[:-2], float("nan"))
    out["d_heads"], out["e_heads"], out["ns"] = d, e, ns
    if jacobian:
        ok = vs.sum(-1) >= 2
        j = metrics.softmax_jacobian_norm(ps[..., ok, :], 1.0, vs[ok], method="secular")
        out["jac_norm"] = j.mean(-1)
    out["rows_sampled"] = int(len(rows))
    return out


# ------------------------------------------------------------------------------------ the diagnosis

def _tqdm(iterable, progress: bool, desc: str, total=None):
    if not progress:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False)


def diagnose(model, text=None, *, lengths: Optional[Sequence[int]] = None, n_top: int = N_TOP, n_sep: int = N_SEP,
             thresholds: Optional[Thresholds] = None, max_rows: Optional[int] = MAX_ROWS, alpha: float = ALPHA,
             crit_max_frac: float = CRIT_MAX_FRAC, crit_step_frac: float = CRIT_STEP_FRAC, device: str = "cpu",
             tokenizer=None, text_info: Optional[dict] = None, progress: bool = True) -> Result:
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
    for L in _tqdm(grid, progress, f"diagnose {model.name}"):
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
                rows.append({"kind": "head", "L": L, "layer": int(layer), "head": int(head),
                             **{k: float(st[k][li, hi]) for k in ("entropy", "entropy_norm", "max_weight",
                                                                   "weight_sum", "ns_frac", "dtilde", "jac_norm")},
                             "rows_sampled": st["rows_sampled"]})
            rows.append({"kind": "layer", "L": L, "layer": int(layer),
                         **pooled_critical_n(st["d_heads"][li], st["e_heads"][li], ns, L, alpha)})
        rows.append({"kind": "model", "L": L, **pooled_critical_n(st["d_heads"], st["e_heads"], ns, L, alpha)})
        del trace
    add_flags(rows, thr)
    prov = provenance(
        experiment="diagnose", **model.provenance(), **tprov, lengths=grid, window="first L tokens of the text "
        "(encoders: [CLS] + L-2 tokens + [SEP]); causal models: one pass at the longest L, prefixes for the others",
        n_top=n_top, n_sep=n_sep, max_rows=max_rows, alpha=alpha, thresholds=asdict(thr), flag_length=Lmax,
        x="per-head value vectors (unit sphere for N_s/N)", keys="visible keys only; rows with L_t <= N skipped",
        entropy="Shannon entropy (nats) of each row's weights; entropy_norm = H / log L_t, rows with L_t >= 2",
        jacobian="exact spectral norm of (diag(a) - a a^T)/T at T = 1 (the model's scaled scores), "
                 "mean over the sampled rows with >= 2 visible keys",
        critical_n=(f"KS two-sample test (alpha={alpha}) of per-head token-mean d~ (reading b) vs E; kind=model pools "
                    "all heads (paper protocol), kind=layer the heads of one layer; N grid: every N up to "
                    f"{CRIT_DENSE}, then steps of {crit_step_frac:g} L up to {crit_max_frac:g} L; reported N = first "
                    "non-rejected grid N (an upper bound on the first N; exact when the step is 1); "
                    "censored = none up to the grid's end"),
        flags=(f"at every L (summary: L={Lmax}): head low_separability if ns_frac < {thr.ns_frac}, near_uniform if entropy_norm >= "
               f"{thr.entropy_norm}; layer/model critical_n if critical N / L > {thr.critical_frac} or censored"),
        runtime_seconds=round(time.perf_counter() - t0, 3), torch_threads=torch.get_num_threads())
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


# ------------------------------------------------------------------------------------------- views

def _grid(result: Result, key: str, L: int) -> np.ndarray:
    """[layer, head] array of `key` over the head rows at L."""
    hr = result.select(kind="head", L=L)
    layers = sorted({r["layer"] for r in hr})
    heads = sorted({r["head"] for r in hr})
    out = np.full((len(layers), len(heads)), np.nan)
    for r in hr:
        v = r.get(key)
        out[layers.index(r["layer"]), heads.index(r["head"])] = np.nan if v is None else float(v)
    return out


def flag_length(result: Result) -> int:
    return int(result.provenance.get("flag_length") or max(r["L"] for r in result.rows))


def _truthy(v) -> bool:
    return v is True or v == 1 or v == "True"


def summary(result: Result) -> str:
    """A few lines for the terminal: model, text, how many heads are flagged and for what."""
    p = result.provenance
    L = flag_length(result)
    heads = result.select(kind="head", L=L)
    low = [r for r in heads if _truthy(r.get("flag_low_separability"))]
    uni = [r for r in heads if _truthy(r.get("flag_near_uniform"))]
    any_ = [r for r in heads if _truthy(r.get("flagged"))]
    thr = p.get("thresholds", {})
    model_row = (result.select(kind="model", L=L) or [{}])[0]
    layers = [r for r in result.select(kind="layer", L=L) if _truthy(r.get("flag_critical_n"))]
    testable = any(r.get("critical_n_testable") in (True, 1, "True") for r in result.select(kind="layer", L=L))

    def crit(r):
        if r.get("critical_n_testable") in (False, "False"):
            return "not testable (too few heads)"
        if _truthy(r.get("critical_n_censored")):
            return f"> {r.get('critical_n_max')} (no N up to {100 * r['critical_n_max'] / L:.0f}% of L passed)"
        return f"{int(r['critical_n'])} ({100 * r['critical_n_frac']:.1f}% of L)"

    def names(rs):
        s = ", ".join(f"{r['layer']}.{r['head']}" for r in rs[:12])
        return s + (", ..." if len(rs) > 12 else "")

    lines = [f"attnlab diagnose: {p.get('model')} ({p.get('n_layers')} layers x {p.get('n_heads')} heads, "
             f"{'causal' if p.get('causal') else 'bidirectional'}) on {p.get('text')} "
             f"(sha256 {str(p.get('text_sha256'))[:12]}...), L = {p.get('lengths')}",
             f"at L={L}: {len(any_)} of {len(heads)} heads flagged",
             f"  N_s/N < {thr.get('ns_frac')} (N={p.get('n_sep')}): {len(low)} heads" + (f" [{names(low)}]" if low else ""),
             f"  entropy >= {thr.get('entropy_norm')} log L: {len(uni)} heads" + (f" [{names(uni)}]" if uni else ""),
             f"  critical N / L > {thr.get('critical_frac')}: model-level critical N {crit(model_row) if model_row else '?'}; "
             + (f"{len(layers)} of {len(result.select(kind='layer', L=L))} layers flagged" if testable else
                "per-layer test impossible (too few heads per layer for the KS test at this alpha)")]
    return "\n".join(lines)


def _png_data_uri(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def heatmap_figure(result: Result, L: Optional[int] = None):
    """matplotlib Figure: layer x head heat maps of the HEAT_METRICS at L (default: the flag length);
    flagged heads are marked x."""
    from matplotlib.figure import Figure

    L = L or flag_length(result)
    low = _grid(result, "flag_low_separability", L)
    uni = _grid(result, "flag_near_uniform", L)
    n_layers, n_heads = low.shape
    fig = Figure(figsize=(3.2 * len(HEAT_METRICS), 0.9 + 0.28 * max(n_layers, 3)))
    axes = fig.subplots(1, len(HEAT_METRICS))
    for ax, (key, title) in zip(np.atleast_1d(axes), HEAT_METRICS):
        grid = _grid(result, key, L)
        im = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, fraction=0.05)
        ys, xs = np.nonzero(low == 1)
        ax.scatter(xs, ys, marker="x", color="red", s=18, linewidths=1)
        ys, xs = np.nonzero(uni == 1)
        ax.scatter(xs, ys, marker="o", facecolors="none", edgecolors="white", s=30, linewidths=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{result.provenance.get('model')}, L = {L}   (red x: N_s/N below threshold; "
                 "white o: entropy near log L)", fontsize=10)
    fig.tight_layout()
    return fig


def curves_figure(result: Result):
    """matplotlib Figure: entropy / log L and max weight of every head against L (one line per head,
    coloured by layer), with the entropy threshold."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    lengths = sorted({r["L"] for r in result.select(kind="head")})
    fig = Figure(figsize=(9, 3.2))
    axes = fig.subplots(1, 2)
    grids = {L: {k: _grid(result, k, L) for k in ("entropy_norm", "max_weight")} for L in lengths}
    n_layers, n_heads = grids[lengths[0]]["max_weight"].shape
    cmap = colormaps["viridis"]
    for ax, key, title in ((axes[0], "entropy_norm", "entropy / log L"), (axes[1], "max_weight", "max weight")):
        for li in range(n_layers):
            color = cmap(li / max(n_layers - 1, 1))
            for hi in range(n_heads):
                ax.plot(lengths, [grids[L][key][li, hi] for L in lengths], color=color, lw=0.8, alpha=0.6,
                        label=f"layer {li}" if hi == 0 else None)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("L")
        ax.set_title(title, fontsize=10)
    thr = result.provenance.get("thresholds", {}).get("entropy_norm")
    if thr is not None:
        axes[0].axhline(thr, color="red", ls="--", lw=1, label="flag threshold")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return html.escape(str(v))


def _table(rows: list[dict], cols: Sequence[str], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr" + (' class="flag"' if _truthy(r.get("flagged")) else "") + ">"
                   + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f3f3f3}tr.flag td{background:#fff0f0}.prov td{text-align:left}
img{max-width:100%}code{background:#f3f3f3;padding:0 3px}pre{background:#f7f7f7;padding:0.8em}"""


def report_html(result: Result) -> str:
    """A self-contained HTML page (no external files: PNGs as base64 data URIs) from a diagnose Result."""
    p = result.provenance
    L = flag_length(result)
    prov_keys = ["model", "model_source", "model_class", "model_weights_sha256", "causal", "n_layers", "n_heads",
                 "d_head", "max_positions", "device", "text", "text_source", "text_sha256", "text_chars", "lengths",
                 "window", "n_top", "n_sep", "max_rows", "alpha", "thresholds", "x", "keys", "entropy", "jacobian",
                 "critical_n", "flags", "attnlab", "torch", "transformers", "created_utc", "runtime_seconds"]
    prov_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(p.get(k)))}</td></tr>"
                        for k in prov_keys if k in p)
    heads = result.select(kind="head", L=L)
    flagged = [r for r in heads if _truthy(r.get("flagged"))]
    crit_rows = sorted(({"layer": "all", **r} for r in result.select(kind="model") + result.select(kind="layer")),
                       key=lambda r: (r["L"], -1 if r["layer"] == "all" else r["layer"]))
    head_cols = ["layer", "head", "entropy", "entropy_norm", "max_weight", "ns_frac", "dtilde", "jac_norm",
                 "flag_low_separability", "flag_near_uniform", "flag_critical_n"]
    crit_cols = ["L", "layer", "critical_n", "critical_n_frac", "critical_n_censored", "critical_n_pvalue",
                 "critical_n_max", "n_pooled_heads", "flag_critical_n"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>attnlab diagnose: {html.escape(str(p.get('model')))}</title><style>{_CSS}</style></head><body>",
        f"<h1>Attention diagnostics: {html.escape(str(p.get('model')))}</h1>",
        f"<table class='prov'>{prov_rows}</table>",
        f"<h2>Summary</h2><pre>{html.escape(summary(result))}</pre>",
        "<p>Guidelines from Mudarisov et al., <i>Limitations of Normalization in Attention Mechanism</i> "
        "(arXiv 2508.17821): separability N<sub>s</sub>/N saturates at 0.70&ndash;0.85; fewer than ~6% of the "
        "tokens can be selected before the distances look as if the weights were uniform (critical N); "
        "monitor entropy. Flags are heuristics for where a head has lost selectivity, not proofs.</p>",
        f"<h2>Heads at L = {L}</h2><img alt='heat maps' src='{_png_data_uri(heatmap_figure(result, L))}'>",
        f"<h2>Against L</h2><img alt='curves' src='{_png_data_uri(curves_figure(result))}'>",
        "<h2>Critical N (KS test pooling heads)</h2>", _table(crit_rows, crit_cols),
        f"<h2>Flagged heads at L = {L} ({len(flagged)})</h2>",
        _table(flagged, head_cols) if flagged else "<p>none</p>",
        f"<h2>All heads at L = {L}</h2>", _table(heads, head_cols),
        "<p>Every length is in the CSV (<code>diagnose.csv</code>); provenance in <code>diagnose.json</code>.</p>",
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(result: Result, out_dir) -> dict[str, Path]:
    """Write diagnose.html, diagnose.csv, diagnose.json into out_dir, all or nothing: everything is
    written into a temporary sibling directory first, then moved in place (a new out_dir is renamed
    in one step). On any error the temporary directory is removed."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out_dir)!r} exists and is not a directory: choose another path")
    parent = out.parent if str(out.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.tmp-"))
    try:
        result.save(tmp)
        (tmp / f"{REPORT_NAME}.html").write_text(report_html(result), encoding="utf-8")
        names = sorted(f.name for f in tmp.iterdir())
        umask = os.umask(0)
        os.umask(umask)
        if not out.exists():
            os.chmod(tmp, 0o777 & ~umask)
            os.rename(tmp, out)
        else:
            for name in names:
                os.replace(tmp / name, out / name)
            tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {Path(n).suffix.lstrip("."): out / n for n in names}


# --------------------------------------------------------------------------------------------- CLI

def add_cli(sub) -> None:
    from attnlab.cli import model_args

    p = sub.add_parser("diagnose", help="per-head saturation report (HTML, CSV, JSON) for any attention model",
                       description=__doc__.split("\n\n")[0])
    model_args(p)
    p.add_argument("--text", help="UTF-8 text file (default: War and Peace from ATTNLAB_DATA_DIR or the cache)")
    p.add_argument("--lengths", type=int, nargs="+", help=f"context lengths L (default {list(DEFAULT_LENGTHS)}, "
                                                          "those that fit the model and the text)")
    p.add_argument("--out", help="output directory (default: diagnose-<model>)")
    p.add_argument("--n-top", type=int, default=N_TOP, help="N of d~ (default %(default)s)")
    p.add_argument("--n-sep", type=int, default=N_SEP, help="N of N_s/N (default %(default)s)")
    p.add_argument("--max-rows", type=int, default=MAX_ROWS, help="query rows per head for the per-row metrics "
                                                                 "(default %(default)s; 0 = all)")
    p.add_argument("--alpha", type=float, default=ALPHA, help="KS level of the critical-N test (default %(default)s)")
    p.add_argument("--ns-threshold", type=float, default=Thresholds.ns_frac, help="flag N_s/N below (default %(default)s)")
    p.add_argument("--entropy-threshold", type=float, default=Thresholds.entropy_norm,
                   help="flag entropy >= this x log L (default %(default)s)")
    p.add_argument("--critical-threshold", type=float, default=Thresholds.critical_frac,
                   help="flag critical N / L above (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run_cli)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name.strip("/").split("/")[-1]) or "model"


def run_cli(args) -> int:
    from attnlab.models import load_model

    text, info = (read_text_file(args.text) if args.text else (None, None))
    thr = Thresholds(args.ns_threshold, args.entropy_threshold, args.critical_threshold).check()
    model = load_model(args.model, args.device)
    result = diagnose(model, text, lengths=args.lengths, n_top=args.n_top, n_sep=args.n_sep, thresholds=thr,
                      max_rows=args.max_rows or None, alpha=args.alpha, text_info=info, progress=not args.quiet)
    out = args.out or f"diagnose-{_safe_name(model.name)}"
    paths = write_report(result, out)
    print(summary(result))
    print("wrote " + ", ".join(str(paths[k]) for k in ("html", "csv", "json")))
    return 0


if __name__ == "__main__":  # pragma: no cover
    from attnlab.cli import main

    sys.exit(main(["diagnose", *sys.argv[1:]]))
