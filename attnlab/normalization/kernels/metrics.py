"""CPU kernels (numba, compiled once and cached on disk) for the hot loops of `normalization.metrics.engine`: one
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
key's farthest visible key (one lookup), scanning the key's distances only where that key is selected
(`far_rows`: those farthest distances for causal rows, a running maximum without torch.cummax's indices).

The incremental critical-N scan (`critical_n.RunningTopN`): `sorted_keys` (each row's visible keys by
weight, once per scan; float32 weights and key indices packed in one integer), `row_sums` (o = sum_i y_i,
sum_i ||y_i||^2, sum_i ||y_i||), `top_brackets` (the brackets of `critical_n.distance_bounds` for a window
of N from the running top-N sum s, O(D) per row and N) and `top_exact` (d~ and E, O(K) per row and N:
x_i.s updated by a_j (X X^T)_ji as each key j joins the top N). Parallel over heads (rows for the first
two); float64 throughout.
"""
from __future__ import annotations

import os

from attnlab.core.text import cache_dir
from attnlab.core.util import drop_damaged_numba_cache, kernels_on, tolerate_damaged_numba_cache

# numba caches compiled kernels beside the source unless told otherwise: into the installed package
# (often read-only, shared by users). Keep them in attnlab's cache, unless the user chose a place.
os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir() / "numba"))

import numba  # noqa: E402  (after NUMBA_CACHE_DIR)
import numpy as np  # noqa: E402
import torch  # noqa: E402

drop_damaged_numba_cache(os.environ["NUMBA_CACHE_DIR"])
tolerate_damaged_numba_cache()


def cache_is_cold(folder) -> bool:
    """True when numba's cache `folder` holds no compiled kernel of this package's copy: numba keeps them in
    <folder>/kernels_<sha1 of this folder's path>/ (`_UserProvidedCacheLocator`), one .nbi index per function."""
    import hashlib
    from pathlib import Path

    here = os.path.dirname(os.path.abspath(__file__))
    sub = Path(folder) / f"{os.path.basename(here)}_{hashlib.sha1(here.encode()).hexdigest()}"
    return not any(sub.glob("*.nbi"))


if kernels_on() and cache_is_cold(os.environ["NUMBA_CACHE_DIR"]):    # one line: the first figure would seem to hang
    from attnlab.core.cache import progress_line

    progress_line(f"attnlab: compiling numba kernels once (about a minute; cached in {os.environ['NUMBA_CACHE_DIR']})"
                  " ...\n")

# reassociation lets the key loops use SIMD; no flag that assumes the absence of NaN or inf
FASTMATH = {"reassoc", "contract", "nsz"}


def use_threads() -> None:
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def _floats(a: torch.Tensor) -> np.ndarray:
    """a as a contiguous float32 / float64 array (half precisions are widened to float32)."""
    return (a if a.dtype in (torch.float32, torch.float64) else a.float()).contiguous().numpy()


def _vis(vis: torch.Tensor | None, K: int) -> np.ndarray:
    """uint8 [q, K]; shape [0, K] when every key is visible."""
    return (torch.empty(0, K, dtype=torch.uint8) if vis is None else vis.to(torch.uint8).contiguous()).numpy()


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
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
    use_threads()
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
    use_threads()
    out = torch.empty(b, q, k, dtype=torch.long)
    _top_k(_floats(a), _vis(vis, K), int(k), out.numpy())
    return out


@numba.njit(inline="always")
def _d2(H, xn2, u, j, i):
    """||x_j - x_i||^2 = H_ji + ||x_j||^2, rounded as `distance._far_tables` rounds it."""
    return H[u, j, i] + xn2[u, j]


@numba.njit(parallel=True, cache=True)
def _d1_small(H, xn2, far2, col, inv, order, N, vis, K, out):
    """H [u, K_all, K_all] (`distance._far_tables`), xn2 [u, K_all]; far2 [u, K_all, P]: the largest d2[j, i] over
    the keys i visible at column P; col [q] row t's column; inv [b] head -> table; order [b, q, >= N]; vis uint8
    [q, K] (shape [0, K]: all visible); K <= K_all: the rows' keys; out [b, q] float64."""
    b, q = order.shape[0], order.shape[1]
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
             order: torch.Tensor, N: int, vis: torch.Tensor | None, K: int | None = None) -> torch.Tensor:
    """float64 [b, q]: d1 = max over the N selected keys j (order[..., :N]) and the visible
    non-selected keys i < K (default: every key of the tables) of ||x_i - x_j|| (-inf where there is no
    such i), from the tables of `distance._far_tables`: one lookup per selected key, a scan of j's distances
    only where j's farthest visible key is itself selected."""
    K = H.shape[1] if K is None else K
    b, q = order.shape[:2]
    use_threads()
    out = torch.empty(b, q, dtype=torch.float64)
    _d1_small(H.contiguous().numpy(), xn2.contiguous().numpy(), far2.contiguous().numpy(), col.contiguous().numpy(),
              inv.contiguous().numpy(), order.contiguous().numpy(), int(N), _vis(vis, K), int(K), out.numpy())
    return out


@numba.njit(parallel=True, cache=True)
def _far_rows(H, xn2, out):
    """out[u, j, c] = max(H[u, j, :c + 1]) + xn2[u, j]: torch.cummax(H, -1).values + xn2, ties as torch's."""
    K = H.shape[1]
    for r in numba.prange(H.shape[0] * K):
        m, j = r // K, r % K
        best = H[m, j, 0]
        for i in range(K):
            best = H[m, j, i] if H[m, j, i] >= best else best
            out[m, j, i] = best + xn2[m, j]


def far_rows(H: torch.Tensor, xn2: torch.Tensor) -> torch.Tensor:
    """`distance._far_tables`' far2 [u, K, K]: each row's running maximum of H [u, K, K] (float64) + xn2 [u, K]."""
    use_threads()
    out = torch.empty(H.shape, dtype=H.dtype)
    _far_rows(H.contiguous().numpy(), xn2.contiguous().numpy(), out.numpy())
    return out


@numba.njit(parallel=True, cache=True)
def _sort_keys(bits, lowest, vis, packed, out):
    """bits [b, q, K] int32 or int64: the weights' IEEE bits; lowest: the smallest integer of bits' type; vis uint8
    [q, K] (shape [0, K]: all visible); packed: value and key index share one int64 sort key (int32 bits, K < 2^21),
    else a stable argsort; out [b, q, k]: the first k keys by weight, descending, ties to the lower index, then the
    invisible keys by index. k >= 1."""
    b, q, K = bits.shape
    k = out.shape[2]
    every = vis.shape[0] == 0
    for r in numba.prange(b * q):
        m, t = r // q, r % q
        key = np.empty(K, np.int64)
        idx = np.empty(K, np.int64)
        n = 0
        for i in range(K):
            if every or vis[t, i] != 0:
                v = np.int64(bits[m, t, i])
                v = v if v >= 0 else lowest - v                 # order of the floats, -0.0 == +0.0
                key[n] = -v * (1 << 21) + i if packed else -v   # ascending key: descending weight
                idx[n] = i
                n += 1
        if packed:                                               # (keys are distinct: select the k first)
            srt = np.sort(np.partition(key[:n], k - 1)[:k] if k < n else key[:n])
            for c in range(min(n, k)):
                out[m, t, c] = srt[c] & ((1 << 21) - 1)
        else:
            perm = np.argsort(key[:n], kind="mergesort")
            for c in range(min(n, k)):
                out[m, t, c] = idx[perm[c]]
        c = n
        for i in range(K):                                       # invisible keys last
            if c >= k:
                break
            if not (every or vis[t, i] != 0):
                out[m, t, c] = i
                c += 1


def sorted_keys(a: torch.Tensor, vis: torch.Tensor | None, k: int) -> torch.Tensor:
    """[b, q, k] (int16 when K < 2^15, else int32): the first k keys of each row of the CPU tensor a [b, q, K] by
    weight, descending, ties broken by the lower key index, invisible keys (vis bool [q, K]; None: all visible) last,
    as `engine.sort_keys`. Sorts the visible keys only; float32 weights sort as one integer key per key."""
    b, q, K = a.shape
    use_threads()
    a = a if a.dtype in (torch.float32, torch.float64) else a.float()
    bits = a.contiguous().view(torch.int32 if a.dtype == torch.float32 else torch.int64)
    out = torch.empty(b, q, k, dtype=torch.int16 if K < 1 << 15 else torch.int32)
    lowest = int(torch.iinfo(bits.dtype).min)
    _sort_keys(bits.numpy(), lowest, _vis(vis, K), a.dtype == torch.float32 and K < 1 << 21, out.numpy())
    return out


@numba.njit(inline="always")
def _dot(u, v):
    acc = 0.0
    for d in range(u.shape[0]):
        acc += u[d] * v[d]
    return acc


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _row_sums(a, X, xn2, inv, hi, vis, o, SA, Syn):
    """Per row over its visible keys (y_i = a_i x_i): o [b, q, D] = sum_i y_i, SA, Syn [b, q] = sum_i ||y_i||^2,
    sum_i ||y_i||. a [b, q, K]; X [u, K, D] float64, xn2 [u, K], inv [b]; hi [q] last visible key + 1; vis uint8
    [q, K] (shape [0, K]: all visible)."""
    b, q, K = a.shape
    every = vis.shape[0] == 0
    for r in numba.prange(b * q):
        m, t = r // q, r % q
        u, orow = inv[m], o[m, t]
        orow[:] = 0.0
        sa, syn = 0.0, 0.0
        for i in range(hi[t]):
            if every or vis[t, i] != 0:
                ai = np.float64(a[m, t, i])
                for d in range(orow.shape[0]):
                    orow[d] += ai * X[u, i, d]
                sa += ai * ai * xn2[u, i]
                syn += ai * np.sqrt(xn2[u, i])
        SA[m, t], Syn[m, t] = sa, syn


def row_sums(a, X, xn2, inv, hi, vis) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [b, q, D], SA [b, q], Syn [b, q]) float64 of `_row_sums`, for CPU tensors as there (vis bool or None)."""
    b, q, K = a.shape
    use_threads()
    o = torch.empty(b, q, X.shape[-1], dtype=torch.float64)
    SA, Syn = torch.empty(b, q, dtype=torch.float64), torch.empty(b, q, dtype=torch.float64)
    _row_sums(_floats(a), X.numpy(), xn2.numpy(), inv.numpy(), hi.numpy(), _vis(vis, K), o.numpy(), SA.numpy(),
              Syn.numpy())
    return o, SA, Syn


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _top_brackets(a, X, xn2, inv, order, o, s, pre, SA, Syn, Lt, n0, slack, out):
    """For N = n0 .. n0 + W - 1, from running sums over the first N keys of each row's `order` (O(D) per row and N):
    d~ (a) exactly, the brackets of d~ (b) and of E (E1) of `critical_n.distance_bounds`. a [b, q, K]; X [u, K, D]
    float64, xn2 [u, K] = ||x_i||^2, inv [b] head -> x; order [b, q, >= n0 + W - 1] (`sorted_keys`, or any order of
    the visible keys); o [b, q, D] = sum_i y_i over the visible keys; s [b, q, D], pre [b, q] (updated in place): sum
    of y_j and of ||y_j|| over the first n0 - 1 keys, advanced to the first n0 + W - 1 (rows with Lt > N only); SA,
    Syn [b, q] = sum_i ||y_i||^2 and sum_i ||y_i||; Lt [q] visible keys per row (float64); out float64 [5, b, W] +=
    d_a, d_b_lo, d_b_hi, e_lo, e_hi summed over the rows with Lt > N (slack applied). Parallel over heads."""
    b, q, K = a.shape
    W = out.shape[2]
    for m in numba.prange(b):
        u = inv[m]
        for t in range(q):
            L = Lt[t]
            if L <= n0:
                continue
            sr, orow = s[m, t], o[m, t]
            s2, os_, o2 = _dot(sr, sr), _dot(orow, sr), _dot(orow, orow)
            on, sa, syn, p = np.sqrt(o2), SA[m, t], Syn[m, t], pre[m, t]
            for w in range(W):
                N = n0 + w
                if N >= L:
                    break
                j = order[m, t, N - 1]
                aj, xj = np.float64(a[m, t, j]), X[u, j]
                xs, xo = 0.0, 0.0
                for d in range(sr.shape[0]):                     # x_j.s (before adding y_j), x_j.o; s += y_j
                    xs += xj[d] * sr[d]
                    xo += xj[d] * orow[d]
                    sr[d] += aj * xj[d]
                s2 += aj * (2.0 * xs + aj * xn2[u, j])
                os_ += aj * xo
                p += aj * np.sqrt(xn2[u, j])
                mm = L - N
                d_a = np.sqrt(max(o2 - 4 * os_ + 4 * s2, 0.0))
                sn, out_yn = np.sqrt(max(s2, 0.0)), syn - p
                d_lo = max(np.sqrt(max(o2 - 2 * (mm + 1) * os_ + (mm + 1) ** 2 * s2, 0.0)), abs(mm * sn - out_yn))
                d_hi = out_yn + mm * sn
                c = N / max(L - 1, 1.0)
                scale = mm / L
                quad = max((1 + c) ** 2 * sa - 2 * (1 + c) * c * o2 + L * c * c * o2, 0.0)
                e_hi = scale * min((1 + c) * syn + L * c * on, np.sqrt(L * quad))
                e_lo = scale * max(abs(1 + c - L * c) * on, abs((1 + c) * syn - L * c * on))
                out[0, m, w] += d_a
                out[1, m, w] += d_lo * (1 - slack) - 1e-12
                out[2, m, w] += d_hi * (1 + slack) + 1e-12
                out[3, m, w] += e_lo * (1 - slack) - 1e-12
                out[4, m, w] += e_hi * (1 + slack) + 1e-12
            pre[m, t] = p


def top_brackets(a, X, xn2, inv, order, o, s, pre, SA, Syn, Lt, n0: int, W: int, slack: float) -> torch.Tensor:
    """float64 [5, b, W]: per head, the sums over the rows with Lt > N of d_a (exact), d_b_lo, d_b_hi, e_lo, e_hi for
    N = n0 .. n0 + W - 1 (`_top_brackets`; advances s and pre in place). CPU tensors as there."""
    use_threads()
    out = torch.zeros(5, a.shape[0], W, dtype=torch.float64)
    _top_brackets(_floats(a), X.numpy(), xn2.numpy(), inv.numpy(), order.numpy(), o.numpy(), s.numpy(), pre.numpy(),
                  SA.numpy(), Syn.numpy(), Lt.numpy(), int(n0), float(slack), out.numpy())
    return out


#: the quantities of `top_exact`, in the order of its output
EXACT_STATS = ("d_a", "d_b", "E1", "E2", "E3", "E5")


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _top_exact(a, xn2, G, inv, order, tv_s, s2_s, n_s, xo, o2, xm, m2, Lt, hi, vis, n0, want, need, out):
    """Exact d~ (a, b) of the first N keys of each row's `order` and the closed-form expectations E1, E2, E3, E5, for
    the N = n0 + w with want[w] (w < W), stepping N = n0 .. through the order. a [b, q, K]; xn2 [u, K] = ||x_i||^2;
    G [u, K, K] float64 = X X^T (d~; else shape [0, 0, 0]); inv [b] head -> x; order [b, q, k]; the state of the
    running top sum s (d~; else shape [0, 0, 0] / [0, 0]): tv_s [b, q, K] = x_i.s and s2_s [b, q] = ||s||^2 for s
    the sum of y_j = a_j x_j over the first n_s keys of the order (n_s <= n0 - 1), stepped on to the first n0 - 1
    keys and written back there (the next call, for N >= n0, starts from it); o2 [b, q] = ||o||^2, o = sum_i y_i;
    xo [b, q, K] = x_i.o (E1, E3, E5); xm [b, q, K] = x_i.m, m2 = ||m||^2, m the plain mean of the row's visible x
    (E2) (unused ones: shape [0, 0, 0] / [0, 0]); Lt [q] visible keys (float64); hi [q] last visible key + 1; vis
    uint8 [q, K] (shape [0, K]: all visible); need uint8 [6]: which of EXACT_STATS to compute; out float64 [6, b, W]
    += each summed over the rows with Lt > N. Per N the new key j adds a_j G[j] to t = x_i.s and 2 a_j t_j + a_j^2
    ||x_j||^2 to ||s||^2, so that d~ (b) is one pass over the keys, ||y_i - s||^2 = a_i (a_i ||x_i||^2 - 2 t_i) +
    ||s||^2, and d~ (a) one more, ||o - 2 s||^2 = ||o||^2 - 4 sum_i a_i t_i + 4 ||s||^2; the E's are root sums over the
    keys of ||l_i x_i - mu xbar||^2 = l_i (l_i ||x_i||^2 - 2 mu x_i.xbar) + mu^2 ||xbar||^2, with (l_i, mu, xbar) =
    (a_i (1 + c), c, o) for E1, (a_i + c, 1, m) for E2, (a_i + c, c, o) for E3, (a_i + c, 1, o) for E5,
    c = N / (L - 1), each times (L - N) / L. Squares in float64, roots in float32 (~1e-7 relative). O(K) per row and
    N, no D: the vectors enter through G only."""
    b, q, K = a.shape
    every = vis.shape[0] == 0
    last = 0
    for w in range(want.shape[0]):
        if want[w]:
            last = w
    need_a, need_b = need[0] != 0, need[1] != 0
    need_s = need_a or need_b
    for m in numba.prange(b):
        u = inv[m]
        tv, keep, visf, av = np.empty(K), np.empty(K), np.empty(K), np.empty(K)
        for t in range(q):
            L, h = Lt[t], hi[t]
            if L <= n0:
                continue
            for i in range(h):
                visf[i] = 1.0 if every or vis[t, i] != 0 else 0.0
                keep[i] = visf[i]
                av[i] = visf[i] * np.float64(a[m, t, i])
            for c in range(n0 - 1):
                keep[order[m, t, c]] = 0.0
            s2 = 0.0
            if need_s:
                s2 = s2_s[m, t]
                tv[:h] = tv_s[m, t, :h]
                for N in range(n_s + 1, n0):                        # the state on to the first n0 - 1 keys
                    j = order[m, t, N - 1]
                    aj = av[j]
                    s2 += aj * (2.0 * tv[j] + aj * xn2[u, j])
                    g = G[u, j]
                    for i in range(h):
                        tv[i] += aj * g[i]
                if n0 - 1 > n_s:
                    tv_s[m, t, :h] = tv[:h]
                    s2_s[m, t] = s2
            for w in range(last + 1):
                N = n0 + w
                if N >= L:
                    break
                j = order[m, t, N - 1]
                aj = av[j]
                keep[j] = 0.0
                if need_s:
                    s2 += aj * (2.0 * tv[j] + aj * xn2[u, j])
                    g = G[u, j]
                    for i in range(h):
                        tv[i] += aj * g[i]
                if not want[w]:
                    continue
                if need_a:
                    os_ = 0.0
                    for i in range(h):
                        os_ += av[i] * tv[i]
                    out[0, m, w] += np.sqrt(max(o2[m, t] - 4.0 * os_ + 4.0 * s2, 0.0))
                if need_b:
                    acc = 0.0
                    for i in range(h):
                        acc += keep[i] * np.sqrt(np.float32(max(s2 + av[i] * (av[i] * xn2[u, i] - 2.0 * tv[i]), 0.0)))
                    out[1, m, w] += acc
                c = N / max(L - 1, 1.0)
                scale = (L - N) / L
                if need[2]:
                    k = c / (1 + c)
                    c0, e, xr = k * k * o2[m, t], 0.0, xo[m, t]
                    for i in range(h):
                        e += visf[i] * np.sqrt(np.float32(max(c0 + av[i] * (av[i] * xn2[u, i] - 2.0 * k * xr[i]),
                                                              0.0)))
                    out[2, m, w] += scale * (1 + c) * e
                if need[3]:
                    e, xr, mm = 0.0, xm[m, t], m2[m, t]
                    for i in range(h):
                        li = av[i] + c
                        e += visf[i] * np.sqrt(np.float32(max(li * (li * xn2[u, i] - 2.0 * xr[i]) + mm, 0.0)))
                    out[3, m, w] += scale * e
                if need[4] or need[5]:
                    e3, e5, xr, oo = 0.0, 0.0, xo[m, t], o2[m, t]
                    for i in range(h):
                        li = av[i] + c
                        ln = li * li * xn2[u, i]
                        if need[4]:
                            e3 += visf[i] * np.sqrt(np.float32(max(ln - 2.0 * li * c * xr[i] + c * c * oo, 0.0)))
                        if need[5]:
                            e5 += visf[i] * np.sqrt(np.float32(max(ln - 2.0 * li * xr[i] + oo, 0.0)))
                    out[4, m, w] += scale * e3
                    out[5, m, w] += scale * e5


def top_exact(a, X, xn2, G, inv, order, o, Lt, hi, vis, n0: int, want, need=EXACT_STATS, xo=None, xm=None,
              state=None, o2=None):
    """float64 [6, b, len(want)]: per head, the sums of EXACT_STATS (d_a, d_b, E1, E2, E3, E5) over the rows with
    Lt > N, for the N = n0 + w with want[w] (`_top_exact`; zero elsewhere and for the stats not in `need`). CPU
    tensors a [b, q, K], X [u, K, D] float64, xn2 [u, K], inv [b], order [b, q, k], o [b, q, D] (sum of y_i), Lt [q],
    hi [q]; G [u, K, K] = X X^T (None when no d~ is needed); xo = x_i.o and xm = x_i.m [b, q, K] when the caller
    has them (else made here, one matrix product each). state (d~): (tv [b, q, K], s2 [b, q], n), the running top
    sum over the first n <= n0 - 1 keys of each order (`_top_exact`), stepped on in place to n0 - 1 (a caller that
    scans N upwards keeps it between calls); None: made here (zero for small n0, else one product with G). o2 [b, q]
    = ||o||^2 when the caller has it."""
    use_threads()
    b, q, K = a.shape
    out = torch.zeros(len(EXACT_STATS), b, len(want), dtype=torch.float64)
    need_s = bool({"d_a", "d_b"} & set(need))
    if need_s and G is None:
        raise ValueError("d~ needs the Gram matrices G = X X^T")
    empty3, empty2 = torch.empty(0, 0, 0, dtype=torch.float64), torch.empty(0, 0, dtype=torch.float64)
    if not need_s:
        state = (empty3, empty2, 0)
    elif state is None:
        state = fresh_state(a, X, G, inv, order, vis, n0)
    tv, s2, n_s = state
    if n_s > n0 - 1:
        raise ValueError(f"the running state holds {n_s} keys, past N = {n0} - 1")
    o2 = (o * o).sum(-1) if o2 is None else o2
    if {"E1", "E3", "E5"} & set(need):
        xo = torch.bmm(o, X[inv].transpose(1, 2)) if xo is None else xo
    else:
        xo = empty3
    m2 = empty2
    if "E2" in need:
        if xm is None:
            Xb = X[inv]
            vf = torch.ones(q, K, dtype=torch.float64) if vis is None else vis.double()
            mean = torch.matmul(vf, Xb) / Lt.view(-1, 1)                 # [b, q, D]
            xm, m2 = torch.bmm(mean, Xb.transpose(1, 2)), (mean * mean).sum(-1)
        else:
            xm, m2 = xm
    else:
        xm = empty3
    G = empty3 if G is None else G
    flags = np.array([k in need for k in EXACT_STATS], np.uint8)
    _top_exact(_floats(a), xn2.numpy(), G.contiguous().numpy(), inv.numpy(), order.numpy(), tv.numpy(), s2.numpy(),
               int(n_s), *(t.contiguous().numpy() for t in (xo, o2, xm, m2)), Lt.numpy(), hi.numpy(), _vis(vis, K),
               int(n0), np.asarray(want, np.uint8), flags, out.numpy())
    return out


def fresh_state(a, X, G, inv, order, vis, n0: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The running top sum of `_top_exact` over the first n0 - 1 keys of each row's order: (tv = x_i.s [b, q, K],
    ||s||^2 [b, q], n) float64; for n0 - 1 <= K / 4 empty (n = 0: the kernel steps it on, O(K) per key), else
    from s (two products with X, O(K D) per row) or with G (one, O(K^2) per row), whichever is smaller."""
    b, q, K = a.shape
    if n0 - 1 <= K // 4:
        return torch.zeros(b, q, K, dtype=torch.float64), torch.zeros(b, q, dtype=torch.float64), 0
    w = torch.zeros(b, q, K, dtype=torch.float64).scatter_(-1, order[..., :n0 - 1].long(), 1.0)
    w.mul_(a.double() * (vis if vis is not None else 1.0))
    if 2 * X.shape[-1] < K:
        s = torch.bmm(w, X[inv])
        return torch.bmm(s, X[inv].transpose(1, 2)), (s * s).sum(-1), n0 - 1
    tv = torch.bmm(w, G[inv])
    return tv, (w * tv).sum(-1), n0 - 1
