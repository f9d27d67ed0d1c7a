"""Lemma 2 / Corollary 3 of arXiv 2508.17821 (Fig. 4): the finite-difference Jacobian norm g(T, eps)
of Alg. 5 (directions: `DIRECTIONS`), its exact limit T -> 0 (`fd_grad_limit`) and the exact spectral
norm of the softmax Jacobian, for every row."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.budget import sync_free
from attnlab.normalization import bounds
from attnlab.normalization.metrics import engine
from attnlab.normalization.metrics.engine import (
    DEFAULT_CHUNK,
    blocks,
    check_inputs,
    cpu_kernels,
    key_spans,
    tile_elements,
    visible_scores,
)

#: how the unit direction v of Alg. 5 is drawn (`attnlab.normalization.readings.DIRECTIONS`): z/||z|| over the
#: visible keys with z ~ N(0, I) ("gaussian", the default) or z_i = -+1 ("rademacher")
DIRECTIONS = ("gaussian", "rademacher")
#: float64 elements of one tile of `fd_grad_norms` ([rows, T, eps, keys]): every T and eps of the tile at once; 64 MiB
#: on a GPU, 512 KiB on CPU (ATTNLAB_KERNELS=0), where a tile that leaves the cache made the torch path 6x slower
GRAD_ELEMENTS = {"cpu": 1 << 16, "other": 1 << 23}


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    return direction


def _direction(
    b: int, vis: torch.Tensor, seed: int, Q: Optional[int] = None, rows: slice = slice(None),
    direction: str = "gaussian",
) -> torch.Tensor:
    """Random unit direction over the visible keys of each row, for flattened head index b: [q, K] float64
    for the rows `rows` of the head's Q rows (vis [q, K] their visibility; default all rows). One
    generator per (seed, head): results do not depend on chunking."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(b))
    Q = vis.shape[0] if Q is None else Q
    if direction == "gaussian":
        z = torch.randn(Q, vis.shape[1], generator=g)[rows]                    # float32 draw: 5x faster
    else:
        z = torch.randint(0, 2, (Q, vis.shape[1]), generator=g, dtype=torch.int8)[rows] * 2 - 1
    z = z.to(vis.device, torch.float64) * vis
    n = z.norm(dim=-1, keepdim=True)
    return torch.where(n > 0, z / n.clamp_min(1e-300), z)


def random_directions(lead: Sequence[int], visible: torch.Tensor, seed: int = 0,
                      direction: str = "gaussian") -> torch.Tensor:
    """Seeded random unit directions over the visible keys, [*lead, Q, K] float64 (v of Alg. 5)."""
    check_direction(direction)
    B = int(np.prod(lead)) if len(lead) else 1
    return torch.stack([_direction(b, visible, seed, direction=direction)
                        for b in range(B)]).reshape(*lead, *visible.shape)


def random_direction_entries(lead: Sequence[int], visible: torch.Tensor, keys: torch.Tensor, seed: int = 0,
                             direction: str = "gaussian") -> torch.Tensor:
    """The entries `random_directions(lead, visible, seed, direction)[..., q, keys[..., q, j]]`, float64
    [*lead, Q, k], drawn one head at a time (never the whole [*lead, Q, K] tensor). keys long [*lead, Q, k]."""
    check_direction(direction)
    B = int(np.prod(lead)) if len(lead) else 1
    idx = keys.reshape(B, *keys.shape[-2:])
    out = torch.stack([_direction(b, visible, seed, direction=direction).gather(-1, idx[b].to(visible.device))
                       for b in range(B)])
    return out.reshape(*lead, *keys.shape[-2:])


def fd_grad_norms(
    scores: torch.Tensor,
    temperatures: Sequence[float],
    epsilons: Sequence[float],
    visible: Optional[torch.Tensor] = None,
    *,
    seed: int = 0,
    direction: str = "gaussian",
    chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """Finite-difference Jacobian norm of Alg. 5 for every row, T and eps: [..., Q, len(T), len(eps)].

    `g(T, eps) = ||softmax((l + eps v)/T) - softmax(l/T)||_2 / eps` with l = the row's scores over its
    visible keys (finite scores & visible), v a seeded random unit vector over those keys (one per
    row, the same for every T and eps; `random_directions`; `direction` "gaussian" or "rademacher").
    Rows with < 2 keys are NaN.

    Every T and eps of a tile of rows is one tensor program (`_fd_tile`: tiles of at most GRAD_ELEMENTS
    [rows, T, eps, keys] elements, within the row blocks and causal key spans), on the scores' device, with one
    transfer to the CPU at the end: no host sync per block, T or eps. On CPU (`engine.batched`), a loop over T and
    eps on cache-sized tensors (`_fd_steps`: 3-4x faster there; the same numbers, bit for bit).
    """
    check_direction(direction)
    vis = visible_scores(scores, visible)
    Ts, Es = positive_grid("temperatures", temperatures), positive_grid("epsilons", epsilons)
    lead = scores.shape[:-2]
    S = scores.reshape(-1, *scores.shape[-2:])
    B, Q, K = S.shape
    dev = scores.device
    out = torch.empty(B, Q, len(Ts), len(Es), dtype=torch.float64, device=dev)
    grid = _fd_grid(Ts, Es, dev)
    masked = not bool(vis.all())
    steps = not engine.batched(scores)                 # CPU: the step loop on cache-sized tensors
    for bs, qs in blocks(B, Q, K, chunk):
        v_all = torch.stack([_direction(b, vis[qs], seed, Q, qs, direction) for b in range(bs.start, bs.stop)])
        for rs, hi in key_spans(vis[qs]):               # causal rows: the keys none of them sees are left out
            vv = vis[qs][rs, :hi]
            r0 = qs.start + rs.start
            l = S[bs, r0:qs.start + rs.stop, :hi].double()
            if masked:
                l = torch.where(vv, l, -math.inf)  # -inf on invisible keys
            l = l - l.amax(-1, keepdim=True)  # max 0: softmax is shift-invariant
            l_min = (torch.where(vv, l, math.inf) if masked else l).amin()      # lowest visible logit (a tensor)
            v = v_all[:, rs, :hi]
            if steps:                                   # CPU with the kernels on: cache-sized steps
                out[bs, r0:qs.start + rs.stop] = _fd_steps(l, v, float(l_min), Ts, Es)
                continue
            step = max(1, tile_elements(GRAD_ELEMENTS, l) // (l.shape[0] * len(Ts) * len(Es) * max(hi, 1)))
            for t0 in range(0, l.shape[1], step):
                rows = slice(t0, t0 + step)
                with sync_free(l):                      # ATTNLAB_SYNC_DEBUG=1 on CUDA: raises on a host sync
                    out[bs, r0 + t0:r0 + t0 + l[:, rows].shape[1]] = _fd_tile(l[:, rows], v[:, rows], l_min, grid)
    ok = vis.sum(-1) >= 2
    out[:, ~ok] = float("nan")
    return out.reshape(*lead, Q, len(Ts), len(Es)).cpu()


def _fd_grid(Ts: list[float], Es: list[float], device) -> dict:
    """The (T, eps) grid of `fd_grad_norms` as float64 tensors on `device`: T [nT, 1], eps [nE, 1], alpha = eps / T
    [nT, nE, 1] (Python divisions, as the scalar loop made them) and big [nT, nE, 1] (eps / T > 300: exponents
    shifted by their maximum)."""
    def t(v):
        return torch.tensor(v, dtype=torch.float64, device=device)

    alpha = [[e / T for e in Es] for T in Ts]
    return {"T": t(Ts).view(-1, 1), "eps": t(Es).view(-1, 1), "alpha": t(alpha).unsqueeze(-1),
            "big": (t(alpha) > 300).unsqueeze(-1)}


def _fd_tile(l: torch.Tensor, v: torch.Tensor, l_min: torch.Tensor, grid: dict) -> torch.Tensor:
    """g(T, eps) of Alg. 5 for every row of a tile, T and eps at once: [b, r, nT, nE] float64. l [b, r, k] the
    rows' logits shifted to max 0 (-inf on invisible keys), v [b, r, k] their directions, l_min the tile's lowest
    visible logit (0-dim), grid `_fd_grid`. The same operations, element by element, as a loop over T and eps."""
    T, alpha = grid["T"], grid["alpha"]
    lT = l.unsqueeze(-2) / T                                             # [b, r, nT, k]
    p = _exp_clamped(lT.clone(), l_min / T)                              # max exponent 0
    p = p.div_(p.sum(-1, keepdim=True)).unsqueeze(-2)                    # softmax(l / T)  [b, r, nT, 1, k]
    # exponents (l + eps v) / T, at most eps / T (l <= 0, |v_i| <= 1): shifted only when large
    e = torch.addcmul(lT.unsqueeze(-2), v.unsqueeze(-2).unsqueeze(-2), alpha)          # [b, r, nT, nE, k]
    big = grid["big"]
    e = e.sub_(torch.where(big, e.amax(-1, keepdim=True), 0.0))
    low = torch.where(big, -math.inf, (l_min - grid["eps"].view(1, -1, 1)) / T.unsqueeze(-1))   # [nT, nE, 1]
    e = _exp_clamped(e, low)
    total = e.sum(-1, keepdim=True)
    e.addcmul_(p, total, value=-1)  # e - total * p = total * (p' - p)
    return torch.linalg.vector_norm(e, dim=-1) / (total.squeeze(-1) * grid["eps"].view(-1))


def _fd_steps(l: torch.Tensor, v: torch.Tensor, l_min: float, Ts: list[float], Es: list[float]) -> torch.Tensor:
    """`_fd_tile` one T and eps at a time, in place on [b, r, k] tensors (the CPU path): [b, r, nT, nE]."""
    out = torch.empty(*l.shape[:2], len(Ts), len(Es), dtype=torch.float64)
    lT, p, e = torch.empty_like(l), torch.empty_like(l), torch.empty_like(l)
    for ti, T in enumerate(Ts):
        torch.div(l, T, out=lT)
        _exp_(p.copy_(lT), l_min / T)  # max exponent 0
        p.div_(p.sum(-1, keepdim=True))  # softmax(l / T)
        for ei, eps in enumerate(Es):
            # exponents (l + eps v) / T, at most eps / T (l <= 0, |v_i| <= 1): shifted only when large
            torch.add(lT, v, alpha=eps / T, out=e)
            low = (l_min - eps) / T
            if eps / T > 300:
                e.sub_(e.amax(-1, keepdim=True))
                low = -math.inf
            _exp_(e, low)
            total = e.sum(-1, keepdim=True)
            e.addcmul_(p, total, value=-1)  # e - total * p = total * (p' - p)
            out[:, :, ti, ei] = torch.linalg.vector_norm(e, dim=-1) / (total.squeeze(-1) * eps)
    return out


def _exp_(z: torch.Tensor, low: float) -> torch.Tensor:
    """exp in place, exponents clamped at -700 when they may go below `low` < -700 (`_exp_clamped`, one column)."""
    if low < -700:
        z.clamp_min_(-700.0)
    return z.exp_()


def _exp_clamped(z: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """exp in place; exponents are first clamped at -700 in the (T, eps) columns whose lowest exponent `low`
    (broadcast against z's leading dims) is below -700 (exp(-700) ~ 1e-304, far below any weight that matters): exp
    of large negative numbers takes a slow denormal path on CPU that made softmax 10x slower at small temperatures.
    Other columns are left as they are (max with -inf), so every value is the one an unclamped exp gives there."""
    floor = torch.where(low < -700, -700.0, -math.inf)
    return torch.maximum(z, floor, out=z).exp_()


def fd_grad_limit(
    scores: torch.Tensor,
    epsilons: Sequence[float],
    visible: Optional[torch.Tensor] = None,
    *,
    seed: int = 0,
    direction: str = "gaussian",
    chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """The exact limit T -> 0 of `fd_grad_norms` (same rows, same directions v), [..., Q, len(eps)].

    As T -> 0, softmax(z/T) -> u(z), the uniform distribution on the argmax set of z (one-hot when the
    maximum is unique): `g(0+, eps) = ||u(l + eps v) - u(l)||_2 / eps`, with A, B the argmax sets of l
    and l + eps v, `||u_B - u_A||^2 = 1/|A| + 1/|B| - 2 |A & B| / (|A| |B|)`. Without ties this is
    `(sqrt 2 / eps) * 1{argmax(l + eps v) != argmax(l)}` ([R]). Ties are exact equalities (float64).
    Rows with < 2 keys are NaN.
    """
    check_direction(direction)
    vis = visible_scores(scores, visible)
    Es = positive_grid("epsilons", epsilons)
    lead = scores.shape[:-2]
    S = scores.reshape(-1, *scores.shape[-2:])
    B, Q, K = S.shape
    out = torch.empty(B, Q, len(Es), dtype=torch.float64)
    ok = vis.sum(-1) >= 2
    for bs, qs in blocks(B, Q, K, chunk):
        l = torch.where(vis[qs], S[bs, qs].double(), -math.inf)
        A = l == l.amax(-1, keepdim=True)
        nA = A.sum(-1).double()
        v = torch.stack([_direction(b, vis[qs], seed, Q, qs, direction) for b in range(bs.start, bs.stop)])
        for ei, eps in enumerate(Es):
            z = l + eps * v                                         # -inf stays -inf (v = 0 there)
            Bm = z == z.amax(-1, keepdim=True)
            nB, nAB = Bm.sum(-1).double(), (A & Bm).sum(-1).double()
            d2 = (1 / nA + 1 / nB - 2 * nAB / (nA * nB)).clamp_min(0)
            out[bs, qs, ei] = (d2.sqrt() / eps).cpu()
    out[:, ~ok.cpu()] = float("nan")
    return out.reshape(*lead, Q, len(Es))


def positive_grid(name: str, values: Sequence[float]) -> list[float]:
    """values as floats, or one ValueError when the grid is empty or has a value that is not finite and > 0."""
    out = [float(v) for v in values]
    if not out or not all(math.isfinite(v) and v > 0 for v in out):
        raise ValueError(f"{name} must be finite numbers > 0, got {out}")
    return out


def softmax_jacobian_norm(
    probs: torch.Tensor,
    T: float = 1.0,
    visible: Optional[torch.Tensor] = None,
    *,
    method: str = "eigvalsh",
    chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """Exact spectral norm of the softmax Jacobian `(diag(a) - a a^T) / T` for every row, [..., Q].

    `probs` are the weights at temperature T (a = softmax(l/T)). The matrix is symmetric PSD, so its
    norm is its largest eigenvalue: method "eigvalsh" (reference, O(K^3) per row) or "secular"
    (same value, O(K) per row and iteration: bisection of `1 = sum_i a_i^2/(a_i - lam)` on
    `[a_(2), a_(1)]`, where interlacing puts the top eigenvalue; on CPU with the kernels, safeguarded Newton steps
    in one numba pass per step, `gradient_kernels.secular_top`).
    """
    bounds.check_T(T)
    vis = check_inputs(probs, None, visible)
    a = probs.double() * vis
    if method == "eigvalsh":
        lead = a.shape[:-1]
        A = a.reshape(-1, a.shape[-1])
        res = torch.empty(A.shape[0], dtype=torch.float64, device=A.device)
        step = max(1, chunk // (A.shape[-1] ** 2))
        for i in range(0, A.shape[0], step):
            p = A[i : i + step]
            J = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
            res[i : i + step] = torch.linalg.eigvalsh(J)[..., -1]
        return res.reshape(lead) / T
    if method == "secular":
        if cpu_kernels(a) is None:
            return _secular_top(a) / T
        from attnlab.normalization.kernels.gradients import secular_top

        return secular_top(a) / T
    raise ValueError(f"method must be 'eigvalsh' or 'secular', got {method!r}")


def _secular_top(a: torch.Tensor, iters: int = 64) -> torch.Tensor:
    """Largest eigenvalue of diag(a) - a a^T per row by bisection of the secular equation, [...]."""
    top2 = a.topk(min(2, a.shape[-1]), dim=-1).values
    hi = top2[..., 0].clone()
    lo = top2[..., -1].clone() if a.shape[-1] > 1 else torch.zeros_like(hi)
    a2 = a * a
    for _ in range(iters):
        mid = (lo + hi) / 2
        f = 1 - (a2 / (a - mid.unsqueeze(-1))).sum(-1)  # decreasing in lam on (lo, hi)
        pos = f > 0
        lo = torch.where(pos, mid, lo)
        hi = torch.where(pos, hi, mid)
    return (lo + hi) / 2
