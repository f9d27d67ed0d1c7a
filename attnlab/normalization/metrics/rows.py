"""Per-row statistics of arXiv 2508.17821's Fig. 1 (vanishing attention): entropy, max weight, log
weights, and the Lemma 1 / Corollary 1 bands of every row."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from attnlab.core.verdicts import holds_le
from attnlab.normalization import bounds
from attnlab.normalization.metrics.engine import (
    blocks,
    check_inputs,
    cpu_kernels,
    last_keys,
    row_lengths,
    span_blocks,
    visible_scores,
)

# elements of one [heads, rows, K] block of `row_summary`: its float32 temporaries (1 MiB each) stay in a
# core's L2 cache between passes (at MiniLM's L = 512, 8.4 ms per layer against 11-14 ms with 1 << 20)
ROW_CHUNK = 1 << 18


def entropy(probs: torch.Tensor, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Shannon entropy (nats) of each row over its visible keys, [..., Q] float64 (0 log 0 = 0)."""
    vis = check_inputs(probs, None, visible)
    a = probs.double() * vis
    return -(torch.special.xlogy(a, a)).sum(-1)


def max_weight(probs: torch.Tensor, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Largest visible weight of each row, [..., Q]."""
    vis = check_inputs(probs, None, visible)
    return probs.double().masked_fill(~vis, float("-inf")).amax(-1)


def log_weights(scores: torch.Tensor, T: float = 1.0, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log softmax(scores / T) over the visible keys (exact even where the weight underflows), [..., Q, K]
    float64, -inf on invisible keys."""
    bounds.check_T(T)
    vis = visible_scores(scores, visible)
    return torch.log_softmax((scores.double() / T).masked_fill(~vis, float("-inf")), dim=-1)


def log_f32(p: torch.Tensor) -> torch.Tensor:
    """Natural log, elementwise, of a float32 tensor (log 0 = -inf, silently). On CPU with the kernels on,
    numpy's SIMD log (max error 4 ulp; 3x torch's float32 log on AVX-512), else torch's."""
    if cpu_kernels(p) is None or p.dtype != torch.float32 or p.requires_grad:
        return torch.log(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        return torch.from_numpy(np.log(p.numpy()))


def _block_stats(S: torch.Tensor, P: torch.Tensor, Qv: torch.Tensor, Kv: torch.Tensor, scaling: float,
                 vis: torch.Tensor, chunk: int, checked: bool) -> Optional[dict[str, torch.Tensor]]:
    """row_summary's pass over scores / probs S, P [B, Q, K] (q Qv [B, Q, D], k Kv [B, K, D] float32), block by
    block: per row max_weight, entropy, score_min / score_max / neg_log_sum (-log sum_i exp(s_i - max)) over the
    visible keys (vis bool [Q, K]), logit_err; each [B, Q] float64. Causal rows: each block leaves out the keys
    none of its rows sees (`span_blocks`). checked=False (every weight finite, no score NaN or +inf): None as
    soon as a block has a -inf score on a visible key (or a row with no visible key)."""
    inf = float("inf")
    keys = ("max_weight", "entropy", "score_min", "score_max", "neg_log_sum", "logit_err")
    parts = {key: [] for key in keys}                                   # blocks in order: heads, then rows
    for bs, qs, kmax in span_blocks(*S.shape, chunk, last_keys(vis)):
        v = vis[qs, :kmax]
        sc, p = S[bs, qs, :kmax].float(), P[bs, qs, :kmax].float()       # [b, q, k]
        masked = not bool(v.all())
        if masked:
            sc, p = torch.where(v, sc, -inf), torch.where(v, p, 0.0)
        hi, lo = sc.amax(-1), (torch.where(v, sc, inf) if masked else sc).amin(-1)
        if not checked and not (bool(torch.isfinite(hi).all()) and bool(torch.isfinite(lo).all())):
            return None
        # log sum_i exp(s_i - max) over visible keys: ATen's fused log_softmax (float32, exp to 2 ulp, sum in
        # float32; log weights within 3.7e-7 of the float64 oracle on every row of MiniLM at L = 512 and the GPT-2
        # shape at L = 1024; half the time of a separate exp pass) has its negative as its largest entry
        nls = torch.log_softmax(sc, -1).amax(-1)
        # p log p in float32 (a few ulp per term; 0 log 0 = 0 * -inf = NaN is left out by nansum, and only
        # it: probs are finite), summed in float32 per row
        plogp = log_f32(p).mul_(p).nansum(-1)
        # |scaling q.k - score| in float32, like the model's own logits (rounding ~1e-7 of |score|,
        # far below the 1e-3 the claims test; masked keys: +inf, then 0)
        err = torch.baddbmm(sc, Qv[bs, qs], Kv[bs, :kmax].transpose(-1, -2), beta=-1, alpha=scaling).abs_()
        if masked:
            err = torch.where(v, err, 0.0)
        vals = {"max_weight": p.amax(-1), "entropy": plogp.neg_(), "score_min": lo, "score_max": hi,
                "neg_log_sum": nls, "logit_err": err.amax(-1)}
        for key in keys:
            parts[key].append(vals[key].reshape(-1))
    return {key: torch.cat(parts[key]).double().reshape(S.shape[:2]) for key in keys}


def row_summary(scores: torch.Tensor, probs: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scaling: float,
                visible: Optional[torch.Tensor] = None, *, chunk: int = ROW_CHUNK) -> dict[str, torch.Tensor]:
    """Fig. 1 per-row quantities, each [..., Q] float64:

    max_weight, entropy, entropy_norm (H / log L_t), log_min_w / log_max_w (natural-log extreme
    weights from the scores, exact under underflow), cor1_lo / cor1_hi (log Corollary-1 band with
    T = 1/scaling, Delta = ||q_t|| max_i ||k_i||), lemma1_lo / lemma1_hi (log Lemma-1 band for
    softmax with a = max_i |scores_i|, i.e. C = exp(-+2a)), L (row length), logit_err (max |scores -
    scaling q.k| over the row, recomputed in float32 like the model's logits: ~1e-7 |score| when
    Corollary 1 applies to them, far larger when the model adds position biases).
    """
    vis = check_inputs(probs, None, visible, values=False)
    if not isinstance(scores, torch.Tensor) or scores.shape != probs.shape:
        raise ValueError(f"scores {tuple(getattr(scores, 'shape', ()))} must have the shape of probs "
                         f"{tuple(probs.shape)}")
    if q.shape[:-1] != probs.shape[:-1] or k.shape[:-1] != probs.shape[:-2] + probs.shape[-1:]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} do not match probs {tuple(probs.shape)}")
    lead, Q, K = probs.shape[:-2], probs.shape[-2], probs.shape[-1]
    S, P = scores.reshape(-1, Q, K), probs.reshape(-1, Q, K)
    Qv, Kv = q.reshape(-1, Q, q.shape[-1]).float(), k.reshape(-1, K, k.shape[-1]).float()
    B = S.shape[0]
    # one reduction over each tensor finds any bad value (probs: one not finite; scores: NaN or +inf, masked keys
    # included); then the visible keys as given, with a -inf score on one of them found block by block while the
    # block is in cache (a separate pass to find the mask costs ~10% of the whole). At a bad value or such a -inf,
    # the full checks, which name the bad value, and the keys the scores mask left out too
    top = S.amax() if S.numel() else torch.zeros(())
    clean = bool(torch.isfinite(P.sum())) and not bool(torch.isnan(top)) and float(top) < float("inf")
    out = _block_stats(S, P, Qv, Kv, scaling, vis, chunk, checked=False) if clean else None
    if out is None:
        vis = check_inputs(probs, None, visible) & visible_scores(scores, visible)
        out = _block_stats(S, P, Qv, Kv, scaling, vis, chunk, checked=True)
    Lt_all = row_lengths(vis).double()                                   # [Q]
    delta_all = bounds.corollary1_delta(Qv, Kv, vis)                    # ||q_t|| max_i ||k_i|| [B, Q]
    Lt = Lt_all.cpu().expand(B, Q)
    ent, nls, lo, hi = out.pop("entropy"), out.pop("neg_log_sum"), out.pop("score_min"), out.pop("score_max")
    logL = Lt.log()
    amax = torch.maximum(hi.abs(), lo.abs())                             # max_i |score_i| over visible keys
    out.update(entropy=ent, entropy_norm=torch.where(Lt > 1, ent / logL.clamp_min(1e-300), torch.zeros_like(ent)),
               log_min_w=(lo - hi) + nls, log_max_w=nls, lemma1_lo=-logL - 2 * amax, lemma1_hi=-logL + 2 * amax,
               L=Lt.clone())
    out["cor1_lo"], out["cor1_hi"] = bounds.corollary1_log_band(Lt, delta_all.cpu(), 1.0 / scaling)
    return {key: t.reshape(*lead, Q) for key, t in out.items()}


def temperature_row_stats(scores: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scaling: float, tau: float,
                          visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chapter 1's sliders: the model's attention at `tau` times its own temperature. For every
    (layer, head, row) of scores [layer, head, Q, K] (q [layer, head, Q, D], k [layer, head, K, D],
    visible bool [Q, K]): the largest weight of softmax(scores / tau), its entropy / log L_t, and
    whether every weight lies in the Corollary 1 band at T = tau / scaling (on the raw logits q.k).
    Returns three [layer, head, Q] tensors (float64, float64, bool), computed a block of ROW_CHUNK elements
    at a time (float64 temporaries of a whole layer cost more in page faults than the arithmetic). The scores are
    checked once (`visible_scores`), not block by block as `log_weights` and `entropy` would: the same numbers
    (chapter 1's frames of SmolLM2, L = 128-1024 at four temperatures: 20.4 s -> 15.2 s)."""
    bounds.check_T(tau)
    vis = visible.to(torch.bool)
    finite = visible_scores(scores, vis)              # the keys log_weights keeps: visible, and a finite score
    Lt = vis.sum(-1).double()
    lo, hi = bounds.corollary1_log_band(Lt, bounds.corollary1_delta(q, k, vis), tau / scaling)
    lead, Q, K = scores.shape[:-2], scores.shape[-2], scores.shape[-1]
    S, lo, hi = scores.reshape(-1, Q, K), lo.reshape(-1, Q), hi.reshape(-1, Q)
    mw = torch.empty(S.shape[:2], dtype=torch.float64, device=scores.device)
    hn, inside = torch.empty_like(mw), torch.empty(S.shape[:2], dtype=torch.bool, device=scores.device)
    log_len = Lt.log().clamp_min(1e-12)
    for bs, qs in blocks(S.shape[0], Q, K, ROW_CHUNK):
        v = vis[qs]
        lw = torch.log_softmax((S[bs, qs].double() / tau).masked_fill(~finite[qs], float("-inf")), dim=-1)
        p = lw.exp()                                                     # (log_weights' numbers)
        mw[bs, qs] = p.amax(-1)
        a = p * v                                                        # (entropy's numbers)
        hn[bs, qs] = -(torch.special.xlogy(a, a)).sum(-1) / log_len[qs]
        b_lo, b_hi = lo[bs, qs], hi[bs, qs]
        scale = Lt[qs].log() + (b_hi - b_lo) / 2                         # the terms -log L -+ 2 Delta / T
        inside[bs, qs] = holds_le(b_lo, lw.masked_fill(~v, 0).amin(-1), scale) & holds_le(lw.amax(-1), b_hi, scale)
    return mw.reshape(*lead, Q), hn.reshape(*lead, Q), inside.reshape(*lead, Q)
