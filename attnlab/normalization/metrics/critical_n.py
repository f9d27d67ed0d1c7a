"""The critical top-N of arXiv 2508.17821 (Alg. 3, Fig. 2c, the "6% rule"): the first N whose per-head
d~ and E a two-sample KS test cannot tell apart, with certified early rejections from cheap brackets."""
from __future__ import annotations

import functools
import math
import warnings
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from attnlab.core.util import last_visible
from attnlab.normalization.metrics.distance import distance_means
from attnlab.normalization.metrics.engine import (
    DEFAULT_CHUNK,
    SMALL_N,
    batched,
    blocks,
    check_inputs,
    check_ns,
    cpu_kernels,
    flatten_heads,
    nan_rows,
    tile_elements,
    top_order,
    unique_x,
)

BRACKET_SLACK = 2e-6             # covers rounding of the exact values (float32 roots, `root_sum`)
GRAM_ELEMENTS = 1 << 24          # float64 elements of the Gram matrices X X^T held at once (128 MiB)
DOTS_ELEMENTS = 1 << 27          # float64 elements of the x_i.o and x_i.m kept for a whole scan (1 GiB)
STATE_ELEMENTS = 1 << 28         # float64 elements of the running x_i.s kept between exact calls (2 GiB)
BRACKET_ELEMENTS = {"cpu": 1 << 16, "other": 1 << 25}   # [heads, rows, N, D] elements of the brackets' running top-N
                                                        # sums at once (`engine.batched`; else windows of 32 N)


def ks_first_indistinguishable(d_heads: np.ndarray, e_heads: np.ndarray, ns: Sequence[int],
                               alpha: float = 0.01) -> tuple[int, list[float], list[float]]:
    """First N whose per-head samples are not rejected by a two-sample KS test (p > alpha).

    d_heads, e_heads [heads, len(ns)] per-head token means of d~ and E. Returns (N or -1, p-values,
    KS statistics) of the N scanned up to and including the first non-rejection. The statistics of every N come from
    one sort and one batched search (`ks_columns`); p-values and statistics are `scipy.stats.ks_2samp`'s.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    d_heads, e_heads = np.asarray(d_heads, float), np.asarray(e_heads, float)
    if d_heads.shape != e_heads.shape or d_heads.shape[-1] != len(ns):
        raise ValueError(f"d_heads {d_heads.shape} and e_heads {e_heads.shape} must both be [heads, {len(ns)}]")
    i, j, n, m = ks_columns(d_heads, e_heads)
    ps, ks = [], []
    for c, N in enumerate(ns):
        if n[c] == 0 or m[c] == 0:
            break
        stat, p = ks_2samp_counts(int(i[c]), int(j[c]), int(n[c]), int(m[c]))
        ps.append(p)
        ks.append(stat)
        if p > alpha:
            return int(N), ps, ks
    return -1, ps, ks


def ks_columns(d: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, ...]:
    """The two-sample KS statistic of every column of d [n_max, C] against e [m_max, C] (finite entries only), as
    `scipy.stats.ks_2samp` finds it, in one sort and one batched `searchsorted`: (i, j, n, m) long [C], the
    statistic being |i/n - j/m| (i of the n finite d and j of the m finite e at or below its location; ties exact)."""
    fd, fe = np.isfinite(d), np.isfinite(e)
    n, m = fd.sum(0), fe.sum(0)
    ds, es = np.sort(np.where(fd, d, np.inf), 0), np.sort(np.where(fe, e, np.inf), 0)   # non-finite last
    allv = np.concatenate([ds, es], 0)                                     # [n_max + m_max, C]

    def below(sorted_, v):                                                 # # entries <= v, column by column
        rows = torch.searchsorted(torch.from_numpy(np.ascontiguousarray(sorted_.T)),
                                  torch.from_numpy(np.ascontiguousarray(v.T)), right=True)
        return rows.numpy().T
    c1, c2 = below(ds, allv), below(es, allv)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = c1 / n - c2 / m                                             # scipy's cdf1 - cdf2
    ok = np.isfinite(allv)
    hi = np.argmax(np.where(ok, diff, -np.inf), 0)
    lo = np.argmin(np.where(ok, diff, np.inf), 0)
    cols = np.arange(diff.shape[1])
    loc = np.where(np.clip(-diff[lo, cols], 0, 1) > diff[hi, cols], lo, hi)
    return c1[loc, cols], c2[loc, cols], n, m


@functools.lru_cache(maxsize=None)
def fewest_heads(alpha: float) -> int:
    """The fewest heads (one token-mean d~ and one E each) at which the KS test can reject at level alpha at all:
    two samples of n entirely apart (statistic 1) have scipy's exact p-value 2 / C(2n, n), the smallest there is.
    With fewer heads every N is accepted, so `critical_n` answers N = 1 whatever the heads: 5 at alpha = 0.01
    (4 heads: p >= 2/70 = 0.029)."""
    n = 1
    while ks_2samp_counts(n, 0, n, n)[1] > alpha:
        n += 1
    return n


@functools.lru_cache(maxsize=1 << 14)
def ks_2samp_counts(i: int, j: int, n: int, m: int) -> tuple[float, float]:
    """(statistic, p-value) of `scipy.stats.ks_2samp` for samples of sizes n and m whose statistic is |i/n - j/m|
    (`ks_columns`): both depend on nothing else, so scipy is asked once per (i, j, n, m), on two samples that put i
    of n and j of m at 0 and the rest at 2 (the same cdf difference, computed the same way)."""
    from scipy.stats import ks_2samp

    a = np.r_[np.zeros(i), np.full(n - i, 2.0)]
    b = np.r_[np.zeros(j), np.full(m - j, 2.0)]
    with warnings.catch_warnings():         # exact p-value fails on heavy ties: scipy falls back itself
        warnings.filterwarnings("ignore", message="ks_2samp: Exact calculation unsuccessful")
        res = ks_2samp(a, b)
    return float(res.statistic), float(res.pvalue)


def _running_sums(tri: torch.Tensor, Y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """s [b, q, D] + the running sums of Y [b, q, w, D] along w: [b, q, w, D], by windows of tri's size (the lower
    triangle of ones, [window, window]): one product per window, the windows' last rows chained by one cumsum."""
    b, q, w, D = Y.shape
    window = tri.shape[0]
    if w <= window:
        return torch.matmul(tri[:w, :w], Y).add_(s.unsqueeze(2))
    nw = -(-w // window)
    T = torch.matmul(tri, torch.nn.functional.pad(Y, (0, 0, 0, nw * window - w)).view(b, q, nw, window, D))
    carry = torch.cumsum(torch.cat([s.unsqueeze(2), T[:, :, :-1, -1]], 2), 2)      # s before each window
    return T.add_(carry.unsqueeze(3)).view(b, q, nw * window, D)[:, :, :w]


def _bounds_blocks(probs, x, ns, vis, reading, chunk, window: int = 32, order=None):
    """Yield (heads slice, rows slice, output columns [w], rows-valid mask [b, q, w], brackets dict of
    [b, q, w]) per block and window of consecutive N (see `distance_bounds`). One top-k per block; the
    context vectors of a window of N come from one cumulative sum over the sorted weighted vectors (`_running_sums`:
    windows of 32 N, or where `engine.batched` as many as BRACKET_ELEMENTS allow in one tensor program).
    `order` [..., Q, >= max(ns)] (optional): each row's selected set is its first N keys in this order (e.g. the
    random subsets of E4, `readings.random_orders`) instead of its top N by weight."""
    K = probs.shape[-1]
    lead, P, X, xmap = flatten_heads(probs, x)
    B, Q, _ = P.shape
    if order is not None:
        order = order.reshape(B, Q, -1)[..., :ns[-1]].to(P.device)
    wanted = {N: c for c, N in enumerate(ns)}
    slack = BRACKET_SLACK
    for bs, qs in blocks(B, Q, K, chunk):
        v = vis[qs]
        Xu, inv, _ = unique_x(X, xmap, bs)
        Xb = Xu[inv]                                                     # [b, K, D]
        rows_order = top_order(P[bs, qs], v, ns[-1]) if order is None else order[bs, qs].long()
        a = P[bs, qs].double() * v
        b, q, _ = a.shape
        bidx = torch.arange(b, device=a.device).view(b, 1, 1)
        Lt = v.sum(-1).double().view(1, q, 1)                            # [1, q, 1]
        yn = a * Xb.norm(dim=-1).unsqueeze(1)                            # ||y_i||  [b, q, K]
        o = torch.matmul(a, Xb)                                          # [b, q, D]
        on = o.norm(dim=-1, keepdim=True)                                # [b, q, 1]
        o2 = on * on
        SA, Syn = (yn * yn).sum(-1, keepdim=True), yn.sum(-1, keepdim=True)
        pre_top = torch.nn.functional.pad(torch.cumsum(yn.gather(-1, rows_order), -1), (1, 0))   # in order
        del yn
        first = torch.zeros_like(a).scatter_(-1, rows_order[..., :ns[0] - 1], 1.0)
        s = torch.matmul(a * first, Xb)                                  # s at N = ns[0] - 1, directly
        del first
        tri = torch.ones(window, window, dtype=torch.float64, device=a.device).tril_()
        span = window * max(1, tile_elements(BRACKET_ELEMENTS, a) // (b * q * window * Xb.shape[-1])) \
            if batched(a) else window                                    # off the CPU: many windows at once
        for n0 in range(ns[0], ns[-1] + 1, span):
            Nw = list(range(n0, min(ns[-1], n0 + span - 1) + 1))
            idx = rows_order[..., Nw[0] - 1:Nw[-1]]                      # [b, q, w]
            Y = a.gather(-1, idx).unsqueeze(-1) * Xb[bidx, idx]          # [b, q, w, D]
            S = _running_sums(tri, Y, s)                                 # s for each N of the span
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
    rejections without the O(K) computation (off the CPU kernels; on them `kernels.top_brackets`
    computes the same brackets).
    """
    vis = check_inputs(probs, x, visible)
    ns = check_ns(ns, probs.shape[-1])
    lead, Q = probs.shape[:-2], probs.shape[-2]
    B = int(np.prod(lead)) if len(lead) else 1
    out = {k: torch.empty(B, Q, len(ns), dtype=torch.float64) for k in ("d_lo", "d_hi", "e_lo", "e_hi")}
    for bs, qs, cs, ok, vals in _bounds_blocks(probs, x, ns, vis, reading, chunk):
        for k, val in vals.items():
            out[k][bs, qs][..., cs] = nan_rows(val, ok).cpu()
    return {k: t.reshape(*lead, Q, len(ns)) for k, t in out.items()}


def bounds_head_means(probs, x, ns, vis, reading, chunk=4 * DEFAULT_CHUNK, order=None) -> dict[str, np.ndarray]:
    """Per-head means over valid rows of the brackets: dict -> [heads, len(ns)] (NaN: no valid row); `order` as in
    `_bounds_blocks` (default: each row's top N by weight)."""
    lead = probs.shape[:-2]
    B = int(np.prod(lead)) if len(lead) else 1
    sums = torch.zeros(4, B, len(ns), dtype=torch.float64, device=probs.device)   # d_lo, d_hi, e_lo, e_hi
    count = torch.zeros(B, len(ns), dtype=torch.float64, device=probs.device)
    for bs, qs, cs, ok, vals in _bounds_blocks(probs, x, ns, vis, reading, chunk, order=order):
        count[bs, cs] += ok.sum(1).double()
        for i, val in enumerate(vals.values()):
            sums[i, bs, cs] += torch.where(ok, val, 0.0).sum(1)
    return dict(zip(("d_lo", "d_hi", "e_lo", "e_hi"), (sums / count).cpu().numpy()))


@functools.lru_cache(maxsize=1 << 14)                # a scan asks for the same few statistics (multiples of 1/n)
def ks_sf(d: float, n: int, m: int) -> float:
    """P(D_{n,m} >= d) for the two-sample KS statistic under H0 (exact, lattice paths; conservative
    by 1e-12 in d). Counts paths that stay strictly inside |i/n - j/m| < d."""
    if d <= 0:
        return 1.0
    thr = d * (1 - 1e-12) * n * m
    row = np.zeros(m + 1)
    log_scale = 0.0                                  # path counts outgrow float64 beyond ~500 samples a side: the
                                                     # row is rescaled as it grows and the scale kept as a log
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
        top = new.max()
        if top > 1e200:
            new /= top
            log_scale += math.log(top)
        row = new
    if row[m] <= 0:
        return 1.0
    log_total = math.lgamma(n + m + 1) - math.lgamma(n + 1) - math.lgamma(m + 1)
    return float(max(0.0, -math.expm1(math.log(row[m]) + log_scale - log_total)))


def ks_lower_statistic(d_lo, d_hi, e_lo, e_hi) -> float:
    """A lower bound on the two-sample KS statistic of samples known only within intervals
    d in [d_lo, d_hi], e in [e_lo, e_hi] (one interval per head): the sup over t of
    #{e_hi <= t}/m - #{d_lo <= t}/n and of #{d_hi <= t}/n - #{e_lo <= t}/m."""
    d_lo, d_hi, e_lo, e_hi = (np.sort(np.asarray(v, float)) for v in (d_lo, d_hi, e_lo, e_hi))
    n, m = len(d_lo), len(e_lo)
    t1 = (np.arange(1, m + 1) / m - np.searchsorted(d_lo, e_hi, side="right") / n).max()
    t2 = (np.arange(1, n + 1) / n - np.searchsorted(e_lo, d_hi, side="right") / m).max()
    return float(max(t1, t2, 0.0))


def certified_rejections(d_lo, d_hi, e_lo, e_hi, ns: Sequence[int], alpha: float) -> dict:
    """{N: (p_upper, d midpoint mean, e midpoint mean)} for the N of the window whose KS rejection the brackets
    certify: even the smallest KS statistic compatible with the per-head brackets d_lo..d_hi, e_lo..e_hi ([heads,
    len(ns)]) has an exact p-value <= alpha / 2. Stops at the first N with no valid head."""
    out = {}
    for c, N in enumerate(ns):
        cols = [d_lo[:, c], d_hi[:, c], e_lo[:, c], e_hi[:, c]]
        okh = np.all([np.isfinite(col) for col in cols], axis=0)
        if okh.sum() == 0:
            break
        p_up = ks_sf(ks_lower_statistic(*(col[okh] for col in cols)), int(okh.sum()), int(okh.sum()))
        if p_up <= alpha / 2:
            out[N] = (p_up, float(np.mean((cols[0] + cols[1])[okh] / 2)), float(np.mean((cols[2] + cols[3])[okh] / 2)))
    return out


class RunningTopN:
    """The incremental scan of `critical_n` (CPU kernels `top_brackets`, `top_exact`): per-head means over the valid
    rows (L_t > N) of the brackets and of the exact values, for windows of consecutive N, from running sums over the
    first N keys of each row's order: its top N by weight (default), or any order of the visible keys (`order`, e.g.
    the random subsets of the readings scan).

    Held for the whole scan: P [B, Q, K] the weights; Xu [u, K, D] the distinct x in float64 (inv [B] head -> x), xn2
    [u, K]; o = sum_i y_i [B, Q, D], SA = sum_i ||y_i||^2 and Syn = sum_i ||y_i|| [B, Q] over the visible keys
    (float64); order [B, Q, k] (`kernels.sorted_keys`, sorted once past SMALL_N; int16 for K < 2^15); and the running
    sums of the bracket windows, s [B, Q, D] and pre [B, Q] (sum of y_j and of ||y_j|| over the first n_done keys).
    Memory beyond the inputs: about B Q (2 n_max + 16 D) bytes, plus GRAM_ELEMENTS float64 for X X^T and, once
    exact values are asked for, 8 B Q K bytes for the running x_i.s (while that is at most STATE_ELEMENTS float64).
    """

    def __init__(self, probs, x, vis, n_max: int, order: Optional[torch.Tensor] = None):
        from attnlab.normalization.kernels import metrics as kernels

        self.kernels = kernels
        _, P, X, xmap = flatten_heads(probs.detach(), x.detach())
        self.P = (P if P.dtype in (torch.float32, torch.float64) else P.float()).contiguous()
        self.vis, self.vis_k, self.n_max = vis, (None if bool(vis.all()) else vis), n_max
        uniq, self.inv = torch.unique(xmap, return_inverse=True)
        self.Xu = X[uniq.to(X.device)].double().cpu().contiguous()
        self.xn2 = (self.Xu * self.Xu).sum(-1)
        B, Q, K = P.shape
        self.Lt = vis.sum(-1).double()
        self.hi = last_visible(vis)
        self.o, self.SA, self.Syn = self.kernels.row_sums(self.P, self.Xu, self.xn2, self.inv, self.hi, self.vis_k)
        self.o2 = (self.o * self.o).sum(-1)
        self.dots = {}
        self._start(order)

    def _start(self, order: Optional[torch.Tensor]) -> None:
        """The scan's own state: running sums at N = 0 over `order` (None: each row's top N by weight)."""
        B, Q, K = self.P.shape
        self.s, self.pre, self.n_done = torch.zeros_like(self.o), torch.zeros(B, Q, dtype=torch.float64), 0
        self.fixed = order is not None
        self.order = (order.reshape(B, Q, -1).contiguous() if self.fixed
                      else torch.empty(B, Q, 0, dtype=torch.int16 if K < 1 << 15 else torch.int32))
        self.__dict__.pop("tv_state", None)

    def reordered(self, order: torch.Tensor) -> "RunningTopN":
        """A scan of the same rows over another order of their keys (e.g. random subsets), sharing everything that
        does not depend on the order (weights, x, o, the sums, the x_i.o and x_i.m products) with this one."""
        import copy

        other = copy.copy(self)
        other._start(order)
        return other

    def _order(self, k: int) -> torch.Tensor:
        if not self.fixed and self.order.shape[-1] < k:
            if k <= SMALL_N:
                self.order = top_order(self.P, self.vis, k).to(self.order.dtype)
            else:
                self.order = self.kernels.sorted_keys(self.P, self.vis_k, self.n_max)
        return self.order

    def _dots(self, b0: int, bs: slice, need) -> tuple:
        """x_i.o [b, Q, K] (E1, E3, E5) and (x_i.m [b, Q, K], ||m||^2 [b, Q]) (E2) of the heads bs, or None (then
        `kernels.top_exact` makes them): they do not depend on N, so they are made once per scan and kept while
        they fit in DOTS_ELEMENTS float64 (else made per call)."""
        B, Q, K = self.P.shape
        keep = 2 * B * Q * K <= DOTS_ELEMENTS
        out = []
        for name, used in (("xo", {"E1", "E3", "E5"}), ("xm", {"E2"})):
            if not used & set(need) or not keep:
                out.append(None)
                continue
            if (name, b0) not in self.dots:
                Xb = self.Xu[self.inv[bs]]                               # [b, K, D]
                if name == "xo":
                    self.dots[name, b0] = torch.bmm(self.o[bs], Xb.transpose(1, 2))
                else:
                    vf = self.vis.double()
                    mean = torch.matmul(vf, Xb) / self.Lt.view(-1, 1)    # [b, Q, D]
                    self.dots[name, b0] = (torch.bmm(mean, Xb.transpose(1, 2)), (mean * mean).sum(-1))
            out.append(self.dots[name, b0])
        return tuple(out)

    def _gram(self, b0: int, Xb: torch.Tensor, keep: bool) -> torch.Tensor:
        """X X^T [u, K, K] of the block of heads from b0 (Xb its distinct x [u, K, D]): it does not depend on N or
        on the order, so it is made once per scan (shared with the `reordered` scans) while every block's fits in
        DOTS_ELEMENTS float64 (else made per call)."""
        if not keep:
            return torch.bmm(Xb, Xb.transpose(1, 2))
        if ("gram", b0) not in self.dots:
            self.dots["gram", b0] = torch.bmm(Xb, Xb.transpose(1, 2))
        return self.dots["gram", b0]

    def means(self, sums: torch.Tensor, ns) -> np.ndarray:
        """sums [..., B, len(ns)] over the valid rows -> means (NaN where no row is valid)."""
        count = (self.Lt.unsqueeze(-1) > torch.tensor(ns, dtype=torch.float64)).sum(0).double()
        return (sums / count).numpy()

    def brackets(self, ns: Sequence[int]) -> dict[str, np.ndarray]:
        """Per-head means [B, len(ns)] of d_a (exact), d_b_lo, d_b_hi, e_lo, e_hi (E1) for the next window ns
        (N = n_done + 1, ...)."""
        if list(ns) != list(range(self.n_done + 1, self.n_done + 1 + len(ns))):
            raise ValueError(f"bracket windows must follow each other: N = {self.n_done + 1}, ... expected")
        sums = self.kernels.top_brackets(self.P, self.Xu, self.xn2, self.inv, self._order(ns[-1]), self.o, self.s,
                                         self.pre, self.SA, self.Syn, self.Lt, ns[0], len(ns), BRACKET_SLACK)
        self.n_done = ns[-1]
        return dict(zip(("d_a", "d_b_lo", "d_b_hi", "e_lo", "e_hi"), self.means(sums, ns)))

    def exact(self, ns: Sequence[int], need: Sequence[str] = ("d_b", "E1")) -> dict[str, np.ndarray]:
        """Per-head means [B, len(ns)] of the exact `need` (of `kernels.EXACT_STATS`: d_a, d_b, E1, E2, E3, E5) for
        ascending ns: one pass from ns[0] to ns[-1], over blocks of heads whose Gram matrices X X^T (d~) and
        [heads, Q, K] dot products hold at most GRAM_ELEMENTS float64 each. The running top sums of d~ (x_i.s,
        ||s||^2) are kept from call to call while they fit in STATE_ELEMENTS float64, so a scan that asks for
        growing N steps through each key once."""
        n0, n1 = ns[0], ns[-1]
        want = np.zeros(n1 - n0 + 1, bool)
        want[np.asarray(ns) - n0] = True
        order = self._order(n1)
        B, _, K = self.P.shape
        stats = self.kernels.EXACT_STATS
        out = torch.empty(len(stats), B, len(want), dtype=torch.float64)
        gram = bool({"d_a", "d_b"} & set(need))
        state = self._state(n0) if gram else None
        step = max(1, GRAM_ELEMENTS // (K * K))
        keep_gram = self.Xu.shape[0] * -(-B // step) * K * K <= DOTS_ELEMENTS
        for b0 in range(0, B, step):
            bs = slice(b0, min(B, b0 + step))
            uniq, inv = torch.unique(self.inv[bs], return_inverse=True)
            Xb = self.Xu[uniq]
            G = self._gram(b0, Xb, keep_gram) if gram else None
            xo, xm = self._dots(b0, bs, need)
            st = None if state is None else (state[0][bs], state[1][bs], state[2])
            out[:, bs] = self.kernels.top_exact(self.P[bs], Xb, self.xn2[uniq], G, inv, order[bs], self.o[bs],
                                                self.Lt, self.hi, self.vis_k, n0, want, need, xo=xo, xm=xm, state=st,
                                                o2=self.o2[bs])
        if state is not None:
            self.n_state = max(state[2], n0 - 1)
        means = self.means(out[..., torch.from_numpy(want)], list(ns))
        return {k: means[stats.index(k)] for k in need}

    def _state(self, n0: int):
        """(x_i.s [B, Q, K], ||s||^2 [B, Q], n) of the running top sum kept between `exact` calls (reset when a
        call asks for an N below it), or None when it would not fit in STATE_ELEMENTS (each call makes its own)."""
        B, Q, K = self.P.shape
        if B * Q * K > STATE_ELEMENTS:
            return None
        if not hasattr(self, "tv_state") or self.n_state > n0 - 1:
            self.tv_state = torch.zeros(B, Q, K, dtype=torch.float64)
            self.s2_state = torch.zeros(B, Q, dtype=torch.float64)
            self.n_state = 0
        return self.tv_state, self.s2_state, self.n_state


def brackets_for(hm: dict[str, np.ndarray], reading: str) -> dict[str, np.ndarray]:
    """The d~ brackets of one reading from `RunningTopN.brackets` (reading a is exact there: slack on both sides),
    as the dict d_lo, d_hi, e_lo, e_hi of `distance_bounds`."""
    if reading == "a":
        d_lo, d_hi = hm["d_a"] * (1 - BRACKET_SLACK) - 1e-12, hm["d_a"] * (1 + BRACKET_SLACK) + 1e-12
    else:
        d_lo, d_hi = hm["d_b_lo"], hm["d_b_hi"]
    return {"d_lo": d_lo, "d_hi": d_hi, "e_lo": hm["e_lo"], "e_hi": hm["e_hi"]}


SCAN_KEYS = ("ns", "pvalues", "ks", "exact", "p_upper", "d_mean", "e_mean")   # per scanned N, in a scan's result


def new_scan_result(*extra: str) -> dict:
    """An empty critical-N scan result: n = -1 and a list per key of SCAN_KEYS (then of `extra`)."""
    return {"n": -1, **{k: [] for k in SCAN_KEYS + extra}}


def record_n(res: dict, N: int, p: float, ks: float, exact: bool, p_up: float, dm: float, em: float, progress=None,
             **extra) -> None:
    """Append one scanned N to a scan result (`new_scan_result`), `extra` to its extra keys; tick `progress`."""
    for k, val in zip(SCAN_KEYS, (N, p, ks, exact, p_up, dm, em)):
        res[k].append(val)
    for k, val in extra.items():
        res[k].append(val)
    if progress is not None:
        progress.update(1)


def scan_n_max(K: int, n_max: Optional[int]) -> int:
    """The last N of a scan over K keys: n_max (default) capped at K - 1; a ValueError when that is below 1."""
    n_max = K - 1 if n_max is None else min(int(n_max), K - 1)
    if n_max < 1:
        raise ValueError(f"need at least 2 keys for a top-N scan, got K={K}")
    return n_max


def scan_windows(n_max: int, block: int, certify: bool, max_block: int = 64) -> Iterator[list[int]]:
    """The windows of consecutive N of a critical-N scan, from N = 1 to n_max (the caller may stop early): `block`
    N first, then x8 and at least 256 each when certifying, else doubling up to `max_block`."""
    start, size = 1, block
    while start <= n_max:
        ns = list(range(start, min(n_max, start + size - 1) + 1))
        yield ns
        start = ns[-1] + 1
        size = min(size * 2, max_block) if not certify else max(size * 8, 256)


def _kernel_means(probs, x, vis, n_max: int, reading: str) -> tuple:
    """(bracket_means, exact_means, first exact batch, largest batch) of the incremental scan (`RunningTopN`):
    bracket_means(ns) -> `distance_bounds`-like dict of per-head means [heads, len(ns)]; exact_means(ns) -> (d~, E)."""
    scan = RunningTopN(probs, x, vis, n_max)

    def bracket_means(ns):
        return brackets_for(scan.brackets(ns), reading)

    def exact_means(ns):
        ex = scan.exact(ns, need=(f"d_{reading}", "E1"))
        return ex[f"d_{reading}"], ex["E1"]
    return bracket_means, exact_means, 32, 64


def _torch_means(probs, x, vis, n_max: int, reading: str, chunk: int, dtype: torch.dtype) -> tuple:
    """As `_kernel_means`, from `distance_bounds`' blocks and `distance_stats` (no kernels, not incremental): exact
    batches of 8 N on the CPU; where `engine.batched` (a GPU) all the uncertified N of a window in one call, every N
    at once (`distance_stats`' tiles), so exact calls and transfers follow the windows, not the N."""
    key = f"dtilde_{reading}"
    most = n_max if batched(probs) else 8

    def bracket_means(ns):
        return bounds_head_means(probs, x, ns, vis, reading)

    def exact_means(ns):
        st = distance_means(probs, x, ns, vis, stats=(key, "E"), chunk=chunk, dtype=dtype)
        return tuple(st[k_].reshape(-1, len(ns)).numpy() for k_ in (key, "E"))
    return bracket_means, exact_means, most, most


def _exact_until_found(todo: list[int], exact_means, nb: int, most: int, alpha: float) -> tuple[dict, int]:
    """Exact values for the uncertified N `todo`, in batches (nb, doubling up to `most`), until the first
    non-rejection: ({N: (p, ks, d mean, e mean)}, the next batch size)."""
    exact = {}
    pos = 0
    found = None
    while pos < len(todo) and found is None:
        batch = todo[pos:pos + nb]
        d, e = exact_means(batch)
        n, ps, ks = ks_first_indistinguishable(d, e, batch, alpha)
        for c in range(len(ps)):
            exact[batch[c]] = (ps[c], ks[c], float(np.nanmean(d[:, c])), float(np.nanmean(e[:, c])))
        if n != -1 or len(ps) < len(batch):
            found = n if n != -1 else "stop"
        pos += len(batch)
        nb = min(2 * nb, most)
    return exact, nb


def _record_window(res: dict, ns: list[int], certified: dict, exact: dict, alpha: float, progress) -> bool:
    """Record the window's N in order; True when the scan ends here (first non-rejection, or no rows left)."""
    for N in ns:
        if N in certified:
            p_up, dm, em = certified[N]
            record_n(res, N, float("nan"), float("nan"), False, p_up, dm, em, progress)
        elif N in exact:
            p, ks, dm, em = exact[N]
            record_n(res, N, p, ks, True, p, dm, em, progress)
            if p > alpha:
                res["n"] = N
                return True
        elif not res["ns"]:
            raise ValueError("no N could be tested: no row has a finite d~ and E at N = 1")
        else:
            return True                 # no rows left for this N (all skipped)
    return False


def _check_scan(probs: torch.Tensor, reading: str, alpha: float, n_max: Optional[int]) -> int:
    """`critical_n`'s arguments, checked; returns the last N to scan."""
    if reading not in ("a", "b"):
        raise ValueError(f"reading must be 'a' or 'b', got {reading!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if probs.numel() == 0:                     # n = -1 would claim that every N was rejected
        raise ValueError(f"nothing to scan: probs {tuple(probs.shape)} holds no rows")
    if n_max is not None and int(n_max) < 1:
        raise ValueError(f"n_max must be >= 1, got {n_max}")
    return scan_n_max(probs.shape[-1], n_max)


def critical_n(probs: torch.Tensor, x: torch.Tensor, visible: Optional[torch.Tensor] = None, *,
               alpha: float = 0.01, n_max: Optional[int] = None, block: int = 8, max_block: int = 64,
               reading: str = "b", certify: bool = True, chunk: int = DEFAULT_CHUNK,
               dtype: torch.dtype = torch.float32, incremental: bool = True, progress=None) -> dict:
    """Critical top-N (Alg. 3): the first N = 1, 2, 3, ... whose per-head token-mean d~ (reading b) and
    per-head token-mean E are indistinguishable by `scipy.stats.ks_2samp` (p > alpha).

    Every N from 1 upward is tested (the paper asks for *the first* N that does not reject, so no N
    may be skipped), in windows of N (`block` first, then >= 256 when certifying, else doubling up to
    `max_block`). With `certify` (default),
    each N is first tested on rigorous brackets of every head's mean d~ and E (`distance_bounds`,
    O(D) per row): if even the smallest KS statistic compatible with the brackets has an exact
    p-value <= alpha / 2, the rejection is certain and the O(K) computation is skipped. Only the
    remaining N are computed exactly, so the answer is the same as the plain scan, much faster when
    the critical N is large.

    On CPU with the kernels on (`incremental`, default) both come from running top-N sums, N after N
    (`RunningTopN`): the brackets in O(D) per row and N, the exact values in float64 and O(K) per row
    and N (each N adds one key j: x_i.s grows by a_j x_i.x_j, from X X^T). Elsewhere (GPU,
    ATTNLAB_KERNELS=0, incremental=False) the brackets come from `distance_bounds` and the exact values
    from `distance_means` (O(K D) per row and N, in `dtype`: float32 by default, the test only ranks
    per-head means): on the CPU in batches of 8 N, on a GPU all the uncertified N of a window in one call.
    All certify the same N and give the same result, the means to float rounding (tests/test_paths_agree.py).
    Heads = all leading dims of probs. `reading` picks d~ (b, default, or a). Scans up to `n_max`
    (default L - 1); an empty scan (no rows, or none with finite values) is a ValueError, never n = -1.
    Returns dict(n=N or -1, ns, pvalues, ks, exact, p_upper, d_mean, e_mean) per
    scanned N (pvalues/ks NaN and exact False where certified; d_mean/e_mean: mean over heads, of the
    exact values or, where certified, of the bracket midpoints: these are not the means (SmolLM2, War and Peace #1,
    reading b at the first N >= 0.06 L: d~ / E of the midpoints 6.85 at L = 32, exact 5.08)).
    """
    vis = check_inputs(probs, x, visible)
    n_max = _check_scan(probs, reading, alpha, n_max)
    if incremental and cpu_kernels(probs) is not None:
        bracket_means, exact_means, nb, most = _kernel_means(probs, x, vis, n_max, reading)
    else:
        bracket_means, exact_means, nb, most = _torch_means(probs, x, vis, n_max, reading, chunk, dtype)
    res = new_scan_result()
    for ns in scan_windows(n_max, block, certify, max_block):
        certified = {}
        if certify:
            hm = bracket_means(ns)
            certified = certified_rejections(hm["d_lo"], hm["d_hi"], hm["e_lo"], hm["e_hi"], ns, alpha)
        exact, nb = _exact_until_found([N for N in ns if N not in certified], exact_means, nb, most, alpha)
        if _record_window(res, ns, certified, exact, alpha, progress):
            break
    return res
