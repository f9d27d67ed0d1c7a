"""Per-row attention metrics of arXiv 2508.17821, vectorised over heads and query rows.

Inputs (all torch tensors):

- `probs [..., Q, K]`: attention weights (0 on masked keys), leading dims e.g. [layer, head];
- `x [..., K, D]`: the vectors x_i of the paper (per-head value vectors by default); its leading dims
  broadcast against those of probs (layer-input hidden states `[layer, 1, K, D]` serve every head);
- `visible bool [Q, K]`: keys each query row counts (default: all). A row's length is
  `L_t = visible[t].sum()`; rows with `L_t <= N` are skipped (NaN in per-row outputs).
  Protocol "masked keys included" = pass `visible=None` (all keys, weight 0 where masked).

Work is done on blocks of (heads, query rows) (`chunk` = elements of one [heads, rows, K] block,
8 MiB in float64: big enough to amortise the ~10-20 us overhead of each torch operation, small
enough to bound memory: a 12 x 12 model at L = 1024 keeps a few such blocks per tensor). Top-N =
the first N keys of each row by weight, descending, ties broken by the lower key index: one top-k
per block serves every N.

Sums of distances over the K keys never form [rows, K, D] tensors: squared norms are expanded in
dot products, `||a_i x_i - s||^2 = a_i (a_i ||x_i||^2 - 2 x_i.s) + ||s||^2`, and each sum costs at
most one matrix product (E and the Jensen spread share one x_i.o; for N <= SMALL_N, x_i.s comes from
the d1 table instead) and one pass over the keys. The squares are float64 (the critical-N scan's
inputs: float32), where the cancellation happens; their square roots are float32 (~1e-7 relative;
float64 roots are 4x slower on CPU), their sums float64. Theorem 2 grows N one key at a time (one
Gram row per step). d1 (the largest selected-to-non-selected distance) comes from each key's
farthest keys, precomputed once per head.

On CPU the per-key loops (the root sums, a small top-k, the d1 lookups) run as numba kernels
(`attnlab.kernels`, `FUSED`): one pass per row where torch makes one per operation. Elsewhere (GPU,
or ATTNLAB_KERNELS=0) the same formulas run as torch operations. `attnlab.oracle` recomputes
everything row by row, directly from the formulas; the tests check both engines against it, to 1e-5
relative. Functions accept tensors on any device; per-row outputs come back on the CPU.
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from attnlab import bounds

DEFAULT_CHUNK = 1 << 20          # elements of one [heads, rows, K] block (8 MiB in float64)
# CPU: the hot loops run as the numba kernels of `attnlab.kernels`; False (or ATTNLAB_KERNELS=0): plain
# torch everywhere, the path GPUs take (the tests check both against the oracle)
FUSED = os.environ.get("ATTNLAB_KERNELS", "1") != "0"
SMALL_N = 16                     # N <= SMALL_N: d1 from each key's farthest visible key (else candidates),
                                 # x_i.s from the d1 table, top-k by insertion (CPU)
DISTANCE_STATS = ("dtilde_b", "dtilde_a", "E", "jensen", "abar", "d1", "R", "dmax_B", "dmax_R", "dmax_a")
SEPARABILITY_STATS = ("ns_frac", "r", "delta", "xi_row", "xi_pair", "xi_delta",
                      "lower_row", "lower_pair", "lower_delta",
                      "upper_B_row", "upper_B_pair", "upper_B_delta",
                      "upper_R_row", "upper_R_pair", "upper_R_delta")
_PAIR_STATS = {"xi_pair", "lower_pair", "upper_B_pair", "upper_R_pair"}
_DELTA_STATS = {"delta", "xi_delta", "lower_delta", "upper_B_delta", "upper_R_delta"}


# ----------------------------------------------------------------------------------------- checking

def check_inputs(probs: torch.Tensor, x: Optional[torch.Tensor] = None,
                 visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Validate shapes and values; return `visible` as bool [Q, K]. Raises ValueError with the fix."""
    if not isinstance(probs, torch.Tensor) or probs.dim() < 2:
        raise ValueError(f"probs must be a tensor [..., Q, K], got {getattr(probs, 'shape', type(probs))}")
    Q, K = probs.shape[-2:]
    if _has_nan(probs):
        raise ValueError("probs contain NaN: check the model's attention (fully masked rows?)")
    if x is not None:
        if x.dim() < 2 or x.shape[-2] != K:
            raise ValueError(f"x must be [..., K={K}, D] to match probs [..., Q, K]; got {tuple(x.shape)}")
        xl, pl = tuple(x.shape[:-2]), tuple(probs.shape[:-2])
        if len(xl) > len(pl):
            raise ValueError("x has more leading dims than probs")
        if any(d not in (1, p) for d, p in zip(reversed(xl), reversed(pl))):   # (torch.broadcast_shapes: ms)
            raise ValueError(f"leading dims of x {xl} do not broadcast to those of probs {pl}")
        if _has_nan(x):
            raise ValueError("x contains NaN")
    if visible is None:
        return torch.ones(Q, K, dtype=torch.bool, device=probs.device)
    if visible.shape != (Q, K):
        raise ValueError(f"visible must be bool [Q={Q}, K={K}], got {tuple(visible.shape)}")
    return visible.to(device=probs.device, dtype=torch.bool)


def _has_nan(t: torch.Tensor) -> bool:
    """Any NaN in t? One reduction in the common case (a NaN makes the sum NaN; so does +inf + -inf,
    which the exact check then tells apart)."""
    return bool(torch.isnan(t.sum())) and bool(torch.isnan(t).any())


def _check_ns(ns: Iterable[int], K: int) -> list[int]:
    ns = sorted({int(n) for n in ns})
    if not ns:
        raise ValueError("need at least one N")
    if ns[0] < 1:
        raise ValueError(f"N must be >= 1, got {ns[0]}")
    if ns[-1] >= K:
        raise ValueError(f"N must be < L (the number of keys, {K}): got N={ns[-1]}; "
                         "choose a smaller top-N or a longer window")
    return ns


def row_lengths(visible: torch.Tensor) -> torch.Tensor:
    """L_t = number of visible keys of each row: bool [Q, K] -> long [Q]."""
    return visible.sum(-1)


# --------------------------------------------------------------------------------------- chunking

def _flat(probs: torch.Tensor, x: Optional[torch.Tensor]):
    """probs -> [B, Q, K]; x -> [Bx, K, D] plus xmap long [B] (which x serves each flattened row)."""
    lead = probs.shape[:-2]
    P = probs.reshape(-1, *probs.shape[-2:])
    if x is None:
        return lead, P, None, None
    xlead = (1,) * (len(lead) - len(x.shape[:-2])) + tuple(x.shape[:-2])
    X = x.reshape(-1, *x.shape[-2:])
    xmap = torch.arange(X.shape[0]).reshape(xlead).expand(lead).reshape(-1) if lead else torch.zeros(1, dtype=torch.long)
    return lead, P, X, xmap


def _blocks(B: int, Q: int, K: int, chunk: int) -> Iterator[tuple[slice, slice]]:
    """(heads, rows) slices with heads * rows * K <= chunk (at least one row)."""
    if Q * K <= chunk:
        nb = max(1, chunk // (Q * K))
        for b0 in range(0, B, nb):
            yield slice(b0, min(B, b0 + nb)), slice(0, Q)
    else:
        nq = max(1, chunk // K)
        for b0 in range(B):
            for q0 in range(0, Q, nq):
                yield slice(b0, b0 + 1), slice(q0, min(Q, q0 + nq))


def _sort(a: torch.Tensor, vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """order, rank [b, q, K]: keys by weight descending (visible first, ties -> lower index)."""
    key = a.masked_fill(~vis, float("-inf"))
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(a.shape[-1], device=a.device).expand_as(order))
    return order, rank


def _sort_top(a: torch.Tensor, vis: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `_sort` for the first k positions only: order [b, q, k] (same keys, same order as the full
    stable sort) and rank [b, q, K] (exact below k, K elsewhere). O(K) per row instead of O(K log K)."""
    key = a.masked_fill(~vis, float("-inf"))
    K = key.shape[-1]
    tau = torch.topk(key, k, dim=-1, sorted=False).values.amin(-1, keepdim=True)     # k-th largest
    gt = key > tau
    need = k - gt.sum(-1, keepdim=True)                                  # ties at tau to take, lowest index first
    eq = key == tau
    sel = gt | (eq & (torch.cumsum(eq, -1) <= need))
    idx = sel.nonzero()[:, -1].view(*key.shape[:-1], k)                  # selected keys, ascending index
    vals = key.gather(-1, idx)
    perm = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    order = idx.gather(-1, perm)
    rank = torch.full_like(key, K, dtype=torch.long).scatter_(
        -1, order, torch.arange(k, device=a.device).expand_as(order))
    return order, rank


def sort_rows(probs: torch.Tensor, visible: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, rank) [..., Q, K]: keys of each row by weight, descending, visible keys first, ties broken
    by the lower key index; `rank[..., t, i]` is the position of key i in row t's order."""
    vis = check_inputs(probs, None, visible)
    return _sort(probs, vis)


def top_n(probs: torch.Tensor, n: int, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Indices [..., Q, n] of the n largest visible weights of each row (ties -> lower index)."""
    vis = check_inputs(probs, None, visible)
    _check_ns([n], probs.shape[-1] + 1)
    return _sort(probs, vis)[0][..., :n]


def context_vector(probs: torch.Tensor, x: torch.Tensor, n: int, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Paper Eq. 6: `s = sum_{i in I_N} a_i x_i` for every row -> [..., Q, D] float64."""
    vis = check_inputs(probs, x, visible)
    _check_ns([n], probs.shape[-1] + 1)
    _, rank = _sort(probs, vis)
    sel = (rank < n) & vis
    return torch.matmul((probs.double() * sel), x.double())


# ------------------------------------------------------------------------------- distance engine

FAR_CANDIDATES = 8               # farthest keys kept per key for d1 (exact; rows where all are excluded recompute)


def _kernels(t: torch.Tensor):
    """`attnlab.kernels` when they serve tensors like t (CPU, `FUSED`), else None (torch operations)."""
    if FUSED and t.device.type == "cpu":
        from attnlab import kernels

        return kernels
    return None


def _top_order(a: torch.Tensor, vis: torch.Tensor, k: int) -> torch.Tensor:
    """order [b, q, k]: the first k keys of each row by weight, descending, ties broken by the lower key
    index, invisible keys last (the first k of `_sort`). On CPU and for k <= SMALL_N one scan per row
    (`kernels.top_k`, when `FUSED`; insertion loses to torch's partial sort for larger k); else one
    `topk`, and rows where two of the first k + 1 weights are equal (where the tie rule decides) are
    redone with the stable `_sort_top`."""
    K = a.shape[-1]
    if k >= K - 1:
        return _sort(a, vis)[0][..., :k]
    kernels = _kernels(a)
    if kernels is not None and k <= SMALL_N:
        return kernels.top_k(a, None if bool(vis.all()) else vis, k)
    w = a if bool(vis.all()) else a.masked_fill(~vis, float("-inf"))
    vals, order = torch.topk(w, k + 1, dim=-1)
    tie = ((vals[..., 1:] == vals[..., :-1]) & (vals[..., 1:] > float("-inf"))).any(-1)     # [b, q]
    if bool(tie.any()):
        bb, tt = tie.nonzero(as_tuple=True)
        order[bb, tt, :k] = _sort_top(a[bb, tt], vis[tt], k)[0]
    return order[..., :k]


def _root_sum(rows: "_Rows", w: Optional[torch.Tensor], c0: torch.Tensor, g, sign: float = 1.0,
              drop: Optional[torch.Tensor] = None, s2_coef=0.0, table: Optional[tuple] = None) -> torch.Tensor:
    """sum over the visible keys (but the positions `drop` [b, q, n]) of the distances
    sqrt(c + sign * a_i (a_i ||x_i||^2 - 2 g w_i)), c = c0 + s2_coef * sum_j a_j^2 ||x_j||^2: [b, q]
    float64, for w [b, q, K] (x_i.s or x_i.o, one matrix product; None on CPU with table = (H, inv) of
    `_far_tables`: w_i = x_i.s for s the dropped keys' sum, from H), c0 [b, q, 1], g and s2_coef numbers or
    [q, 1]. The squares are formed in float64 by default (the cancellation happens there), their roots
    in float32 (~1e-7 relative; float64 roots are 4x slower on CPU), the sums in float64. On CPU one
    fused pass per row (`attnlab.kernels`, when `FUSED`); elsewhere torch, a pass per operation."""
    kernels = _kernels(rows.a)
    if kernels is not None:
        c0, g, s2_coef = (v.squeeze(-1) if torch.is_tensor(v) else v for v in (c0, g, s2_coef))
        return kernels.root_sums(rows.p, rows.xn2, w, c0, g, sign, rows.vis if rows.masked else None, drop,
                                 s2_coef=s2_coef, table=table)
    ax = rows.a * rows.xn2.unsqueeze(1)                                  # a_i ||x_i||^2
    c = c0 + s2_coef * (rows.a * ax).sum(-1, keepdim=True)
    sq = torch.addcmul(c, rows.a, ax.sub_(w * g, alpha=2), value=sign).float()
    if drop is not None:
        sq.scatter_(-1, drop, 0.0)
    if rows.masked:
        sq.masked_fill_(~rows.vis, 0.0)
    return sq.clamp_min_(0).sqrt_().sum(-1).double()


class _Rows:
    """One block of attention rows (b heads x q queries x K keys), prepared once for every N.

    p [b, q, K] the weights as given, a the same in `dtype`, 0 on invisible keys; order [b, q, k] the
    top k keys of each row (`_top_order`); X [b, K, D] the vectors of each head, from the distinct Xu
    [u, K, D] (one per head for value vectors, one per layer for hidden states; inv [b] says which), so
    Gram matrices are made once per distinct x; xn2 [b, K] = ||x_i||^2; n [q] visible keys per row
    (`lengths`, if the caller has them) and Lt the same in `dtype`; masked: some key is invisible to
    some row; prefix: every row sees the keys 0..n_t - 1 (given, or found when first asked).
    """

    def __init__(self, probs, vis, Xu, inv, k: int, dtype, lengths=None, prefix=None):
        self.order = _top_order(probs, vis, k)
        self.p = probs
        self.n = vis.sum(-1) if lengths is None else lengths
        self.masked = bool((self.n < vis.shape[-1]).any())
        self._prefix = prefix
        self.vis = vis
        self.a = probs.to(dtype) * vis if self.masked else probs.to(dtype)
        self.Xu, self.inv = Xu, inv
        self.X = Xu[inv]
        self.XT = self.X.transpose(1, 2)                                 # [b, D, K]
        self.xn2 = (self.X * self.X).sum(-1)
        self.Lt = self.n.to(dtype)
        b = probs.shape[0]
        self.bidx = torch.arange(b, device=probs.device).view(b, 1, 1)

    @property
    def prefix(self) -> bool:
        if self._prefix is None:
            self._prefix = _prefix_lengths(self.vis) is not None
        return self._prefix

    def top_sum(self, lo: int, hi: int) -> torch.Tensor:
        """sum of y_j = a_j x_j over the keys at positions lo..hi-1 of each row's order: [b, q, D]."""
        b, q, K = self.a.shape
        if hi - lo > 8:                                                  # many keys: one masked product
            w = torch.zeros_like(self.a).scatter_(-1, self.order[..., lo:hi], 1.0).mul_(self.a)
            return torch.bmm(w, self.X)
        j = self.order[..., lo:hi]
        K, D = self.Xu.shape[1:]
        xj = self.Xu.view(-1, D).index_select(0, (self.inv.view(b, 1, 1) * K + j).flatten()).view(b, q, -1, D)
        return (self.a.gather(-1, j).unsqueeze(-1) * xj).sum(-2)

    def selected(self, N: int) -> torch.Tensor:
        """bool [b, q, K]: the top-N keys of each row."""
        return torch.zeros(self.a.shape, dtype=torch.bool, device=self.a.device).scatter_(
            -1, self.order[..., :N], True)


def _far_tables(rows: "_Rows", ns: Sequence[int], m: int) -> dict:
    """Lookup tables for `_d1`. For small N and prefix-shaped visibility (bidirectional or causal rows):
    H [u, K, K] (float64), H_ji = ||x_i||^2 - 2 x_j.x_i, so that the squared distance is
    d2[j, i] = H_ji + ||x_j||^2 (formed so wherever it is needed); xn2 [u, K] = ||x_i||^2; and far2
    [u, K, P], the largest d2[j, i] over the first n keys, at column col[t] for row t's n = L_t. For
    larger N: each key's m farthest keys, farthest first (far_dist, far_idx [u, K, m]), for the keys
    that are ever selected."""
    Xu, K = rows.Xu, rows.a.shape[-1]
    xn2 = (Xu * Xu).sum(-1)
    tables = {}
    n_vis = rows.n if rows.prefix else None
    if n_vis is not None and ns[0] <= SMALL_N:
        H = torch.baddbmm(xn2.unsqueeze(-2).expand(-1, K, -1), Xu, Xu.transpose(1, 2), alpha=-2)
        if bool((n_vis == K).all()):
            far2, col = H.amax(-1, keepdim=True), torch.zeros_like(n_vis)
        else:
            far2, col = torch.cummax(H, dim=-1).values, (n_vis - 1).clamp_min(0)
        tables["small"] = (H, xn2, far2.add_(xn2.unsqueeze(-1)), col)
    if ns[-1] > SMALL_N or "small" not in tables:
        m = min(m, K)
        far_dist = torch.zeros(Xu.shape[0], K, m, dtype=Xu.dtype, device=Xu.device)
        far_idx = torch.zeros(Xu.shape[0], K, m, dtype=torch.long, device=Xu.device)
        for u in range(Xu.shape[0]):
            keys = torch.zeros(K, dtype=torch.bool, device=Xu.device)
            keys[rows.order[rows.inv == u].flatten()] = True
            U = keys.nonzero().squeeze(-1)                               # keys that are ever selected
            d2 = torch.addmm(xn2[u, U].unsqueeze(-1) + xn2[u].unsqueeze(0), Xu[u, U], Xu[u].T, alpha=-2)
            val, idx = torch.topk(d2, m, dim=-1)
            far_dist[u, U], far_idx[u, U] = val.clamp_min_(0).sqrt_(), idx
        tables["candidates"] = (far_dist, far_idx)
    return tables


def _d1(rows: _Rows, N: int, tables: dict, ok: torch.Tensor, chunk: int) -> torch.Tensor:
    """d1 = max over selected j and visible non-selected i of ||x_i - x_j|| per row: [b, q].

    Small N ("small" tables): j's farthest visible key is not selected when it is strictly farther
    than every selected key, and then gives max_i ||x_i - x_j|| (on CPU: `kernels.d1_small`).
    Otherwise ("candidates"): j's farthest keys, farthest first: the first one that is visible and not
    selected gives it. Rows where some j is left undecided are recomputed over all keys. `ok` [b, q]
    marks the rows that count."""
    kernels = _kernels(rows.a)
    if N <= SMALL_N and "small" in tables and kernels is not None:
        return kernels.d1_small(*tables["small"], rows.inv, rows.order, N, rows.vis if rows.masked else None)
    b, q, K = rows.a.shape
    j = rows.order[..., :N]                                              # [b, q, N]
    if N <= SMALL_N and "small" in tables:
        H, xn2, far2, col = tables["small"]
        P = far2.shape[-1]
        base = rows.inv.view(b, 1, 1) * K                                # first row of each head's table
        fj = torch.take(far2, ((base + j) * P + col.view(1, q, 1)))     # [b, q, N]
        Hjj = torch.take(H, ((base + j).unsqueeze(-1) * K + j.unsqueeze(-2)))                # [b, q, N, N]
        ms = (Hjj + torch.take(xn2, base + j).unsqueeze(-1)).amax(-1)  # d2 to the selected i, max over i
        best = torch.where(ms < fj, fj.clamp_min(0).sqrt(), float("-inf"))          # [b, q, N]
    else:
        far_dist, far_idx = tables["candidates"]
        m = far_idx.shape[-1]
        rowsel = (rows.inv.view(b, 1, 1) * K + j).flatten()              # rows of the [u*K, m] tables
        allowed = rows.vis & ~rows.selected(N)                           # [b, q, K]
        cand = far_idx.view(-1, m).index_select(0, rowsel).view(b, q, N * m)
        valid = allowed.gather(-1, cand)
        dist = far_dist.view(-1, m).index_select(0, rowsel).view(b, q, N * m)
        best = torch.where(valid, dist, float("-inf")).view(b, q, N, m).amax(-1)  # [b, q, N]
    d1 = best.amax(-1)
    redo = (best == float("-inf")).any(-1) & ok
    if bool(redo.any()):                                                 # exact, over all keys
        bb, tt = redo.nonzero(as_tuple=True)
        jj = j[bb, tt]                                                   # [r, N]
        sel = torch.zeros(len(bb), K, dtype=torch.bool, device=jj.device).scatter_(-1, jj, True)
        allowed = (rows.vis[tt] & ~sel).unsqueeze(1)                     # [r, 1, K]
        step = max(1, chunk // max(1, N * K))
        for c0 in range(0, len(bb), step):
            cs = slice(c0, c0 + step)
            if "small" in tables:                                        # rows of the H table
                H, xn2, _, _ = tables["small"]
                at = (rows.inv[bb[cs]].unsqueeze(-1) * K + jj[cs]).flatten()
                d2 = H.view(-1, K).index_select(0, at).view(-1, N, K) + xn2.view(-1).index_select(0, at).view(-1, N, 1)
            else:
                xj = rows.X[bb[cs].unsqueeze(-1), jj[cs]]                # [r, N, D]
                d2 = torch.einsum("rnd,rkd->rnk", xj, rows.X[bb[cs]]).mul_(-2)
                d2 += rows.xn2[bb[cs].unsqueeze(-1), jj[cs]].unsqueeze(-1) + rows.xn2[bb[cs]].unsqueeze(1)
            d2 = torch.where(allowed[cs], d2.view(-1, N, K), float("-inf"))
            d1[bb[cs], tt[cs]] = d2.flatten(1).amax(-1).clamp_min(0).sqrt()
    return d1


def _unique_x(X: torch.Tensor, xmap: torch.Tensor, bs: slice,
              dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """Distinct x of a heads block: Xu [u, K, D] in `dtype`, inv [b], and a hashable key."""
    uniq, inv = torch.unique(xmap[bs], return_inverse=True)
    return X[uniq.to(X.device)].to(dtype), inv.to(X.device), tuple(uniq.tolist())


def _nan_rows(value: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    return value.masked_fill(~ok, float("nan"))


def distance_stats(probs: torch.Tensor, x: torch.Tensor, ns: Sequence[int], visible: Optional[torch.Tensor] = None,
                   *, stats: Sequence[str] = ("dtilde_b", "dtilde_a", "E", "jensen", "dmax_B", "dmax_R"),
                   chunk: int = DEFAULT_CHUNK, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """Theorem-1 quantities of every row for each N in `ns`: dict stat -> float64 [..., Q, len(ns)].

    stats (any of `DISTANCE_STATS`):
      dtilde_b  reading (b) [R, default]: `sum_{i out} ||a_i x_i - s||`
      dtilde_a  reading (a) [S]: `||sum_{i out} a_i x_i - s||`
      E         random-set main sum (`bounds.theorem1_random_main`), over the row's L_t keys
      jensen    its Jensen-gap bound (`bounds.theorem1_jensen_bound`)
      abar, d1, R   top-N mass, max out-to-selected distance, max selected norm
      dmax_B, dmax_R, dmax_a   Theorem 1 fixed-set bounds ([B], [R], reading-(a) [R])
    Rows with L_t <= N are NaN. `ns` are sorted ascending in the output. `dtype` of the weights, vectors
    and matrix products: float64 (default; matches the oracle to ~1e-7, `_root_sum`) or float32 (faster;
    d~ and E within 6e-7 relative of float64 on MiniLM's traces, L = 32..512; used by the critical-N
    scan, which only ranks per-head means). The CPU kernels form the squares in float64 either way.

    Per row (y_i = a_i x_i, o = sum_i y_i, s = the top-N sum): the sums over keys come from squared
    norms expanded in dot products, `||y_i - s||^2 = a_i (a_i ||x_i||^2 - 2 x_i.s) + ||s||^2` and
    `||(1+c) y_i - c o||^2 = (1+c)^2 ||y_i||^2 - 2 (1+c) c y_i.o + c^2 ||o||^2`: two matrix products
    per block (x_i.o) and per N (x_i.s), no [rows, K, D] tensors.
    """
    vis = check_inputs(probs, x, visible)
    K = probs.shape[-1]
    ns = _check_ns(ns, K)
    stats = list(stats)
    bad = set(stats) - set(DISTANCE_STATS)
    if bad:
        raise ValueError(f"unknown stats {sorted(bad)}; choose from {DISTANCE_STATS}")
    lead, P, X, xmap = _flat(probs, x)
    B, Q, _ = P.shape
    out = torch.empty(len(stats), len(ns), B, Q, dtype=torch.float64)    # one write per (N, block)
    need = set(stats)
    need_d1 = bool({"d1", "dmax_B", "dmax_R", "dmax_a"} & need)
    need_top = need_d1 or bool({"R", "abar"} & need)
    lengths, prefix = vis.sum(-1), _prefix_lengths(vis) is not None      # (once, not per block)
    for bs, qs in _blocks(B, Q, K, chunk):
        Xu, inv, _ = _unique_x(X, xmap, bs, dtype)
        rows = _Rows(P[bs, qs], vis[qs], Xu, inv, ns[-1], dtype, lengths[qs], prefix)
        a, Lt = rows.a, rows.Lt
        Lt1 = (Lt - 1).clamp_min(1).unsqueeze(-1)                        # [q, 1]
        o = torch.bmm(rows.XT, a.transpose(1, 2)).transpose(1, 2)        # sum_i y_i  [b, q, D]
        o2 = (o * o).sum(-1, keepdim=True)                               # [b, q, 1]
        xo = torch.bmm(o, rows.XT) if {"E", "jensen"} & need else None   # x_i.o, shared by E and jensen
        if "jensen" in need:
            # sum_{j != i} ||y_j - mu_i||^2 = S2 - ||y_i||^2 - ||o - y_i||^2 / (L - 1)
            #   = L / (L - 1) * [(S2 (L - 1) - ||o||^2) / L - a_i (a_i ||x_i||^2 - 2 x_i.o / L)],
            #   S2 = sum_j ||y_j||^2 (`s2_coef`)
            L_ = Lt.unsqueeze(-1)
            spread = (L_ / Lt1).sqrt().squeeze(-1) * _root_sum(rows, xo, -o2 / L_, 1 / L_, sign=-1.0, s2_coef=Lt1 / L_)
        if need_top:
            xn_top = rows.xn2.sqrt().unsqueeze(1).expand(a.shape).gather(-1, rows.order)   # ||x_j|| in order
            Rcum = torch.cummax(xn_top, dim=-1).values                   # [b, q, k]
            acum = torch.cumsum(a.gather(-1, rows.order), dim=-1)
        far = _far_tables(rows, ns, FAR_CANDIDATES) if need_d1 else {}
        # x_i.s for N <= SMALL_N from the d1 table H (kernels only): N products per key instead of D
        on_kernels = _kernels(a) is not None and dtype == torch.float64
        table = (far["small"][0], rows.inv) if on_kernels and "small" in far else None
        s = torch.zeros_like(o)
        n_done = 0
        for c, N in enumerate(ns):
            ok = (Lt > N).expand(a.shape[:2])
            s += rows.top_sum(n_done, N)
            n_done = N
            res = {}
            if "dtilde_b" in need:                   # ||y_i - s||^2 = a_i (a_i ||x_i||^2 - 2 x_i.s) + ||s||^2
                from_table = table is not None and N <= SMALL_N
                xs = None if from_table else torch.bmm(s, rows.XT)
                res["dtilde_b"] = _root_sum(rows, xs, (s * s).sum(-1, keepdim=True), 1.0, drop=rows.order[..., :N],
                                            table=table if from_table else None)
            if "dtilde_a" in need:
                res["dtilde_a"] = (o - 2 * s).square().sum(-1).sqrt()
            if "E" in need:
                # ||(1 + c) y_i - c o||^2 = (1 + c)^2 [a_i (a_i ||x_i||^2 - 2 k x_i.o) + k^2 ||o||^2],
                # c = N / (L - 1), k = c / (1 + c)
                cN = N / Lt1                                             # [q, 1]
                k = cN / (1 + cN)
                res["E"] = (Lt - N) / Lt * (1 + cN.squeeze(-1)) * _root_sum(rows, xo, k * k * o2, k)
            if "jensen" in need:
                coef = (N * (Lt - 1 - N) / ((Lt - 1) * (Lt - 2))).clamp_min(0)
                coef = torch.where(Lt > 2, coef, torch.zeros_like(coef))
                res["jensen"] = (Lt - N) / Lt * coef.sqrt() * spread
            if need_top:
                abar, R = acum[..., N - 1], Rcum[..., N - 1]
                res["abar"], res["R"] = abar, R
            if need_d1:
                d1 = _d1(rows, N, far, ok, chunk)
                res["d1"] = d1
                res["dmax_B"] = bounds.theorem1_fixed_bound(abar, d1, R, Lt, N, "B")
                res["dmax_R"] = bounds.theorem1_fixed_bound(abar, d1, R, Lt, N, "R")
                res["dmax_a"] = bounds.theorem1_fixed_bound_a(abar, d1, R)
            out[:, c, bs, qs] = _nan_rows(torch.stack([res[k] for k in stats]), ok)
    return {k: out[i].permute(1, 2, 0).reshape(*lead, Q, len(ns)) for i, k in enumerate(stats)}


def dtilde(probs, x, n: int, visible=None, *, reading: str = "b", chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Representation distance d~ (paper Eq. 7) of every row, [..., Q]. reading "b" (default, [R]):
    `sum_{i out} ||a_i x_i - s||`; "a" ([S]): `||sum_{i out} a_i x_i - s||`."""
    if reading not in ("a", "b"):
        raise ValueError(f"reading must be 'a' or 'b', got {reading!r}")
    key = f"dtilde_{reading}"
    return distance_stats(probs, x, [n], visible, stats=[key], chunk=chunk)[key][..., 0]


def expectation(probs, x, n: int, visible=None, *, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Random-set expectation E (main sum, [R]/[B]) of every row, [..., Q]."""
    return distance_stats(probs, x, [n], visible, stats=["E"], chunk=chunk)["E"][..., 0]


def jensen_gap_bound(probs, x, n: int, visible=None, *, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Bound on the Jensen gap of E ([R]) of every row, [..., Q]."""
    return distance_stats(probs, x, [n], visible, stats=["jensen"], chunk=chunk)["jensen"][..., 0]


def dmax(probs, x, n: int, visible=None, *, form: str = "B", chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Theorem 1 fixed-set bound d_max of every row ([B] default, or "R"), [..., Q]."""
    key = {"B": "dmax_B", "R": "dmax_R", "A": "dmax_a"}.get(form.upper())
    if key is None:
        raise ValueError(f"form must be 'B', 'R' or 'a', got {form!r}")
    return distance_stats(probs, x, [n], visible, stats=[key], chunk=chunk)[key][..., 0]


# ------------------------------------------------------------------------------------ separability

def unit_vectors(x: torch.Tensor, M: float = 1.0) -> torch.Tensor:
    """x_i / ||x_i|| * M in float64 (zero vectors stay zero): Assumption 1 of Theorem 2."""
    x = x.double()
    n = x.norm(dim=-1, keepdim=True)
    return torch.where(n > 0, x / n.clamp_min(1e-300), torch.zeros_like(x)) * M


def _prefix_lengths(vis: torch.Tensor) -> Optional[torch.Tensor]:
    """If every row's visible set is {0..n_t-1}, return n_t [q]; else None."""
    n = vis.sum(-1)
    ar = torch.arange(vis.shape[-1], device=vis.device)
    return n if bool(torch.equal(vis, ar.unsqueeze(0) < n.unsqueeze(-1))) else None


def min_pairwise_distance(x: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """delta: min_{i != j visible} ||x_i - x_j|| for each row. x [b, K, D], visible [q, K] -> [b, q]
    (NaN for rows with fewer than 2 visible keys). Fast path for prefix-shaped visibility
    (bidirectional or causal rows); other masks go row by row."""
    x = x.double()
    D = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")  # [b, K, K]
    K = x.shape[-2]
    D = D + torch.diag_embed(torch.full((K,), float("inf"), dtype=torch.float64, device=x.device))
    n = _prefix_lengths(visible)
    if n is not None:
        upper = torch.triu(torch.ones(K, K, dtype=torch.bool, device=x.device), diagonal=1)   # i < j
        m = D.masked_fill(~upper, float("inf")).amin(dim=-2)                     # [b, K]: min_{i<j}
        cm = torch.cummin(m, dim=-1).values                                      # delta of prefix j+1
        out = cm[:, (n - 1).clamp_min(0)]
    else:
        out = torch.empty(x.shape[0], visible.shape[0], dtype=torch.float64, device=x.device)
        for t in range(visible.shape[0]):
            idx = visible[t].nonzero().squeeze(-1)
            out[:, t] = D[:, idx][:, :, idx].flatten(1).amin(-1)
    return out.masked_fill(~torch.isfinite(out), float("nan"))


def separability_stats(probs: torch.Tensor, x: torch.Tensor, ns: Sequence[int], visible: Optional[torch.Tensor] = None,
                       *, M: float = 1.0, normalize: bool = True,
                       stats: Sequence[str] = ("ns_frac", "r", "lower_row", "upper_B_row", "upper_R_row"),
                       chunk: int = DEFAULT_CHUNK) -> dict[str, torch.Tensor]:
    """Theorem 2 / Fig. 3 quantities of every row for each N: dict stat -> float64 [..., Q, len(ns)].

    x is put on the sphere of radius M first (`normalize`; Assumption 1). Per row:
    `dist_i = ||a_i x_i - s||`, `r = min_{i out} dist_i` (every non-selected token outside the ball),
    `N_s = #{i in I_N : dist_i < r}` (strict, [R]/[G10]), `ns_frac = N_s / N`.
    Spread estimators xi_i ([B] text, "show both"): `row` = the row's own `dist_i`;
    `pair` = mean over the other selected j of `||a_j x_j - a_i x_i||` (0 when N = 1);
    `delta` = `bounds.theorem2_xi_delta` from delta = min pairwise distance of the row's visible
    vectors ([R]). For each: lower = `1 - sum xi / (r N)`, upper_B / upper_R as in
    `bounds.theorem2_bounds`. Stats named `*_row`... `xi_*` are means over the selected tokens.

    N grows one key at a time up to max(ns): s and x_i.s follow (one Gram row per step), r comes from
    `||y_i||^2 - 2 y_i.s + ||s||^2` minimised over the non-selected keys, and the selected
    distances (few) are computed directly.
    """
    vis = check_inputs(probs, x, visible)
    K = probs.shape[-1]
    ns = _check_ns(ns, K)
    stats = list(stats)
    bad = set(stats) - set(SEPARABILITY_STATS)
    if bad:
        raise ValueError(f"unknown stats {sorted(bad)}; choose from {SEPARABILITY_STATS}")
    xu = unit_vectors(x, M) if normalize else x.double()
    lead, P, X, xmap = _flat(probs, xu)
    B, Q, _ = P.shape
    D = X.shape[-1]
    n_max = ns[-1]
    out = torch.empty(len(stats), len(ns), B, Q, dtype=torch.float64)    # one write per (N, block)
    need_pair = bool(_PAIR_STATS & set(stats))
    need_delta = bool(_DELTA_STATS & set(stats))
    wanted = {N: c for c, N in enumerate(ns)}
    inf = float("inf")
    delta_cache: dict[tuple, torch.Tensor] = {}
    for bs, qs in _blocks(B, Q, K, chunk):
        v = vis[qs]
        Xu, inv, key = _unique_x(X, xmap, bs)
        rows = _Rows(P[bs, qs], v, Xu, inv, n_max, torch.float64)
        a, Xb, Lt = rows.a, rows.X, rows.Lt
        b, q, _ = a.shape
        bidx = rows.bidx[..., 0]                                         # [b, 1]
        if need_delta:
            if key not in delta_cache:
                delta_cache = {key: min_pairwise_distance(Xu, vis)}      # [u, Q]
            delta = delta_cache[key][inv][:, qs]
        G = torch.bmm(Xu, Xu.transpose(1, 2)).view(-1, K)                # Gram rows of the distinct x
        grow = inv.view(b, 1) * K
        A = a * a * rows.xn2.unsqueeze(1)                                # ||y_i||^2
        A_out = torch.where(v, A, inf)                                   # +inf on invisible, then selected keys
        order = rows.order
        # small per-selected tensors are laid out [n, b, q] (reductions over n are then vectorised)
        order_n = order.permute(2, 0, 1)                                 # [n_max, b, q] view
        a_top = a.gather(-1, order).permute(2, 0, 1).contiguous()
        A_top = A.gather(-1, order).permute(2, 0, 1).contiguous()
        xs = torch.zeros_like(a)                                         # x_i . s
        s = torch.zeros(b, q, D, dtype=a.dtype, device=a.device)
        psum = torch.zeros(n_max, b, q, dtype=a.dtype, device=a.device)  # sum of ||y_j - y_i|| over selected j
        buf = torch.empty_like(a)
        for m in range(n_max):
            j = order_n[m]                                               # [b, q]
            aj = a_top[m].unsqueeze(-1)                                  # [b, q, 1]
            s.addcmul_(aj, Xb[bidx, j])
            torch.index_select(G, 0, (grow + j).flatten(), out=buf.view(-1, K))   # x_j . x_i, every i
            xs.addcmul_(buf, aj)
            A_out.scatter_(-1, j.unsqueeze(-1), inf)
            if need_pair and m:
                g = buf.gather(-1, order[..., :m]).permute(2, 0, 1)      # x_j . x_i, earlier selected i
                d = (A_top[:m] + A_top[m]).addcmul_(a_top[:m] * a_top[m], g, value=-2)
                d = d.clamp_min_(0).sqrt_()                              # ||y_j - y_i||  [m, b, q]
                psum[:m] += d
                psum[m] = d.sum(0)
            N = m + 1
            if N not in wanted:
                continue
            # dist_i^2 = ||y_i||^2 - 2 a_i x_i.s + ||s||^2, the same expression for r and the selected
            s2 = (s * s).sum(-1, keepdim=True)
            r = (torch.addcmul(A_out, a, xs, value=-2, out=buf).amin(-1, keepdim=True) + s2).clamp_min_(0).sqrt_()
            xs_top = xs.gather(-1, order[..., :N]).permute(2, 0, 1)
            dsel = (torch.addcmul(A_top[:N], a_top[:N], xs_top, value=-2) + s2.squeeze(-1))
            dsel = dsel.clamp_min_(0).sqrt_().permute(1, 2, 0)          # [b, q, N] view of [N, b, q]
            r = r.squeeze(-1)
            ok = (Lt > N).expand(b, q) & (r > 0)
            res = {"ns_frac": (dsel < r.unsqueeze(-1)).sum(-1).double() / N, "r": r}
            xis = {"row": dsel}
            if need_pair:
                xis["pair"] = psum[:N].permute(1, 2, 0) / (N - 1) if N > 1 else torch.zeros_like(dsel)
            if need_delta:
                res["delta"] = delta
                xis["delta"] = bounds.theorem2_xi_delta(a_top[:N].permute(1, 2, 0), delta, M)
            for name, xi in xis.items():
                lo, (up_b, up_r) = bounds.theorem2_bound_set(xi, r, M, forms=("B", "R"))
                res[f"xi_{name}"] = xi.mean(-1)
                res[f"lower_{name}"], res[f"upper_B_{name}"], res[f"upper_R_{name}"] = lo, up_b, up_r
            out[:, wanted[N], bs, qs] = _nan_rows(torch.stack([res[k] for k in stats]), ok)
    return {k: out[i].permute(1, 2, 0).reshape(*lead, Q, len(ns)) for i, k in enumerate(stats)}


def separability(probs, x, n: int, visible=None, *, M: float = 1.0, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """N_s / N of every row (paper Eq. 10, r = nearest non-selected distance, strict <), [..., Q]."""
    return separability_stats(probs, x, [n], visible, M=M, stats=["ns_frac"], chunk=chunk)["ns_frac"][..., 0]


# ------------------------------------------------------------------------------- row statistics

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
    bounds._check_T(T)
    vis = _visible_scores(scores, visible)
    return torch.log_softmax((scores.double() / T).masked_fill(~vis, float("-inf")), dim=-1)


def _visible_scores(scores: torch.Tensor, visible: Optional[torch.Tensor]) -> torch.Tensor:
    """bool [Q, K]: keys whose score is finite in every head (and visible, if given)."""
    if not isinstance(scores, torch.Tensor) or scores.dim() < 2:
        raise ValueError(f"scores must be a tensor [..., Q, K], got {getattr(scores, 'shape', type(scores))}")
    Q, K = scores.shape[-2:]
    if visible is not None and visible.shape != (Q, K):
        raise ValueError(f"visible must be bool [Q={Q}, K={K}], got {tuple(visible.shape)}")
    flat = scores.reshape(-1, Q, K)
    lo, hi = flat.amin(0), flat.amax(0)                                  # NaN propagates
    if torch.isnan(hi).any():
        raise ValueError("scores contain NaN; masked keys must be -inf, not NaN")
    vis = (lo.abs() < float("inf")) & (hi.abs() < float("inf"))         # finite in every head
    return vis if visible is None else vis & visible.to(device=vis.device, dtype=torch.bool)


def _row_max(values: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    """max over each row's visible keys of per-key values: values [b, K], vis [q, K] -> [b, q]
    (-inf for rows with no visible key). O(K) per head for prefix-shaped visibility."""
    n = _prefix_lengths(vis)
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
    vis = check_inputs(probs, None, visible) & _visible_scores(scores, visible)
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
    for bs, qs in _blocks(B, Q, K, chunk):
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


# ------------------------------------------------------------------------------------ gradients

def _direction(b: int, vis: torch.Tensor, seed: int, Q: Optional[int] = None, rows: slice = slice(None)) -> torch.Tensor:
    """Random unit direction over the visible keys of each row, for flattened head index b: [q, K] float64
    for the rows `rows` of the head's Q rows (vis [q, K] their visibility; default all rows). One
    generator per (seed, head): results do not depend on chunking."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(b))
    Q = vis.shape[0] if Q is None else Q
    z = torch.randn(Q, vis.shape[1], generator=g)[rows].to(vis.device, torch.float64) * vis   # float32 draw: 5x faster
    n = z.norm(dim=-1, keepdim=True)
    return torch.where(n > 0, z / n.clamp_min(1e-300), z)


def random_directions(lead: Sequence[int], visible: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Seeded random unit directions over the visible keys, [*lead, Q, K] float64 (v of Alg. 5)."""
    B = int(np.prod(lead)) if len(lead) else 1
    return torch.stack([_direction(b, visible, seed) for b in range(B)]).reshape(*lead, *visible.shape)


def fd_grad_norms(scores: torch.Tensor, temperatures: Sequence[float], epsilons: Sequence[float],
                  visible: Optional[torch.Tensor] = None, *, seed: int = 0,
                  chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Finite-difference Jacobian norm of Alg. 5 for every row, T and eps: [..., Q, len(T), len(eps)].

    `g(T, eps) = ||softmax((l + eps v)/T) - softmax(l/T)||_2 / eps` with l = the row's scores over its
    visible keys (finite scores & visible), v a seeded random unit vector over those keys (one per
    row, the same for every T and eps; `random_directions`). Rows with < 2 keys are NaN.
    """
    vis = _visible_scores(scores, visible)
    Ts = [float(t) for t in temperatures]
    Es = [float(e) for e in epsilons]
    if not Ts or min(Ts) <= 0:
        raise ValueError(f"temperatures must be > 0, got {Ts}")
    if not Es or min(Es) <= 0:
        raise ValueError(f"epsilons must be > 0, got {Es}")
    lead = scores.shape[:-2]
    S = scores.reshape(-1, *scores.shape[-2:])
    B, Q, K = S.shape
    out = torch.empty(B, Q, len(Ts), len(Es), dtype=torch.float64)
    ok = vis.sum(-1) >= 2
    masked = not bool(vis.all())
    inf = float("inf")
    for bs, qs in _blocks(B, Q, K, chunk):
        l = S[bs, qs].double()
        if masked:
            l = torch.where(vis[qs], l, -inf)                            # -inf on invisible keys
        l.sub_(l.amax(-1, keepdim=True))                                 # max 0: softmax is shift-invariant
        l_min = float((torch.where(vis[qs], l, inf) if masked else l).amin())   # lowest visible logit
        v = torch.stack([_direction(b, vis[qs], seed, Q, qs) for b in range(bs.start, bs.stop)])
        lT, p, e = torch.empty_like(l), torch.empty_like(l), torch.empty_like(l)
        for ti, T in enumerate(Ts):
            torch.div(l, T, out=lT)
            _exp_(p.copy_(lT), l_min / T)                                # max exponent 0
            p.div_(p.sum(-1, keepdim=True))                              # softmax(l / T)
            for ei, eps in enumerate(Es):
                # exponents (l + eps v) / T, at most eps / T (l <= 0, |v_i| <= 1): shifted only when large
                torch.add(lT, v, alpha=eps / T, out=e)
                low = (l_min - eps) / T
                if eps / T > 300:
                    e.sub_(e.amax(-1, keepdim=True))
                    low = -inf
                _exp_(e, low)
                total = e.sum(-1, keepdim=True)
                e.addcmul_(p, total, value=-1)                           # e - total * p = total * (p' - p)
                out[bs, qs, ti, ei] = (torch.linalg.vector_norm(e, dim=-1) / (total.squeeze(-1) * eps)).cpu()
    out[:, ~ok.cpu()] = float("nan")
    return out.reshape(*lead, Q, len(Ts), len(Es))


def _exp_(z: torch.Tensor, low: float) -> torch.Tensor:
    """exp in place; exponents are first clamped at -700 when they may go below `low` < -700
    (exp(-700) ~ 1e-304, far below any weight that matters): exp of large negative numbers takes a
    slow denormal path on CPU that made softmax 10x slower at small temperatures."""
    if low < -700:
        z.clamp_min_(-700.0)
    return z.exp_()


def softmax_jacobian_norm(probs: torch.Tensor, T: float = 1.0, visible: Optional[torch.Tensor] = None,
                          *, method: str = "eigvalsh", chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Exact spectral norm of the softmax Jacobian `(diag(a) - a a^T) / T` for every row, [..., Q].

    `probs` are the weights at temperature T (a = softmax(l/T)). The matrix is symmetric PSD, so its
    norm is its largest eigenvalue: method "eigvalsh" (reference, O(K^3) per row) or "secular"
    (same value, O(K) per row and iteration: bisection of `1 = sum_i a_i^2/(a_i - lam)` on
    `[a_(2), a_(1)]`, where interlacing puts the top eigenvalue).
    """
    bounds._check_T(T)
    vis = check_inputs(probs, None, visible)
    a = probs.double() * vis
    if method == "eigvalsh":
        lead = a.shape[:-1]
        A = a.reshape(-1, a.shape[-1])
        res = torch.empty(A.shape[0], dtype=torch.float64, device=A.device)
        step = max(1, chunk // (A.shape[-1] ** 2))
        for i in range(0, A.shape[0], step):
            p = A[i:i + step]
            J = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
            res[i:i + step] = torch.linalg.eigvalsh(J)[..., -1]
        return res.reshape(lead) / T
    if method == "secular":
        return _secular_top(a) / T
    raise ValueError(f"method must be 'eigvalsh' or 'secular', got {method!r}")


def _secular_top(a: torch.Tensor, iters: int = 64) -> torch.Tensor:
    """Largest eigenvalue of diag(a) - a a^T per row by bisection of the secular equation, [...]."""
    top2 = a.topk(min(2, a.shape[-1]), dim=-1).values
    hi = top2[..., 0].clone()
    lo = top2[..., -1].clone() if a.shape[-1] > 1 else torch.zeros_like(hi)
    a2 = a * a
    for _ in range(iters):
        mid = (lo + hi) / 2
        f = 1 - (a2 / (a - mid.unsqueeze(-1))).sum(-1)                  # decreasing in lam on (lo, hi)
        pos = f > 0
        lo = torch.where(pos, mid, lo)
        hi = torch.where(pos, hi, mid)
    return (lo + hi) / 2


# ------------------------------------------------------------------------------------ aggregation

def row_mean(values: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Mean over query rows ignoring skipped (NaN) rows; pass `dim` of the row axis."""
    return torch.nanmean(values, dim=dim)


def ks_first_indistinguishable(d_heads: np.ndarray, e_heads: np.ndarray, ns: Sequence[int],
                               alpha: float = 0.01) -> tuple[int, list[float], list[float]]:
    """First N whose per-head samples are not rejected by a two-sample KS test (p > alpha).

    d_heads, e_heads [heads, len(ns)] per-head token means of d~ and E. Returns (N or -1, p-values,
    KS statistics) of the N scanned up to and including the first non-rejection.
    """
    from scipy.stats import ks_2samp

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    d_heads, e_heads = np.asarray(d_heads, float), np.asarray(e_heads, float)
    if d_heads.shape != e_heads.shape or d_heads.shape[-1] != len(ns):
        raise ValueError(f"d_heads {d_heads.shape} and e_heads {e_heads.shape} must both be [heads, {len(ns)}]")
    ps, ks = [], []
    for c, N in enumerate(ns):
        d, e = d_heads[:, c], e_heads[:, c]
        d, e = d[np.isfinite(d)], e[np.isfinite(e)]
        if len(d) == 0 or len(e) == 0:
            break
        with warnings.catch_warnings():         # exact p-value fails on heavy ties: scipy falls back itself
            warnings.filterwarnings("ignore", message="ks_2samp: Exact calculation unsuccessful")
            res = ks_2samp(d, e)
        ps.append(float(res.pvalue))
        ks.append(float(res.statistic))
        if res.pvalue > alpha:
            return int(N), ps, ks
    return -1, ps, ks


def _bounds_blocks(probs, x, ns, vis, reading, chunk, window: int = 32):
    """Yield (heads slice, rows slice, output columns [w], rows-valid mask [b, q, w], brackets dict of
    [b, q, w]) per block and window of consecutive N (see `distance_bounds`). One top-k per block; the
    context vectors of a window of N come from one cumulative sum over the sorted weighted vectors."""
    K = probs.shape[-1]
    lead, P, X, xmap = _flat(probs, x)
    B, Q, _ = P.shape
    wanted = {N: c for c, N in enumerate(ns)}
    slack = 2e-6                         # covers rounding of the exact values (float32 roots, `_root_sum`)
    for bs, qs in _blocks(B, Q, K, chunk):
        v = vis[qs]
        Xu, inv, _ = _unique_x(X, xmap, bs)
        Xb = Xu[inv]                                                     # [b, K, D]
        order = _top_order(P[bs, qs], v, ns[-1])
        a = P[bs, qs].double() * v
        b, q, _ = a.shape
        bidx = torch.arange(b, device=a.device).view(b, 1, 1)
        Lt = v.sum(-1).double().view(1, q, 1)                            # [1, q, 1]
        yn = a * Xb.norm(dim=-1).unsqueeze(1)                            # ||y_i||  [b, q, K]
        o = torch.matmul(a, Xb)                                          # [b, q, D]
        on = o.norm(dim=-1, keepdim=True)                                # [b, q, 1]
        o2 = on * on
        SA, Syn = (yn * yn).sum(-1, keepdim=True), yn.sum(-1, keepdim=True)
        pre_top = torch.nn.functional.pad(torch.cumsum(yn.gather(-1, order), -1), (1, 0))   # by weight
        del yn
        first = torch.zeros_like(a).scatter_(-1, order[..., :ns[0] - 1], 1.0)
        s = torch.matmul(a * first, Xb)                                  # s at N = ns[0] - 1, directly
        del first
        tri = torch.ones(window, window, dtype=torch.float64, device=a.device).tril_()
        for n0 in range(ns[0], ns[-1] + 1, window):
            Nw = list(range(n0, min(ns[-1], n0 + window - 1) + 1))
            w = len(Nw)
            idx = order[..., Nw[0] - 1:Nw[-1]]                           # [b, q, w]
            Y = a.gather(-1, idx).unsqueeze(-1) * Xb[bidx, idx]          # [b, q, w, D]
            S = torch.matmul(tri[:w, :w], Y).add_(s.unsqueeze(2))        # s for each N of the window
            s = S[:, :, -1].clone()
            cols = [i for i, N in enumerate(Nw) if N in wanted]
            if not cols:
                continue
            S = S[:, :, cols]
            N = torch.tensor([Nw[i] for i in cols], dtype=torch.float64, device=a.device).view(1, 1, -1)
            m = Lt - N                                                   # [1, q, w]
            sn2 = (S * S).sum(-1)                                        # [b, q, w]
            os_ = torch.matmul(S, o.unsqueeze(-1)).squeeze(-1)           # o . s
            sn = sn2.sqrt()
            if reading == "a":
                d_lo = d_hi = (o2 - 4 * os_ + 4 * sn2).clamp_min(0).sqrt()
            else:
                out_yn = Syn - pre_top[..., [Nw[i] for i in cols]]
                d_lo = torch.maximum((o2 - 2 * (m + 1) * os_ + (m + 1) ** 2 * sn2).clamp_min(0).sqrt(),
                                     (m * sn - out_yn).abs())
                d_hi = out_yn + m * sn
            cN = N / (Lt - 1).clamp_min(1)
            scale = m / Lt
            quad = ((1 + cN) ** 2 * SA - 2 * (1 + cN) * cN * o2 + Lt * cN ** 2 * o2).clamp_min(0)
            e_hi = scale * torch.minimum((1 + cN) * Syn + Lt * cN * on, (Lt * quad).sqrt())
            e_lo = scale * torch.maximum((1 + cN - Lt * cN).abs() * on, ((1 + cN) * Syn - Lt * cN * on).abs())
            vals = {"d_lo": d_lo * (1 - slack) - 1e-12, "d_hi": d_hi * (1 + slack) + 1e-12,
                    "e_lo": e_lo * (1 - slack) - 1e-12, "e_hi": e_hi * (1 + slack) + 1e-12}
            ok = (Lt > N).expand(b, q, len(cols))
            yield bs, qs, [wanted[Nw[i]] for i in cols], ok, vals


def distance_bounds(probs: torch.Tensor, x: torch.Tensor, ns: Sequence[int], visible: Optional[torch.Tensor] = None,
                    *, reading: str = "b", chunk: int = DEFAULT_CHUNK) -> dict[str, torch.Tensor]:
    """Cheap rigorous brackets of d~ and E for every row and N: dict d_lo, d_hi, e_lo, e_hi [..., Q, len(ns)].

    O(D) work per row and N instead of O(K D), from the triangle inequality
    (`sum_out ||y_i - s|| >= ||o - (m+1) s||`, `>= |m ||s|| - sum_out ||y_i|||`, `<= sum_out ||y_i|| + m ||s||`
    with m = L_t - N; `sum_i ||w_i|| >= ||sum_i w_i||` and `>= |sum_i (1+c)||y_i|| - c ||o|||` for E)
    and Cauchy-Schwarz (`sum_i ||w_i|| <= sqrt(L sum_i ||w_i||^2)`, with `sum_i ||w_i||^2` in closed
    form). Reading "a" of d~ is exact here (||o - 2 s||). Used by `critical_n` to certify KS
    rejections without the O(K) computation.
    """
    vis = check_inputs(probs, x, visible)
    ns = _check_ns(ns, probs.shape[-1])
    lead, Q = probs.shape[:-2], probs.shape[-2]
    B = int(np.prod(lead)) if len(lead) else 1
    out = {k: torch.empty(B, Q, len(ns), dtype=torch.float64) for k in ("d_lo", "d_hi", "e_lo", "e_hi")}
    for bs, qs, cs, ok, vals in _bounds_blocks(probs, x, ns, vis, reading, chunk):
        for k, val in vals.items():
            out[k][bs, qs][..., cs] = _nan_rows(val, ok).cpu()
    return {k: t.reshape(*lead, Q, len(ns)) for k, t in out.items()}


def _bounds_head_means(probs, x, ns, vis, reading, chunk=4 * DEFAULT_CHUNK) -> dict[str, np.ndarray]:
    """Per-head means over valid rows of the brackets: dict -> [heads, len(ns)] (NaN: no valid row)."""
    lead = probs.shape[:-2]
    B = int(np.prod(lead)) if len(lead) else 1
    sums = {k: torch.zeros(B, len(ns), dtype=torch.float64) for k in ("d_lo", "d_hi", "e_lo", "e_hi")}
    count = torch.zeros(B, len(ns), dtype=torch.float64)
    for bs, qs, cs, ok, vals in _bounds_blocks(probs, x, ns, vis, reading, chunk):
        okc = ok.cpu()
        count[bs, cs] += okc.sum(1).double()
        for k, val in vals.items():
            sums[k][bs, cs] += torch.where(okc, val.cpu(), 0.0).sum(1)
    return {k: (v / count).numpy() for k, v in sums.items()}


def ks_sf(d: float, n: int, m: int) -> float:
    """P(D_{n,m} >= d) for the two-sample KS statistic under H0 (exact, lattice paths; conservative
    by 1e-12 in d). Counts paths that stay strictly inside |i/n - j/m| < d."""
    if d <= 0:
        return 1.0
    thr = d * (1 - 1e-12) * n * m
    row = np.zeros(m + 1)
    for i in range(n + 1):
        j = np.arange(m + 1)
        inside = np.abs(i * m - j * n) < thr
        new = np.zeros(m + 1)
        if i == 0:
            new[0] = 1.0 if inside[0] else 0.0
            for jj in range(1, m + 1):
                new[jj] = new[jj - 1] if inside[jj] else 0.0
        else:
            lo = np.flatnonzero(inside)
            if len(lo):
                a, b = lo[0], lo[-1]
                new[a:b + 1] = np.cumsum(row[a:b + 1])
        row = new
    total = math.comb(n + m, n)
    return float(max(0.0, 1.0 - row[m] / total))


def ks_lower_statistic(d_lo, d_hi, e_lo, e_hi) -> float:
    """A lower bound on the two-sample KS statistic of samples known only within intervals
    d in [d_lo, d_hi], e in [e_lo, e_hi] (one interval per head): the sup over t of
    #{e_hi <= t}/m - #{d_lo <= t}/n and of #{d_hi <= t}/n - #{e_lo <= t}/m."""
    d_lo, d_hi, e_lo, e_hi = (np.sort(np.asarray(v, float)) for v in (d_lo, d_hi, e_lo, e_hi))
    n, m = len(d_lo), len(e_lo)
    t1 = (np.arange(1, m + 1) / m - np.searchsorted(d_lo, e_hi, side="right") / n).max()
    t2 = (np.arange(1, n + 1) / n - np.searchsorted(e_lo, d_hi, side="right") / m).max()
    return float(max(t1, t2, 0.0))


def critical_n(probs: torch.Tensor, x: torch.Tensor, visible: Optional[torch.Tensor] = None, *,
               alpha: float = 0.01, n_max: Optional[int] = None, block: int = 8, max_block: int = 64,
               reading: str = "b", certify: bool = True, chunk: int = DEFAULT_CHUNK,
               dtype: torch.dtype = torch.float32, progress=None) -> dict:
    """Critical top-N (Alg. 3): the first N = 1, 2, 3, ... whose per-head token-mean d~ (reading b) and
    per-head token-mean E are indistinguishable by `scipy.stats.ks_2samp` (p > alpha).

    Every N from 1 upward is tested (the paper asks for *the first* N that does not reject, so no N
    may be skipped), in windows of N (`block` first, then >= 256 when certifying, else doubling up to
    `max_block`). With `certify` (default),
    each N is first tested on rigorous brackets of every head's mean d~ and E (`distance_bounds`,
    O(D) per row): if even the smallest KS statistic compatible with the brackets has an exact
    p-value <= alpha / 2, the rejection is certain and the O(K) computation is skipped. Only the
    remaining N are computed exactly (float32 by default: the test only ranks per-head means), so the
    answer is the same as the plain scan, much faster when the critical N is large.
    Heads = all leading dims of probs. `reading` picks d~ (b, default, or a). Scans up to `n_max`
    (default L - 1). Returns dict(n=N or -1, ns, pvalues, ks, exact, p_upper, d_mean, e_mean) per
    scanned N (pvalues/ks NaN and exact False where certified; d_mean/e_mean: mean over heads, of the
    exact values or of the bracket midpoints).
    """
    vis = check_inputs(probs, x, visible)
    if reading not in ("a", "b"):
        raise ValueError(f"reading must be 'a' or 'b', got {reading!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    key = f"dtilde_{reading}"
    K = probs.shape[-1]
    n_max = K - 1 if n_max is None else min(int(n_max), K - 1)
    if n_max < 1:
        raise ValueError(f"need at least 2 keys for a top-N scan, got K={K}")
    res = {"n": -1, "ns": [], "pvalues": [], "ks": [], "exact": [], "p_upper": [], "d_mean": [], "e_mean": []}

    def record(N, p, ks, exact, p_up, dm, em):
        for k_, val in (("ns", N), ("pvalues", p), ("ks", ks), ("exact", exact), ("p_upper", p_up),
                        ("d_mean", dm), ("e_mean", em)):
            res[k_].append(val)
        if progress is not None:
            progress.update(1)

    start, size = 1, block
    while start <= n_max:
        ns = list(range(start, min(n_max, start + size - 1) + 1))
        certified = {}
        if certify:
            hm = _bounds_head_means(probs, x, ns, vis, reading)
            for c, N in enumerate(ns):
                cols = [hm[k_][:, c] for k_ in ("d_lo", "d_hi", "e_lo", "e_hi")]
                okh = np.all([np.isfinite(col) for col in cols], axis=0)
                if okh.sum() == 0:
                    break
                D = ks_lower_statistic(*(col[okh] for col in cols))
                p_up = ks_sf(D, int(okh.sum()), int(okh.sum()))
                if p_up <= alpha / 2:
                    certified[N] = (p_up, float(np.mean((cols[0] + cols[1])[okh] / 2)),
                                    float(np.mean((cols[2] + cols[3])[okh] / 2)))
        todo = [N for N in ns if N not in certified]
        exact = {}
        # exact values for the uncertified N, in small batches, until the first non-rejection
        pos = 0
        found = None
        while pos < len(todo) and found is None:
            batch = todo[pos:pos + 8]
            st = distance_stats(probs, x, batch, vis, stats=(key, "E"), chunk=chunk, dtype=dtype)
            d = row_mean(st[key], dim=-2).reshape(-1, len(batch)).numpy()
            e = row_mean(st["E"], dim=-2).reshape(-1, len(batch)).numpy()
            n, ps, ks = ks_first_indistinguishable(d, e, batch, alpha)
            for c in range(len(ps)):
                exact[batch[c]] = (ps[c], ks[c], float(np.nanmean(d[:, c])), float(np.nanmean(e[:, c])))
            if n != -1 or len(ps) < len(batch):
                found = n if n != -1 else "stop"
            pos += len(batch)
        for N in ns:
            if N in certified:
                p_up, dm, em = certified[N]
                record(N, float("nan"), float("nan"), False, p_up, dm, em)
            elif N in exact:
                p, ks, dm, em = exact[N]
                record(N, p, ks, True, p, dm, em)
                if p > alpha:
                    res["n"] = N
                    return res
            else:
                return res              # no rows left for this N (all skipped)
        start = ns[-1] + 1
        size = min(size * 2, max_block) if not certify else max(size * 8, 256)
    return res
