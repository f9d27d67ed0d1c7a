"""Attention sinks: how much weight a head puts on the first token and on repeated tokens, and the paper's
headline claims recomputed without the heads that sink.

A *sink* (Xiao et al. 2023, StreamingLLM; Gu et al. 2024) is a token that absorbs attention regardless of its
content: in causal language models the first token of the sequence; in BERT-like encoders the special tokens.
Definitions used here (stated once, read everywhere):

- **first token**: key position 0 of the window. For a causal model (SmolLM2, no BOS token in its windows) the
  first word piece of the text; for an encoder (MiniLM, `core.text.WINDOW_RULE`: [CLS] + L - 2 + [SEP]) the
  [CLS] token. An encoder's last key, [SEP], is reported apart (`sep`).
- **repeated token**: key position j > 0 whose token id occurs at some earlier position i < j of the window
  (the first occurrence of an id is not repeated; the first token never is). It is a property of the key, the
  same for every query row.
- **share** of a row: the sum of its weights on those keys (a row sums to 1); a head's share is the mean over
  its query rows that see at least 2 keys (a causal row 0 sees only the first token and is left out).
- **uniform baseline**: the share a row would give those keys with uniform weights over its visible keys
  (1/n for the first token), averaged over the same rows.
- **sink head** (`SINK_RULE`): a head whose mean weight on the first token is >= 0.5 at that L.

`sink_shares(model, ids, lengths) -> Result "sink_shares"`: one row per (L, layer, head).
`sink_claims(model, ids, lengths, fig3=...) -> Result "sink_claims"`: the critical N (Fig. 2c's KS test),
Fig. 3's separability band and Fig. 4's 1/T slope, for all heads, without the sink heads, and for the sink
heads alone; Fig. 3 from the per-head rows of the fig3 Result given (no recomputation).
"""
from __future__ import annotations

import contextlib
import time
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.core.text import WINDOW_RULE
from attnlab.core.util import with_threads
from attnlab.normalization import claims as paper_claims
from attnlab.normalization.experiments import (
    Captures,
    by_kind_groups,
    head_rows,
    kind_of,
    length_grid,
    temperature_grid,
)
from attnlab.normalization.metrics.critical_n import critical_n, fewest_heads
from attnlab.normalization.metrics.engine import row_mean
from attnlab.normalization.metrics.gradients import fd_grad_norms
from attnlab.normalization.paper import EPSILONS, KS_ALPHA, SATURATION_N

SINK_RULE = 0.5           # a sink head: mean weight on the first token >= this
SUBSETS = ("all heads", "without sink heads", "sink heads only")
BOOK_WINDOW = "W&P #1"     # the book's text window of the sink Results: the first tokens of War and Peace
CLAIM_MAX_LENGTH = 512     # the book's sink claims at the window set's lengths (`windows.BOOK_LENGTHS`)


def window_text(corpus) -> dict:
    """The text provenance of the book's sink Results: the corpus's, with BOOK_WINDOW."""
    return dict(corpus.provenance(), window=BOOK_WINDOW)
DEFINITIONS = {
    "first": "weight on key position 0 (causal: the text's first token; encoder: [CLS])",
    "repeated": "weight on keys j > 0 whose token id occurs at an earlier position of the window",
    "sep": "encoder only: weight on the last key ([SEP]); None for causal models",
    "head mean": "mean over the query rows that see >= 2 keys",
    "uniform": "the same share under uniform weights over each row's visible keys, same rows",
    "sink head": f"mean weight on the first token >= {SINK_RULE} at that L",
}


# ------------------------------------------------------------------------------------ pure functions

def repeated_keys(ids: torch.Tensor) -> torch.Tensor:
    """bool [K]: key j is repeated when ids[j] == ids[i] for some i < j (ids [K], token ids of the window)."""
    ids = torch.as_tensor(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be one window of token ids [K], got shape {tuple(ids.shape)}")
    eq = ids[:, None] == ids[None, :]                               # [j, i]
    return torch.tril(eq, diagonal=-1).any(dim=1)


def row_shares(probs: torch.Tensor, ids: torch.Tensor, visible: torch.Tensor, *, sep: bool = False
               ) -> dict[str, torch.Tensor]:
    """Per-row sink shares of probs [..., Q, K] (weights, 0 on masked keys), ids [K], visible bool [Q, K]:
    {"first", "repeated"[, "sep"]} each [..., Q], and their uniform baselines "first_uniform",
    "repeated_uniform" [Q]. sep=True adds the weight on the last key (an encoder's [SEP])."""
    K = probs.shape[-1]
    if ids.shape[-1] != K or visible.shape[-1] != K:
        raise ValueError(f"ids [{ids.shape[-1]}] and visible [.., {visible.shape[-1]}] must match probs' {K} keys")
    rep = repeated_keys(ids)
    p = probs.double()
    n = visible.sum(-1).double().clamp_min(1)                        # [Q] visible keys per row
    out = {"first": p[..., 0], "repeated": (p * rep).sum(-1),
           "first_uniform": visible[:, 0].double() / n, "repeated_uniform": (visible & rep).sum(-1).double() / n}
    if sep:
        out["sep"] = p[..., -1]
    return out


def head_shares(probs: torch.Tensor, ids: torch.Tensor, visible: torch.Tensor, *, sep: bool = False
                ) -> dict[str, torch.Tensor]:
    """`row_shares` averaged over the rows that see >= 2 keys: each [...] (baselines: 0-d tensors); the first
    token's share and its baseline over those of them that see it (a sliding-window layer's rows t < w; every row
    of a full layer)."""
    rows = visible.sum(-1) >= 2                                      # [Q]
    if not bool(rows.any()):
        raise ValueError("no query row sees 2 or more keys: the window is too short")
    first = rows & visible[:, 0]
    return {k: v[..., first if k.startswith("first") else rows].mean(-1)
            for k, v in row_shares(probs, ids, visible, sep=sep).items()}


def sink_heads(first: torch.Tensor, threshold: float = SINK_RULE) -> torch.Tensor:
    """bool [...]: heads whose mean weight on the first token (`head_shares`' "first" [...]) is >= threshold."""
    return torch.as_tensor(first) >= threshold


def subset_masks(sink: torch.Tensor) -> dict[str, torch.Tensor]:
    """{subset: bool [layer, head]} for `SUBSETS`, from the sink-head mask sink [layer, head]."""
    return {"all heads": torch.ones_like(sink), "without sink heads": ~sink, "sink heads only": sink}


def fig4_slope(Ts: Sequence[float], g: np.ndarray) -> tuple[float, float, int]:
    """The log-log slope of g [T] against T over T < 0.1 (Fig. 4's "1/T" claim, `claims.linear_fit`):
    (slope, R^2, number of temperatures); NaN where fewer than 2 temperatures have g > 0."""
    T, g = np.asarray(Ts, float), np.asarray(g, float)
    small = (T < paper_claims.ONE_OVER_T_BELOW) & (g > 0)
    if small.sum() < 2:
        return float("nan"), float("nan"), int(small.sum())
    slope, _, r2 = paper_claims.linear_fit(np.log10(T[small]), np.log10(g[small]))
    return slope, r2, int(small.sum())


def band_medians(fig3: Result, keep: set[tuple[int, int]]) -> dict[int, float]:
    """{N: median over the heads (layer, head) in `keep` of the token-mean N_s/N} for N >= 16, from a fig3
    Result's per-head rows (window 0): Fig. 3's saturation claim on a subset of heads."""
    out = {}
    for n in sorted(fig3.unique("N")):
        if n >= SATURATION_N:
            vals = [r["ns_frac"] for r in fig3.select(N=n) if r.get("window", 0) == 0
                    and (r["layer"], r["head"]) in keep]
            out[int(n)] = float(np.nanmedian(vals)) if vals else float("nan")
    return out


# ------------------------------------------------------------------------------------ computations

def _lengths(model, ids: torch.Tensor, lengths: Optional[Sequence[int]]) -> list[int]:
    return length_grid(model, len(ids), lengths=lengths or [L for L in (64, 128, 256, 512, 1024) if L <= len(ids)])


def _prov(name: str, model, ids, caps: Captures, text: Optional[dict], t0: float, **extra) -> dict:
    return provenance(experiment=name, model=model.name, causal=bool(model.causal),
                      model_info=(model.provenance() if hasattr(model, "provenance") else None),
                      text=(text or {}).get("text", (text or {}).get("name")), text_meta=text or {},
                      window_tokens=len(ids), window_rule=WINDOW_RULE, definitions=DEFINITIONS,
                      n_passes=caps.n_passes, capture_seconds=round(caps.seconds, 3),
                      runtime_seconds=round(time.perf_counter() - t0, 3), torch_threads=torch.get_num_threads(),
                      **extra)


@with_threads
def sink_shares(model, ids, *, lengths: Optional[Sequence[int]] = None, normalizer: Optional[str] = None,
                text: Optional[dict] = None, threads: Optional[int] = None) -> Result:
    """Result "sink_shares": one row per (L, layer, head) of the window ids [L_max] (its first L tokens; an
    encoder: `WINDOW_RULE`): normalizer, first, repeated, sep (encoders), their uniform baselines, sink (bool),
    n_repeated (repeated keys among the L), L. Causal models: one pass at the longest L (rows of a prefix are
    exact). normalizer: a `tools.normalizers` name swapped into every layer (None: the model's softmax); the
    shares are then the swapped weights as they are (softpick and sigmoid rows need not sum to 1). A model with
    sliding-window layers: each kind over its own keys (`head_shares`: the first token where it is seen), rows
    carrying `layer_kind` and `sliding_window`."""
    from attnlab.tools.normalizers import get_normalizer

    t0 = time.perf_counter()
    ids = torch.as_tensor(ids).long()
    grid = _lengths(model, ids, lengths)
    caps = Captures(model, ids, {"probs"})
    swap = model.normalizer(get_normalizer(normalizer)) if normalizer else contextlib.nullcontext()
    rows = []
    with swap:
        traces = [caps.get(L) for L in grid]
    for L, trace in zip(grid, traces):
        for tr in by_kind_groups(trace):                      # (a full-only model: the trace itself)
            st = head_shares(tr.probs, tr.token_ids, tr.visible(), sep=not model.causal)
            base = {k: float(st.pop(k)) for k in ("first_uniform", "repeated_uniform")}
            st["sink"] = sink_heads(st["first"]).double()
            for r in head_rows(tr, st, L=L, normalizer=normalizer or "softmax",
                               n_repeated=int(repeated_keys(tr.token_ids).sum()), **base):
                r["sink"] = bool(r["sink"])
                r.setdefault("sep", None)
                rows.append(r)
    return Result("sink_shares", rows, _prov("sink_shares", model, ids, caps, text, t0, lengths=grid,
                                             sink_rule=SINK_RULE))


def _masked(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """t [layer, head, ...] -> [n, ...]: the heads where mask [layer, head] is True."""
    return t[mask]


@with_threads
def sink_claims(model, ids, *, fig3: Optional[Result] = None, lengths: Optional[Sequence[int]] = None,
                temperatures: Optional[Sequence[float]] = None, seed: int = 0, text: Optional[dict] = None,
                threads: Optional[int] = None) -> Result:
    """Result "sink_claims": the headline claims per head subset (`SUBSETS`; sink heads by `SINK_RULE` at each
    L) on the window ids [L_max]. Rows: subset, quantity, L, value, n_heads, detail, where quantity is
    - "critical_frac": Fig. 2c's critical N / L (KS, alpha 0.01, d~ reading b, value vectors, visible keys,
      `metrics.critical_n` on the subset's heads); NaN when no N is accepted or the subset has too few heads for
      the test to reject at all (`fewest_heads`: 5 at alpha 0.01; with fewer, N = 1 is accepted whatever the heads);
    - "fig3_median_lo" / "fig3_median_hi" (at the longest L): the smallest / largest over N >= 16 of the
      median N_s/N over the subset's heads, from `fig3`'s per-head rows (the fig3 Result of this window at
      this L; left out when None);
    - "fig4_slope" (at the longest L): the log-log slope over T < 0.1 of the max over the subset's heads of
      the token-mean g(T, eps = 1e-3) (`metrics.fd_grad_norms`, seed as Fig. 4's).
    A model with sliding-window layers: every claim per layer kind (`Trace.kind_groups`: its heads, its keys; sink
    heads by the first token's share where it is seen), rows carrying `layer_kind`, `sliding_window` and
    `longest_row` (min(L, w), which critical_frac divides by; the KS scan stops below it).
    """
    t0 = time.perf_counter()
    ids = torch.as_tensor(ids).long()
    grid = _lengths(model, ids, lengths)
    Ts = list(temperatures or temperature_grid())
    caps = Captures(model, ids, {"probs", "v", "scores"})
    rows = []
    for L in grid:
        subs = by_kind_groups(caps.get(L))
        for tr in subs:
            vis = tr.visible()
            longest = L if len(subs) == 1 else int(vis[L - 1].sum())            # min(L, w) in a sliding layer
            more = {} if longest == L else {"n_max": longest - 1}
            out: list[dict] = []
            sink = sink_heads(head_shares(tr.probs, tr.token_ids, vis)["first"])
            masks = subset_masks(sink)
            done: dict[bytes, float] = {}    # a subset equal to one scanned before (no sink heads) is not scanned again
            for name, m in masks.items():
                n = int(m.sum())
                key = m.numpy().tobytes()
                if key not in done:
                    done[key] = float("nan")
                    if n >= fewest_heads(KS_ALPHA):
                        crit = int(critical_n(_masked(tr.probs, m), _masked(tr.v, m), vis, alpha=KS_ALPHA,
                                              **more)["n"])
                        done[key] = crit / longest if crit > 0 else float("nan")
                out.append({"subset": name, "quantity": "critical_frac", "L": L, "value": done[key], "n_heads": n,
                             "detail": "critical N / L" if longest == L else "critical N / min(L, w)"})
            if L == grid[-1]:                        # Fig. 3's medians and Fig. 4's slope: the longest L
                if fig3 is not None:
                    for name, m in masks.items():
                        keep = {(int(tr.layers[a]), int(tr.heads[b])) for a, b in m.nonzero().tolist()}
                        med = band_medians(fig3, keep)
                        vals = [v for v in med.values() if np.isfinite(v)]
                        for q, v in (("fig3_median_lo", min(vals, default=float("nan"))),
                                     ("fig3_median_hi", max(vals, default=float("nan")))):
                            detail = f"median N_s/N over heads, N = {min(med)}..{max(med)}" if med else ""
                            out.append({"subset": name, "quantity": q, "L": L, "value": v, "n_heads": int(m.sum()),
                                        "detail": detail})
                g = row_mean(fd_grad_norms(tr.scores, Ts, [EPSILONS[0]], vis, seed=seed), dim=-3)[..., 0]   # [l,h,T]
                for name, m in masks.items():
                    gmax = _masked(g, m).amax(0).numpy() if bool(m.any()) else np.full(len(Ts), np.nan)
                    slope, _, k = fig4_slope(Ts, gmax)
                    out.append({"subset": name, "quantity": "fig4_slope", "L": L, "value": slope,
                                "n_heads": int(m.sum()), "detail": f"max over heads of the token-mean g, {k} "
                                                                   f"temperatures < 0.1, eps = {EPSILONS[0]:g}"})
            tag = kind_of(tr) | {"longest_row": longest} if len(subs) > 1 else {}
            rows += [r | tag for r in out]
    return Result("sink_claims", rows, _prov("sink_claims", model, ids, caps, text, t0, lengths=grid,
                                             sink_rule=SINK_RULE, alpha=KS_ALPHA, temperatures=Ts,
                                             eps=EPSILONS[0], seed=seed,
                                             fig3=(fig3.provenance.get("figure_spec") if fig3 is not None else None)))
