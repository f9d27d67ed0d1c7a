"""One function per figure of arXiv 2508.17821 ("Limitations of Normalization in Attention Mechanism").

Each `figX(model, ids, *, quick=False, progress=True, **protocol) -> Result` runs the paper's
recipe on a real model (`attnlab.core.models.AttnModel`) and returns tidy rows + provenance.

`ids` is one window of token ids [L_max] (the largest length; shorter windows are cut by `core.text.WINDOW_RULE`), or a
list of such windows (rows then carry `window` = 0, 1, ...; plots and claims use the mean and the
spread over windows). Causal models: one forward pass at L_max serves every L (`Trace.prefix`);
bidirectional models: one pass per L. `captures=` shares passes between figures (`run_figures`).

Protocol switches (all recorded in provenance; defaults are the readings of the book's appendix
"How we read the papers"):

- `x`: "v" (per-head value vectors, default) or "hidden" (layer-input hidden states, shared by the
  heads of a layer);
- `keys`: "visible" (each row counts its visible keys only, rows with L_t <= N skipped; default)
  or "all" (masked keys included as zero-weight tokens, every row used);
- `lengths`, `ns`, `temperatures`, `epsilons`: grids (defaults below; `quick` = small grids);
- `seed` (directions of Fig. 4), `alpha` (KS level, 0.01), `n_max` (scan limit of Fig. 2c),
  `jac_rows` (rows per head for the exact Jacobian curve of Fig. 4), `reading` (d~ of the KS
  test of Fig. 2c: "b" default, "a"), `threads` (torch threads while computing; None = as set),
  `text` (dict of text
  provenance: name, sha256, offset, ... recorded as given), `impl` ("vectorised", or the oracle module: benchmarks).
"""
from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.core.text import WINDOW_RULE, window_prefix
from attnlab.core.util import progress as progress_bar
from attnlab.core.util import recheck_threads, with_threads
from attnlab.core.verdicts import holds_le
from attnlab.normalization import bounds, streaming
from attnlab.normalization.concentration import (  # noqa: F401 (re-exported: `computations`, `recompute`, the tests)
    FLAT_RHO,
    concentration_direction,
    concentration_relation,
    concentration_rows,
    relation_ns,
    separability_by_concentration,
)
from attnlab.normalization.metrics import critical_n, distance, gradients, rows, separability
from attnlab.normalization.metrics.engine import DEFAULT_CHUNK, row_mean, tile_elements, visible_scores
from attnlab.normalization.paper import EPSILONS, FIG2A_N, FIG2B_NS, FIG3_NMAX, KS_ALPHA

PAPER_FIGURES = ("fig1", "fig2a", "fig2b", "fig2c", "fig3", "fig4")   # the paper's six (registry: `attnlab.figures`)
# the engine's functions under one name; `attnlab.normalization.oracle` has the same names (impl=oracle)
VECTORISED = SimpleNamespace(NAME="vectorised", row_summary=rows.row_summary,
                             distance_stats=distance.distance_stats, critical_n=critical_n.critical_n,
                             separability_stats=separability.separability_stats,
                             fd_grad_norms=gradients.fd_grad_norms,
                             softmax_jacobian_norm=gradients.softmax_jacobian_norm)

DEFAULTS = {"x": "v", "keys": "visible", "seed": 0, "alpha": KS_ALPHA, "n_max": None, "jac_rows": 16,
            "lengths": None, "ns": None, "temperatures": None, "epsilons": None, "text": None,
            "impl": "vectorised", "chunk": DEFAULT_CHUNK, "reading": "b", "threads": None}


def with_defaults(defaults: dict, protocol: dict) -> dict:
    """defaults updated by protocol; one ValueError naming any option that defaults does not know."""
    bad = set(protocol) - set(defaults)
    if bad:
        raise ValueError(f"unknown protocol option(s) {sorted(bad)}; known: {sorted(defaults)}")
    return dict(defaults, **protocol)


def resolve_protocol(quick: bool, protocol: dict) -> dict:
    p = with_defaults(DEFAULTS, protocol)
    if p["x"] not in ("v", "hidden"):
        raise ValueError(f"x must be 'v' (value vectors) or 'hidden' (layer inputs), got {p['x']!r}")
    if p["keys"] not in ("visible", "all"):
        raise ValueError(f"keys must be 'visible' or 'all', got {p['keys']!r}")
    if p["reading"] not in ("a", "b"):
        raise ValueError(f"reading must be 'a' or 'b' (d~ used by the KS test of Fig. 2c), got {p['reading']!r}")
    if p["impl"] != "vectorised" and getattr(p["impl"], "NAME", None) != "oracle":
        raise ValueError(f"impl must be 'vectorised' or the oracle module, got {p['impl']!r}")
    if not 0 < float(p["alpha"]) < 1:
        raise ValueError(f"alpha must be in (0, 1), got {p['alpha']}")
    if p["jac_rows"] is None:
        p["jac_rows"] = 16
    if quick and protocol.get("jac_rows") is None:
        p["jac_rows"] = 4
    p["quick"] = bool(quick)
    return p


def _impl(p: dict):
    """The functions that compute the rows: the vectorised engine, or the oracle (benchmarks)."""
    return VECTORISED if p["impl"] == "vectorised" else p["impl"]


def sep_token_id(model) -> Optional[int]:
    """An encoder's [SEP] id (None for causal models and models without one): what `window_prefix` keeps last."""
    if getattr(model, "causal", True):
        return None
    return getattr(getattr(model, "tokenizer", None), "sep_token_id", None)


def as_windows(ids) -> list[torch.Tensor]:
    if isinstance(ids, torch.Tensor):
        if ids.ndim == 1:
            return [ids.long()]
        if ids.ndim == 2:
            return [w.long() for w in ids]
        raise ValueError(f"ids must be [token] or [window, token], got shape {tuple(ids.shape)}")
    wins = [torch.as_tensor(w).long() for w in ids]
    if not wins or any(w.ndim != 1 for w in wins):
        raise ValueError("ids must be a 1-D tensor of token ids or a non-empty list of them")
    n = {len(w) for w in wins}
    if len(n) != 1:
        raise ValueError(f"all windows must have the same length, got {sorted(n)}")
    return wins


# --------------------------------------------------------------------------------------- captures

class Captures:
    """Traces of one window at every length a figure needs, made on demand and kept.

    Causal models: one pass at the full window, shorter lengths are exact prefixes. Bidirectional
    models: one pass per length (`core.text.WINDOW_RULE`: [CLS] + L - 2 tokens + [SEP]). `n_passes` and
    `seconds` record the cost. layers: the layers to capture (None: all); outputs: the window's
    `AttnModel.layer_outputs`, so that the layers below the first captured one are not computed again
    (causal models).
    """

    def __init__(self, model, ids: torch.Tensor, keep: Iterable[str], layers: Optional[Sequence[int]] = None,
                 outputs=None, heads: Optional[Sequence[int]] = None, storage: Optional[dict] = None):
        self.model = model
        self.ids = torch.as_tensor(ids).long()
        self.keep = tuple(sorted(set(keep)))
        self.layers, self.outputs = (None if layers is None else list(layers)), outputs
        self.heads = None if heads is None else list(heads)
        self.storage = storage        # `AttnModel.capture`'s: the full-window pass of a causal model writes into it
        self.traces: dict = {}
        self.n_passes = 0
        self.seconds = 0.0
        self.last = None
        if len(self.ids) > model.max_positions:
            raise ValueError(f"the window has {len(self.ids)} tokens but {model.name} has only "
                             f"{model.max_positions} positions: cut ids to <= {model.max_positions}")

    def _pass(self, L: int):
        if L not in self.traces:
            t0 = time.perf_counter()
            more = {}          # passed only when used: a model's capture may not take these
            if self.outputs is not None and self.layers and L == len(self.ids):
                more["reuse"] = (self.outputs, min(self.layers))
            if self.heads is not None:
                more["heads"] = self.heads
            if self.storage is not None and self.model.causal and L == len(self.ids):   # (the one pass made)
                more["storage"] = self.storage
            ids = window_prefix(self.ids, L, sep_token_id(self.model))
            self.traces[L] = self.model.capture(ids, keep=self.keep, layers=self.layers, **more)
            self.seconds += time.perf_counter() - t0
            self.n_passes += 1
        return self.traces[L]

    def get(self, L: int):
        n = len(self.ids)
        if not 2 <= L <= n:
            raise ValueError(f"L must be in [2, {n}] for this window, got {L}")
        if self.model.causal:
            full = self._pass(n)
            self.last = full if L == n else full.prefix(L)
        else:
            self.last = self._pass(L)
        return self.last

    def require(self, keep: Iterable[str]) -> None:
        missing = set(keep) - set(self.keep)
        if missing:
            raise ValueError(f"these captures kept {self.keep}; the figure also needs {sorted(missing)}")


def trace_needs(fig: str, p: dict) -> set[str]:
    xk = {"v"} if p["x"] == "v" else {"hidden"}
    return {"fig1": {"probs", "scores", "q", "k"}, "fig2a": {"probs"} | xk, "fig2b": {"probs"} | xk,
            "fig2c": {"probs"} | xk, "fig3": {"probs"} | xk, "fig4": {"scores"}}[fig]


def by_length(cap: Captures, grid: Sequence[int], p: dict, table: Callable, progress: bool, label: str):
    """(L, trace at L, table(trace) or None) for each L of `grid`. A causal window whose rows count their
    visible keys only: `table` runs once, at the longest L, and each L uses its first L rows (row t sees
    keys <= t at every length: the same numbers up to float64 rounding, 2.6e-13 relative measured on
    SmolLM2's fig2a, without computing each prefix again). Otherwise None: the caller computes at each L."""
    once = cap.model.causal and p["keys"] == "visible"
    full = table(cap.get(grid[-1])) if once else None
    for L in progress_bar(grid, progress, label):
        yield L, cap.get(L), full


def _captures(model, ids, fig: str, p: dict, captures) -> list[Captures]:
    need = trace_needs(fig, p)
    if captures is None:
        return [Captures(model, w, need) for w in as_windows(ids)]
    caps = list(captures) if isinstance(captures, (list, tuple)) else [captures]
    for c in caps:
        c.require(need)
    return caps


# ------------------------------------------------------------------------------------------- grids

def length_grid(model, n_tokens: int, quick: bool = False, lengths: Optional[Sequence[int]] = None) -> list[int]:
    """L grid: 32, 64, 128, ... up to min(window, model positions) (plus that maximum if it is not a
    power of two); quick: up to 128. `lengths` overrides (checked)."""
    top = min(int(n_tokens), int(model.max_positions))
    if lengths is not None:
        grid = sorted({int(L) for L in lengths})
        if not grid or grid[0] < 2 or grid[-1] > top:
            raise ValueError(f"lengths must be in [2, {top}] (window / model positions), got {grid}")
        return grid
    cap = min(top, 128) if quick else top
    grid = [2 ** k for k in range(5, 31) if 2 ** k <= cap]
    if not grid or grid[-1] != cap:
        grid.append(cap)
    return grid


def _x(trace, p: dict) -> torch.Tensor:
    """x [layer, head|1, token, D] for the chosen protocol."""
    if p["x"] == "v":
        if trace.v is None:
            raise ValueError("the trace has no value vectors: capture with keep including 'v'")
        return trace.v
    if trace.hidden is None:
        raise ValueError("the trace has no hidden states: capture with keep including 'hidden'")
    return trace.hidden.unsqueeze(1)


def _visible(trace, p: dict) -> Optional[torch.Tensor]:
    return trace.visible() if p["keys"] == "visible" else None


# ------------------------------------------------------------------------------------------ layer kinds
#
# A sliding-window layer's row t sees keys t - w < s <= t (`Trace.visible(layer=)`), so the paper's row length L_t is
# that row's count of visible keys, the uniform weight 1 / L_t, and top-N, distances, separability and the finite
# differences run over those keys only. The engine takes one [query, key] mask for every head it is given, so a
# trace mixing kinds is computed one kind at a time (`Trace.kind_groups`) and stitched back in layer order; a
# full-only trace is one group: the same call, the same numbers as before.

def by_kind_groups(trace) -> list:
    """The trace itself (full-only: rows unchanged) or one sub-trace per layer kind (`Trace.kind_groups`)."""
    groups = trace.kind_groups()
    return [trace] if len(groups) == 1 else [trace.select_layers(g) for g in groups]


def per_kind(trace, table: Callable[..., dict]) -> dict[str, torch.Tensor]:
    """table(trace) -> {name: tensor [layer, ...]}, computed on each group of layers that see the same keys
    (`by_kind_groups`) and stitched back in the trace's layer order."""
    parts = [table(sub) for sub in by_kind_groups(trace)]
    if len(parts) == 1:
        return parts[0]
    order = torch.argsort(torch.tensor([i for g in trace.kind_groups() for i in g]))
    return {k: torch.cat([part[k] for part in parts])[order] for k in parts[0]}


def kind_of(trace, position: int = 0) -> dict:
    """{"layer_kind", "sliding_window"} of the layer at `position` of the trace's layer axis (window None: full)."""
    kind, window = trace.kinds[position] if trace.kinds else ("full", None)
    return {"layer_kind": kind, "sliding_window": window}


def head_rows(trace, values: dict, **fixed) -> list[dict]:
    """One row per (layer, head) of arrays values[name] [layer, head]."""
    return _head_rows(trace, {k: torch.as_tensor(v).double().tolist() for k, v in values.items()}, fixed)


def _head_rows(trace, lists: dict, fixed: dict, c: Optional[int] = None) -> list[dict]:
    """`head_rows` from nested lists [layer][head] (or [layer][head][c], column c)."""
    rows = []
    for li, layer in enumerate(trace.layers):
        kind = kind_of(trace, li) if trace.kinds else {}     # rows carry their layer's kind where kinds differ
        for hi, head in enumerate(trace.heads):
            row = dict(fixed, layer=int(layer), head=int(head), **kind)
            for k, v in lists.items():
                row[k] = v[li][hi] if c is None else v[li][hi][c]
            rows.append(row)
    return rows


def head_rows_n(trace, values: dict, name: str, grid: Sequence, **fixed) -> list[dict]:
    """`head_rows` for each value of `grid` (column c of every values[k] [layer, head, len(grid)]), in grid order:
    one conversion per array, not one per grid value."""
    lists = {k: torch.as_tensor(v).double().tolist() for k, v in values.items()}
    return [row for c, g in enumerate(grid) for row in _head_rows(trace, lists, {**fixed, name: g}, c)]


def hold_frac(value: torch.Tensor, bound: torch.Tensor, scale=0.0) -> torch.Tensor:
    """Fraction of the (non-NaN) rows where value <= bound up to rounding (`core.verdicts.holds_le`, `scale` the
    magnitude of the terms both are computed from), over the row axis -2: [..., rows, n] -> [..., n]."""
    ok = ~torch.isnan(value)
    holds = holds_le(value, bound, scale) & ok
    return holds.sum(-2).double() / ok.sum(-2).clamp_min(1)


def theorem1_holds(st: dict) -> dict[str, torch.Tensor]:
    """holds_B, holds_R, holds_a: the fraction of rows where each Theorem 1 bound holds, from `distance_stats`
    [..., rows, n]. The scale of (b) is d_max [R] = (1 - abar) d1 + ((1 - abar) + (L - N) abar) R: the sum of the
    magnitudes of [B]'s terms and a bound on those of d~ (b), so a [B] bound near zero by cancellation (N = 1, two
    nearly equal weights on nearly equal x) keeps the tolerance of its terms."""
    return {"holds_B": hold_frac(st["dtilde_b"], st["dmax_B"], st["dmax_R"]),
            "holds_R": hold_frac(st["dtilde_b"], st["dmax_R"]),
            "holds_a": hold_frac(st["dtilde_a"], st["dmax_a"])}


def _finish(name: str, model, caps: list[Captures], p: dict, grids: dict, rows: list[dict], t0: float) -> Result:
    first = caps[0].last
    text = p["text"] or {}
    prov = provenance(
        figure=name, model=model.name, causal=bool(model.causal), max_positions=int(model.max_positions),
        device=str(getattr(model, "device", "cpu")),
        model_info=(model.provenance() if hasattr(model, "provenance") else None),
        text=text.get("text", text.get("name")), text_sha256=text.get("text_sha256") or
        (first.text_sha256 if first is not None else None), text_meta=text,
        window_offsets=text.get("offsets", text.get("offset")), n_windows=len(caps), window_tokens=len(caps[0].ids),
        window_rule=WINDOW_RULE,
        token_ids_sha256=[_ids_sha(c.ids) for c in caps],
        scaling=(first.scaling if first is not None else None),
        layers=(first.layers if first is not None else None), heads=(first.heads if first is not None else None),
        x=p["x"], x_meaning={"v": "per-head value vectors", "hidden": "layer-input hidden states"}[p["x"]],
        keys=p["keys"], keys_meaning={"visible": "visible keys only; rows with L_t <= N skipped",
                                      "all": "masked keys included as zero-weight tokens; every row used"}[p["keys"]],
        dtilde_reading=f"{p['reading']} in the KS test of fig2c; b = sum of per-token distances (default), "
                       "a also reported",
        dmax_form="B default, R reported",
        xi_estimator="row (||a_i x_i - s||) default; pair and delta reported",
        quick=p["quick"], impl=_impl(p).NAME, seed=p["seed"], alpha=p["alpha"], grids=grids,
        n_passes=sum(c.n_passes for c in caps), capture_seconds=round(sum(c.seconds for c in caps), 3),
        runtime_seconds=round(time.perf_counter() - t0, 3), torch_threads=torch.get_num_threads())
    return Result(name=name, rows=rows, provenance=prov)


def _ids_sha(ids: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(ids.numpy().astype(np.int64).tobytes()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------ figure 1

def fig1_table(trace, p: dict) -> dict[str, torch.Tensor]:
    """Fig. 1's per-row quantities [layer, head, row] (`row_summary`) of a trace, each layer over its visible keys."""
    return per_kind(trace, lambda t: _impl(p).row_summary(t.scores, t.probs, t.q, t.k, t.scaling, t.visible()))


def fig1_rows(trace, p: dict, L: int, window: int = 0, st: Optional[dict] = None) -> list[dict]:
    """Per head: mean max weight, entropy, Corollary-1 and Lemma-1 bands (log10) against L. st: the trace's
    `fig1_table` when already computed (its first L rows are used)."""
    # Corollary 1 is about the row's own (visible) keys
    st = fig1_table(trace, p) if st is None else {k: v[..., :L] for k, v in st.items()}
    ln10 = math.log(10)
    cor_ok, lem_ok = (band_holds(st, k).double() for k in ("cor1", "lemma1"))
    values = {
        "max_weight": st["max_weight"].mean(-1), "entropy": st["entropy"].mean(-1),
        "entropy_norm": st["entropy_norm"].mean(-1),
        "log10_min_w": st["log_min_w"].mean(-1) / ln10, "log10_max_w": st["log_max_w"].mean(-1) / ln10,
        "log10_cor1_lo": st["cor1_lo"].mean(-1) / ln10, "log10_cor1_hi": st["cor1_hi"].mean(-1) / ln10,
        "log10_lemma1_lo": st["lemma1_lo"].mean(-1) / ln10, "log10_lemma1_hi": st["lemma1_hi"].mean(-1) / ln10,
        "cor1_holds": cor_ok.mean(-1), "lemma1_holds": lem_ok.mean(-1),
        "logit_err": st["logit_err"].amax(-1), "mean_row_len": st["L"].mean(-1),
    }
    if trace.kinds:          # sliding layers: the uniform weight of the last row's own keys, 1 / min(L, w)
        values["uniform"] = 1.0 / st["L"][..., L - 1].double()
        return head_rows(trace, values, window=window, L=L, n_rows=trace.probs.shape[-2])
    return head_rows(trace, values, window=window, L=L, uniform=1.0 / L, n_rows=trace.probs.shape[-2])


def band_holds(st: dict, band: str) -> torch.Tensor:
    """Whether every weight of each row lies in the log band `band` ("cor1" or "lemma1") of `fig1_table` st, up to
    rounding: scale log L + half the band's width (the magnitudes of the terms -log L -+ 2 Delta / T)."""
    lo, hi = st[f"{band}_lo"], st[f"{band}_hi"]
    scale = st["L"].log() + (hi - lo) / 2
    return holds_le(lo, st["log_min_w"], scale) & holds_le(st["log_max_w"], hi, scale)


@with_threads
def fig1(model, ids, *, quick: bool = False, progress: bool = True, captures=None, **protocol) -> Result:
    """Fig. 1 (quantitative counterpart): vanishing attention. For every L and head: mean max weight,
    entropy (and entropy / log L_t), and the Corollary-1 band `log10(1/L) -+ 2 Delta/(T ln 10)` with
    T = 1/scaling, Delta = ||q_t|| max ||k_i||; `cor1_holds` = fraction of rows inside the band."""
    t0 = time.perf_counter()
    p = resolve_protocol(quick, protocol)
    caps = _captures(model, ids, "fig1", p, captures)
    grid = length_grid(model, len(caps[0].ids), quick, p["lengths"])
    rows = []
    for w, cap in enumerate(caps):
        for L, trace, st in by_length(cap, grid, p, lambda tr: fig1_table(tr, p), progress, f"fig1 w{w}"):
            rows += fig1_rows(trace, p, L, w, st)
    return _finish("fig1", model, caps, p, {"lengths": grid}, rows, t0)


# --------------------------------------------------------------------------------------- figure 2a/b

DIST_STATS = ("dtilde_b", "dtilde_a", "E", "jensen", "abar", "d1", "R", "dmax_B", "dmax_R", "dmax_a")


def ns_below(ns: Sequence[int], L: int) -> list[int]:
    """The top-N sizes of `ns` defined at length L (N < L), in order."""
    return [n for n in ns if n < L]


def distance_table(trace, p: dict, ns: Sequence[int]) -> dict[str, torch.Tensor]:
    """`distance_stats` [layer, head, row, N] of a trace for the N of `ns` below its length."""
    ns = ns_below(ns, trace.n_tokens)
    return per_kind(trace, lambda t: _impl(p).distance_stats(t.probs, _x(t, p), ns, _visible(t, p), stats=DIST_STATS,
                                                             chunk=p["chunk"]))


def distance_rows(trace, p: dict, ns: Sequence[int], L: int, window: int = 0, st: Optional[dict] = None) -> list[dict]:
    """Per (N, head): token means of d~ (a, b), E, Jensen bound, d_max ([B], [R], (a)) and the fraction
    of rows in which each bound holds. st: a `distance_table(.., ns)` of this trace or of a longer causal
    window (its first L rows and the columns of N < L are used)."""
    if st is None:
        st = distance_table(trace, p, ns)
    else:
        cols = [c for c, n in enumerate(ns_below(ns, st["dtilde_b"].shape[-2])) if n < L]   # the table's N, below L
        st = {k: v[..., :L, :][..., cols] for k, v in st.items()}
    ns = ns_below(ns, L)
    hold = theorem1_holds(st)
    means = {k: row_mean(v, dim=-2) for k, v in st.items()}
    n_rows = (~torch.isnan(st["dtilde_b"])).sum(-2)
    rows = head_rows_n(trace, {**means, **hold, "n_rows": n_rows}, "N", ns, window=window, L=L)
    for r in rows:
        r["n_rows"] = int(r["n_rows"])
    return rows


@with_threads
def fig2a(model, ids, *, quick: bool = False, progress: bool = True, captures=None, **protocol) -> Result:
    """Fig. 2a: N = 5, L = 32, 64, ... : per head the true d~, the expectation E and d_max."""
    t0 = time.perf_counter()
    p = resolve_protocol(quick, protocol)
    caps = _captures(model, ids, "fig2a", p, captures)
    grid = length_grid(model, len(caps[0].ids), quick, p["lengths"])
    ns = list(p["ns"] or [FIG2A_N])
    rows = []
    for w, cap in enumerate(caps):
        for L, trace, st in by_length(cap, grid, p, lambda tr: distance_table(tr, p, ns), progress, f"fig2a w{w}"):
            rows += distance_rows(trace, p, ns, L, w, st)
    return _finish("fig2a", model, caps, p, {"lengths": grid, "ns": ns}, rows, t0)


@with_threads
def fig2b(model, ids, *, quick: bool = False, progress: bool = True, captures=None, **protocol) -> Result:
    """Fig. 2b: L = largest, N in {1, 5, 10, 20, 100} (those < L): d~, E, d_max per head."""
    t0 = time.perf_counter()
    p = resolve_protocol(quick, protocol)
    caps = _captures(model, ids, "fig2b", p, captures)
    L = length_grid(model, len(caps[0].ids), quick, p["lengths"])[-1]
    ns = [n for n in (p["ns"] or (FIG2B_NS[:4] if quick else FIG2B_NS)) if n < L]
    rows = []
    for w, cap in enumerate(progress_bar(caps, progress and len(caps) > 1, "fig2b")):
        rows += distance_rows(cap.get(L), p, ns, L, w)
    return _finish("fig2b", model, caps, p, {"L": L, "ns": ns}, rows, t0)


# ------------------------------------------------------------------------------------------ figure 2c

def critical_rows(trace, p: dict, L: int, window: int = 0, progress: bool = False) -> list[dict]:
    """The KS scan of Alg. 3 at one L: one row per scanned N (p-value, NaN where the brackets certified
    the rejection; p_upper: the p-value or, where certified, its upper bound; KS statistic; mean d~ and
    E over heads), each carrying the critical N (first N not rejected; -1 if none up to n_max). A trace mixing
    layer kinds: one scan per kind, over that kind's heads (rows carry `layer_kind`, `sliding_window`, `longest_row`,
    the last row's visible keys, min(L, w), which `critical_frac` divides by; the scan stops below it: no row of a
    sliding layer has more than w keys)."""
    subs = by_kind_groups(trace)
    if len(subs) > 1:
        rows = []
        for sub in subs:
            longest = int(sub.visible()[L - 1].sum())
            scan = dict(p, n_max=min(p["n_max"] or L - 1, longest - 1))
            for r in critical_rows(sub, scan, L, window, progress):
                crit = r["critical_n"]
                rows.append(dict(r, **kind_of(sub), longest_row=longest,
                                 critical_frac=crit / longest if crit > 0 else float("nan")))
        return rows
    impl = _impl(p)
    bar = None
    if progress and impl is VECTORISED:
        from tqdm.auto import tqdm

        bar = tqdm(total=(p["n_max"] or L - 1), desc=f"fig2c N scan, L={L}", leave=False)
    try:
        res = impl.critical_n(trace.probs, _x(trace, p), _visible(trace, p), alpha=p["alpha"], n_max=p["n_max"],
                              reading=p["reading"], chunk=p["chunk"], progress=bar)
    finally:
        if bar is not None:
            bar.close()
    crit = int(res["n"])
    p_upper = res.get("p_upper", res["pvalues"])          # the oracle certifies nothing: its p-values
    return [{"window": window, "L": L, "N": int(N), "pvalue": pv, "p_upper": pu, "ks": ks, "d_mean": d, "e_mean": e,
             "critical_n": crit, "critical_frac": (crit / L if crit > 0 else float("nan")),
             "is_critical": int(N) == crit, "n_heads": int(np.prod(trace.probs.shape[:-2]))}
            for N, pv, pu, ks, d, e in zip(res["ns"], res["pvalues"], p_upper, res["ks"], res["d_mean"], res["e_mean"])]


@with_threads
def fig2c(model, ids, *, quick: bool = False, progress: bool = True, captures=None, **protocol) -> Result:
    """Fig. 2c: for each L, the critical top-N (KS two-sample test of per-head mean d~ vs per-head mean
    E, alpha = 0.01; every N from 1 upward, first non-rejection) and critical N / L vs 0.06."""
    t0 = time.perf_counter()
    p = resolve_protocol(quick, protocol)
    caps = _captures(model, ids, "fig2c", p, captures)
    grid = length_grid(model, len(caps[0].ids), quick, p["lengths"])
    rows = []
    for w, cap in enumerate(caps):
        for L in progress_bar(grid, progress, f"fig2c w{w}"):
            rows += critical_rows(cap.get(L), p, L, w, progress)
    return _finish("fig2c", model, caps, p, {"lengths": grid, "n_scan": "every N from 1, stop at first p > alpha",
                                             "n_max": p["n_max"] or "L-1"}, rows, t0)


RATIO_POINTS = 24      # N per length of the exact d~ / E curve (`fig2c_ratio`)


def ratio_ns(L: int, fracs: Sequence[float] = (), points: int = RATIO_POINTS) -> list[int]:
    """The N of the exact d~ / E curve at length L: `points` N spread evenly over 1..L-1, plus ceil(f L) for each f
    of `fracs` (the first N >= f L: the paper's 6%)."""
    grid = {round(1 + (L - 2) * i / (points - 1)) for i in range(points)} | {math.ceil(f * L) for f in fracs}
    return sorted(int(n) for n in grid if 1 <= n < L)


def ratio_rows(trace, p: dict, L: int, ns: Sequence[int], window: int = 0) -> list[dict]:
    """Exact means over heads of the per-head token means of d~ (the KS test's reading) and E at each N of `ns`
    below L: one row per N (d_mean, e_mean, ratio, n_heads). Fig. 2c's scan records these only where it computed N
    exactly; where its brackets certified a rejection its d_mean / e_mean are the brackets' midpoints. A trace mixing
    layer kinds: the means over each kind's heads (rows carry `layer_kind`, `sliding_window`), at the N below its
    kind's longest row (min(L, w): a sliding layer's rows have at most w keys)."""
    subs = by_kind_groups(trace)
    if len(subs) > 1:
        return [dict(r, **kind_of(sub)) for sub in subs
                for r in ratio_rows(sub, p, L, ns_below(ns, int(sub.visible()[L - 1].sum())), window)]
    ns = ns_below(ns, L)
    key = f"dtilde_{p['reading']}"
    means = distance.distance_means(trace.probs, _x(trace, p), ns, _visible(trace, p), stats=(key, "E"),
                                    chunk=p["chunk"])
    d, e = (means[k].reshape(-1, len(ns)).numpy() for k in (key, "E"))      # [heads, N]
    rows = []
    for c, N in enumerate(ns):
        dm, em = float(np.nanmean(d[:, c])), float(np.nanmean(e[:, c]))
        rows.append({"window": window, "L": L, "N": int(N), "d_mean": dm, "e_mean": em, "ratio": dm / em,
                     "n_heads": int(d.shape[0])})
    return rows


@with_threads
def fig2c_ratio(model, ids, *, quick: bool = False, progress: bool = True, captures=None, fracs: Sequence[float] = (),
                points: int = RATIO_POINTS, **protocol) -> Result:
    """d~ / E of the head means against N at each length of Fig. 2c's grid, exact at every N (`ratio_rows`, at
    `ratio_ns(L, fracs, points)`): the curve Fig. 2c's KS scan moves along."""
    t0 = time.perf_counter()
    p = resolve_protocol(quick, protocol)
    caps = _captures(model, ids, "fig2c", p, captures)
    grid = length_grid(model, len(caps[0].ids), quick, p["lengths"])
    rows = []
    for w, cap in enumerate(caps):
        for L in progress_bar(grid, progress, f"d~/E w{w}"):
            rows += ratio_rows(cap.get(L), p, L, ratio_ns(L, fracs, points), w)
    grids = {"lengths": grid, "points": points, "fracs": [float(f) for f in fracs]}
    return _finish("fig2c_ratio", model, caps, p, grids, rows, t0)


# ------------------------------------------------------------------------------------------ figure 3

SEP_STATS = separability.SEPARABILITY_STATS


def separability_rows(trace, p: dict, ns: Sequence[int], L: int, window: int = 0) -> list[dict]:
    """Per (N, head): token means of N_s/N, r, delta, the spreads and the Theorem-2 bounds, plus the
    fraction of rows where the lower (row xi) and upper ([B], row xi) bounds hold."""
    impl = _impl(p)
    ns = [n for n in ns if n < L]
    st = per_kind(trace, lambda t: impl.separability_stats(t.probs, _x(t, p), ns, _visible(t, p), stats=SEP_STATS,
                                                           chunk=p["chunk"]))
    hold = {"lower_holds": hold_frac(st["lower_row"], st["ns_frac"], 1.0),       # shares: terms of magnitude 1
            "lower_pair_holds": hold_frac(st["lower_pair"], st["ns_frac"], 1.0),
            "upper_B_holds": hold_frac(st["ns_frac"], st["upper_B_row"], 1.0),
            "upper_R_holds": hold_frac(st["ns_frac"], st["upper_R_row"], 1.0)}
    means = {k: row_mean(v, dim=-2) for k, v in st.items()}
    return head_rows_n(trace, {**means, **hold}, "N", ns, window=window, L=L)


@with_threads
def fig3(model, ids, *, quick: bool = False, progress: bool = True, captures=None, **protocol) -> Result:
    """Fig. 3: L = largest, N = 1..32: N_s/N per head (x on the unit sphere) with the Theorem-2 bounds."""
    t0 = time.perf_counter()
    p = resolve_protocol(quick, protocol)
    caps = _captures(model, ids, "fig3", p, captures)
    L = length_grid(model, len(caps[0].ids), quick, p["lengths"])[-1]
    ns = [n for n in (p["ns"] or range(1, (8 if quick else FIG3_NMAX) + 1)) if n < L]
    rows = []
    for w, cap in enumerate(progress_bar(caps, progress and len(caps) > 1, "fig3")):
        rows += separability_rows(cap.get(L), p, ns, L, w)
    return _finish("fig3", model, caps, p, {"L": L, "ns": ns, "M": 1.0}, rows, t0)


# ------------------------------------------------------------------------------------------ figure 4

def temperature_grid(quick: bool = False) -> list[float]:
    return [float(t) for t in np.logspace(-3, 2, 6 if quick else 26)]


def gradient_rows(trace, p: dict, Ts: Sequence[float], Es: Sequence[float], L: int, window: int = 0,
                  keep: Optional[torch.Tensor] = None) -> list[dict]:
    """Per (T, eps): max over heads of the token-mean finite-difference norm g (Alg. 5), the head that
    attains it, the mean over heads, the fraction of rows with g <= 1/(2T) (a theorem) and with
    g <= min{1/(4T), sqrt 2} (the paper's curve), and the max over heads of the token-mean exact
    Jacobian spectral norm on `jac_rows` evenly spaced rows per head. `keep` (bool [l, h, Q], optional): the
    rows that count; the others are left out of every mean and share, as rows with < 2 keys are
    (`windows.degenerate_rows`). Every (T, eps) at once: one conversion to Python numbers per column, not one per
    (T, eps). A trace mixing layer kinds: g and the Jacobian per kind over its visible keys (each kind's directions
    drawn from `seed`), the max and means over every head."""
    impl = _impl(p)
    g = per_kind(trace, lambda t: {"g": impl.fd_grad_norms(t.scores, Ts, Es, t.visible(), seed=p["seed"],
                                                             chunk=p["chunk"])})["g"]       # [l, h, Q, T, E]
    if keep is not None:
        g = g.masked_fill(~keep.to(g.device)[..., None, None], float("nan"))
    gm = row_mean(g, dim=-3)                                                     # [l, h, T, E]
    H = gm.shape[0] * gm.shape[1]
    cols = gm.reshape(H, len(Ts), len(Es)).permute(1, 2, 0).contiguous()        # [T, E, H]
    jac = ([max(per) for per in zip(*(_jacobian_max(sub, p, Ts, sub.visible()) for sub in by_kind_groups(trace)))]
           if p["jac_rows"] else [float("nan")] * len(Ts))
    Tt = torch.tensor(Ts, dtype=torch.float64)
    exact, paper = bounds.softmax_jacobian_bound(Tt), bounds.corollary3_bound(Tt)          # [T]
    valid = ~torch.isnan(g)
    n_ok = valid.flatten(0, 2).sum(0).double().clamp_min(1)                               # [T, E]
    best = cols.nan_to_num(float("-inf")).argmax(-1)          # [T, E]; a head whose every row is left out: NaN
    col = {"g_max": cols.gather(-1, best.unsqueeze(-1)).squeeze(-1), "g_mean": cols.nanmean(-1),
           "holds_exact": (holds_le(g, exact.view(-1, 1)) & valid).flatten(0, 2).sum(0).double() / n_ok,
           "holds_paper": (holds_le(g, paper.view(-1, 1)) & valid).flatten(0, 2).sum(0).double() / n_ok}
    col = {k: v.tolist() for k, v in col.items()}
    best, exact, paper = best.tolist(), exact.tolist(), paper.tolist()
    caps = bounds.finite_difference_cap(torch.tensor(Es, dtype=torch.float64)).tolist()
    rows = []
    for ti, T in enumerate(Ts):
        for ei, eps in enumerate(Es):
            b = best[ti][ei]
            rows.append({
                "window": window, "L": L, "T": float(T), "eps": float(eps), "g_max": col["g_max"][ti][ei],
                "g_max_layer": int(trace.layers[b // len(trace.heads)]),
                "g_max_head": int(trace.heads[b % len(trace.heads)]), "g_mean": col["g_mean"][ti][ei],
                "bound_paper": paper[ti], "bound_exact": exact[ti], "cap_eps": caps[ei],
                "holds_exact": col["holds_exact"][ti][ei], "holds_paper": col["holds_paper"][ti][ei],
                "jac_max": jac[ti],
            })
    return rows


def _jacobian_max(trace, p: dict, Ts: Sequence[float], vis: torch.Tensor) -> list[float]:
    """Per T: the max over heads of the token-mean exact Jacobian spectral norm on `jac_rows` evenly spaced rows per
    head; the temperatures in groups of at most GRAD_ELEMENTS weights (one call each), one conversion at the end."""
    Q = trace.scores.shape[-2]
    rows_idx = torch.unique(torch.linspace(1, Q - 1, min(p["jac_rows"], Q - 1)).round().long())
    sc = trace.scores[..., rows_idx, :].double()
    vsub = visible_scores(sc, vis[rows_idx].to(sc.device))
    Tt = torch.tensor(Ts, dtype=torch.float64, device=sc.device)
    step = max(1, tile_elements(gradients.GRAD_ELEMENTS, sc) // max(1, sc.numel()))   # CPU: one T at a time
    out = []
    for t0 in range(0, len(Ts), step):
        T = Tt[t0:t0 + step].view(-1, *([1] * sc.dim()))
        a = torch.softmax((sc / T).masked_fill(~vsub, float("-inf")), dim=-1)
        j = _impl(p).softmax_jacobian_norm(a, 1.0, vsub, method="secular") / T.squeeze(-1)   # [t, l, h, r]
        out.append(j.mean(-1).flatten(1).amax(-1))
    return torch.cat(out).tolist()


@with_threads
def fig4(model, ids, *, quick: bool = False, progress: bool = True, captures=None, **protocol) -> Result:
    """Fig. 4: T in logspace(-3, 2, 26), eps in {1e-3, 1e-1, 10}: max over heads of the token-mean g(T, eps)
    with min{1/(4T), sqrt 2} (paper) and 1/(2T) (exact spectral bound). Logits = the model's own
    pre-softmax scores over visible keys (T = 1 is the native model); one seeded unit direction per row."""
    t0 = time.perf_counter()
    p = resolve_protocol(quick, protocol)
    caps = _captures(model, ids, "fig4", p, captures)
    L = length_grid(model, len(caps[0].ids), quick, p["lengths"])[-1]
    Ts = list(p["temperatures"] or temperature_grid(quick))
    Es = list(p["epsilons"] or EPSILONS)
    rows = []
    for w, cap in enumerate(progress_bar(caps, progress and len(caps) > 1, "fig4")):
        rows += gradient_rows(cap.get(L), p, Ts, Es, L, w)
    return _finish("fig4", model, caps, p, {"L": L, "temperatures": Ts, "epsilons": Es,
                                            "direction": "z/||z||, z ~ N(0, I) over visible keys, one per row, "
                                                         "shared by all (T, eps)", "jac_rows": p["jac_rows"]},
                   rows, t0)


# ---------------------------------------------------------------------------------------- entry points

FIGURE_FUNCS: dict[str, Callable] = {"fig1": fig1, "fig2a": fig2a, "fig2b": fig2b, "fig2c": fig2c,
                                     "fig3": fig3, "fig4": fig4}


def _all_windows(ids, ids_list) -> list[torch.Tensor]:
    wins = as_windows(ids)
    if ids_list is not None:
        wins += as_windows(ids_list)
    return as_windows(wins)


@with_threads
def run_figures(model, ids, ids_list=None, *, quick: bool = False, progress: bool = True,
                figures: Optional[Sequence[str]] = None, **protocol) -> dict[str, Result]:
    """Every figure of the paper (or `figures`), sharing forward passes: dict name -> Result.

    ids: the main window [L_max]; ids_list: optional further windows of the same length (rows carry
    `window`; K windows give the mean and spread). Protocol switches as in the module docstring.
    Long windows of a causal model stream: the layers are captured in blocks that fit CAPTURE_BUDGET
    (`streaming.layer_blocks`; a few heads of one layer where a layer does not fit), each block's figures
    computed and its tensors freed before the next; the layers below a block are not computed again
    (`AttnModel.layer_outputs`). Same rows as one pass.
    """
    names = list(figures or PAPER_FIGURES)
    bad = set(names) - set(PAPER_FIGURES)
    if bad:
        raise ValueError(f"unknown figures {sorted(bad)}; known: {PAPER_FIGURES}")
    p = resolve_protocol(quick, protocol)
    keep = set().union(*(trace_needs(n, p) for n in names))
    windows = _all_windows(ids, ids_list)
    blocks = streaming.layer_blocks(model, len(windows[0]), keep)
    pooled = streaming.POOLED
    plan = [(blocks, [n for n in names if n not in pooled]), ([None], [n for n in names if n in pooled])]
    if blocks == [None]:
        plan = [(blocks, names)]                       # one pass serves every figure
    elif any(n in pooled for n in names):
        streaming.check_pooled_fits(model, len(windows[0]), keep)
    streamed = blocks != [None] and any(n not in pooled for n in names)
    outputs = [model.layer_outputs(w) if streamed else None for w in windows]
    storages = [{} for _ in windows]          # per window: each block's capture reuses the last block's memory
    parts: dict[str, list[Result]] = {n: [] for n in names}
    steps = [(b, group) for b_list, group in plan if group for b in b_list]
    label = "figures (blocks of layers or heads)" if len(steps) > 1 else "figures"
    for block, group in progress_bar(steps, progress, label):
        layers, heads = block or (None, None)
        caps = [Captures(model, w, keep, layers=layers, heads=heads, outputs=o, storage=s if block else None)
                for w, o, s in zip(windows, outputs, storages)]
        for name in group:
            recheck_threads()                  # the CPUs free now, before each figure and block (auto only)
            parts[name].append(FIGURE_FUNCS[name](model, None, quick=quick, progress=progress and len(steps) == 1,
                                                  captures=caps, **protocol))
        del caps
    return {n: streaming.merge(parts[n]) for n in names}
