"""Theorem 2 of arXiv 2508.17821 (Fig. 3): geometric separability N_s/N of the top-N tokens and its
bounds, for every row. N grows a window of keys at a time (one cumulative sum of Gram rows per window)."""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

import torch

from attnlab.core.budget import sync_free
from attnlab.normalization import bounds
from attnlab.normalization.metrics import engine
from attnlab.normalization.metrics.engine import (
    DEFAULT_CHUNK,
    RowBlock,
    blocks,
    check_inputs,
    check_ns,
    check_stats,
    flatten_heads,
    nan_rows,
    prefix_lengths,
    tile_elements,
    unique_x,
)

SEPARABILITY_STATS = ("ns_frac", "r", "delta", "xi_row", "xi_pair", "xi_delta",
                      "lower_row", "lower_pair", "lower_delta",
                      "upper_B_row", "upper_B_pair", "upper_B_delta",
                      "upper_R_row", "upper_R_pair", "upper_R_delta")
#: N_s/N under each radius reading (`attnlab.normalization.readings.RADII`), whatever `radius` chooses for "ns_frac"
RADIUS_STATS = ("ns_frac_nearest", "ns_frac_closed")
RADII = ("nearest", "closed")
ROW_SETS = ("positive_r", "all")
_PAIR_STATS = {"xi_pair", "lower_pair", "upper_B_pair", "upper_R_pair"}
_DELTA_STATS = {"delta", "xi_delta", "lower_delta", "upper_B_delta", "upper_R_delta"}
#: float64 elements of one window of key steps ([rows, steps, keys]): its steps are one cumulative sum; 64 MiB on a
#: GPU, 512 KiB on CPU (ATTNLAB_KERNELS=0: windows that leave the cache made the torch path 6x slower)
SEP_ELEMENTS = {"cpu": 1 << 16, "other": 1 << 23}


def unit_vectors(x: torch.Tensor, M: float = 1.0) -> torch.Tensor:
    """x_i / ||x_i|| * M in float64 (zero vectors stay zero): Assumption 1 of Theorem 2."""
    x = x.double()
    n = x.norm(dim=-1, keepdim=True)
    return torch.where(n > 0, x / n.clamp_min(1e-300), torch.zeros_like(x)) * M



def min_pairwise_distance(x: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """delta: min_{i != j visible} ||x_i - x_j|| for each row. x [b, K, D], visible [q, K] -> [b, q]
    (NaN for rows with fewer than 2 visible keys). Fast paths for prefix-shaped visibility (bidirectional or causal
    rows) and for rows that each see one run of consecutive keys (sliding-window layers: `_run_minima`); other masks
    go row by row (`_row_minima`)."""
    x = x.double()
    D = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")  # [b, K, K]
    K = x.shape[-2]
    D = D + torch.diag_embed(torch.full((K,), float("inf"), dtype=torch.float64, device=x.device))
    n = prefix_lengths(visible)
    if n is not None:
        upper = torch.triu(torch.ones(K, K, dtype=torch.bool, device=x.device), diagonal=1)   # i < j
        m = D.masked_fill(~upper, float("inf")).amin(dim=-2)                     # [b, K]: min_{i<j}
        cm = torch.cummin(m, dim=-1).values                                      # delta of prefix j+1
        out = cm[:, (n - 1).clamp_min(0)]
    else:
        runs = key_runs(visible)
        out = _row_minima(D, visible) if runs is None else _run_minima(D, *runs)
    return out.masked_fill(~torch.isfinite(out), float("nan"))


def key_runs(visible: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(first visible key, number of visible keys) of each row of visible [q, K] when every row sees one run of
    consecutive keys (causal, bidirectional and sliding-window rows), else None."""
    n = engine.row_lengths(visible)
    first = visible.view(torch.uint8).argmax(-1)                         # (0 for a row that sees none)
    seen = n > 0
    if not bool(torch.equal(engine.last_visible(visible)[seen], (first + n)[seen])):
        return None
    return first, n


def _run_minima(D: torch.Tensor, first: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """min of D [b, K, K] over the pairs i != j of each row's run of keys first .. first + n - 1 (first, n [q]): [b, q]
    (+inf where n < 2). The minimum over a run of span s (its last key - its first) is the minimum of the two runs of
    span s - 1 it holds and of its two end pairs, so one pass over the spans gives every run's, the same numbers as
    `_row_minima` (minima of the same entries) without a [b, n, n] copy per row: Gemma 3's Fig. 3 at L = 1,024 (its
    sliding layers) spent 15 s there."""
    out = torch.full((D.shape[0], len(n)), float("inf"), dtype=D.dtype, device=D.device)
    cur = None                                                          # [b, K - s]: the runs of span s by first key
    for span in range(1, int(n.max()) if len(n) else 0):
        ends = torch.minimum(torch.diagonal(D, span, -2, -1), torch.diagonal(D, -span, -2, -1))
        cur = ends if cur is None else torch.minimum(torch.minimum(cur[:, :-1], cur[:, 1:]), ends)
        rows = (n - 1 == span).nonzero().squeeze(-1)
        if len(rows):
            out[:, rows] = cur[:, first[rows]]
    return out


def _row_minima(D: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """min of D [b, K, K] over the pairs of each row's visible keys (visible [q, K]), row by row: [b, q]."""
    out = torch.empty(D.shape[0], visible.shape[0], dtype=torch.float64, device=D.device)
    for t in range(visible.shape[0]):
        idx = visible[t].nonzero().squeeze(-1)
        out[:, t] = D[:, idx][:, :, idx].flatten(1).amin(-1)
    return out


def _windows(rows: RowBlock, Xu: torch.Tensor, inv: torch.Tensor, n_max: int, ns: list[int],
             need_pair: bool) -> Iterator[dict]:
    """Grow each row's selected set in top order up to n_max, a window of key steps at a time (one cumulative sum
    per window: the running sums of the step-by-step scan, the same additions in the same order), and yield per
    window the terms at its wanted N (`ns`, w of them: the list "want", and "ns" long [w]); "r" [b, q, w] (nearest
    non-selected distance); "dsel" [n, b, q, w] the selected distances ||y_i - s|| in top order (entries i >= N
    are 0, "sel" bool [n, 1, 1, w] says which count); "a_top" [n, b, q, 1]; "pair" [n, b, q, w] (need_pair) the
    mean over the other selected j of ||y_j - y_i||. Windows hold at most SEP_ELEMENTS [rows, steps, keys] elements."""
    a, Xb, K = rows.a, rows.X, Xu.shape[1]
    b, q, _ = a.shape
    dev = a.device
    order = rows.order                                                  # [b, q, n]
    G = torch.bmm(Xu, Xu.transpose(1, 2)).view(-1, K)                  # Gram rows of the distinct x
    grow = inv.view(b, 1, 1) * K
    A = a * a * rows.xn2.unsqueeze(1)                                   # ||y_i||^2
    A_vis = torch.where(rows.vis, A, float("inf"))                      # +inf on invisible keys
    rank = torch.full((b, q, K), n_max, dtype=torch.long, device=dev).scatter_(
        -1, order, torch.arange(n_max, device=dev).expand(b, q, n_max))
    a_top = a.gather(-1, order).permute(2, 0, 1).contiguous()           # [n, b, q]: reductions over n in order
    A_top = A.gather(-1, order).permute(2, 0, 1).contiguous()
    psum = _pair_sums(G, grow, order, a_top, A_top) if need_pair else None   # [n(i), n(N), b, q]
    xs = torch.zeros_like(a)                                            # x_i . s at the last step done
    s = torch.zeros(b, q, Xb.shape[-1], dtype=a.dtype, device=dev)
    step = max(1, tile_elements(SEP_ELEMENTS, a) // max(1, b * q * K))
    bidx = rows.bidx
    for m0 in range(0, ns[-1], step):
        m1 = min(ns[-1], m0 + step)
        j = order[..., m0:m1]                                           # [b, q, w'] keys of the steps
        aj = a.gather(-1, j).unsqueeze(-1)                              # [b, q, w', 1]
        gj = G[grow + j] * aj                                           # a_j x_j . x_i, every i  [b, q, w', K]
        XS = torch.cat([xs.unsqueeze(2), gj], 2).cumsum(2)[:, :, 1:]     # x_i . s after each step
        S = torch.cat([s.unsqueeze(2), aj * Xb[bidx, j]], 2).cumsum(2)[:, :, 1:]   # s after each step
        xs, s = XS[:, :, -1], S[:, :, -1]
        want = [N for N in ns if m0 < N <= m1]
        if not want:
            continue
        cols = torch.tensor([N - 1 - m0 for N in want], device=dev)
        Nt = torch.tensor(want, device=dev)
        with sync_free(a):                              # ATTNLAB_SYNC_DEBUG=1 on CUDA: raises on a host sync
            res = _window_terms(rows, XS[:, :, cols], S[:, :, cols], Nt, rank, A_vis, a_top, A_top, psum)
        res["want"] = want
        yield res


def _window_terms(rows: RowBlock, XS: torch.Tensor, S: torch.Tensor, Nt: torch.Tensor, rank: torch.Tensor,
                  A_vis: torch.Tensor, a_top: torch.Tensor, A_top: torch.Tensor, psum) -> dict:
    """The terms `_windows` yields for the wanted N Nt [w] of a window, from x_i . s XS [b, q, w, K] and s
    S [b, q, w, D] at those N."""
    a, order = rows.a, rows.order
    b, q, n_max = order.shape
    dev = a.device
    s2 = (S * S).sum(-1, keepdim=True)                              # ||s||^2  [b, q, w, 1]
    A_out = torch.where(rank.unsqueeze(2) < Nt.view(-1, 1), float("inf"), A_vis.unsqueeze(2))   # [b, q, w, K]
    r = (torch.addcmul(A_out, a.unsqueeze(2), XS, value=-2).amin(-1, keepdim=True) + s2).clamp_min_(0).sqrt_()
    xs_top = XS.gather(-1, order.unsqueeze(2).expand(b, q, len(Nt), n_max)).permute(3, 0, 1, 2)  # [n, b, q, w]
    s2 = s2.squeeze(-1)
    dsel = (torch.addcmul(A_top.unsqueeze(-1), a_top.unsqueeze(-1), xs_top, value=-2) + s2).clamp_min_(0).sqrt_()
    sel = (torch.arange(n_max, device=dev).view(-1, 1) < Nt).view(n_max, 1, 1, -1)       # [n, 1, 1, w]
    res = {"ns": Nt, "r": r.squeeze(-1), "dsel": dsel.masked_fill_(~sel, 0.0), "sel": sel,
           "a_top": a_top.unsqueeze(-1)}
    if psum is not None:
        pair = psum[:, Nt - 1] / (Nt - 1).clamp_min(1).double().view(-1, 1, 1)          # [n, w, b, q]
        res["pair"] = pair.permute(0, 2, 3, 1).masked_fill(~sel, 0.0)
    return res


def _pair_sums(G: torch.Tensor, grow: torch.Tensor, order: torch.Tensor, a_top: torch.Tensor,
               A_top: torch.Tensor) -> torch.Tensor:
    """[n, n, b, q]: entry (i, N - 1) = sum of ||y_j - y_i|| over the first N selected j != i, summed in top order
    (a cumulative sum over j). Each distance is computed from the Gram row of the later-selected key of the pair,
    as the step-by-step scan made it."""
    b, q, n = order.shape
    K = G.shape[-1]
    flat = ((grow + order) * K).unsqueeze(-1) + order.unsqueeze(-2)    # [b, q, j, i] -> x_j . x_i in G
    g = G.view(-1)[flat].permute(2, 3, 0, 1)                            # [j, i, b, q]
    aj, Aj = a_top.unsqueeze(1), A_top.unsqueeze(1)                    # j on dim 0, i on dim 1
    ai, Ai = a_top.unsqueeze(0), A_top.unsqueeze(0)
    d = (Ai + Aj).addcmul_(ai * aj, g, value=-2).clamp_min_(0).sqrt_()  # [j, i, b, q]; row j = the later key
    later = torch.ones(n, n, dtype=torch.bool, device=G.device).tril_(-1).view(n, n, 1, 1)   # j > i
    d = torch.where(later, d, d.transpose(0, 1))                        # symmetric, the later key's row
    d = d.masked_fill_(torch.eye(n, dtype=torch.bool, device=G.device).view(n, n, 1, 1), 0.0)
    return d.transpose(0, 1).cumsum(1)                                   # [i, N - 1, b, q]


def _ns_fracs(w: dict) -> dict:
    """N_s / N [b, q, w] under each radius reading, from a window of `_windows`; rows with r = 0 count 0."""
    res, r, N = {}, w["r"], w["ns"].double()
    pos = r > 0
    for name, below in (("nearest", torch.lt), ("closed", torch.le)):
        frac = (below(w["dsel"], r) & w["sel"]).sum(0).double() / N
        res[f"ns_frac_{name}"] = frac.masked_fill_(~pos, 0.0)            # r = 0 (rows "all"): N_s = 0
    return res


def _xi_bounds(xis: dict, w: dict, M: float) -> dict:
    """xi_* (mean over the selected) and Theorem 2's lower / upper_B / upper_R bounds [b, q, w] of each spread
    estimator in xis (name -> [n, b, q, w], the first N entries of column N count); NaN where r = 0 (Theorem 2
    needs r > 0). Sums over the selected run over n, the outer axis: in top order, as for one N at a time."""
    res, r = {}, w["r"]
    pos = r > 0
    for name, xi in xis.items():
        xi = xi.permute(1, 2, 3, 0)                                      # [b, q, w, n] view
        sel = w["sel"].permute(1, 2, 3, 0).expand(xi.shape)
        lo, (up_b, up_r) = bounds.theorem2_bound_set(xi, r, M, forms=("B", "R"), selected=sel)
        res[f"xi_{name}"] = xi.masked_fill(~sel, 0.0).sum(-1) / w["ns"].double()
        for key, val in ((f"lower_{name}", lo), (f"upper_B_{name}", up_b), (f"upper_R_{name}", up_r)):
            res[key] = val.masked_fill(~pos, float("nan"))             # Theorem 2 needs r > 0
    return res


def _grow_steps(rows: RowBlock, Xu: torch.Tensor, inv: torch.Tensor, n_max: int, need_pair: bool) -> Iterator[dict]:
    """The CPU path of `separability_stats` (its tensors stay cache-sized: 3-4x faster there than `_windows`, the
    same numbers to 1 ulp). Grow each row's selected set one key at a time, in top order, up to n_max (one Gram row per
    step); after each key yield the running terms (tensors updated in place by the next step): N; s [b, q, D] the
    top-N sum; xs [b, q, K] = x_i.s; A_out [b, q, K] = ||y_i||^2 on the visible non-selected keys (+inf
    elsewhere); a_top, A_top [n_max, b, q] = a_i, ||y_i||^2 of the selected in order;
    psum [n_max, b, q] (need_pair) = sum of
    ||y_j - y_i|| over the selected j."""
    a, Xb, K = rows.a, rows.X, Xu.shape[1]
    b, q, _ = a.shape
    bidx = rows.bidx[..., 0]                                             # [b, 1]
    G = torch.bmm(Xu, Xu.transpose(1, 2)).view(-1, K)                    # Gram rows of the distinct x
    grow = inv.view(b, 1) * K
    A = a * a * rows.xn2.unsqueeze(1)                                    # ||y_i||^2
    order = rows.order
    # small per-selected tensors are laid out [n, b, q] (reductions over n are then vectorised)
    order_n = order.permute(2, 0, 1)                                     # [n_max, b, q] view
    st = {"A_out": torch.where(rows.vis, A, float("inf")),               # +inf on invisible, then selected keys
          "a_top": a.gather(-1, order).permute(2, 0, 1).contiguous(),
          "A_top": A.gather(-1, order).permute(2, 0, 1).contiguous(),
          "xs": torch.zeros_like(a), "s": torch.zeros(b, q, Xb.shape[-1], dtype=a.dtype, device=a.device),
          "psum": torch.zeros(n_max, b, q, dtype=a.dtype, device=a.device), "buf": torch.empty_like(a)}
    a_top, A_top, buf, psum = st["a_top"], st["A_top"], st["buf"], st["psum"]
    for m in range(n_max):
        j = order_n[m]                                                   # [b, q]
        aj = a_top[m].unsqueeze(-1)                                      # [b, q, 1]
        st["s"].addcmul_(aj, Xb[bidx, j])
        torch.index_select(G, 0, (grow + j).flatten(), out=buf.view(-1, K))   # x_j . x_i, every i
        st["xs"].addcmul_(buf, aj)
        st["A_out"].scatter_(-1, j.unsqueeze(-1), float("inf"))
        if need_pair and m:
            g = buf.gather(-1, order[..., :m]).permute(2, 0, 1)          # x_j . x_i, earlier selected i
            d = (A_top[:m] + A_top[m]).addcmul_(a_top[:m] * a_top[m], g, value=-2)
            d = d.clamp_min_(0).sqrt_()                                  # ||y_j - y_i||  [m, b, q]
            psum[:m] += d
            psum[m] = d.sum(0)
        st["N"] = m + 1
        yield st


def _radius_step(rows: RowBlock, st: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """r [b, q] (nearest non-selected distance) and the selected distances dist_i [b, q, N] at st["N"]."""
    # dist_i^2 = ||y_i||^2 - 2 a_i x_i.s + ||s||^2, the same expression for r and the selected
    N, a, xs, s = st["N"], rows.a, st["xs"], st["s"]
    s2 = (s * s).sum(-1, keepdim=True)
    r = (torch.addcmul(st["A_out"], a, xs, value=-2, out=st["buf"]).amin(-1, keepdim=True) + s2).clamp_min_(0).sqrt_()
    xs_top = xs.gather(-1, rows.order[..., :N]).permute(2, 0, 1)
    dsel = (torch.addcmul(st["A_top"][:N], st["a_top"][:N], xs_top, value=-2) + s2.squeeze(-1))
    dsel = dsel.clamp_min_(0).sqrt_().permute(1, 2, 0)                  # [b, q, N] view of [N, b, q]
    return r.squeeze(-1), dsel


def _ns_fracs_step(dsel: torch.Tensor, r: torch.Tensor, pos: torch.Tensor) -> dict:
    """N_s / N [b, q] under each radius reading (dsel [b, q, N], r [b, q]); rows with r = 0 (pos False) count 0."""
    res = {}
    for name, below in (("nearest", torch.lt), ("closed", torch.le)):
        frac = below(dsel, r.unsqueeze(-1)).sum(-1).double() / dsel.shape[-1]
        res[f"ns_frac_{name}"] = frac.masked_fill_(~pos, 0.0)            # r = 0 (rows "all"): N_s = 0
    return res


def _xi_bounds_step(xis: dict, r: torch.Tensor, pos: torch.Tensor, M: float) -> dict:
    """xi_* (mean over the selected) and Theorem 2's lower / upper_B / upper_R bounds [b, q] of each spread
    estimator in xis (name -> [b, q, N]); NaN where r = 0 (Theorem 2 needs r > 0)."""
    res = {}
    for name, xi in xis.items():
        lo, (up_b, up_r) = bounds.theorem2_bound_set(xi, r, M, forms=("B", "R"))
        res[f"xi_{name}"] = xi.mean(-1)
        for key, val in ((f"lower_{name}", lo), (f"upper_B_{name}", up_b), (f"upper_R_{name}", up_r)):
            res[key] = val.masked_fill(~pos, float("nan"))             # Theorem 2 needs r > 0
    return res


def _check_choices(radius: str, rows: str) -> None:
    if radius not in RADII:
        raise ValueError(f"radius must be one of {RADII}, got {radius!r}")
    if rows not in ROW_SETS:
        raise ValueError(f"rows must be one of {ROW_SETS}, got {rows!r}")


def separability_stats(probs: torch.Tensor, x: torch.Tensor, ns: Sequence[int], visible: Optional[torch.Tensor] = None,
                       *, M: float = 1.0, normalize: bool = True,
                       stats: Sequence[str] = ("ns_frac", "r", "lower_row", "upper_B_row", "upper_R_row"),
                       radius: str = "nearest", rows: str = "positive_r",
                       chunk: int = DEFAULT_CHUNK) -> dict[str, torch.Tensor]:
    """Theorem 2 / Fig. 3 quantities of every row for each N: dict stat -> float64 [..., Q, len(ns)].

    x is put on the sphere of radius M first (`normalize`; Assumption 1). Per row:
    `dist_i = ||a_i x_i - s||`, `r = min_{i out} dist_i` (every non-selected token outside the ball),
    `N_s = #{i in I_N : dist_i < r}` (radius "nearest": strict, [R]/G10 of the book appendix "How we read
    the papers"; "closed": `<=`, the closed ball), `ns_frac = N_s / N`; stats "ns_frac_nearest" and
    "ns_frac_closed" give both. Rows: "positive_r" (default) keeps the rows with L_t > N and r > 0 (the
    others are NaN); "all" keeps every row with L_t > N, a row with r = 0 counting N_s = 0 (its bounds, which
    need r > 0, stay NaN).
    Spread estimators xi_i ([B] text, "show both"): `row` = the row's own `dist_i`;
    `pair` = mean over the other selected j of `||a_j x_j - a_i x_i||` (0 when N = 1);
    `delta` = `bounds.theorem2_xi_delta` from delta = min pairwise distance of the row's visible
    vectors ([R]). For each: lower = `1 - sum xi / (r N)`, upper_B / upper_R as in
    `bounds.theorem2_bounds`. Stats named `*_row`... `xi_*` are means over the selected tokens.

    N grows up to max(ns), a window of key steps at a time (`_windows`: one cumulative sum of Gram rows per
    window, the additions of a one-key-at-a-time scan in the same order; on CPU (`engine.batched`), one key at a
    time, `_grow_steps`): s and x_i.s follow, r comes from
    `||y_i||^2 - 2 y_i.s + ||s||^2` minimised over the non-selected keys, and the selected
    distances (few) are computed directly.
    """
    vis = check_inputs(probs, x, visible)
    K = probs.shape[-1]
    ns = check_ns(ns, K)
    stats = check_stats(stats, SEPARABILITY_STATS + RADIUS_STATS)
    _check_choices(radius, rows)
    all_rows = rows == "all"                                             # (`rows` is reused for the row blocks)
    xu = unit_vectors(x, M) if normalize else x.double()
    lead, P, X, xmap = flatten_heads(probs, xu)
    B, Q, _ = P.shape
    out = torch.empty(len(stats), len(ns), B, Q, dtype=torch.float64, device=probs.device)   # one write per window
    need_pair, need_delta = bool(_PAIR_STATS & set(stats)), bool(_DELTA_STATS & set(stats))
    wanted, delta_cache = {N: c for c, N in enumerate(ns)}, {}                # delta_cache: {key: [u, Q]}
    steps = not engine.batched(probs)                 # CPU: the step loop on cache-sized tensors
    for bs, qs in blocks(B, Q, K, chunk):
        Xu, inv, key = unique_x(X, xmap, bs)
        rows = RowBlock(P[bs, qs], vis[qs], Xu, inv, ns[-1], torch.float64)
        if need_delta:
            if key not in delta_cache:
                delta_cache = {key: min_pairwise_distance(Xu, vis)}      # [u, Q]
            delta = delta_cache[key][inv][:, qs]
        for st in ([] if not steps else _grow_steps(rows, Xu, inv, ns[-1], need_pair)):
            N = st["N"]
            if N not in wanted:
                continue
            r, dsel = _radius_step(rows, st)
            pos = r > 0
            ok = (rows.Lt > N).expand(r.shape) & (True if all_rows else pos)
            res = {"r": r, **_ns_fracs_step(dsel, r, pos)}
            res["ns_frac"] = res[f"ns_frac_{radius}"]
            xis = {"row": dsel}
            if need_pair:
                xis["pair"] = st["psum"][:N].permute(1, 2, 0) / (N - 1) if N > 1 else torch.zeros_like(dsel)
            if need_delta:
                res["delta"] = delta
                xis["delta"] = bounds.theorem2_xi_delta(st["a_top"][:N].permute(1, 2, 0), delta, M)
            res.update(_xi_bounds_step(xis, r, pos, M))
            out[:, wanted[N], bs, qs] = nan_rows(torch.stack([res[k] for k in stats]), ok)
        for w in ([] if steps else _windows(rows, Xu, inv, ns[-1], ns, need_pair)):
            r, Nt = w["r"], w["ns"]
            ok = (rows.Lt.view(1, -1, 1) > Nt).expand(r.shape) & (True if all_rows else r > 0)
            res = {"r": r, **_ns_fracs(w)}
            res["ns_frac"] = res[f"ns_frac_{radius}"]
            xis = {"row": w["dsel"]}
            if need_pair:
                xis["pair"] = w["pair"]
            if need_delta:
                res["delta"] = delta.unsqueeze(-1).expand(r.shape)
                a_sel = w["a_top"].masked_fill(~w["sel"], 0.0).permute(1, 2, 3, 0)        # [b, q, w, n]
                xis["delta"] = bounds.theorem2_xi_delta(a_sel, res["delta"], M).permute(3, 0, 1, 2)
            res.update(_xi_bounds(xis, w, M))
            cols = [wanted[N] for N in w["want"]]
            out[:, cols, bs, qs] = nan_rows(torch.stack([res[k] for k in stats]), ok).permute(0, 3, 1, 2)
    out = out.cpu()                                                      # one transfer
    return {k: out[i].permute(1, 2, 0).reshape(*lead, Q, len(ns)) for i, k in enumerate(stats)}


def separability(probs, x, n: int, visible=None, *, M: float = 1.0, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """N_s / N of every row (paper Eq. 10, r = nearest non-selected distance, strict <), [..., Q]."""
    return separability_stats(probs, x, [n], visible, M=M, stats=["ns_frac"], chunk=chunk)["ns_frac"][..., 0]
