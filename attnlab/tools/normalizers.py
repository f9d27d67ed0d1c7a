"""Attention normalizers with one signature, and their Jacobians.

    normalize(scores[..., K], visible[..., K] | None, **params) -> weights[..., K]

`scores` are the scaled logits of a row (`scaling * q.k`); `visible` (bool, broadcastable) marks the keys a
row may attend to (causal mask, padding). Masked keys get weight exactly 0; a row with no visible key
gets all zeros. Every normalizer takes a temperature T > 0 (scores are divided by T first). Weights sum to 1
over the visible keys for the normalizers of `SUMS_TO_ONE`; SA-Softmax, softpick and sigmoid attention do not, by
their papers' definitions.

Sparsemax and entmax come from the `entmax` library (deep-spin), wrapped for masking and float32.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Optional

import torch
from entmax import entmax15, entmax_bisect, sparsemax

from attnlab.core.util import last_visible

Normalizer = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]
TOPK = 16             # sparsemax / 1.5-entmax sort at least each row's top 16 (the library doubles it where needed)
MIN_BLOCK_ROWS = 64   # `row_blocks`: at least this many query rows per block
MAX_BLOCKS = 16       # and at most this many blocks


def _no_overflow(t: torch.Tensor, what: str) -> torch.Tensor:
    """`t`, or a ValueError where finite scores overflowed on the way (the weights would be NaN)."""
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{what} overflow {str(t.dtype).replace('torch.', '')}: the scores are finite but too "
                         "large for this normalizer; scale them down")
    return t


def _prepare(scores: torch.Tensor, visible: Optional[torch.Tensor], T: float):
    """Validate; return float32 scores / T, the visible mask (bool, broadcastable to the scores) and rows
    with any visible key [..., 1]. All-finite scores (a model's raw scores) cost one check and no copy."""
    if not isinstance(scores, torch.Tensor) or scores.ndim < 1:
        raise ValueError("scores must be a tensor [..., keys]")
    if not (isinstance(T, (int, float)) and math.isfinite(T) and T > 0):
        raise ValueError(f"temperature T must be a finite number > 0, got {T!r}")
    z = scores if scores.dtype == torch.float64 else scores.float()  # float32 unless given float64
    if visible is None:
        visible = z > float("-inf")
    else:
        visible = visible.to(torch.bool)
        torch.broadcast_shapes(visible.shape, z.shape)                 # a mask that does not fit fails here
    if not bool(torch.isfinite(z.sum())):           # a finite sum: every score is finite (one cheap pass)
        if torch.isnan(z).any() or bool((z == float("inf")).any()):
            bad = (torch.isnan(z) | (z == float("inf"))).nonzero()[0].tolist()
            raise ValueError(f"scores have NaN or +inf at position {tuple(bad)}: a masked key must be -inf")
        if torch.isinf(z[torch.broadcast_to(visible, z.shape)]).any():
            raise ValueError("visible scores must be finite (use `visible` to mask keys, not -inf)")
        z = torch.where(visible, z, torch.zeros((), dtype=z.dtype))
    return (z if T == 1 else _no_overflow(z / T, "scores / T")), visible, visible.any(dim=-1, keepdim=True)


def softmax(scores: torch.Tensor, visible: Optional[torch.Tensor] = None, *, T: float = 1.0) -> torch.Tensor:
    """exp(z_i/T) / sum_j exp(z_j/T) over visible keys. Stable for T down to 1e-4 (max-subtracted)."""
    z, visible, any_row = _prepare(scores, visible, T)
    # in place only on a tensor of our own (never on the caller's scores)
    z = z.masked_fill(~visible, float("-inf")) if z is scores else z.masked_fill_(~visible, float("-inf"))
    if bool(any_row.all()):                     # exp(-inf) = 0: masked keys get exactly 0 already
        return torch.softmax(z, dim=-1)
    return torch.softmax(z.masked_fill(~any_row, 0.0), dim=-1) * visible * any_row


def row_blocks(visible: torch.Tensor, n_rows: int, n_keys: int) -> list[tuple[slice, int]]:
    """(query rows, key width) blocks covering the rows of a mask visible (broadcastable to [..., Q, K]):
    the visible keys of a block's rows all lie in [0, width). A causal mask gives widths that grow with
    the rows (about half the keys in all); a mask whose rows all see their last key gives one block."""
    vis = visible if visible.ndim >= 2 else visible[None]
    vis = torch.broadcast_to(vis.reshape(-1, *vis.shape[-2:]).any(0), (n_rows, n_keys))   # [Q, K]: seen by any
    last = last_visible(vis)                                                            # [Q]
    if bool((last == n_keys).all()):
        return [(slice(0, n_rows), n_keys)]
    size = max(MIN_BLOCK_ROWS, -(-n_rows // MAX_BLOCKS))
    return [(slice(a, min(a + size, n_rows)), max(1, int(last[a:a + size].max()))) for a in range(0, n_rows, size)]


def _entmax_family(fn, alpha: float, scores, visible, T, **kw) -> torch.Tensor:
    """fn (a sparse normalizer of the entmax library) over the visible keys, row block by row block
    (`row_blocks`: a causal row is not sorted over the keys it cannot see). With a partial sort (`k`
    in kw), each block sorts the top max(k, 2 x the previous block's median support) keys of its rows
    (exact whatever k: the library doubles k for the rows whose support fills it)."""
    z, visible, _ = _prepare(scores, visible, T)
    if z.ndim < 2:
        return _entmax_rows(fn, alpha, z, visible, kw)
    blocks = row_blocks(visible, *z.shape[-2:])
    if len(blocks) == 1:
        return _entmax_rows(fn, alpha, z, visible, kw)
    out = z.new_zeros(z.shape)
    for rows, width in blocks:
        vis = torch.broadcast_to(visible, z.shape)[..., rows, :width]
        y = _entmax_rows(fn, alpha, z[..., rows, :width], vis, kw)
        if kw.get("k"):
            kw = {**kw, "k": max(kw["k"], 2 * int((y > 0).sum(-1).median()))}
        out[..., rows, :width] = y
    return out


def _entmax_rows(fn, alpha: float, z: torch.Tensor, visible: torch.Tensor, kw: dict) -> torch.Tensor:
    """fn over the last axis of z [..., K], masked keys set below every row's threshold, then 0."""
    # A masked key must fall below the threshold tau >= (alpha-1) z_max - 1, i.e. z <= z_max - 1/(alpha-1).
    z_max = z.masked_fill(~visible, float("-inf")).amax(dim=-1, keepdim=True)
    fill = (z_max.masked_fill(z_max == float("-inf"), 0.0) - 1.0 / (alpha - 1.0) - 1.0).detach()
    return fn(torch.where(visible, z, fill), dim=-1, **kw) * visible


def sparsemax_(scores, visible=None, *, T: float = 1.0) -> torch.Tensor:
    """Sparsemax (Martins & Astudillo 2016): Euclidean projection of z/T onto the simplex; exact zeros."""
    return _entmax_family(sparsemax, 2.0, scores, visible, T, k=TOPK)


def entmax(scores, visible=None, *, alpha: float = 1.5, T: float = 1.0, method: str = "auto") -> torch.Tensor:
    """alpha-entmax (Peters et al. 2019): alpha=1 softmax, 1.5 the common choice, 2 sparsemax.

    method: "sort" (exact, sort-based; alpha in {1.5, 2} only), "bisect" (any alpha > 1), or "auto"
    (where it exists, the same exact algorithm sorting only each row's largest keys, `_entmax_family`;
    else bisection).
    """
    if not (isinstance(alpha, (int, float)) and alpha >= 1):
        raise ValueError(f"entmax alpha must be >= 1, got {alpha!r}")
    if alpha == 1:
        return softmax(scores, visible, T=T)
    exact = {1.5: entmax15, 2.0: sparsemax}
    if method not in ("auto", "sort", "bisect"):
        raise ValueError(f"method must be auto, sort or bisect, got {method!r}")
    if method == "sort" and alpha not in exact:
        raise ValueError(f"no exact sort-based entmax for alpha={alpha}; use method='bisect'")
    if method != "bisect" and alpha in exact:
        return _entmax_family(exact[alpha], alpha, scores, visible, T, k=TOPK if method == "auto" else None)
    return _entmax_family(partial(entmax_bisect, alpha=alpha), alpha, scores, visible, T)


def ssmax(scores, visible=None, *, s: Optional[float] = None, ref_length: int = 512, T: float = 1.0) -> torch.Tensor:
    """Scalable-Softmax (Nakanishi 2025): softmax(s * log(n) * z), n = the row's own visible length.

    A causal row t scales by log t, not log L. Without `s`, s = 1/log(ref_length), so that a row of
    `ref_length` visible keys gets exactly the native softmax.
    """
    if s is None:
        if ref_length < 2:
            raise ValueError("ref_length must be >= 2")
        s = 1.0 / math.log(ref_length)
    z, visible, any_row = _prepare(scores, visible, T)
    n = visible.sum(dim=-1, keepdim=True).clamp(min=1).float()
    return softmax(_no_overflow(z * (s * torch.log(n)), "scores * s log n"), visible)


def sa_softmax(scores, visible=None, *, variant: str = "normalized", T: float = 1.0) -> torch.Tensor:
    """Self-Adjust Softmax (Zheng et al. 2025). Faithful to the paper, the weights need not sum to 1.

    variant "plain":      z * softmax(z)   (can be negative)
    variant "normalized": (z - min(z_min, 0)) / (max(0, z_max) - min(z_min, 0)) * softmax(z)   (in [0, 1])
    with z_min, z_max over the row's visible keys.
    """
    z, visible, any_row = _prepare(scores, visible, T)
    p = softmax(z, visible)
    if variant == "plain":
        return z * p
    if variant != "normalized":
        raise ValueError(f"SA-Softmax variant must be 'plain' or 'normalized', got {variant!r}")
    lo = z.masked_fill(~visible, float("inf")).amin(dim=-1, keepdim=True).clamp(max=0.0)
    hi = z.masked_fill(~visible, float("-inf")).amax(dim=-1, keepdim=True).clamp(min=0.0)
    lo, hi = lo.masked_fill(~any_row, 0.0), hi.masked_fill(~any_row, 1.0)
    _no_overflow(hi - lo, "the scores' range")
    return (z - lo).div_((hi - lo).clamp(min=1e-12)).mul_(p)        # (z - lo) / (hi - lo) * p, one new tensor


SOFTPICK_EPS = 1e-8       # softpick's eps (the authors' code: added to the max-shifted denominator)


def softpick(scores, visible=None, *, eps: float = SOFTPICK_EPS, T: float = 1.0) -> torch.Tensor:
    """Softpick (Zuhri et al. 2025, arXiv:2504.20966): ReLU(e^z_i - 1) / (sum_j |e^z_j - 1| + eps) over the
    visible keys (z = scores / T). Not sum-to-one: a row sums to P / (P + N) <= 1 (P, N: the masses of its
    positive and negative scores) and is all zeros when every score is <= 0.

    Numerically stable form (the paper's, with m clamped at 0 here): m = max(the row's largest visible score, 0),
    e^z - 1 = e^m (e^(z-m) - e^-m), so weight_i = ReLU(e^(z_i-m) - e^-m) / (sum_j |e^(z_j-m) - e^-m| + eps).
    The eps is added after the shift, as in the code released with the paper: it differs from the formula's by
    the factor e^-m, which matters only when no visible score is positive enough to outweigh it [R: the place
    of eps is read from the code, not from the typeset formula].
    """
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"softpick eps must be a finite number > 0, got {eps!r}")
    z, visible, _ = _prepare(scores, visible, T)
    # m >= every visible score and >= 0: e^(z-m) <= 1 and e^-m <= 1 never overflow (a row whose scores are all
    # <= 0 is shifted by 0, and its weights are exactly 0)
    m = z.masked_fill(~visible, float("-inf")).amax(dim=-1, keepdim=True).clamp(min=0.0)
    shifted = (torch.exp(z - m) - torch.exp(-m)).masked_fill(~visible, 0.0)     # (e^z - 1) e^-m
    return torch.relu(shifted) / (shifted.abs().sum(dim=-1, keepdim=True) + eps)


def sigmoid_attention(scores, visible=None, *, bias: Optional[float] = None, T: float = 1.0) -> torch.Tensor:
    """Sigmoid attention (Ramapuram et al. 2024, arXiv:2409.04431): sigmoid(z_i + b) on each visible key, no
    normalization over the row (weights need not sum to 1). b = -log n by default, the paper's choice, with n
    read here as the row's own number of visible keys (a causal row t: n = t + 1) [R: the paper's n is the
    sequence length of a trained model; per row it makes a row of n equal scores 0 sum to n / (n + 1)]; `bias`
    fixes b instead."""
    z, visible, _ = _prepare(scores, visible, T)
    if bias is None:
        b = -torch.log(visible.sum(dim=-1, keepdim=True).clamp(min=1).to(z.dtype))
    elif isinstance(bias, (int, float)) and math.isfinite(bias):
        b = float(bias)
    else:
        raise ValueError(f"sigmoid attention bias must be a finite number or None (-log n), got {bias!r}")
    return torch.sigmoid(z + b) * visible


NORMALIZERS: dict[str, Callable[..., torch.Tensor]] = {
    "softmax": softmax,
    "sparsemax": sparsemax_,
    "entmax15": partial(entmax, alpha=1.5),
    "entmax": entmax,
    "ssmax": ssmax,
    "sa_softmax": sa_softmax,
    "softpick": softpick,
    "sigmoid": sigmoid_attention,
}
SUMS_TO_ONE = {"softmax", "sparsemax", "entmax15", "entmax", "ssmax"}


def get_normalizer(name: str, **params) -> Normalizer:
    """`get_normalizer("softmax", T=0.5)` -> f(scores, visible). Parameters are checked at once."""
    if name not in NORMALIZERS:
        raise ValueError(f"unknown normalizer {name!r}; choose one of {', '.join(NORMALIZERS)}")
    fn = partial(NORMALIZERS[name], **params)
    fn(torch.zeros(1, 2))  # fail early on bad parameters
    return fn


def describe(name: str, **params) -> str:
    """Short label, e.g. 'softmax(T=0.5)'."""
    inner = ", ".join(f"{k}={v}" for k, v in params.items())
    return f"{name}({inner})" if inner else name


# ---------------------------------------------------------------- Jacobians

def softmax_jacobian(probs: torch.Tensor, T: float = 1.0) -> torch.Tensor:
    """Analytic softmax Jacobian d a / d l = (diag(a) - a a^T) / T.  probs [..., K] -> [..., K, K]."""
    return (torch.diag_embed(probs) - probs.unsqueeze(-1) * probs.unsqueeze(-2)) / T


def jacobian(normalizer: Normalizer, scores: torch.Tensor, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Autograd Jacobian of one row: scores [K] -> [K, K] (row i = d weight_i / d score_j), from one
    backward pass over K copies of the row (copy i carries output i's gradient)."""
    if scores.ndim != 1:
        raise ValueError("jacobian() takes one row of scores [K]")
    K = scores.shape[0]
    z = scores.detach().float().expand(K, K).clone().requires_grad_(True)         # [copy, key]
    with torch.enable_grad():
        weights = normalizer(z, visible)
        (grad,) = torch.autograd.grad(weights.diagonal().sum(), z)
    return grad


def spectral_norm(jac: torch.Tensor) -> torch.Tensor:
    """Largest singular value of [..., K, K] Jacobians (for softmax: symmetric, so eigvalsh)."""
    return torch.linalg.matrix_norm(jac, ord=2)
