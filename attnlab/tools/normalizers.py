"""Attention normalizers with one signature, and their Jacobians.

    normalize(scores[..., K], visible[..., K] | None, **params) -> weights[..., K]

`scores` are the scaled logits of a row (`scaling * q.k`); `visible` (bool, broadcastable) marks the keys a
row may attend to (causal mask, padding). Masked keys get weight exactly 0; a row with no visible key
gets all zeros. Every normalizer takes a temperature T > 0 (scores are divided by T first).

Sparsemax and entmax come from the `entmax` library (deep-spin), wrapped for masking and float32.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Optional

import torch
from entmax import entmax15, entmax_bisect, sparsemax

Normalizer = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


def _prepare(scores: torch.Tensor, visible: Optional[torch.Tensor], T: float):
    """Validate; return float32 scores / T, the visible mask (full shape) and rows with any visible key."""
    if not isinstance(scores, torch.Tensor) or scores.ndim < 1:
        raise ValueError("scores must be a tensor [..., keys]")
    if not (isinstance(T, (int, float)) and math.isfinite(T) and T > 0):
        raise ValueError(f"temperature T must be a finite number > 0, got {T!r}")
    z = scores if scores.dtype == torch.float64 else scores.float()  # float32 unless given float64
    if torch.isnan(z).any() or bool((z == float("inf")).any()):
        bad = (torch.isnan(z) | (z == float("inf"))).nonzero()[0].tolist()
        raise ValueError(f"scores have NaN or +inf at position {tuple(bad)}: a masked key must be -inf")
    if visible is None:
        visible = z > float("-inf")
    else:
        visible = torch.broadcast_to(visible.to(torch.bool), z.shape)
    if torch.isinf(z[visible]).any():
        raise ValueError("visible scores must be finite (use `visible` to mask keys, not -inf)")
    z = torch.where(visible, z, torch.zeros((), dtype=z.dtype)) / T
    return z, visible, visible.any(dim=-1, keepdim=True)


def softmax(scores: torch.Tensor, visible: Optional[torch.Tensor] = None, *, T: float = 1.0) -> torch.Tensor:
    """exp(z_i/T) / sum_j exp(z_j/T) over visible keys. Stable for T down to 1e-4 (max-subtracted)."""
    z, visible, any_row = _prepare(scores, visible, T)
    z = z.masked_fill(~visible, float("-inf")).masked_fill(~any_row, 0.0)
    return torch.softmax(z, dim=-1) * visible * any_row


def _entmax_family(fn, alpha: float, scores, visible, T, **kw) -> torch.Tensor:
    z, visible, any_row = _prepare(scores, visible, T)
    # A masked key must fall below the threshold tau >= (alpha-1) z_max - 1, i.e. z <= z_max - 1/(alpha-1).
    z_max = z.masked_fill(~visible, float("-inf")).amax(dim=-1, keepdim=True).masked_fill(~any_row, 0.0)
    fill = (z_max - 1.0 / (alpha - 1.0) - 1.0).detach()
    z = torch.where(visible, z, fill)
    return fn(z, dim=-1, **kw) * visible * any_row


def sparsemax_(scores, visible=None, *, T: float = 1.0) -> torch.Tensor:
    """Sparsemax (Martins & Astudillo 2016): Euclidean projection of z/T onto the simplex; exact zeros."""
    return _entmax_family(sparsemax, 2.0, scores, visible, T)


def entmax(scores, visible=None, *, alpha: float = 1.5, T: float = 1.0, method: str = "auto") -> torch.Tensor:
    """alpha-entmax (Peters et al. 2019): alpha=1 softmax, 1.5 the common choice, 2 sparsemax.

    method: "sort" (exact, sort-based; alpha in {1.5, 2} only), "bisect" (any alpha > 1), or "auto"
    (sort where it exists, else bisection).
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
        return _entmax_family(exact[alpha], alpha, scores, visible, T)
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
    return softmax(z * (s * torch.log(n)), visible)


def sa_softmax(scores, visible=None, *, variant: str = "normalized", T: float = 1.0) -> torch.Tensor:
    """Self-Adjust Softmax (Zheng et al. 2025). Faithful to the paper, the weights need not sum to 1.

    variant "plain":      z * softmax(z)   (can be negative)
    variant "normalized": (z - min(z_min, 0)) / (max(0, z_max) - min(z_min, 0)) * softmax(z)   (in [0, 1])
    with z_min, z_max over the row's visible keys.
    """
    p = softmax(scores, visible, T=T)
    z, visible, any_row = _prepare(scores, visible, T)
    if variant == "plain":
        return z * p
    if variant != "normalized":
        raise ValueError(f"SA-Softmax variant must be 'plain' or 'normalized', got {variant!r}")
    lo = z.masked_fill(~visible, float("inf")).amin(dim=-1, keepdim=True).clamp(max=0.0)
    hi = z.masked_fill(~visible, float("-inf")).amax(dim=-1, keepdim=True).clamp(min=0.0)
    lo, hi = lo.masked_fill(~any_row, 0.0), hi.masked_fill(~any_row, 1.0)
    return (z - lo) / (hi - lo).clamp(min=1e-12) * p


NORMALIZERS: dict[str, Callable[..., torch.Tensor]] = {
    "softmax": softmax,
    "sparsemax": sparsemax_,
    "entmax15": partial(entmax, alpha=1.5),
    "entmax": entmax,
    "ssmax": ssmax,
    "sa_softmax": sa_softmax,
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
    """Autograd Jacobian of one row: scores [K] -> [K, K] (row i = d weight_i / d score_j)."""
    if scores.ndim != 1:
        raise ValueError("jacobian() takes one row of scores [K]")
    return torch.autograd.functional.jacobian(lambda z: normalizer(z, visible), scores.float())


def spectral_norm(jac: torch.Tensor) -> torch.Tensor:
    """Largest singular value of [..., K, K] Jacobians (for softmax: symmetric, so eigvalsh)."""
    return torch.linalg.matrix_norm(jac, ord=2)
