"""Per-row statistics of arXiv 2508.17821's Fig. 1 (vanishing attention): entropy, max weight, log
weights, and the Lemma 1 / Corollary 1 bands of every row."""
from __future__ import annotations

from typing import Optional

import torch

from attnlab.normalization import bounds
from attnlab.normalization.engine import DEFAULT_CHUNK, blocks, check_inputs, prefix_lengths, visible_scores


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



def _row_max(values: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    """max over each row's visible keys of per-key values: values [b, K], vis [q, K] -> [b, q]
    (-inf for rows with no visible key). O(K) per head for prefix-shaped visibility."""
    n = prefix_lengths(vis)
    if n is not None:
        cm = torch.cummax(values, dim=-1).values
        return torch.where(n > 0, cm[:, (n - 1).clamp_min(0)], float("-inf"))
    return values.unsqueeze(1).masked_fill(~vis, float("-inf")).amax(-1)


def row_summary(scores: torch.Tensor, probs: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scaling: float,
                visible: Optional[torch.Tensor] = None, *, chunk: int = DEFAULT_CHUNK) -> dict[str, torch.Tensor]:
    """Fig. 1 per-row quantities, each [..., Q] float64:

    max_weight, entropy, entropy_norm (H / log L_t), log_min_w / log_max_w (natural-log extreme
    weights from the scores, exact under underflow), cor1_lo / cor1_hi (log Corollary-1 band with
    T = 1/scaling, Delta = ||q_t|| max_i ||k_i||), lemma1_lo / lemma1_hi (log Lemma-1 band for
    softmax with a = max_i |scores_i|, i.e. C = exp(-+2a)), L (row length), logit_err (max |scores -
    scaling q.k| over the row, recomputed in float32 like the model's logits: ~1e-7 |score| when
    Corollary 1 applies to them, far larger when the model adds position biases).
    """
    vis = check_inputs(probs, None, visible) & visible_scores(scores, visible)
    if q.shape[:-1] != probs.shape[:-1] or k.shape[:-1] != probs.shape[:-2] + probs.shape[-1:]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} do not match probs {tuple(probs.shape)}")
    lead, Q, K = probs.shape[:-2], probs.shape[-2], probs.shape[-1]
    S, P = scores.reshape(-1, Q, K), probs.reshape(-1, Q, K)
    Qv, Kv = q.reshape(-1, Q, q.shape[-1]).float(), k.reshape(-1, K, k.shape[-1]).float()
    B = S.shape[0]
    masked = not bool(vis.all())
    Lt_all = vis.sum(-1).double()                                        # [Q]
    delta_all = Qv.double().norm(dim=-1) * _row_max(Kv.double().norm(dim=-1), vis)   # ||q_t|| max_i ||k_i|| [B, Q]
    inf = float("inf")
    keys = ("max_weight", "entropy", "score_min", "score_max", "lse", "logit_err")
    out = {key: torch.empty(B, Q, dtype=torch.float64) for key in keys}
    for bs, qs in blocks(B, Q, K, chunk):
        v = vis[qs]
        sc = S[bs, qs].float()                                           # [b, q, K]
        if masked:
            sc = torch.where(v, sc, -inf)
        hi = sc.amax(-1, keepdim=True)
        lo = (torch.where(v, sc, inf) if masked else sc).amin(-1)
        # log-sum-exp over visible keys: exp in float32 (terms that matter have |score - max| < ~30,
        # rounding ~1e-7 relative), sum in float64
        lse = hi.squeeze(-1).double() + torch.sub(sc, hi).exp_().sum(-1).double().log_()
        p = P[bs, qs].float()
        if masked:
            p = torch.where(v, p, 0.0)
        # -p log p in float32 (1 ulp per term; 0 log 0 = 0), summed in float64
        plogp = torch.log(p.clamp_min(1e-45)).mul_(p).sum(-1).double()
        # |scaling q.k - score| in float32, like the model's own logits (rounding ~1e-7 of |score|,
        # far below the 1e-3 the claims test; masked keys: +inf, then 0)
        err = torch.baddbmm(sc, Qv[bs, qs], Kv[bs].transpose(-1, -2), beta=-1, alpha=scaling).abs_()
        if masked:
            err = torch.where(v, err, 0.0)
        vals = {"max_weight": p.amax(-1), "entropy": -plogp, "score_min": lo, "score_max": hi.squeeze(-1),
                "lse": lse, "logit_err": err.amax(-1)}
        for key in keys:
            out[key][bs, qs] = vals[key].cpu().double()
    Lt = Lt_all.cpu().expand(B, Q)
    ent, lse, lo, hi = out.pop("entropy"), out.pop("lse"), out.pop("score_min"), out.pop("score_max")
    logL = Lt.log()
    amax = torch.maximum(hi.abs(), lo.abs())                             # max_i |score_i| over visible keys
    out.update(entropy=ent, entropy_norm=torch.where(Lt > 1, ent / logL.clamp_min(1e-300), torch.zeros_like(ent)),
               log_min_w=lo - lse, log_max_w=hi - lse, lemma1_lo=-logL - 2 * amax, lemma1_hi=-logL + 2 * amax,
               L=Lt.clone())
    out["cor1_lo"], out["cor1_hi"] = bounds.corollary1_log_band(Lt, delta_all.cpu(), 1.0 / scaling)
    return {key: t.reshape(*lead, Q) for key, t in out.items()}


def temperature_row_stats(scores: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scaling: float, tau: float,
                          visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chapter 1's sliders: the model's attention at `tau` times its own temperature. For every
    (layer, head, row) of scores [layer, head, Q, K] (q [layer, head, Q, D], k [layer, head, K, D],
    visible bool [Q, K]): the largest weight of softmax(scores / tau), its entropy / log L_t, and
    whether every weight lies in the Corollary 1 band at T = tau / scaling (on the raw logits q.k).
    Returns three [layer, head, Q] tensors (float64, float64, bool); one layer at a time in memory."""
    bounds.check_T(tau)
    vis = visible.to(torch.bool)
    Lt = vis.sum(-1).double()
    lo, hi = bounds.corollary1_log_band(Lt, bounds.corollary1_delta(q, k, vis), tau / scaling)
    mw, hn, inside = [], [], []
    for li in range(scores.shape[0]):
        lw = log_weights(scores[li], tau, vis)
        p = lw.exp()
        mw.append(p.amax(-1))
        hn.append(entropy(p, vis) / Lt.log().clamp_min(1e-12))
        inside.append((lw.masked_fill(~vis, 0).amin(-1) >= lo[li] - 1e-9) & (lw.amax(-1) <= hi[li] + 1e-9))
    return torch.stack(mw), torch.stack(hn), torch.stack(inside)
