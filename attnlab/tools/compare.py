"""Beyond softmax: other normalizers swapped into a pretrained model, and what sparse ones cost in time.

**What this measures.** A model trained with softmax runs with another normalizer in all layers (or in
one layer at a time), without retraining. That measures how much the *pretrained model tolerates* the
change; it says nothing about a model *trained* with that normalizer (which would learn other scores).

`compare_normalizers(model, text, ...) -> Result` ("compare_normalizers"), one row per
(normalizer, L[, swapped layer]):

- the attention the swapped model produces, measured with the paper-1 metrics (`attnlab.normalization`,
  through the per-head statistics of `attnlab.tools.diagnose`): max weight, entropy (and / log L), d~ at N = 5, N_s/N at
  N = 16 (on `max_rows` = 32 evenly spaced query rows per head), critical N / L (KS test pooling all
  swapped heads, N scanned up to L/4: enough to place it against the paper's 6%), means over heads;
- the Jacobian spectral norm of the normalizer with respect to the model's own (native-temperature)
  scores `scaling * q.k`, at the scores the swapped model produces: exact `(diag(a) - a a^T)/T` for
  softmax(T), autograd (`normalizers.jacobian`) for the others, on `jac_rows` seeded random rows of
  the whole model (the same count for every normalizer);
- what it costs the model, on held-out windows of the text (from its second half; the metric window
  is its start): a causal LM's next-token loss (mean over the window's positions) against L, next to
  the native model's; for every model the drift of the final hidden states from the native softmax
  model, 1 - cosine, mean over tokens.

Normalizers (`default_specs`): softmax at T in {0.5, 1, 2}, sparsemax, 1.5-entmax, Scalable-Softmax
with s = 1/log(L_ref), L_ref = the shortest L of the grid (so it equals the native softmax at L_ref and
departs from it as rows grow: a causal row t uses log t), and Self-Adjust Softmax (normalized variant;
its weights do not sum to 1, faithful to its paper: entropy is taken of the renormalized row, the
row sum is reported as `weight_sum`).

`bench_normalizers(...)`: the exact sort-based sparsemax / 1.5-entmax of the `entmax` library against
partial sorting (`k=`, the library's exact top-k with doubling) and bisection, on the model's real
scores and on synthetic ones; all times and ratios from one run (`attnlab bench normalizers`).

**Speed.** A causal model runs one pass per normalizer at the longest L (shorter L are prefixes; the
per-row weight statistics are computed once per pass, one layer and one causal block of rows at a time);
a capture stops after the last recorded layer; with swap="each", the layers below the swapped one
are not computed again (`AttnModel.layer_outputs`: the native model's, same numbers).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.capture import all_full
from attnlab.core.models import as_attn_model
from attnlab.core.result import Result, provenance
from attnlab.core.text import resolve_text
from attnlab.core.util import check_int
from attnlab.core.util import progress as progress_bar
from attnlab.normalization.experiments import by_kind_groups
from attnlab.normalization.metrics.critical_n import RunningTopN, brackets_for, certified_rejections
from attnlab.normalization.metrics.engine import cpu_kernels
from attnlab.normalization.metrics.gradients import softmax_jacobian_norm
from attnlab.tools import normalizers
from attnlab.tools.diagnose import (
    ALPHA,
    CRIT_STEP_FRAC,
    N_SEP,
    N_TOP,
    check_lengths,
    check_options,
    critical_grid,
    distance_heads,
    mean_separability,
    pooled_critical_n,
    row_sample,
    row_weight_stats,
    sample_view,
    text_window,
)

TOLERANCE_NOTE = ("normalizers swapped into a model trained with softmax, without retraining: this measures the "
                  "pretrained model's tolerance to the change, not what a model trained with that normalizer does")
JAC_ROWS = 16
N_WINDOWS = 2
MAX_ROWS_COMPARE = 32     # rows per head for N_s/N, d~, critical N (a budget: the default grid runs in ~2 min)
CRIT_MAX_FRAC_COMPARE = 0.25   # scan N up to L/4: enough to place the critical N against the paper's 6% line
HELD_OUT_START = 0.5      # held-out windows come from the second half of the text
LOSS_CHUNK = 64           # positions per log-softmax over the vocabulary (small temporaries)


@dataclass(frozen=True)
class NormSpec:
    """One normalizer of the comparison: `normalizers.get_normalizer(name, **params)`."""

    name: str
    params: tuple = ()            # ((key, value), ...), hashable

    @property
    def kwargs(self) -> dict:
        return dict(self.params)

    @property
    def label(self) -> str:
        return normalizers.describe(self.name, **self.kwargs)

    def fn(self):
        return normalizers.get_normalizer(self.name, **self.kwargs)

    @property
    def softmax_T(self) -> Optional[float]:
        """T when this is plain softmax (exact Jacobian), else None."""
        return float(self.kwargs.get("T", 1.0)) if self.name == "softmax" else None


def spec(name: str, **params) -> NormSpec:
    return NormSpec(name, tuple(sorted(params.items())))


def default_specs(ssmax_ref_length: int) -> list[NormSpec]:
    """softmax T in {0.5, 1, 2}, sparsemax, 1.5-entmax, SSMax (s = 1/log ssmax_ref_length), SA-Softmax."""
    return [spec("softmax", T=0.5), spec("softmax", T=1.0), spec("softmax", T=2.0), spec("sparsemax"),
            spec("entmax15"), spec("ssmax", ref_length=int(ssmax_ref_length)), spec("sa_softmax", variant="normalized")]


# ------------------------------------------------------------------------------------ model costs

def held_out_windows(model, text: str, L: int, n: int, *, start_frac: float = HELD_OUT_START) -> torch.Tensor:
    """ids [n, L]: n windows of L tokens starting at line starts evenly spread over the text from
    `start_frac` of its characters to 95% (disjoint from the metric window at the text's start)."""
    if n < 1:
        raise ValueError(f"need at least one held-out window, got n={n}")
    out = []
    for i in range(n):
        pos = int(len(text) * (start_frac + (0.95 - start_frac) * i / n))
        nl = text.find("\n", pos)
        pos = nl + 1 if 0 <= nl < len(text) - 1 else pos
        try:
            out.append(text_window(model, text[pos:], L))
        except ValueError as exc:
            raise ValueError(f"held-out window {i} (from character {pos}): {exc}; use fewer windows or a "
                             "longer text") from None
    return torch.stack(out)


def forward_outputs(model, ids: torch.Tensor, reuse=None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One forward pass of ids [n, L] -> final hidden states [n, L, d] (float32) and, for a model with
    an LM head, the next-token loss of every position [n, L-1] (None otherwise). reuse: `AttnModel.forward`'s."""
    out = model.forward(ids, output_hidden_states=True, use_cache=False, reuse=reuse)
    hidden = out.hidden_states[-1].float()
    logits = getattr(out, "logits", None)
    if logits is None:
        return hidden, None
    # = cross_entropy(reduction="none"), LOSS_CHUNK positions at a time (no copy of the logits)
    targets, n = ids[:, 1:, None].to(logits.device), ids.shape[1] - 1          # position t predicts token t + 1
    chunks = [slice(a, min(a + LOSS_CHUNK, n)) for a in range(0, n, LOSS_CHUNK)]
    logp = [torch.log_softmax(logits[:, c].float(), dim=-1).gather(-1, targets[:, c]) for c in chunks]
    return hidden, -torch.cat(logp, dim=1).squeeze(-1).cpu()


def row_weights(trace) -> dict[str, torch.Tensor]:
    """`row_weight_stats` of every query row of a trace's probs: each [layer, head, Q] float64, computed one
    layer and one block of rows at a time (`normalizers.row_blocks`: causal rows read only the keys they see)."""
    vis = trace.visible()
    Q, K = trace.probs.shape[-2:]
    blocks = normalizers.row_blocks(vis, Q, K)
    per_layer = [[row_weight_stats(p[:, rows, :width], vis[rows, :width]) for rows, width in blocks]
                 for p in trace.probs]
    return {k: torch.stack([torch.cat([b[k] for b in layer], dim=-1) for layer in per_layer])
            for k in per_layer[0][0]}


def hidden_drift(hidden: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """1 - cosine(hidden, reference) per token: [n, L, d] x 2 -> [n, L] (clamped at 0: cos <= 1 up to rounding)."""
    cos = torch.nn.functional.cosine_similarity(hidden.double(), reference.double(), dim=-1).cpu()
    return (1.0 - cos).clamp_min(0.0)


# -------------------------------------------------------------------------------------- Jacobians

def jacobian_sample(trace, n_rows: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """n_rows seeded random (layer index, head index, query row) of the trace among rows with >= 2
    visible keys (without replacement when possible)."""
    vis = trace.visible()
    ok_rows = torch.nonzero(vis.sum(-1) >= 2).squeeze(-1)
    n_l, n_h = trace.probs.shape[:2]
    total = n_l * n_h * len(ok_rows)
    if total == 0 or n_rows <= 0:
        return []
    g = torch.Generator().manual_seed(int(seed))
    picks = torch.randperm(total, generator=g)[: min(n_rows, total)]
    out = []
    for p in picks.tolist():
        li, rest = divmod(p, n_h * len(ok_rows))
        hi, ri = divmod(rest, len(ok_rows))
        out.append((li, hi, int(ok_rows[ri])))
    return out


def _compact_spectral_norm(jac: torch.Tensor) -> float:
    """Spectral norm of [K, K] after dropping all-zero rows and columns (same value; sparse normalizers
    give mostly-zero Jacobians, on which LAPACK's SVD is pathologically slow)."""
    r = jac.abs().sum(1) > 0
    c = jac.abs().sum(0) > 0
    if not bool(r.any()) or not bool(c.any()):
        return 0.0
    return float(normalizers.spectral_norm(jac[r][:, c]))


def jacobian_norms(spec_: NormSpec, trace, picks: Sequence[tuple[int, int, int]]) -> tuple[torch.Tensor, str]:
    """Spectral norms [R] of d weights / d scores at the sampled rows, over each row's visible keys.
    softmax(T): exact `(diag(a) - a a^T)/T` (`softmax_jacobian_norm`); others: autograd."""
    if not picks:
        return torch.empty(0, dtype=torch.float64), "none"
    vis = trace.visible()
    li, hi, ti = (torch.tensor(v) for v in zip(*picks))
    if spec_.softmax_T is not None:
        a = trace.probs[li, hi, ti]                                        # [R, K]
        return (softmax_jacobian_norm(a, spec_.softmax_T, vis[ti], method="secular"),
                "exact (diag(a) - a a^T)/T")
    fn = spec_.fn()
    norms = []
    for l, h, t in picks:
        keys = vis[t].nonzero().squeeze(-1)
        z = trace.scores[l, h, t, keys]
        norms.append(_compact_spectral_norm(normalizers.jacobian(fn, z)))
    return torch.tensor(norms, dtype=torch.float64), "autograd (normalizers.jacobian)"


# ------------------------------------------------------------------------------------- comparison

def _nanmean(t) -> float:
    t = torch.as_tensor(t, dtype=torch.float64)
    return float(torch.nanmean(t)) if t.numel() else float("nan")


SWAP_MEANINGS = {"all": "every layer at once", "each": "one layer at a time; metrics of that layer"}
SSMAX_NOTE = ("s = 1/log({ref_len}): equals the native softmax for rows of {ref_len} visible keys "
              "(the shortest L of the grid); a row of n visible keys scales its scores by log(n)/log({ref_len})")
SA_SOFTMAX_NOTE = "normalized variant; weights do not sum to 1 (weight_sum); entropy of the renormalized row"
METRIC_WINDOW_NOTE = ("first L tokens of the text (encoders: [CLS] + L-2 + [SEP]); causal: one pass at the "
                      "longest L, prefixes for the others")
HELD_OUT_NOTE = "{n_windows} windows per L starting at line starts spread over {start:.0%}-95% of the text"
COST_NOTES = {
    True: ("next-token loss (mean over the window's positions) and drift of the final hidden states "
           "(1 - cosine vs the native model, mean over tokens)"),
    False: ("drift of the final hidden states (1 - cosine vs the native softmax model, mean over tokens); "
            "no LM head, so no loss"),
}
JACOBIAN_NOTE = ("d weights / d scores (the model's scaled scores, native temperature) at the swapped scores; "
                 "{jac_rows} seeded random rows of the whole model per (normalizer, L), the same rows for every "
                 "normalizer; softmax(T): exact (diag(a) - a a^T)/T; others: autograd, spectral norm")
CRITICAL_N_NOTE = ("KS (alpha={alpha}) of per-head token-mean d~ vs E pooling every swapped head; N grid: every N "
                   "up to 8, then steps of {crit_step_frac:g} L up to {crit_max_frac:g} L; first non-rejected grid N "
                   "(upper bound on the first N); censored = none up to the grid's end")


@dataclass
class _Windows:
    """The token windows of a comparison, per pass length L (`lengths`): metric windows [L] and held-out
    windows [n, L], the native layers recorded for swap="each" ({} otherwise), the native model's outputs."""

    lengths: list
    metric: dict
    cost: dict
    recorded: dict
    native: dict


def _windows(model, text: str, grid: list[int], n_windows: int, swap: str) -> _Windows:
    """Every window first (a text too short fails before any forward pass), then the native passes."""
    lengths = [grid[-1]] if model.causal else grid
    metric = {L: text_window(model, text, L) for L in lengths}
    cost = {L: held_out_windows(model, text, L, n_windows) for L in lengths}
    # swap="each": the layers below the swapped one are the native model's, recorded once per window
    recorded = ({L: (model.layer_outputs(metric[L]), model.layer_outputs(cost[L])) for L in lengths}
                if swap == "each" and model.blocks is not None else {})
    native = {L: forward_outputs(model, cost[L], reuse=(recorded[L][1], model.n_layers) if recorded else None)
              for L in lengths}
    return _Windows(lengths, metric, cost, recorded, native)


def kind_tag(model, trace) -> dict:
    """{"layer_kind", "sliding_window"} of the trace's layers (one kind) where `model` has layers that are not full,
    else {} (a full-only model's rows keep their columns); read from the model: a one-layer capture of a full
    layer has no kinds of its own (`AttnModel.capture`)."""
    kinds = model.layer_kinds
    return {} if all_full(kinds) else dict(zip(("layer_kind", "sliding_window"), kinds[trace.layers[0]]))


def _swapped_pass(model, fn, target, Lpass: int, win: _Windows, text_sha256: Optional[str]):
    """One pass with normalizer fn in layer `target` (or "all"): its trace of the metric window, the drift of
    its final hidden states [n, Lpass] and its next-token loss [n, Lpass-1] (None without an LM head)."""
    swap_layers = None if target == "all" else [target]
    rec_metric, rec_cost = [(r, target) for r in win.recorded[Lpass]] if win.recorded else [None, None]
    with model.normalizer(fn, layers=swap_layers):
        full = model.capture(win.metric[Lpass], layers=swap_layers, keep=("probs", "scores", "v"),
                             text_sha256=text_sha256, reuse=rec_metric)
        hidden, loss = forward_outputs(model, win.cost[Lpass], reuse=rec_cost)
    return full, hidden_drift(hidden, win.native[Lpass][0]), loss


def _loss_fields(loss: Optional[torch.Tensor], native_loss: Optional[torch.Tensor], L: int) -> dict:
    """loss, loss_native, loss_delta of the first L positions (None each without an LM head)."""
    if loss is None:
        return {"loss": None, "loss_native": None, "loss_delta": None}
    out = {"loss": float(loss[:, :L - 1].mean()), "loss_native": float(native_loss[:, :L - 1].mean())}
    return {**out, "loss_delta": out["loss"] - out["loss_native"]}


def _pass_rows(model, sp: NormSpec, fn, target, Lpass: int, grid: list[int], win: _Windows, text_sha256,
               metric_opts: dict, seed: int) -> list[dict]:
    """The rows of one swapped pass at length Lpass: one per L of the grid (a causal model's prefixes) or Lpass."""
    t0 = time.perf_counter()
    full, drift_tok, loss = _swapped_pass(model, fn, target, Lpass, win, text_sha256)      # drift [n, Lpass]
    subs = by_kind_groups(full)                                  # one per layer kind (full-only: the trace itself)
    weights = [row_weights(sub) for sub in subs]                 # [layer, head, Lpass] per row
    pass_seconds = time.perf_counter() - t0
    rows = []
    for L in (grid if model.causal else [Lpass]):
        for sub, w in zip(subs, weights):
            t1 = time.perf_counter()
            trace = sub if L == sub.n_tokens else sub.prefix(L)
            row = _metric_row(sp, trace, L, {k: v[..., :L] for k, v in w.items()}, **metric_opts, seed=seed + L)
            row["swap"] = target
            row.update(kind_tag(model, sub))
            row["drift"] = float(drift_tok[:, :L].mean())
            row.update(_loss_fields(loss, win.native[Lpass][1], L))
            share = pass_seconds / ((len(grid) if model.causal else 1) * len(subs))
            row["seconds"] = round(time.perf_counter() - t1 + share, 3)
            rows.append(row)
    return rows


def _compare_provenance(model, tprov: dict, grid: list[int], specs: list[NormSpec], win: _Windows, *, swap: str,
                        ref_len: int, n_windows: int, opts: dict, quick: bool, seed: int, t_start: float) -> dict:
    """The provenance of :func:`compare_normalizers`' Result (opts: the metric options; t_start: its start)."""
    return provenance(
        experiment="compare_normalizers",
        note=TOLERANCE_NOTE,
        **model.provenance(),
        **tprov,
        lengths=grid,
        swap=swap,
        swap_meaning=SWAP_MEANINGS[swap],
        normalizers=[{"label": s.label, "name": s.name, "params": s.kwargs} for s in specs],
        ssmax=SSMAX_NOTE.format(ref_len=ref_len),
        sa_softmax=SA_SOFTMAX_NOTE,
        metric_window=METRIC_WINDOW_NOTE,
        held_out=HELD_OUT_NOTE.format(n_windows=n_windows, start=HELD_OUT_START),
        cost=COST_NOTES[bool(model.causal and win.native[grid[-1]][1] is not None)],
        jacobian=JACOBIAN_NOTE.format(jac_rows=opts["jac_rows"]),
        n_top=opts["n_top"],
        n_sep=opts["n_sep"],
        max_rows=opts["max_rows"],
        alpha=opts["alpha"],
        critical_n=CRITICAL_N_NOTE.format(**opts),
        quick=quick,
        seed=seed,
        runtime_seconds=round(time.perf_counter() - t_start, 3),
        torch_threads=torch.get_num_threads(),
    )


def compare_normalizers(model, text=None, *, lengths: Optional[Sequence[int]] = None,
                        specs: Optional[Sequence[NormSpec]] = None, swap: str = "all", n_windows: int = N_WINDOWS,
                        n_top: int = N_TOP, n_sep: int = N_SEP, max_rows: Optional[int] = MAX_ROWS_COMPARE,
                        jac_rows: int = JAC_ROWS, alpha: float = ALPHA, crit_max_frac: float = CRIT_MAX_FRAC_COMPARE,
                        crit_step_frac: float = CRIT_STEP_FRAC, ssmax_ref_length: Optional[int] = None,
                        seed: int = 0, quick: bool = False, device: str = "cpu", text_info: Optional[dict] = None,
                        progress: bool = True) -> Result:
    """Swap each normalizer into `model` and measure attention and cost against L (see the module doc).

    swap: "all" (every layer at once; metrics pool every head) or "each" (one layer at a time: rows carry
    `swap` = that layer, metrics are of that layer's heads, the cost is the whole model's).
    quick: lengths (32, 64), one held-out window, 16 rows per head, 4 Jacobian rows (tests).
    Returns Result "compare_normalizers" (or "compare_normalizers_each"), rows: normalizer, family,
    params, swap, L, max_weight, entropy, entropy_norm, weight_sum, dtilde, ns_frac, critical_n,
    critical_n_frac, critical_n_censored, jac_norm_mean, jac_norm_max, jac_rows, jac_method, drift,
    loss, loss_native, loss_delta, seconds.
    A model with sliding-window layers (Gemma 3): one row per layer kind (columns layer_kind, sliding_window), its
    metrics over that kind's heads and the keys each row sees in its layer, its critical N scanned up to a fraction
    of its longest row (min(L, w), which critical_n_frac divides by), `jac_rows` Jacobian rows of that kind; the
    cost columns (drift, loss) are the whole swapped model's, the same on each kind's row; `seconds` shares the
    pass's time between them.
    """
    t_start = time.perf_counter()
    if swap not in ("all", "each"):
        raise ValueError(f"swap must be 'all' or 'each', got {swap!r}")
    check_options(n_top=n_top, n_sep=n_sep, alpha=alpha, max_rows=max_rows, lengths=lengths)   # as diagnose's
    check_int(n_windows, "n_windows", low=1)
    check_int(jac_rows, "jac_rows", low=1)
    if quick:
        lengths = lengths or (32, 64)
        n_windows, max_rows, jac_rows = 1, min(max_rows or 16, 16), min(jac_rows, 4)
    model = as_attn_model(model, device)
    text, tprov = resolve_text(text)
    tprov = {**tprov, **(text_info or {})}
    grid = check_lengths(model, text, lengths, min_length=max(n_top, n_sep))
    ref_len = int(ssmax_ref_length or grid[0])
    specs = list(specs) if specs is not None else default_specs(ref_len)
    win = _windows(model, text, grid, n_windows, swap)
    opts = dict(n_top=n_top, n_sep=n_sep, max_rows=max_rows, jac_rows=jac_rows, alpha=alpha,
                crit_max_frac=crit_max_frac, crit_step_frac=crit_step_frac)
    targets = ["all"] if swap == "all" else list(range(model.n_layers))
    rows = []
    total = len(targets) * len(specs) * len(win.lengths)
    bar = progress_bar(range(total), progress, f"compare {model.name}", total=total)
    it = iter(bar)
    for target in targets:
        for sp in specs:
            fn = sp.fn()
            for Lpass in win.lengths:
                next(it, None)
                rows += _pass_rows(model, sp, fn, target, Lpass, grid, win, tprov.get("text_sha256"), opts, seed)
    close = getattr(bar, "close", None)
    if close:
        close()
    order = [s.label for s in specs]
    rows.sort(key=lambda r: (-1 if r["swap"] == "all" else r["swap"], order.index(r["normalizer"]), r["L"]))
    prov = _compare_provenance(model, tprov, grid, specs, win, swap=swap, ref_len=ref_len, n_windows=n_windows,
                               opts=opts, quick=quick, seed=seed, t_start=t_start)
    name = "compare_normalizers" if swap == "all" else "compare_normalizers_each"
    return Result(name, rows, prov)


def _metric_row(sp: NormSpec, trace, L: int, weights: dict, *, n_top, n_sep, max_rows, jac_rows, alpha,
                crit_max_frac, crit_step_frac, seed) -> dict:
    """Model-level (mean over the trace's heads) metrics of one swapped trace at length L (its layers of one kind);
    weights: its `row_weights` [layer, head, L]."""
    vis = trace.visible()
    longest = int(vis[L - 1].sum())                      # L; min(L, w) in a sliding layer
    ns = critical_grid(longest, n_top=n_top, max_frac=crit_max_frac, step_frac=crit_step_frac)
    ps, vs = sample_view(trace.probs, vis, row_sample(L, max_rows))
    crit, d = grid_critical_n(ps, trace.v, vs, ns, n_top, longest, alpha)
    jn, method = jacobian_norms(sp, trace, jacobian_sample(trace, jac_rows, seed))
    return {
        "normalizer": sp.label,
        "family": sp.name,
        "params": json.dumps(sp.kwargs, sort_keys=True),
        "L": L,
        **{k: _nanmean(weights[k].mean(-1)) for k in ("max_weight", "entropy", "weight_sum")},
        "entropy_norm": _nanmean(torch.nanmean(weights["entropy_norm"], dim=-1)),
        "dtilde": _nanmean(d[..., -1]),                                # d~ at N = n_top, the last column
        "ns_frac": _nanmean(mean_separability(ps, trace.v, n_sep, vs)),
        "critical_n": crit["critical_n"],
        "critical_n_frac": crit["critical_n_frac"],
        "critical_n_censored": crit["critical_n_censored"],
        "critical_n_max": crit["critical_n_max"],
        "jac_norm_mean": _nanmean(jn),
        "jac_norm_max": float(jn.max()) if len(jn) else float("nan"),
        "jac_rows": int(len(jn)),
        "jac_method": method,
    }


def grid_critical_n(probs, x, visible, ns: Sequence[int], n_top: int, L: int, alpha: float) -> tuple[dict, np.ndarray]:
    """`pooled_critical_n` on the grid ns of the rows probs [..., Q, K] (vectors x [..., K, D], visible [Q, K])
    and the per-head d~ [..., k] at the grid's first k values of N (the last is n_top), for less work, same
    numbers: the grid up to n_top is computed exactly (`distance_heads`; a value at N depends only on the
    grid up to N); beyond it, the brackets of the incremental scan (`critical_n.RunningTopN`) certify the
    KS rejections (p <= alpha / 2 whatever the exact values), and only if one is not certified is the
    whole grid computed exactly."""
    k = list(ns).index(n_top) + 1
    d, e = distance_heads(probs, x, visible, ns[:k])
    crit = pooled_critical_n(d, e, ns[:k], L, alpha)
    rest = list(ns[k:])
    if rest and crit["critical_n_censored"] and crit["critical_n_testable"]:
        certified = {}
        if cpu_kernels(probs) is not None:
            scan = RunningTopN(probs, x, visible, rest[-1])
            hm = brackets_for(scan.brackets(list(range(1, rest[-1] + 1))), "b")
            cols = [n - 1 for n in rest]
            certified = certified_rejections(*(hm[b][:, cols] for b in ("d_lo", "d_hi", "e_lo", "e_hi")), rest, alpha)
        if len(certified) < len(rest):
            crit = pooled_critical_n(*distance_heads(probs, x, visible, ns), ns, L, alpha)
    return {**crit, "critical_n_max": int(max(ns))}, d
