"""CPU kernels (numba, compiled once and cached on disk) for the hot loops of `attnlab.normalization.engine`: one
pass over the keys of each attention row where torch would make a pass per operation.

`root_sums` (`engine.root_sum`). The sums of Theorem 1 (d~, E, the Jensen spread) all have one form,
per row r = (head, query t):

    sum over the keys i visible to t and not dropped of  sqrt(c_r + sign * a_i (a_i ||x_i||^2 - 2 g_r w_i)),
    c_r = c0_r + h_r * sum_j a_j^2 ||x_j||^2   (h_r = `s2_coef`: 0 but for the Jensen spread),

with w_i = x_i . v for a vector v per row (o or s): either given ([b, q, K], one matrix product), or,
for v = s = sum_{j dropped} a_j x_j (the top-N sum of d~), formed from the table H_ji = ||x_i||^2 -
2 x_j . x_i that the d1 lookups hold already: x_i . s = (||x_i||^2 sum_j a_j - sum_j a_j H_ji) / 2,
N multiply-adds per key instead of D (float64: its rounding, ~1e-16 of ||x_i||^2 sum_j a_j, is far
below the roots' 1e-7). In torch each step of the expression is a pass over a [heads, rows, keys]
tensor (about 8 of them); here one loop reads the keys of a row once. Squares in float64 (where the
cancellation happens), roots in float32 (~1e-7 relative), sums in float64, as in the torch version.

`top_k` (`engine.top_order`, small k): the k heaviest visible keys of each row in one scan
(insertion into a sorted list of k), ties to the lower index by construction.

`d1_small` (`distance._d1`, small N): the largest selected-to-non-selected distance from each selected
key's farthest visible key (one lookup), scanning the key's distances only where that key is selected.
"""
from __future__ import annotations

import os

from attnlab.core.text import cache_dir

# numba caches compiled kernels beside the source unless told otherwise: into the installed package
# (often read-only, shared by users). Keep them in attnlab's cache, unless the user chose a place.
os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir() / "numba"))

import numba  # noqa: E402  (after NUMBA_CACHE_DIR)
import numpy as np  # noqa: E402
import torch  # noqa: E402

# reassociation lets the key loops use SIMD; no flag that assumes the absence of NaN or inf
_FASTMATH = {"reassoc", "contract", "nsz"}


def _threads() -> None:
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def _floats(a: torch.Tensor) -> np.ndarray:
    """a as a contiguous float32 / float64 array (half precisions are widened to float32)."""
    return (a if a.dtype in (torch.float32, torch.float64) else a.float()).contiguous().numpy()


def _vis(vis: torch.Tensor | None, K: int) -> np.ndarray:
    """uint8 [q, K]; shape [0, K] when every key is visible."""
    return (torch.empty(0, K, dtype=torch.uint8) if vis is None else vis.to(torch.uint8).contiguous()).numpy()


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True)
def _root_sums(a, xn2, w, H, inv, c0, h, g, sign, vis, drop, out):
    """a [b, q, K] float32 or float64 (read as float64); xn2 [b, K]; w [b, q, K], or shape [0, 0, 0]
    and then w_i = x_i . s from H [u, K, K] (inv [b] head -> table) and the keys drop; c0, h, g
    [b, q]; vis uint8 [q, K] (shape [0, K]: every key visible); drop int64 [b, q, n] (keys left out
    of each row's sums, the h term's included); out float64 [b, q]."""
    b, q, K = a.shape
    for r in numba.prange(b * q):
        m, t = r // q, r % q
        keep = np.ones(K, np.float32)
        if vis.shape[0] > 0:
            for i in range(K):
                keep[i] = vis[t, i]
        for j in range(drop.shape[2]):
            keep[drop[m, t, j]] = 0.0
        if w.shape[0] > 0:
            wr = w[m, t]
        else:                                                    # 2 x_i.s = ||x_i||^2 sum a_j - sum a_j H_ji
            wr = np.zeros(K, w.dtype)                            # (w is empty, of H's dtype)
            total = 0.0
            for c in range(drop.shape[2]):
                j = drop[m, t, c]
                aj, row = np.float64(a[m, t, j]), H[inv[m], j]
                total += aj
                for i in range(K):
                    wr[i] -= aj * row[i]
            for i in range(K):
                wr[i] = 0.5 * (wr[i] + total * xn2[m, i])
        c_r, g2 = c0[m, t], 2.0 * g[m, t]
        if h[m, t] != 0.0:
            s2 = 0.0
            for i in range(K):
                ai = np.float64(a[m, t, i])
                s2 += keep[i] * ai * ai * xn2[m, i]
            c_r += h[m, t] * s2
        acc = 0.0
        for i in range(K):
            ai = np.float64(a[m, t, i])
            sq = c_r + sign * ai * (ai * xn2[m, i] - g2 * wr[i])
            acc += keep[i] * np.sqrt(np.float32(max(sq, 0.0)))
        out[m, t] = acc


def root_sums(a: torch.Tensor, xn2: torch.Tensor, w: torch.Tensor | None, c0, g, sign: float,
              vis: torch.Tensor | None, drop: torch.Tensor | None, s2_coef=0.0, table=None) -> torch.Tensor:
    """float64 [b, q]: the sums above, for CPU tensors a [b, q, K], xn2 [b, K], and w [b, q, K] or (w
    None) table = (H [u, K, K], inv [b]) with v = the dropped keys' sum; c0, s2_coef and g numbers or
    tensors broadcastable to [b, q]; vis bool [q, K] or None (all visible); drop int64 [b, q, n] or
    None."""
    b, q, K = a.shape
    _threads()
    c0, h, g = (torch.as_tensor(v, dtype=torch.float64).expand(b, q).contiguous() for v in (c0, s2_coef, g))
    drop = torch.empty(b, q, 0, dtype=torch.long) if drop is None else drop.contiguous()
    if w is None:
        H, inv = table
        w = torch.empty(0, 0, 0, dtype=H.dtype)
    else:
        H, inv = torch.empty(0, 0, 0, dtype=w.dtype), torch.zeros(b, dtype=torch.long)
    out = torch.empty(b, q, dtype=torch.float64)
    _root_sums(_floats(a), xn2.contiguous().numpy(), w.contiguous().numpy(), H.contiguous().numpy(),
               inv.contiguous().numpy(), c0.numpy(), h.numpy(), g.numpy(), float(sign), _vis(vis, K), drop.numpy(),
               out.numpy())
    return out


@numba.njit(cache=True, inline="always")
def _insert(val, idx, n, v, i):
    """Insert key i of weight v into the sorted val/idx (n entries used, at most len(val)), after the
    entries of equal weight (lower index first); the last entry falls off when full. Returns the new n."""
    j = min(n, len(val) - 1)
    while j > 0 and val[j - 1] < v:
        val[j] = val[j - 1]
        idx[j] = idx[j - 1]
        j -= 1
    val[j] = v
    idx[j] = i
    return min(n + 1, len(val))


@numba.njit(parallel=True, cache=True)
def _top_k(a, vis, k, out):
    """a [b, q, K]; vis uint8 [q, K] (shape [0, K]: all visible); out int64 [b, q, k]: the visible keys
    by weight, descending, ties by the lower index; rows with fewer than k visible keys end with
    their invisible keys, by index."""
    b, q, K = a.shape
    every = vis.shape[0] == 0
    for r in numba.prange(b * q):
        m, t = r // q, r % q
        row, idx = a[m, t], out[m, t]
        val = np.empty(k, a.dtype)
        n, i = 0, 0
        while n < k and i < K:                                   # the first k visible keys
            if every or vis[t, i] != 0:
                n = _insert(val, idx, n, row[i], i)
            i += 1
        kth = val[k - 1] if n == k else 0.0
        for j in range(i, K):                                    # then only keys heavier than the k-th
            if row[j] > kth and (every or vis[t, j] != 0):
                _insert(val, idx, n, row[j], j)
                kth = val[k - 1]
        for i in range(K):                                       # fewer than k visible: invisible keys
            if n == k:
                break
            if vis[t, i] == 0:
                idx[n] = i
                n += 1


def top_k(a: torch.Tensor, vis: torch.Tensor | None, k: int) -> torch.Tensor:
    """int64 [b, q, k]: the first k keys of each row of the CPU tensor a [b, q, K] by weight, descending,
    ties broken by the lower key index, invisible keys (vis bool [q, K]; None: all visible) last."""
    b, q, K = a.shape
    _threads()
    out = torch.empty(b, q, k, dtype=torch.long)
    _top_k(_floats(a), _vis(vis, K), int(k), out.numpy())
    return out


@numba.njit(inline="always")
def _d2(H, xn2, u, j, i):
    """||x_j - x_i||^2 = H_ji + ||x_j||^2, rounded as `distance._far_tables` rounds it."""
    return H[u, j, i] + xn2[u, j]


@numba.njit(parallel=True, cache=True)
def _d1_small(H, xn2, far2, col, inv, order, N, vis, out):
    """H [u, K, K] (`distance._far_tables`), xn2 [u, K]; far2 [u, K, P]: the largest d2[j, i] over the keys i
    visible at column P; col [q] row t's column; inv [b] head -> table; order [b, q, >= N]; vis uint8
    [q, K] (shape [0, K]: all visible); out [b, q] float64."""
    b, q, K = order.shape[0], order.shape[1], H.shape[1]
    every = vis.shape[0] == 0
    for r in numba.prange(b * q):
        m, t = r // q, r % q
        u, sel = inv[m], order[m, t]
        best = -np.inf
        for a in range(N):
            j = sel[a]
            far, near_sel = far2[u, j, col[t]], -np.inf
            for c in range(N):
                near_sel = max(near_sel, _d2(H, xn2, u, j, sel[c]))
            if near_sel < far:                                   # j's farthest visible key is not selected
                best = max(best, far)
                continue
            for i in range(K):                                   # else: every visible non-selected key
                d = _d2(H, xn2, u, j, i)
                if d > best and (every or vis[t, i] != 0):
                    chosen = False
                    for c in range(N):
                        chosen = chosen or sel[c] == i
                    if not chosen:
                        best = d
        out[m, t] = np.sqrt(max(best, 0.0)) if best > -np.inf else -np.inf


def d1_small(H: torch.Tensor, xn2: torch.Tensor, far2: torch.Tensor, col: torch.Tensor, inv: torch.Tensor,
             order: torch.Tensor, N: int, vis: torch.Tensor | None) -> torch.Tensor:
    """float64 [b, q]: d1 = max over the N selected keys j (order[..., :N]) and the visible
    non-selected keys i of ||x_i - x_j|| (-inf where there is no such i), from the tables of
    `distance._far_tables`: one lookup per selected key, a scan of j's distances only where j's farthest
    visible key is itself selected."""
    b, q = order.shape[:2]
    _threads()
    out = torch.empty(b, q, dtype=torch.float64)
    _d1_small(H.contiguous().numpy(), xn2.contiguous().numpy(), far2.contiguous().numpy(), col.contiguous().numpy(),
              inv.contiguous().numpy(), order.contiguous().numpy(), int(N), _vis(vis, H.shape[1]), out.numpy())
    return out
