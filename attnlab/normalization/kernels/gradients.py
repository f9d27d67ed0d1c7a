"""CPU kernel (numba) of Lemma 2's exact Jacobian norm (`attnlab.normalization.metrics.gradients.softmax_jacobian_norm`,
method "secular"): the top eigenvalue of diag(a) - a a^T per row. Compiled once and cached on disk like
`attnlab.normalization.kernels.metrics` (imported first: it sets numba's cache folder)."""
from __future__ import annotations

import numba
import torch

from attnlab.normalization.kernels.metrics import FASTMATH, use_threads


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _secular_top(a, out):
    """Largest eigenvalue of diag(a) - a a^T for each row of a [R, K] (float64, a_i >= 0; zeros are left out): the
    root of f(lam) = 1 - sum_i a_i^2 / (a_i - lam) on (a_(2), a_(1)), where interlacing puts it (f decreases from
    +inf to -inf there), by Newton steps kept inside a bisection bracket: a handful of passes over the row instead of
    64 bisections. A tie at the top (a_(1) = a_(2)) is the root itself."""
    R, K = a.shape
    for r in numba.prange(R):
        row = a[r]
        a1, a2 = 0.0, 0.0
        for i in range(K):
            v = row[i]
            if v > a1:
                a1, a2 = v, a1
            elif v > a2:
                a2 = v
        lo, hi = a2, a1
        lam = 0.5 * (lo + hi)
        for _ in range(200):
            if not hi - lo > 4e-16 * hi:
                break
            f, fp = 1.0, 0.0
            for i in range(K):
                v = row[i]
                if v != 0.0:
                    d = v - lam
                    t = v * v / d
                    f -= t
                    fp -= t / d                     # f' = -sum_i a_i^2 / (a_i - lam)^2 < 0
            if f > 0:
                lo = lam
            elif f < 0:
                hi = lam
            else:
                lo = hi = lam
                break
            step = lam - f / fp
            lam = step if lo < step < hi else 0.5 * (lo + hi)
        out[r] = lam if lo < hi else lo


def secular_top(a: torch.Tensor) -> torch.Tensor:
    """[...] float64: the largest eigenvalue of diag(a) - a a^T for each row of a [..., K] (`_secular_top`)."""
    use_threads()
    flat = a.double().reshape(-1, a.shape[-1]).contiguous()
    out = torch.empty(flat.shape[0], dtype=torch.float64)
    _secular_top(flat.numpy(), out.numpy())
    return out.reshape(a.shape[:-1])
