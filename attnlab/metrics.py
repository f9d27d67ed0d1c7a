"""Per-row attention metrics of arXiv 2508.17821, vectorised over heads and query rows.

Inputs (all torch tensors):

- `probs [..., Q, K]`: attention weights (0 on masked keys), leading dims e.g. [layer, head];
- `x [..., K, D]`: the vectors x_i of the paper (per-head value vectors by default); its leading dims
  broadcast against those of probs (layer-input hidden states `[layer, 1, K, D]` serve every head);
- `visible bool [Q, K]`: keys each query row counts (default: all). A row's length is
  `L_t = visible[t].sum()`; rows with `L_t <= N` are skipped (NaN in per-row outputs).
  Protocol "masked keys included" = pass `visible=None` (all keys, weight 0 where masked).

Everything is computed in float64 (the critical-N scan: float32) on blocks of (head, query rows)
small enough to stay in cache and bound memory (`chunk` = elements of one [heads, rows, K] block,
2 MiB: a 12 x 12 model at L = 1024 never allocates more than a few such blocks per tensor). Top-N =
the first N keys of each row sorted by weight, descending, ties broken by the lower key index
(stable sort; a partial top-k selection with the same tie rule when only small N are needed), so
one sort serves every N. Selected-set quantities (s, x_i.s, cumulative mass, max norm) are updated
as N grows, from the Gram matrix, instead of being recomputed.

Distances use `||a_i x_i - s||^2 = a_i^2 ||x_i||^2 - 2 a_i x_i.s + ||s||^2` for the many non-selected
keys (no [rows, K, D] tensors) and direct differences for the few selected ones. `attnlab.oracle`
recomputes all of it row by row, directly from the formulas; the tests check both agree to 1e-5
relative. Functions accept tensors on any device; per-row outputs come back on the CPU.
"""
from __future__ import annotations

import math
import warnings
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from attnlab import bounds

DEFAULT_CHUNK = 1 << 18          # elements of one float64 [heads, rows, K] block (2 MiB: stays in cache)
REANCHOR = 32                    # recompute s directly every REANCHOR steps of N (bounds rounding drift)
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
    if torch.isnan(probs).any():
        raise ValueError("probs contain NaN: check the model's attention (fully masked rows?)")
    if x is not None:
        if x.dim() < 2 or x.shape[-2] != K:
            raise ValueError(f"x must be [..., K={K}, D] to match probs [..., Q, K]; got {tuple(x.shape)}")
        try:
            torch.broadcast_shapes(x.shape[:-2], probs.shape[:-2])
        except RuntimeError as exc:
            raise ValueError(f"leading dims of x {tuple(x.shape[:-2])} do not broadcast to those of "
                             f"probs {tuple(probs.shape[:-2])}") from exc
        if len(x.shape[:-2]) > len(probs.shape[:-2]):
            raise ValueError("x has more leading dims than probs")
        if torch.isnan(x).any():
            raise ValueError("x contains NaN")
    if visible is None:
        return torch.ones(Q, K, dtype=torch.bool, device=probs.device)
    if visible.shape != (Q, K):
        raise ValueError(f"visible must be bool [Q={Q}, K={K}], got {tuple(visible.shape)}")
    return visible.to(device=probs.device, dtype=torch.bool)


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

class _Block:
    """One (heads, rows) block: sorted rows, Gram matrix, running context vector s and x.s.

    Xu [u, K, D] are the distinct x of the block (one per head for value vectors, one per layer for
    hidden states) and inv [b] says which one each head uses, so the Gram matrix and pairwise
    distances are computed once per distinct x. Big per-N work is done in place in `buf`.
    """

    def __init__(self, probs, vis, Xu, inv, n_max: Optional[int] = None):
        self.vis = vis                               # [q, K]
        K = probs.shape[-1]
        if n_max is not None and n_max + 1 <= K // 8:   # only the first n_max + 1 positions are needed
            self.order, self.rank = _sort_top(probs, vis, n_max + 1)
        else:
            self.order, self.rank = _sort(probs, vis)   # sort the input dtype (same order as float64)
        dt = Xu.dtype
        a = probs.to(dt) * vis
        self.a = a                                   # [b, q, K] (float64 by default), 0 on invisible keys
        self.Xu, self.inv = Xu, inv
        self.X = Xu[inv]                             # [b, K, D]
        self.Lt = vis.sum(-1).to(dt)                 # [q]
        self.n_hidden = (vis.shape[-1] - self.Lt).unsqueeze(-1)   # invisible keys per row [q, 1]
        self.xn2 = (self.X * self.X).sum(-1)         # [b, K]
        self.A = a * a * self.xn2.unsqueeze(1)       # ||y_i||^2  [b, q, K]
        self.Gu = Xu @ Xu.transpose(1, 2)            # [u, K, K]
        b, q, K = a.shape
        dev = a.device
        self.s = torch.zeros(b, q, Xu.shape[-1], dtype=dt, device=dev)
        self.xs = torch.zeros(b, q, K, dtype=dt, device=dev)
        self.buf = torch.empty(b, q, K, dtype=dt, device=dev)
        self.n = 0
        self.bidx = torch.arange(b, device=dev).unsqueeze(1)     # [b, 1]
        self.gflat = (inv.unsqueeze(1) * K)          # [b, 1] row offset into Gu viewed [u*K, K]
        self.jump = max(2, Xu.shape[-1] // 8)        # stepping N costs ~2 passes, a jump ~2 D flops

    def advance(self, N: int) -> None:
        """Move s (top-N context vector) and xs = X s to N."""
        if N < self.n or N - self.n > self.jump or N // REANCHOR != self.n // REANCHOR:
            self.s = torch.matmul(self.a * (self.rank < N), self.X)
            torch.matmul(self.s, self.X.transpose(1, 2), out=self.xs)
        else:
            G = self.Gu.reshape(-1, self.Gu.shape[-1])
            for m in range(self.n, N):
                j = self.order[..., m]                                   # [b, q]
                aj = self.a.gather(-1, j.unsqueeze(-1))                  # [b, q, 1]
                self.s += aj * self.X[self.bidx, j]
                torch.index_select(G, 0, (self.gflat + j).reshape(-1), out=self.buf.view(-1, G.shape[-1]))
                self.xs.addcmul_(self.buf, aj)
        self.n = N

    def dist(self) -> torch.Tensor:
        """||a_i x_i - s|| for every key, written into and returned as `self.buf` [b, q, K].
        Invisible keys (a = 0) hold exactly ||s||."""
        s2 = (self.s * self.s).sum(-1, keepdim=True)
        buf = torch.mul(self.a, self.xs, out=self.buf)
        torch.add(self.A, buf, alpha=-2, out=buf)
        return buf.add_(s2).clamp_min_(0).sqrt_()

    def out_sum(self, dist: torch.Tensor, N: int) -> torch.Tensor:
        """sum over visible non-selected keys of `dist` [b, q, K] (invisible entries hold ||s||)."""
        hidden = self.n_hidden.squeeze(-1) * self.s.norm(dim=-1)
        if 2 * N < dist.shape[-1] or self.order.shape[-1] < dist.shape[-1]:   # gather N or K - N keys
            return dist.sum(-1) - hidden - dist.gather(-1, self.order[..., :N]).sum(-1)
        return dist.gather(-1, self.order[..., N:]).sum(-1) - hidden

    def sel_dist(self, N: int, chunk: int) -> torch.Tensor:
        """||a_i x_i - s|| for the top-N keys, computed directly (no cancellation): [b, q, N]."""
        b, q, K = self.a.shape
        top = self.order[..., :N]
        res = torch.empty(b, q, N, dtype=torch.float64, device=self.a.device)
        step = max(1, chunk // max(1, b * N * self.X.shape[-1]))
        for q0 in range(0, q, step):
            qs = slice(q0, min(q, q0 + step))
            t = top[:, qs]
            y = self.a[:, qs].gather(-1, t).unsqueeze(-1) * self.X[self.bidx.unsqueeze(-1), t]
            res[:, qs] = (y - self.s[:, qs].unsqueeze(2)).norm(dim=-1)
        return res

    def pair_xi(self, N: int, chunk: int) -> torch.Tensor:
        """Mean over the other selected j of ||a_j x_j - a_i x_i|| for each selected i: [b, q, N]."""
        b, q, K = self.a.shape
        top = self.order[..., :N]
        if N == 1:
            return torch.zeros(b, q, 1, dtype=torch.float64, device=self.a.device)
        res = torch.empty(b, q, N, dtype=torch.float64, device=self.a.device)
        step = max(1, chunk // max(1, b * N * max(N, self.X.shape[-1])))
        for q0 in range(0, q, step):
            qs = slice(q0, min(q, q0 + step))
            t = top[:, qs]                                               # [b, qq, N]
            y = self.a[:, qs].gather(-1, t).unsqueeze(-1) * self.X[self.bidx.unsqueeze(-1), t]
            g = y @ y.transpose(-1, -2)                                  # [b, qq, N, N]
            y2 = torch.diagonal(g, dim1=-2, dim2=-1)
            d2 = y2.unsqueeze(-1) + y2.unsqueeze(-2) - 2 * g
            res[:, qs] = d2.clamp_min(0).sqrt().sum(-1) / (N - 1)
        return res


class _TopSet:
    """y_j = a_j x_j of each row's top keys in sorted order, grown one key at a time as N grows, with
    running sums of the pairwise distances among them (the 'pair' spread of Theorem 2): O(N D) work
    per row and step instead of O(N^2 D) per N. Memory [b, q, n_max, D]."""

    def __init__(self, blk: _Block, n_max: int):
        b, q, _ = blk.a.shape
        self.blk = blk
        self.Y = torch.empty(b, q, n_max, blk.X.shape[-1], dtype=blk.a.dtype, device=blk.a.device)
        self.psum = torch.zeros(b, q, n_max, dtype=blk.a.dtype, device=blk.a.device)
        self.n = 0

    def grow(self, N: int) -> None:
        blk = self.blk
        for m in range(self.n, N):
            j = blk.order[..., m]                                        # [b, q]
            y = blk.a.gather(-1, j.unsqueeze(-1)) * blk.X[blk.bidx, j]   # [b, q, D]
            self.Y[:, :, m] = y
            if m:
                d = (self.Y[:, :, :m] - y.unsqueeze(2)).norm(dim=-1)     # [b, q, m]
                self.psum[:, :, :m] += d
                self.psum[:, :, m] = d.sum(-1)
        self.n = max(self.n, N)

    def sel_dist(self, N: int) -> torch.Tensor:
        """||y_i - s|| for the top-N keys [b, q, N] (call after grow(N) and blk.advance(N))."""
        return (self.Y[:, :, :N] - self.blk.s.unsqueeze(2)).norm(dim=-1)

    def pair_xi(self, N: int) -> torch.Tensor:
        if N == 1:
            return torch.zeros_like(self.psum[:, :, :1])
        return self.psum[:, :, :N] / (N - 1)


def _unique_x(X: torch.Tensor, xmap: torch.Tensor, bs: slice,
              dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """Distinct x of a heads block: Xu [u, K, D] in `dtype`, inv [b], and a hashable key."""
    uniq, inv = torch.unique(xmap[bs], return_inverse=True)
    return X[uniq.to(X.device)].to(dtype), inv.to(X.device), tuple(uniq.tolist())


def _nan_rows(value: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    return value.masked_fill(~ok, float("nan"))


def _d1(block: "_Block", N: int, D: torch.Tensor, out: torch.Tensor, chunk: int) -> torch.Tensor:
    """max_{j in top-N, i out, visible} ||x_i - x_j|| per row, [b, q]; D [b, K, K] pairwise distances."""
    b, q, K = block.a.shape
    res = torch.empty(b, q, dtype=torch.float64, device=block.a.device)
    step = max(1, chunk // max(1, b * N * K))
    for q0 in range(0, q, step):
        qs = slice(q0, min(q, q0 + step))
        j = block.order[:, qs, :N]                                       # [b, qq, N]
        far = D[block.bidx.unsqueeze(-1), j].amax(dim=2)                 # max over selected j: [b, qq, K]
        res[:, qs] = torch.where(out[:, qs], far, float("-inf")).amax(-1)
    return res


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
    Rows with L_t <= N are NaN. `ns` are sorted ascending in the output. `dtype` of the internal
    arithmetic: float64 (default; matches the oracle to ~1e-12) or float32 (about 2x faster; ~1e-6
    relative, used by the critical-N scan, which only ranks per-head means).
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
    out = {k: torch.empty(B, Q, len(ns), dtype=torch.float64) for k in stats}
    need_d1 = bool({"d1", "dmax_B", "dmax_R", "dmax_a"} & set(stats))
    need_R = need_d1 or "R" in stats
    need_E = bool({"E", "jensen"} & set(stats))
    for bs, qs in _blocks(B, Q, K, chunk):
        v = vis[qs]
        Xu, inv, _ = _unique_x(X, xmap, bs, dtype)
        blk = _Block(P[bs, qs], v, Xu, inv, n_max=ns[-1])
        a = blk.a
        o = torch.matmul(a, blk.X)                                       # full output [b, q, D]
        Lt = blk.Lt
        if need_E:
            Bterm = torch.matmul(o, blk.X.transpose(1, 2)).mul_(a)       # a_i x_i.o
            o2 = (o * o).sum(-1, keepdim=True)
            S2 = blk.A.sum(-1, keepdim=True)
            Lm1 = (Lt - 1).clamp_min(1).unsqueeze(-1)
            V = torch.add(o2, Bterm, alpha=-2).add_(blk.A).div_(Lm1)     # ||o - y_i||^2 / (L-1)
            V = torch.sub(S2, blk.A).sub_(V).clamp_min_(0).sqrt_()       # sqrt(sum_{j!=i} ||y_j - mu_i||^2)
            # invisible keys have y_i = 0: their V is sqrt(S2 - o2/(L-1)); remove them exactly
            V0 = (S2 - o2 / Lm1).clamp_min(0).sqrt().squeeze(-1)
            SV = V.sum(-1) - blk.n_hidden.squeeze(-1) * V0
            del V
        if need_R:
            xn_sorted = blk.xn2.sqrt()[blk.bidx.unsqueeze(-1), blk.order]  # [b, q, K]
            Rcum = torch.cummax(xn_sorted, dim=-1).values
            acum = torch.cumsum(a.gather(-1, blk.order), dim=-1)
            del xn_sorted
        if need_d1:
            Dm = torch.cdist(Xu, Xu)[inv]                                # [b, K, K]
        for c, N in enumerate(ns):
            ok = (Lt > N).expand(a.shape[:2])
            blk.advance(N)
            res = {}
            if "dtilde_b" in stats:
                res["dtilde_b"] = blk.out_sum(blk.dist(), N)
            if "dtilde_a" in stats:
                res["dtilde_a"] = (o - 2 * blk.s).norm(dim=-1)
            if need_E:
                cN = N / Lm1                                             # [q, 1]
                if "E" in stats:
                    buf = torch.mul(blk.A, (1 + cN) ** 2, out=blk.buf)
                    buf.addcmul_(Bterm, -2 * (1 + cN) * cN).add_(cN ** 2 * o2).clamp_min_(0).sqrt_()
                    hidden = blk.n_hidden * cN * o2.sqrt()               # invisible keys: c ||o|| each
                    res["E"] = (Lt - N) / Lt * (buf.sum(-1) - hidden.squeeze(-1))
                if "jensen" in stats:
                    coef = (N * (Lt - 1 - N) / ((Lt - 1) * (Lt - 2))).clamp_min(0)
                    coef = torch.where(Lt > 2, coef, torch.zeros_like(coef))
                    res["jensen"] = (Lt - N) / Lt * coef.sqrt() * SV
            if need_R:
                abar = acum[..., N - 1]
                R = Rcum[..., N - 1]
                res["abar"], res["R"] = abar, R
            if need_d1:
                outk = v & (blk.rank >= N)
                d1 = _d1(blk, N, Dm, outk, chunk)
                res["d1"] = d1
                res["dmax_B"] = bounds.theorem1_fixed_bound(abar, d1, R, Lt, N, "B")
                res["dmax_R"] = bounds.theorem1_fixed_bound(abar, d1, R, Lt, N, "R")
                res["dmax_a"] = bounds.theorem1_fixed_bound_a(abar, d1, R)
            for k in stats:
                out[k][bs, qs, c] = _nan_rows(res[k], ok).to(out[k].device, torch.float64)
    return {k: t.reshape(*lead, Q, len(ns)) for k, t in out.items()}


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
    out = {k: torch.empty(B, Q, len(ns), dtype=torch.float64) for k in stats}
    need_pair = bool(_PAIR_STATS & set(stats))
    need_delta = bool(_DELTA_STATS & set(stats))
    delta_cache: dict[tuple, torch.Tensor] = {}
    for bs, qs in _blocks(B, Q, K, chunk):
        v = vis[qs]
        Xu, inv, key = _unique_x(X, xmap, bs)
        blk = _Block(P[bs, qs], v, Xu, inv, n_max=ns[-1])
        a = blk.a
        Lt = blk.Lt
        if need_delta:
            if key not in delta_cache:
                delta_cache = {key: min_pairwise_distance(Xu, vis)}      # [u, Q]
            delta = delta_cache[key][inv][:, qs]
        tops = _TopSet(blk, ns[-1]) if a.shape[0] * a.shape[1] * ns[-1] * Xu.shape[-1] <= 8 * chunk else None
        hide = torch.zeros(v.shape, dtype=a.dtype, device=a.device).masked_fill_(~v, float("inf"))   # +inf on invisible keys
        for c, N in enumerate(ns):
            ok = (Lt > N).expand(a.shape[:2])
            blk.advance(N)
            if tops is not None:
                tops.grow(N)
            top = blk.order[..., :N]                                     # [b, q, N]
            dist = blk.dist().add_(hide).scatter_(-1, top, float("inf"))
            near = dist.argmin(-1, keepdim=True)                         # nearest non-selected key
            y_near = a.gather(-1, near) * blk.X[blk.bidx, near.squeeze(-1)]          # [b, q, D]
            r = (y_near - blk.s).norm(dim=-1)                            # recomputed directly [b, q]
            ok = ok & (r > 0)
            dsel = blk.sel_dist(N, chunk) if tops is None else tops.sel_dist(N)      # [b, q, N]
            res = {"ns_frac": (dsel < r.unsqueeze(-1)).sum(-1).double() / N, "r": r}
            a_sel = a.gather(-1, top)
            xis = {"row": dsel}
            if need_pair:
                xis["pair"] = blk.pair_xi(N, chunk) if tops is None else tops.pair_xi(N)
            if need_delta:
                res["delta"] = delta
                xis["delta"] = bounds.theorem2_xi_delta(a_sel, delta, M)
            for name, xi in xis.items():
                lo, up_b = bounds.theorem2_bounds(xi, r, M, form="B")
                _, up_r = bounds.theorem2_bounds(xi, r, M, form="R")
                res[f"xi_{name}"] = xi.mean(-1)
                res[f"lower_{name}"], res[f"upper_B_{name}"], res[f"upper_R_{name}"] = lo, up_b, up_r
            for k in stats:
                out[k][bs, qs, c] = _nan_rows(res[k], ok).to(out[k].device, torch.float64)
    return {k: t.reshape(*lead, Q, len(ns)) for k, t in out.items()}


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
    if not isinstance(scores, torch.Tensor) or scores.dim() < 2:
        raise ValueError(f"scores must be a tensor [..., Q, K], got {getattr(scores, 'shape', type(scores))}")
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN; masked keys must be -inf, not NaN")
    Q, K = scores.shape[-2:]
    if visible is not None and visible.shape != (Q, K):
        raise ValueError(f"visible must be bool [Q={Q}, K={K}], got {tuple(visible.shape)}")
    vis = torch.isfinite(scores).reshape(-1, Q, K).all(0)          # a key counts if finite in every head
    return vis if visible is None else vis & visible.to(torch.bool)


def row_summary(scores: torch.Tensor, probs: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scaling: float,
                visible: Optional[torch.Tensor] = None, *, chunk: int = DEFAULT_CHUNK) -> dict[str, torch.Tensor]:
    """Fig. 1 per-row quantities, each [..., Q] float64:

    max_weight, entropy, entropy_norm (H / log L_t), log_min_w / log_max_w (natural-log extreme
    weights from the scores, exact under underflow), cor1_lo / cor1_hi (log Corollary-1 band with
    T = 1/scaling, Delta = ||q_t|| max_i ||k_i||), lemma1_lo / lemma1_hi (log Lemma-1 band for
    softmax with a = max_i |scores_i|, i.e. C = exp(-+2a)), L (row length), logit_err (max |scores -
    scaling q.k| over the row: 0 when Corollary 1 applies to the model's logits).
    """
    vis = check_inputs(probs, None, visible) & _visible_scores(scores, visible)
    if q.shape[:-1] != probs.shape[:-1] or k.shape[:-1] != probs.shape[:-2] + probs.shape[-1:]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} do not match probs {tuple(probs.shape)}")
    lead, Q, K = probs.shape[:-2], probs.shape[-2], probs.shape[-1]
    S, P = scores.reshape(-1, Q, K), probs.reshape(-1, Q, K)
    Qv, Kv = q.reshape(-1, Q, q.shape[-1]), k.reshape(-1, K, k.shape[-1])
    B = S.shape[0]
    keys = ("max_weight", "entropy", "entropy_norm", "log_min_w", "log_max_w", "cor1_lo", "cor1_hi",
            "lemma1_lo", "lemma1_hi", "L", "logit_err")
    out = {key: torch.empty(B, Q, dtype=torch.float64) for key in keys}
    Lt_all = vis.sum(-1).double()
    T = 1.0 / scaling
    inf = float("inf")
    for bs, qs in _blocks(B, Q, K, chunk):
        v, Lt = vis[qs], Lt_all[qs]
        sc = S[bs, qs].double()
        lse = torch.logsumexp(torch.where(v, sc, -inf), dim=-1)          # [b, q]
        p = P[bs, qs].double() * v
        ent = -(torch.special.xlogy(p, p)).sum(-1)
        kn = Kv[bs].double().norm(dim=-1)                                # [b, K]
        delta = Qv[bs, qs].double().norm(dim=-1) * torch.where(v, kn.unsqueeze(1), -inf).amax(-1)
        cor_lo, cor_hi = bounds.corollary1_log_band(Lt, delta, T)
        amax = torch.where(v, sc.abs(), 0.0).amax(-1)
        logits = scaling * torch.matmul(Qv[bs, qs].double(), Kv[bs].double().transpose(-1, -2))
        err = torch.where(v, (logits - sc).abs(), 0.0).amax(-1)
        res = {"max_weight": p.amax(-1), "entropy": ent,
               "entropy_norm": torch.where(Lt > 1, ent / Lt.log().clamp_min(1e-300), torch.zeros_like(ent)),
               "log_min_w": torch.where(v, sc, inf).amin(-1) - lse, "log_max_w": torch.where(v, sc, -inf).amax(-1) - lse,
               "cor1_lo": cor_lo, "cor1_hi": cor_hi,
               "lemma1_lo": -Lt.log() - 2 * amax, "lemma1_hi": -Lt.log() + 2 * amax,
               "L": Lt.expand_as(ent), "logit_err": err}
        for key in keys:
            out[key][bs, qs] = res[key].cpu()
    return {key: t.reshape(*lead, Q) for key, t in out.items()}


# ------------------------------------------------------------------------------------ gradients

def _direction(b: int, vis: torch.Tensor, seed: int) -> torch.Tensor:
    """Random unit direction over the visible keys of each row, for flattened head index b: [Q, K] float64.
    One generator per (seed, head): results do not depend on chunking."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(b))
    z = torch.randn(vis.shape, generator=g).to(vis.device, torch.float64) * vis   # float32 draw: 5x faster
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
    hide = torch.zeros(vis.shape, dtype=torch.float64, device=vis.device).masked_fill_(~vis, float("-inf"))
    for bs, qs in _blocks(B, Q, K, chunk):
        l = S[bs, qs].double().add_(hide[qs])                           # -inf on invisible keys
        l = l.sub_(l.amax(-1, keepdim=True))                             # softmax is shift-invariant
        v = torch.stack([_direction(b, vis, seed)[qs] for b in range(bs.start, bs.stop)])
        base = torch.empty_like(l)
        buf = torch.empty_like(l)
        for ti, T in enumerate(Ts):
            _softmax_(torch.div(l, T, out=base))
            for ei, eps in enumerate(Es):
                _softmax_(torch.add(l, v, alpha=eps, out=buf).div_(T)).sub_(base)
                out[bs, qs, ti, ei] = (torch.linalg.vector_norm(buf, dim=-1) / eps).cpu()
    out[:, ~ok.cpu()] = float("nan")
    return out.reshape(*lead, Q, len(Ts), len(Es))


def _softmax_(z: torch.Tensor) -> torch.Tensor:
    """In-place softmax over the last dim of float64 logits. Exponents below -700 are clamped there
    (exp(-700) ~ 1e-304, far below any weight that matters): exp of large negative numbers takes a
    slow denormal path on CPU that made this 10x slower at small temperatures."""
    z.sub_(z.amax(-1, keepdim=True)).clamp_min_(-700.0).exp_()
    return z.div_(z.sum(-1, keepdim=True))


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
    [b, q, w]) per block and window of consecutive N (see `distance_bounds`). One sort per block; the
    context vectors of a window of N come from one cumulative sum over the sorted weighted vectors."""
    K = probs.shape[-1]
    lead, P, X, xmap = _flat(probs, x)
    B, Q, _ = P.shape
    wanted = {N: c for c, N in enumerate(ns)}
    slack = 1e-7                         # covers rounding in the expanded squared norms
    for bs, qs in _blocks(B, Q, K, chunk):
        v = vis[qs]
        Xu, inv, _ = _unique_x(X, xmap, bs)
        Xb = Xu[inv]                                                     # [b, K, D]
        order, rank = _sort(P[bs, qs], v)
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
        s = torch.matmul(a * (rank < ns[0] - 1), Xb)                     # s at N = ns[0] - 1, directly
        del rank
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
                    *, reading: str = "b", chunk: int = 4 * DEFAULT_CHUNK) -> dict[str, torch.Tensor]:
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


def _bounds_head_means(probs, x, ns, vis, reading, chunk=16 * DEFAULT_CHUNK) -> dict[str, np.ndarray]:
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
