"""CPU kernels (numba) of the readings scan (`attnlab.normalization.readings.six_percent`): the closed-form brackets of
E2, E3, E5 in O(1) per row and N, and the seeded random orders of E4 (counter-based Fisher-Yates). Compiled once and
cached on disk like `attnlab.normalization.kernels.metrics` (imported first: it sets numba's cache folder)."""
from __future__ import annotations

import numba
import numpy as np
import torch

from attnlab.normalization.kernels.metrics import FASTMATH, use_threads


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _formula_brackets(SA, Syn, San, Sn, Sn2, oo, oX, XX, Lt, n0, flags, slack, out):
    """Brackets of the closed forms E2, E3, E5 (flags uint8 [3]) for N = n0 .. n0 + W - 1 from per-row sums [b, q]
    (`six_percent.FormulaRows`), in O(1) per row and N: out float64 [6, b, W] += lo, hi of E2, E3, E5 summed
    over the rows with Lt > N. For sum_i ||l_i x_i - mu xbar||, l_i = a_i + c: lo = max(||sum_i (l_i x_i - mu xbar)||,
    |sum l_i ||x_i|| - L mu ||xbar|||), hi = min(sum l_i ||x_i|| + L mu ||xbar||, sqrt(L sum ||l_i x_i - mu xbar||^2)),
    times (L - N) / L; xbar = Xs / L and mu = 1 (E2), xbar = o and mu = c (E3) or 1 (E5)."""
    b, q = SA.shape
    W = out.shape[2]
    for m in numba.prange(b):
        for t in range(q):
            L = Lt[t]
            for w in range(W):
                N = n0 + w
                if N >= L:
                    break
                c = N / max(L - 1, 1.0)
                scale = (L - N) / L
                T1 = Syn[m, t] + c * Sn[m, t]
                base = SA[m, t] + 2 * c * San[m, t] + c * c * Sn2[m, t]
                for r in range(3):
                    if flags[r] == 0:
                        continue
                    if r == 0:
                        mu, xx = 1.0, XX[m, t] / (L * L)
                        cross = (oX[m, t] + c * XX[m, t]) / L
                        V = oo[m, t] - 2 * (1 - c) * oX[m, t] + (1 - c) ** 2 * XX[m, t]
                    else:
                        mu, xx = (c if r == 1 else 1.0), oo[m, t]
                        cross = oo[m, t] + c * oX[m, t]
                        k = 1 - L * mu
                        V = k * k * oo[m, t] + 2 * k * c * oX[m, t] + c * c * XX[m, t]
                    Lmx = L * mu * np.sqrt(max(xx, 0.0))
                    sq = max(base - 2 * mu * cross + L * mu * mu * xx, 0.0)
                    lo = scale * max(np.sqrt(max(V, 0.0)), abs(T1 - Lmx))
                    hi = scale * min(T1 + Lmx, np.sqrt(L * sq))
                    out[2 * r, m, w] += lo * (1 - slack) - 1e-12
                    out[2 * r + 1, m, w] += hi * (1 + slack) + 1e-12


def formula_brackets(sums: dict, Lt: torch.Tensor, n0: int, W: int, readings, slack: float) -> torch.Tensor:
    """float64 [6, b, W]: lo, hi of E2, E3, E5 (those in `readings`) summed over the rows with Lt > N, N = n0 ..
    n0 + W - 1 (`_formula_brackets`); sums: dict of the per-row sums SA, Syn, San, Sn, Sn2, oo, oX, XX [b, q]."""
    use_threads()
    names = ("SA", "Syn", "San", "Sn", "Sn2", "oo", "oX", "XX")
    b = sums["SA"].shape[0]
    out = torch.zeros(6, b, W, dtype=torch.float64)
    flags = np.array([r in readings for r in ("E2", "E3", "E5")], np.uint8)
    _formula_brackets(*(sums[k].contiguous().numpy() for k in names), Lt.numpy(), int(n0), flags, float(slack),
                      out.numpy())
    return out


@numba.njit(inline="always")
def _splitmix(z):
    """splitmix64: a well-mixed 64-bit value from z (uint64)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(parallel=True, cache=True)
def _random_orders(vis, seeds, out):
    """out [b, q, K]: each row's visible keys (vis uint8 [q, K]) in a uniformly random order (Fisher-Yates, with
    random numbers from splitmix64 of (seeds[b], row, step): deterministic, independent of threads), then its
    invisible keys by index."""
    b, q, K = out.shape
    for r in numba.prange(b * q):
        m, t = r // q, r % q
        n = 0
        for i in range(K):
            if vis[t, i] != 0:
                out[m, t, n] = i
                n += 1
        c = n
        for i in range(K):
            if vis[t, i] == 0:
                out[m, t, c] = i
                c += 1
        state = _splitmix(np.uint64(seeds[m]) ^ (np.uint64(t) * np.uint64(0xD1B54A32D192ED03)))
        for i in range(n - 1, 0, -1):
            state = _splitmix(state)
            j = np.int64(state % np.uint64(i + 1))
            tmp = out[m, t, i]
            out[m, t, i] = out[m, t, j]
            out[m, t, j] = tmp


def random_orders(vis: torch.Tensor, seeds: np.ndarray, dtype) -> torch.Tensor:
    """[len(seeds), q, K] of `dtype`: uniformly random orders of each row's visible keys (`_random_orders`), one seed
    per head."""
    q, K = vis.shape
    out = torch.empty(len(seeds), q, K, dtype=dtype)
    _random_orders(vis.to(torch.uint8).contiguous().numpy(), np.asarray(seeds, np.uint64), out.numpy())
    return out
