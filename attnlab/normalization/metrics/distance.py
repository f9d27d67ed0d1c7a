"""Theorem 1 of arXiv 2508.17821 (Fig. 2a/2b): the representation distance d~ of the top-N tokens,
its random-set expectation E, the Jensen spread, and the fixed-set bound d_max, for every row.

Built on `attnlab.normalization.metrics.engine` (blocks, top-N orders, root sums). E and the Jensen spread
share one x_i.o product; for N <= SMALL_N, x_i.s comes from the d1 table instead. d1 (the largest
selected-to-non-selected distance) comes from each key's farthest keys, precomputed once per head.
On the CPU a block steps through the N; off it (`engine.batched`: a GPU) a tile takes every N at once (`_tiles`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from attnlab.normalization import bounds
from attnlab.normalization.metrics.engine import (
    DEFAULT_CHUNK,
    SMALL_N,
    RowBlock,
    batched,
    check_inputs,
    check_ns,
    check_stats,
    cpu_kernels,
    flatten_heads,
    last_keys,
    last_visible,
    nan_rows,
    root_sum,
    row_lengths,
    row_mean,
    same_x,
    span_blocks,
    tile_elements,
    top_order,
    unique_x,
)

DISTANCE_STATS = ("dtilde_b", "dtilde_a", "E", "jensen", "abar", "d1", "R", "dmax_B", "dmax_R", "dmax_a", "E2", "E3",
                  "E5")
PRINTED_E = ("E2", "E3", "E5")   # the printed [B] form of E read literally (`attnlab.normalization.readings`)
FAR_CANDIDATES = 8               # farthest keys kept per key for d1 (exact; rows where all are excluded recompute)
TABLE_D1_N = 128                 # CPU kernels: d1 from each key's farthest visible key (O(N^2) per row) up to this N,
                                 # for prefix-shaped rows (the candidates miss the visible keys of short causal rows)
DIST_ELEMENTS = {"cpu": 1 << 16, "other": 1 << 25}  # [heads, rows, N, keys] elements of one tile of all N at once
                                                   # (`engine.batched`: off the CPU)
D1_STATS = {"d1", "dmax_B", "dmax_R", "dmax_a"}                      # the stats that need d1
TOP_N_STATS = D1_STATS | {"abar", "R"}                               # the stats defined for the top-N set only


def _table_d1(N: int, kernels) -> bool:
    """d1 of top-N sets of this size from the "small" tables: up to TABLE_D1_N on the CPU kernels, SMALL_N in torch
    (whose version holds [rows, N, N] tensors)."""
    return N <= (TABLE_D1_N if kernels is not None else SMALL_N)


def _far_tables(rows: "RowBlock", ns: Sequence[int], m: int, x_all: torch.Tensor, key: tuple = (),
                cache: Optional[dict] = None) -> dict:
    """Lookup tables for `_d1`. For small N and prefix-shaped visibility (bidirectional or causal rows), over
    all the keys of x_all [u, K_all, D] (the block's distinct x; the block's own keys may stop earlier, `span_blocks`):
    H [u, K_all, K_all] (float64), H_ji = ||x_i||^2 - 2 x_j.x_i, so that the squared distance is
    d2[j, i] = H_ji + ||x_j||^2 (formed so wherever it is needed); xn2 [u, K_all] = ||x_i||^2; and far2
    [u, K_all, P], the largest d2[j, i] over the first n keys, at column col[t] for row t's n = L_t. For
    larger N: each key's m farthest keys among the block's, farthest first (far_dist, far_idx [u, K, m]), for
    the keys that are ever selected. `cache` (a dict kept across the row blocks of one call) keeps H and far2 for
    the distinct x named by `key` (`unique_x`; heads with equal x share one, `same_x`): they depend on the x only,
    and a long window's row blocks of one head would otherwise form them again each (O(K^2 D) per block)."""
    tables = {}
    n_vis = rows.n if rows.prefix else None
    kernels = cpu_kernels(rows.a)
    if n_vis is not None and _table_d1(ns[0], kernels):
        Xu, K = x_all, x_all.shape[1]
        xn2 = (Xu * Xu).sum(-1)
        full = bool((n_vis == K).all())
        cache = {} if cache is None else cache
        if cache.get("key") != (key, full, K) or not key:
            cache.clear()                                                # (frees the last x's tables first)
            H = torch.baddbmm(xn2.unsqueeze(-2).expand(-1, K, -1), Xu, Xu.transpose(1, 2), alpha=-2)
            if full:
                far2 = H.amax(-1, keepdim=True).add_(xn2.unsqueeze(-1))
            elif kernels is not None:
                far2 = kernels.far_rows(H, xn2)                          # (no int64 index tensor)
            else:
                far2 = torch.cummax(H, dim=-1).values.add_(xn2.unsqueeze(-1))
            cache.update(key=(key, full, K), H=H, far2=far2)
        col = torch.zeros_like(n_vis) if full else (n_vis - 1).clamp_min(0)
        tables["small"] = (cache["H"], xn2, cache["far2"], col)
    if not _table_d1(ns[-1], kernels) or "small" not in tables:
        Xu, K = rows.Xu, rows.a.shape[-1]
        xn2 = (Xu * Xu).sum(-1)
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


def _d1(rows: RowBlock, N: int, tables: dict, ok: torch.Tensor, chunk: int) -> torch.Tensor:
    """d1 = max over selected j and visible non-selected i of ||x_i - x_j|| per row: [b, q].

    Small N ("small" tables): j's farthest visible key is not selected when it is strictly farther
    than every selected key, and then gives max_i ||x_i - x_j|| (on CPU: `kernels.d1_small`).
    Otherwise ("candidates"): j's farthest keys, farthest first: the first one that is visible and not
    selected gives it. Rows where some j is left undecided are recomputed over all keys. `ok` [b, q]
    marks the rows that count. The "small" tables may cover more keys than the block (`_far_tables`)."""
    kernels = cpu_kernels(rows.a)
    b, q, K = rows.a.shape
    if _table_d1(N, kernels) and "small" in tables and kernels is not None:
        return kernels.d1_small(*tables["small"], rows.inv, rows.order, N, rows.vis if rows.masked else None, K)
    j = rows.order[..., :N]                                              # [b, q, N]
    u = rows.inv.view(b, 1, 1)                                           # each head's table
    if N <= SMALL_N and "small" in tables:
        H, xn2, far2, col = tables["small"]
        fj = far2[u, j, col.view(1, q, 1)]                               # [b, q, N]
        Hjj = H[u.unsqueeze(-1), j.unsqueeze(-1), j.unsqueeze(-2)]       # [b, q, N, N]
        ms = (Hjj + xn2[u, j].unsqueeze(-1)).amax(-1)                    # d2 to the selected i, max over i
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
    if bool(redo.any()):                                                 # exact, over the rows' visible keys
        bb, tt = redo.nonzero(as_tuple=True)
        jj = j[bb, tt]                                                   # [r, N]
        sel = torch.zeros(len(bb), K, dtype=torch.bool, device=jj.device).scatter_(-1, jj, True)
        allowed = (rows.vis[tt] & ~sel).unsqueeze(1)                     # [r, 1, K]
        step = max(1, chunk // max(1, N * K))
        for c0 in range(0, len(bb), step):
            cs = slice(c0, c0 + step)
            lo, hi = key_span(rows.vis[tt[cs]])                          # a sliding layer's rows: their band only
            d2 = _exact_d2(rows, tables, bb[cs], jj[cs], lo, hi).view(-1, N, hi - lo)
            d2 = torch.where(allowed[cs][..., lo:hi], d2, float("-inf"))
            d1[bb[cs], tt[cs]] = d2.flatten(1).amax(-1).clamp_min(0).sqrt()
    return d1


def key_span(vis: torch.Tensor) -> tuple[int, int]:
    """(first, last + 1) of the keys any row of vis [r, K] sees: all K for full rows, a sliding layer's band (w keys
    of rows that see the same window) for its rows."""
    seen = vis.any(0).nonzero()
    return (int(seen[0]), int(seen[-1]) + 1) if len(seen) else (0, vis.shape[-1])


def _exact_d2(rows: RowBlock, tables: dict, bb: torch.Tensor, jj: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Squared distances [r, n, hi - lo] from each selected key jj [r, n] of head bb [r] of the block to its keys
    lo..hi-1: rows of the "small" tables' H where there are any, else from the block's x (d1's exact fallback)."""
    if "small" in tables:                                                # rows of the H table
        H, xn2, _, _ = tables["small"]
        uj = (rows.inv[bb].unsqueeze(-1), jj)                            # [r, n] each
        return H[:, :, lo:hi][uj] + xn2[uj].unsqueeze(-1)                   # (only the band is copied)
    xj = rows.X[bb.unsqueeze(-1), jj]                                    # [r, n, D]
    band = rows.X[:, lo:hi]                                              # [u, k, D], a view: nothing copied
    d2 = torch.empty(*xj.shape[:2], hi - lo, dtype=xj.dtype, device=xj.device)
    for u in bb.unique().tolist():                                       # one product per head, its rows together
        at = (bb == u).nonzero().squeeze(-1)
        d2[at] = torch.bmm(xj[at], band[u].transpose(0, 1).expand(len(at), -1, -1))
    d2.mul_(-2)
    return d2.add_(rows.xn2[bb.unsqueeze(-1), jj].unsqueeze(-1) + rows.xn2[:, lo:hi][bb].unsqueeze(1))


def _check_order(order: Optional[torch.Tensor], probs: torch.Tensor, ns: list[int], stats: list[str], B: int,
                 Q: int) -> Optional[torch.Tensor]:
    """`distance_stats`' `order` [..., Q, >= max(ns)], checked, as [B, Q, k] (None stays None)."""
    if order is None:
        return None
    if order.shape[:-1] != probs.shape[:-1] or order.shape[-1] < ns[-1]:
        raise ValueError(f"order must be [..., Q, >= {ns[-1]}] like probs {tuple(probs.shape)}, "
                         f"got {tuple(order.shape)}")
    if TOP_N_STATS & set(stats):
        raise ValueError("abar, d1, R and the d_max bounds are defined for the top-N set: pass no order")
    return order.reshape(B, Q, -1)


def _row_sums(rows: RowBlock, vis: torch.Tensor, need: set) -> dict:
    """The N-independent terms of a row block (vis [q, K]): Lt1 = max(L - 1, 1) [q, 1], o = sum_i y_i [b, q, D],
    o2 = ||o||^2 [b, q, 1], xo = x_i.o [b, q, K]; for E2 the plain mean m of the visible x: xm = x_i.m [b, q, K],
    m2 = ||m||^2; spread (jensen) [b, q]; Rcum, acum [b, q, k] (running max norm and mass in top order)."""
    a, Lt = rows.a, rows.Lt
    out = {"Lt1": (Lt - 1).clamp_min(1).unsqueeze(-1)}
    out["o"] = o = torch.bmm(rows.XT, a.transpose(1, 2)).transpose(1, 2)
    out["o2"] = o2 = (o * o).sum(-1, keepdim=True)
    out["xo"] = torch.bmm(o, rows.XT) if {"E", "jensen", "E3", "E5"} & need else None
    if "E2" in need:
        mean = torch.matmul(vis.to(a.dtype), rows.X) / Lt.view(-1, 1)   # [b, q, D]
        out["xm"], out["m2"] = torch.bmm(mean, rows.XT), (mean * mean).sum(-1, keepdim=True)
    if "jensen" in need:
        # sum_{j != i} ||y_j - mu_i||^2 = S2 - ||y_i||^2 - ||o - y_i||^2 / (L - 1)
        #   = L / (L - 1) * [(S2 (L - 1) - ||o||^2) / L - a_i (a_i ||x_i||^2 - 2 x_i.o / L)],
        #   S2 = sum_j ||y_j||^2 (`s2_coef`)
        L_, Lt1 = Lt.unsqueeze(-1), out["Lt1"]
        out["spread"] = (L_ / Lt1).sqrt().squeeze(-1) * root_sum(rows, out["xo"], -o2 / L_, 1 / L_, sign=-1.0,
                                                                 s2_coef=Lt1 / L_)
    if TOP_N_STATS & need:
        xn_top = rows.xn2.sqrt().unsqueeze(1).expand(a.shape).gather(-1, rows.order)   # ||x_j|| in order
        out["Rcum"] = torch.cummax(xn_top, dim=-1).values                # [b, q, k]
        out["acum"] = torch.cumsum(a.gather(-1, rows.order), dim=-1)
    return out


def _e_stats(rows: RowBlock, N: int, sums: dict, need: set) -> dict:
    """E, its printed forms E2, E3, E5 and the Jensen bound at N, each [b, q] (`_row_sums` terms, `_e_formulas`)."""
    return _e_formulas(rows, N, rows.Lt, N / sums["Lt1"], {**sums, "a": rows.a}, need)


def _e_formulas(rows: RowBlock, N, Lt: torch.Tensor, cN: torch.Tensor, terms: dict, need: set) -> dict:
    """E, E2, E3, E5 and the Jensen bound from the `_row_sums` terms (and a = the weights), cN = N / (L - 1): at one N
    (an int; Lt [q], cN [q, 1], the terms as `_row_sums` gives them: each [b, q]) or at every N of a tile (N [n];
    Lt [q, 1], cN [q, n, 1], the terms with an N axis at dim 2: each [b, q, n]). The same operations either way."""
    o2, xo = terms["o2"], terms["xo"]
    scale = (Lt - N) / Lt
    res = {}
    if "E" in need:
        # ||(1 + c) y_i - c o||^2 = (1 + c)^2 [a_i (a_i ||x_i||^2 - 2 k x_i.o) + k^2 ||o||^2],
        # c = N / (L - 1), k = c / (1 + c)
        k = cN / (1 + cN)
        res["E"] = scale * (1 + cN.squeeze(-1)) * root_sum(rows, xo, k * k * o2, k)
    if set(PRINTED_E) & need:
        # ||(a_i + c) x_i - mu xbar||^2 = l_i (l_i ||x_i||^2 - 2 mu x_i.xbar) + mu^2 ||xbar||^2, l_i = a_i + c
        lam = terms["a"] + cN
        if "E2" in need:
            res["E2"] = scale * root_sum(rows, terms["xm"], terms["m2"], 1.0, lam=lam)
        if "E3" in need:
            res["E3"] = scale * root_sum(rows, xo, cN * cN * o2, cN, lam=lam)
        if "E5" in need:
            res["E5"] = scale * root_sum(rows, xo, o2, 1.0, lam=lam)
    if "jensen" in need:
        coef = (N * (Lt - 1 - N) / ((Lt - 1) * (Lt - 2))).clamp_min(0)
        coef = torch.where(Lt > 2, coef, torch.zeros_like(coef))
        res["jensen"] = scale * coef.sqrt() * terms["spread"]
    return res


def _top_stats(rows: RowBlock, N: int, sums: dict, need: set, far: dict, ok: torch.Tensor, chunk: int) -> dict:
    """abar, R, d1 and the d_max bounds of the top-N set, each [b, q] (`ok` [b, q]: the rows that count)."""
    abar, R = sums["acum"][..., N - 1], sums["Rcum"][..., N - 1]
    res = {"abar": abar, "R": R}
    if D1_STATS & need:
        res["d1"] = d1 = _d1(rows, N, far, ok, chunk)
        res.update(_dmax(abar, d1, R, rows.Lt, N))
    return res


def _dmax(abar: torch.Tensor, d1: torch.Tensor, R: torch.Tensor, Lt: torch.Tensor, N) -> dict:
    """The Theorem 1 fixed-set bounds dmax_B, dmax_R, dmax_a: at one N (an int; each [b, q], Lt [q]) or at every N
    of a tile (N [n]; each [b, q, n], Lt [q, 1])."""
    return {"dmax_B": bounds.theorem1_fixed_bound(abar, d1, R, Lt, N, "B"),
            "dmax_R": bounds.theorem1_fixed_bound(abar, d1, R, Lt, N, "R"),
            "dmax_a": bounds.theorem1_fixed_bound_a(abar, d1, R)}


def _stats_at(rows: RowBlock, N: int, s: torch.Tensor, sums: dict, need: set, far: dict, table, ok: torch.Tensor,
              chunk: int) -> dict:
    """Every needed stat at N, each [b, q], from the top-N sum s [b, q, D] (`table`: x_i.s from the d1 table H)."""
    res = {}
    if "dtilde_b" in need:                       # ||y_i - s||^2 = a_i (a_i ||x_i||^2 - 2 x_i.s) + ||s||^2
        from_table = table is not None and N <= SMALL_N
        xs = None if from_table else torch.bmm(s, rows.XT)
        res["dtilde_b"] = root_sum(rows, xs, (s * s).sum(-1, keepdim=True), 1.0, drop=rows.order[..., :N],
                                   table=table if from_table else None)
    if "dtilde_a" in need:
        res["dtilde_a"] = (sums["o"] - 2 * s).square().sum(-1).sqrt()
    res.update(_e_stats(rows, N, sums, need))
    if TOP_N_STATS & need:
        res.update(_top_stats(rows, N, sums, need, far, ok, chunk))
    return res


def distance_stats(probs: torch.Tensor, x: torch.Tensor, ns: Sequence[int], visible: Optional[torch.Tensor] = None,
                   *, stats: Sequence[str] = ("dtilde_b", "dtilde_a", "E", "jensen", "dmax_B", "dmax_R"),
                   chunk: int = DEFAULT_CHUNK, dtype: torch.dtype = torch.float64,
                   order: Optional[torch.Tensor] = None,
                   top_orders: Optional[dict] = None) -> dict[str, torch.Tensor]:
    """Theorem-1 quantities of every row for each N in `ns`: dict stat -> float64 [..., Q, len(ns)].

    stats (any of `DISTANCE_STATS`):
      dtilde_b  reading (b) [R, default]: `sum_{i out} ||a_i x_i - s||`
      dtilde_a  reading (a) [S]: `||sum_{i out} a_i x_i - s||`
      E         random-set main sum (`bounds.theorem1_random_main`), over the row's L_t keys
      jensen    its Jensen-gap bound (`bounds.theorem1_jensen_bound`)
      abar, d1, R   top-N mass, max out-to-selected distance, max selected norm
      dmax_B, dmax_R, dmax_a   Theorem 1 fixed-set bounds ([B], [R], reading-(a) [R])
      E2, E3, E5   the printed [B] form of E read literally, `(L-N)/L sum_i ||(a_i + c) x_i - xbar||`,
                c = N/(L-1), xbar = the plain mean of the row's x (E2), c sum_j a_j x_j (E3), sum_j a_j x_j (E5)
    `order` [..., Q, >= max(ns)] (optional): the selected set of each row is its first N keys in this order
    instead of its top N by weight (e.g. random subsets: `readings.random_orders`); the d1 bounds assume top-N.
    Rows with L_t <= N are NaN. `top_orders` (optional, CPU): a dict the caller keeps between calls on the same probs
    and visible with other x (chapter 2's readings: eight vector choices), where each row block's top order is made
    once (`engine.top_order`, the same tensor). `ns` are sorted ascending in the output. `dtype` of the weights, vectors
    and matrix products: float64 (default; matches the oracle to ~1e-7, `root_sum`) or float32 (faster;
    d~ and E within 6e-7 relative of float64 on MiniLM's traces, L = 32..512; used by the critical-N
    scan, which only ranks per-head means). The CPU kernels form the squares in float64 either way.

    Per row (y_i = a_i x_i, o = sum_i y_i, s = the top-N sum): the sums over keys come from squared
    norms expanded in dot products, `||y_i - s||^2 = a_i (a_i ||x_i||^2 - 2 x_i.s) + ||s||^2` and
    `||(1+c) y_i - c o||^2 = (1+c)^2 ||y_i||^2 - 2 (1+c) c y_i.o + c^2 ||o||^2`: two matrix products
    per block (x_i.o) and per N (x_i.s), no [rows, K, D] tensors. Off the CPU (`engine.batched`) every N of a
    block is one tensor program (`_tiles`): the CPU loop's NaN rows, abar and R, d1 within 1e-14 relative, the
    sums of float32 roots within 1e-6 (tests/test_budget.py).
    """
    inp = _inputs(probs, x, ns, visible, stats, order)
    P, vis, ns, stats, order, lengths = inp.probs, inp.visible, inp.ns, inp.stats, inp.order, inp.lengths
    B, Q, K = P.shape
    need = set(stats)
    if batched(P):                                                       # off the CPU: every N at once
        out = torch.full((len(stats), len(ns), B, Q), float("nan"), dtype=torch.float64, device=P.device)
        for cols, bs, qs, val in _tiles(inp, chunk=chunk, dtype=dtype):
            out[:, cols, bs, qs] = val
        out = out.cpu()
        return {k: out[i].permute(1, 2, 0).reshape(*inp.lead, Q, len(ns)) for i, k in enumerate(stats)}
    out = torch.empty(len(stats), len(ns), B, Q, dtype=torch.float64)    # one write per (N, block)
    far_cache: dict = {}                                                 # `_far_tables`' H and far2, per distinct x
    for bs, qs, hi in row_blocks(B, Q, K, chunk, lengths, ns, inp.last):
        Xu, inv, key = unique_x(inp.x, inp.xmap, bs, dtype)              # (keys past hi: seen by no row of the block)
        k = min(ns[-1], hi)
        given = None if order is None else order[bs, qs]
        if order is None and top_orders is not None:                     # the block's top order: made once
            at = (bs.start, bs.stop, qs.start, qs.stop, hi, k)
            if at not in top_orders:
                top_orders[at] = top_order(P[bs, qs, :hi], vis[qs, :hi], k)
            given = top_orders[at]
        rows = RowBlock(P[bs, qs, :hi], vis[qs, :hi], Xu[:, :hi], inv, k, dtype, lengths[qs], inp.prefix, order=given)
        far = table = sums = None                                        # (the last block's tables may go first)
        sums = _row_sums(rows, vis[qs, :hi], need)
        far = _far_tables(rows, ns, FAR_CANDIDATES, Xu, key, far_cache) if D1_STATS & need else {}
        # x_i.s for N <= SMALL_N from the d1 table H (kernels only): N products per key instead of D
        on_kernels = cpu_kernels(rows.a) is not None and dtype == torch.float64
        table = (far["small"][0], rows.inv) if on_kernels and "small" in far else None
        s = torch.zeros_like(sums["o"])
        n_done = 0
        for c, N in enumerate(ns):
            if not bool((rows.Lt > N).any()):                            # no row of the block is long enough
                out[:, c:, bs, qs] = float("nan")
                break
            ok = (rows.Lt > N).expand(rows.a.shape[:2])
            s += rows.top_sum(n_done, N)
            n_done = N
            res = _stats_at(rows, N, s, sums, need, far, table, ok, chunk)
            out[:, c, bs, qs] = nan_rows(torch.stack([res[k] for k in stats]), ok)
    return {k: out[i].permute(1, 2, 0).reshape(*inp.lead, Q, len(ns)) for i, k in enumerate(stats)}


# ------------------------------------------------------------- off the CPU: every N of a tile in one tensor program

class _Inputs(NamedTuple):
    """`distance_stats`' inputs, checked (`_inputs`)."""
    lead: tuple                        # the leading dims of probs before [Q, K]
    probs: torch.Tensor                # [B, Q, K], the heads flattened
    x: torch.Tensor                    # [Bx, K, D], the distinct x
    xmap: torch.Tensor                 # long [B]: each head's x in x (`same_x`)
    visible: torch.Tensor              # [Q, K] bool
    ns: list                           # the N, ascending
    stats: list                        # the stats asked for
    order: Optional[torch.Tensor]      # [B, Q, k] or None (top-N sets)
    lengths: torch.Tensor              # [Q]: visible keys per row
    last: Optional[list]               # `engine.last_keys`
    prefix: bool                       # every row sees keys 0..L_t - 1


def _inputs(probs, x, ns, visible, stats, order) -> _Inputs:
    """`distance_stats`' inputs, checked, named (`_Inputs`)."""
    vis = check_inputs(probs, x, visible)
    ns = check_ns(ns, probs.shape[-1])
    stats = check_stats(stats, DISTANCE_STATS)
    lead, P, X, xmap = flatten_heads(probs, x)
    xmap = same_x(X, xmap)                                               # GQA: one x (and d1 table) per KV head
    order = _check_order(order, probs, ns, stats, *P.shape[:2])
    lengths = row_lengths(vis)                                           # (once, not per block)
    last = last_visible(vis)
    prefix = bool(torch.equal(last, lengths))                            # (`prefix_lengths`)
    return _Inputs(lead, P, X, xmap, vis, ns, stats, order, lengths, last_keys(vis, last), prefix)


def distance_means(probs: torch.Tensor, x: torch.Tensor, ns: Sequence[int], visible: Optional[torch.Tensor] = None,
                   *, stats: Sequence[str] = ("dtilde_b", "E"), chunk: int = DEFAULT_CHUNK,
                   dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """The means over each head's rows (those not NaN: L_t > N) of `distance_stats`: dict stat -> float64 [...,
    len(ns)] (NaN where no row counts). Where `engine.batched`, summed tile by tile on the device: the per-row values
    ([stats, N, heads, rows]: gigabytes for a critical-N window of a large model) are never held; else `row_mean`."""
    if not batched(probs):
        st = distance_stats(probs, x, ns, visible, stats=stats, chunk=chunk, dtype=dtype)
        return {k: row_mean(v, dim=-2) for k, v in st.items()}
    inp = _inputs(probs, x, ns, visible, stats, None)
    sums = torch.zeros(len(inp.stats), len(inp.ns), inp.probs.shape[0], dtype=torch.float64, device=probs.device)
    count = torch.zeros_like(sums)
    for cols, bs, _, val in _tiles(inp, chunk=chunk, dtype=dtype):
        sums[:, cols, bs] += torch.nansum(val, -1)
        count[:, cols, bs] += (~torch.isnan(val)).sum(-1)
    return {k: v.T.reshape(*inp.lead, len(inp.ns)) for k, v in zip(inp.stats, (sums / count).cpu())}


def _tiles(inp: _Inputs, *, chunk: int, dtype: torch.dtype):
    """`distance_stats` where `engine.batched` (`_inputs`): yields (N columns, heads, rows, values [stats,
    n, b, q] float64, NaN where L_t <= N). Blocks of `span_blocks` hold at most `chunk` and DIST_ELEMENTS / len(ns)
    [heads, rows, keys] elements, so that all N of a block make one tile of DIST_ELEMENTS [heads, rows, N, keys] (N
    in groups only when a single row is larger); a block skips the N none of its rows is longer than."""
    P, vis, ns, order, lengths = inp.probs, inp.visible, inp.ns, inp.order, inp.lengths
    B, Q, K = P.shape
    need, budget = set(inp.stats), tile_elements(DIST_ELEMENTS, P)
    longest = lengths.tolist()
    far_cache: dict = {}                                                 # `_far_tables`' H and far2, per distinct x
    for bs, qs, hi in span_blocks(B, Q, K, max(1, min(chunk, budget // len(ns))), inp.last):
        nb = [N for N in ns if N < max(longest[qs])]                     # the N some row of the block has
        if not nb:
            continue
        rows = far = sums = rank = None                                  # (the last block's tensors may go first)
        Xu, inv, key = unique_x(inp.x, inp.xmap, bs, dtype)
        rows = RowBlock(P[bs, qs, :hi], vis[qs, :hi], Xu[:, :hi], inv, nb[-1], dtype, lengths[qs], inp.prefix,
                        order=None if order is None else order[bs, qs])
        sums = _row_sums(rows, vis[qs, :hi], need)
        far = _far_tables(rows, nb, FAR_CANDIDATES, Xu, key, far_cache) if D1_STATS & need else {}
        rank = _ranks(rows)
        step = max(1, budget // rows.a.numel())
        for c0 in range(0, len(nb), step):
            part = nb[c0:c0 + step]
            ok = rows.Lt.unsqueeze(-1) > torch.tensor(part, dtype=rows.Lt.dtype, device=P.device)   # [q, n]
            res = _tile_stats(rows, part, sums, need, far, rank, ok, budget)
            yield slice(c0, c0 + len(part)), bs, qs, nan_rows(torch.stack([res[k] for k in inp.stats]), ok).permute(
                0, 3, 1, 2)


def _ranks(rows: RowBlock) -> torch.Tensor:
    """Each key's position in the block's order, long [b, q, K] (K for the keys past its first k)."""
    b, q, K = rows.a.shape
    k = rows.order.shape[-1]
    pos = torch.arange(k, device=rows.a.device).expand(b, q, k)
    return torch.full((b, q, K), K, dtype=torch.long, device=rows.a.device).scatter_(-1, rows.order, pos)


def _tile_stats(rows: RowBlock, ns: list[int], sums: dict, need: set, far: dict, rank: torch.Tensor,
                ok: torch.Tensor, budget: int) -> dict:
    """`_stats_at` at every N of ns (ascending, at most the block's k) at once: each stat [b, q, n]. The top-N sums s
    [b, q, n, D] and x_i.s [b, q, n, K] are one matrix product each (the selected keys: rank < N); ok [q, n]."""
    b, q, K = rows.a.shape
    n = len(ns)
    Nl = torch.tensor(ns, device=rows.a.device)
    res = {}
    if {"dtilde_b", "dtilde_a"} & need:
        drop = rank.unsqueeze(2) < Nl.view(n, 1)                         # [b, q, n, K]: the top N
        s = torch.bmm((rows.a.unsqueeze(2) * drop).view(b, q * n, K), rows.X).view(b, q, n, -1)
        if "dtilde_b" in need:
            xs = torch.bmm(s.view(b, q * n, -1), rows.XT).view(b, q, n, K)
            res["dtilde_b"] = root_sum(rows, xs, (s * s).sum(-1, keepdim=True), 1.0, drop=drop)
            del xs
        if "dtilde_a" in need:
            res["dtilde_a"] = (sums["o"].unsqueeze(2) - 2 * s).square().sum(-1).sqrt()
    Nt = Nl.to(rows.Lt.dtype)
    res.update(_tile_e_stats(rows, Nt, sums, need))
    if TOP_N_STATS & need:
        abar, R = sums["acum"][..., Nl - 1], sums["Rcum"][..., Nl - 1]
        res.update(abar=abar, R=R)
        if D1_STATS & need:
            res["d1"] = d1 = _tile_d1(rows, ns, far, rank, ok, budget)
            res.update(_dmax(abar, d1, R, rows.Lt.unsqueeze(-1), Nt))
    return res


def _tile_e_stats(rows: RowBlock, Nt: torch.Tensor, sums: dict, need: set) -> dict:
    """`_e_stats` at every N of Nt [n] (rows' dtype) at once: each [b, q, n] (`_e_formulas`, broadcast over N)."""
    cN = sums["Lt1"].reciprocal().unsqueeze(-1) * Nt.view(1, -1, 1)      # [q, n, 1] (as N / Lt1 rounds)
    terms = {k: sums[k] for k in ("o2", "xo", "xm", "m2", "spread") if sums.get(k) is not None}
    terms |= {"a": rows.a} if set(PRINTED_E) & need else {}
    terms = {"xo": None} | {k: v.unsqueeze(2) for k, v in terms.items()}  # [b, q, 1, ...]: an N axis
    return _e_formulas(rows, Nt, rows.Lt.unsqueeze(-1), cN, terms, need)


def _tile_d1(rows: RowBlock, ns: list[int], tables: dict, rank: torch.Tensor, ok: torch.Tensor,
             budget: int) -> torch.Tensor:
    """`_d1` at every N of ns at once: [b, q, n]. N <= SMALL_N from the "small" tables (`_tile_d1_small`), the others
    from the candidates (`_tile_d1_candidates`); the rows (and N) where some selected key is left undecided are
    recomputed over all keys in one exact pass for the tile (`_tile_d1_exact`). ok [q, n]: the rows that count."""
    small = [N for N in ns if N <= SMALL_N] if "small" in tables else []
    parts = []
    if small:
        parts.append(_tile_d1_small(rows, small, tables["small"]))
    if len(small) < len(ns):
        parts.append(_tile_d1_candidates(rows, ns[len(small):], tables["candidates"], rank))
    d1, undecided = (torch.cat(t, -1) for t in zip(*parts))
    redo = undecided & ok
    if bool(redo.any()):
        _tile_d1_exact(rows, ns, tables, rank, redo, d1, budget)
    return d1


def _tile_d1_small(rows: RowBlock, ns: list[int], small: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(d1, undecided) [b, q, n] for N <= SMALL_N from the "small" tables of `_far_tables`: j's farthest visible key
    against the running max (over i, one cummax) of d2[j, i] to the first selected keys i."""
    H, xn2, far2, col = small
    b, q, _ = rows.a.shape
    n = ns[-1]
    j = rows.order[..., :n]                                              # [b, q, n]
    u = rows.inv.view(b, 1, 1)
    fj = far2[u, j, col.view(1, q, 1)]                                   # [b, q, n]
    Hjj = H[u.unsqueeze(-1), j.unsqueeze(-1), j.unsqueeze(-2)]           # [b, q, n, n]
    ms = torch.cummax(Hjj + xn2[u, j].unsqueeze(-1), -1).values          # d2 to the first i + 1 selected, max
    pos = torch.tensor(ns, device=j.device) - 1
    best = torch.where(ms[..., pos] < fj.unsqueeze(-1), fj.clamp_min(0).sqrt().unsqueeze(-1), float("-inf"))
    return _over_selected(best, pos)


def _tile_d1_candidates(rows: RowBlock, ns: list[int], candidates: tuple, rank: torch.Tensor):
    """(d1, undecided) [b, q, n] from each selected key's farthest keys (farthest first): the first candidate that is
    visible and not selected (rank >= N) gives it; one searchsorted of N in the candidates' running max rank."""
    far_dist, far_idx = candidates
    b, q, K = rows.a.shape
    m, n = far_idx.shape[-1], ns[-1]
    j = rows.order[..., :n]
    rowsel = (rows.inv.view(b, 1, 1) * K + j).flatten()                 # rows of the [u*K, m] tables
    cand = far_idx.view(-1, m).index_select(0, rowsel).view(b, q, n * m)
    dist = far_dist.view(-1, m).index_select(0, rowsel).view(b, q, n, m)
    crank = rank.gather(-1, cand).masked_fill_(~rows.vis.expand(b, q, K).gather(-1, cand), -1)
    run = torch.cummax(crank.view(b, q, n, m), -1).values
    Nl = torch.tensor(ns, device=j.device)
    first = torch.searchsorted(run, Nl.expand(b, q, n, len(ns)).contiguous())   # [b, q, j, N]; m: none
    best = dist.gather(-1, first.clamp_max(m - 1)).masked_fill_(first == m, float("-inf"))
    return _over_selected(best, Nl - 1)


def _over_selected(best: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """best [b, q, j, n] (j's distance to its farthest non-selected key at each N, -inf: undecided) -> (d1, undecided)
    [b, q, n] over the selected j (j <= pos, pos [n] = N - 1)."""
    sel = torch.arange(best.shape[2], device=best.device).view(-1, 1) <= pos            # [j, n]
    return best.masked_fill(~sel, float("-inf")).amax(2), ((best == float("-inf")) & sel).any(2)


def _tile_d1_exact(rows: RowBlock, ns: list[int], tables: dict, rank: torch.Tensor, redo: torch.Tensor,
                   d1: torch.Tensor, budget: int) -> None:
    """d1 [b, q, n] recomputed in place over the rows' keys where redo [b, q, n] (as `_d1`'s fallback), in chunks of at
    most `budget` [pairs, selected, keys] elements."""
    b, q, K = rows.a.shape
    bb, tt, cc = redo.nonzero(as_tuple=True)
    n = ns[-1]
    Nr = torch.tensor(ns, device=bb.device)[cc].unsqueeze(-1)            # [r, 1]
    jj = rows.order[bb, tt, :n]                                          # [r, n]
    jsel = torch.arange(n, device=bb.device) < Nr                        # [r, n]
    allowed = rows.vis[tt] & (rank[bb, tt] >= Nr)                        # [r, K]
    step = max(1, budget // (n * K))
    for c0 in range(0, len(bb), step):
        cs = slice(c0, c0 + step)
        lo, hi = key_span(allowed[cs])                                   # a sliding layer's rows: their band only
        d2 = _exact_d2(rows, tables, bb[cs], jj[cs], lo, hi)
        d2 = torch.where(jsel[cs].unsqueeze(-1) & allowed[cs, lo:hi].unsqueeze(1), d2, float("-inf"))
        d1[bb[cs], tt[cs], cc[cs]] = d2.flatten(1).amax(-1).clamp_min(0).sqrt()


def row_blocks(B: int, Q: int, K: int, chunk: int, lengths: torch.Tensor, ns: Sequence[int],
               last: Optional[list[int]] = None):
    """(heads, rows, hi) blocks of `engine.span_blocks` (causal rows, `last` = `engine.last_keys`: the keys past hi
    are seen by no row of the block; None: hi = K), with each block's rows also cut where a row's visible keys
    (lengths [Q]) first exceed each N in ns, when they grow with the row (causal): a block then holds only rows
    valid for the same N and skips the N none of its rows has (at L = 1024 and N = L - 1, one row instead of 1024).
    The heads per block stay those of `engine.blocks` (per-head tables are made per block)."""
    n = lengths.cpu()
    cuts = []
    if Q > 1 and bool((n[1:] >= n[:-1]).all()):
        cuts = sorted({int(torch.searchsorted(n, N, right=True)) for N in ns})
    for bs, qs, hi in span_blocks(B, Q, K, chunk, last):
        edges = [qs.start, *(c for c in cuts if qs.start < c < qs.stop), qs.stop]
        for q0, q1 in zip(edges, edges[1:]):
            yield bs, slice(q0, q1), (hi if last is None else max(1, last[q1 - 1]))


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
