"""Vectorised metrics == per-row oracle; edge cases; critical N; bad input."""
import math

import numpy as np
import pytest
import torch

from attnlab.normalization import bounds, oracle
from attnlab.normalization.metrics import critical_n, distance, engine, gradients, rows, separability


def _inputs(seed=0, layers=2, heads=2, L=12, D=4, sharp=2.0, causal=True):
    g = torch.Generator().manual_seed(seed)
    vis = torch.tril(torch.ones(L, L, dtype=torch.bool)) if causal else torch.ones(L, L, dtype=torch.bool)
    scores = (torch.randn(layers, heads, L, L, generator=g) * sharp).masked_fill(~vis, float("-inf"))
    probs = torch.softmax(scores, -1)
    x = torch.randn(layers, heads, L, D, generator=g)
    hidden = torch.randn(layers, 1, L, D + 3, generator=g)
    return scores, probs, x, hidden, vis


def _close(a: torch.Tensor, b: torch.Tensor, rtol=1e-5, atol=1e-9):
    assert a.shape == b.shape
    assert torch.equal(torch.isnan(a), torch.isnan(b)), "different rows skipped"
    m = ~torch.isnan(a)
    assert torch.allclose(a[m], b[m], rtol=rtol, atol=atol), float(((a[m] - b[m]).abs() / (b[m].abs() + atol)).max())


CASES = [dict(causal=True, keys="visible"), dict(causal=True, keys="all"), dict(causal=False, keys="visible")]


@pytest.fixture(params=["kernels", "torch", "tiles"])
def fused(request, monkeypatch):
    """Run a test on each engine: the CPU numba kernels, the plain-torch path, and that path with the batched tiles
    a GPU runs (`engine.TILES_ON_CPU`, with the CPU's small tiles: many blocks, N in groups)."""
    monkeypatch.setattr(engine, "FUSED", request.param == "kernels")
    monkeypatch.setattr(engine, "TILES_ON_CPU", request.param == "tiles")
    return request.param == "kernels"


@pytest.mark.parametrize("shape", ["causal", "bidirectional"])
def test_d1_table_and_candidates_meet_at_the_table_limit(shape):
    """On the kernels, d1 comes from the farthest-visible-key table up to TABLE_D1_N and from the candidates beyond:
    both equal the oracle on either side of the limit."""
    g = torch.Generator().manual_seed(3)
    N0 = distance.TABLE_D1_N
    L = N0 + 6
    vis = torch.tril(torch.ones(L, L, dtype=torch.bool)) if shape == "causal" else torch.ones(L, L, dtype=torch.bool)
    probs = torch.softmax((torch.randn(1, 2, L, L, generator=g) * 2).masked_fill(~vis, float("-inf")), -1)
    x = torch.randn(1, 2, L, 3, generator=g)
    ns = [N0 - 1, N0, N0 + 1, N0 + 4]
    a = distance.distance_stats(probs, x, ns, vis, stats=("d1", "dmax_B"))
    b = oracle.distance_stats(probs, x, ns, vis, stats=("d1", "dmax_B"))
    for k in ("d1", "dmax_B"):
        _close(a[k], b[k])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("chunk", [engine.DEFAULT_CHUNK, 40])
def test_distance_stats_equal_oracle(case, chunk, fused):
    _, probs, x, hidden, vis = _inputs(causal=case["causal"])
    visible = vis if case["keys"] == "visible" else None
    ns = [1, 2, 3, 5, 11]
    for xx in (x, hidden):
        a = distance.distance_stats(probs, xx, ns, visible, stats=distance.DISTANCE_STATS, chunk=chunk)
        b = oracle.distance_stats(probs, xx, ns, visible, stats=distance.DISTANCE_STATS)
        for k in distance.DISTANCE_STATS:
            _close(a[k], b[k])


@pytest.mark.parametrize("shape", ["causal", "bidirectional", "irregular"])
def test_d1_lookups_equal_oracle(shape, fused):
    """d1 for small N (farthest visible key) and large N (farthest-key candidates), on prefix-shaped and
    irregular visibility, with rows that fall back to the full recomputation (few keys, many ties)."""
    g = torch.Generator().manual_seed(7)
    L, D = 40, 3
    vis = {"causal": torch.tril(torch.ones(L, L, dtype=torch.bool)),
           "bidirectional": torch.ones(L, L, dtype=torch.bool),
           "irregular": torch.rand(L, L, generator=g) > 0.3}[shape]
    vis[:, 0] = True
    scores = (torch.randn(2, 3, L, L, generator=g) * 2).masked_fill(~vis, float("-inf"))
    probs = torch.softmax(scores, -1)
    x = torch.randn(2, 3, L, D, generator=g)
    x[..., 5, :] = x[..., 6, :]                                          # duplicate vectors: ties in distance
    ns = [1, 4, engine.SMALL_N, engine.SMALL_N + 1, 30]
    a = distance.distance_stats(probs, x, ns, vis, stats=("d1", "dmax_B"))
    b = oracle.distance_stats(probs, x, ns, vis, stats=("d1", "dmax_B"))
    for k in ("d1", "dmax_B"):
        _close(a[k], b[k])


@pytest.mark.parametrize("case", CASES)
def test_separability_stats_equal_oracle(case, fused):
    _, probs, x, hidden, vis = _inputs(seed=1, causal=case["causal"])
    visible = vis if case["keys"] == "visible" else None
    ns = [1, 2, 4, 8]
    for xx, chunk in ((x, engine.DEFAULT_CHUNK), (hidden, 30)):
        a = separability.separability_stats(probs, xx, ns, visible, stats=separability.SEPARABILITY_STATS, chunk=chunk)
        b = oracle.separability_stats(probs, xx, ns, visible, stats=separability.SEPARABILITY_STATS)
        for k in separability.SEPARABILITY_STATS:
            _close(a[k], b[k], atol=1e-7)


def test_row_summary_fd_and_jacobian_equal_oracle():
    g = torch.Generator().manual_seed(2)
    L, D = 10, 4
    vis = torch.tril(torch.ones(L, L, dtype=torch.bool))
    q, k = torch.randn(2, 3, L, D, generator=g), torch.randn(2, 3, L, D, generator=g)
    scores = (0.5 * q @ k.transpose(-1, -2)).masked_fill(~vis, float("-inf"))
    probs = torch.softmax(scores, -1)
    a, b = rows.row_summary(scores, probs, q, k, 0.5, vis), oracle.row_summary(scores, probs, q, k, 0.5, vis)
    for key in a:
        _close(a[key].double(), b[key].double(), atol=1e-6)
    Ts, Es = [0.003, 0.1, 1.0, 30.0], [1e-3, 0.1, 10.0]
    _close(gradients.fd_grad_norms(scores, Ts, Es, vis, seed=5, chunk=25),
           oracle.fd_grad_norms(scores, Ts, Es, vis, seed=5), atol=1e-9)
    for T in (0.05, 1.0):
        pT = torch.softmax((scores / T), -1)
        ref = oracle.softmax_jacobian_norm(pT, T, vis)
        _close(gradients.softmax_jacobian_norm(pT, T, vis), ref, atol=1e-10)
        _close(gradients.softmax_jacobian_norm(pT, T, vis, method="secular"), ref, atol=1e-10)


@pytest.mark.parametrize("shape", ["bidirectional", "window", "causal"])
def test_row_summary_block_paths_equal_oracle(shape, fused):
    """row_summary first runs as if every value were finite (checked block by block) and falls back to the full
    checks at a -inf mask: all finite (bidirectional), finite with a narrower `visible` (window), -inf masks
    (causal); probs with exact zeros (0 log 0); several blocks; numpy's log on the kernels, torch's without."""
    g = torch.Generator().manual_seed(4)
    L, D = 12, 4
    q, k = torch.randn(2, 3, L, D, generator=g), torch.randn(2, 3, L, D, generator=g)
    scores = 0.5 * q @ k.transpose(-1, -2)
    band = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).abs() <= 3
    vis = {"bidirectional": None, "window": band, "causal": torch.tril(torch.ones(L, L, dtype=torch.bool))}[shape]
    if shape == "causal":
        scores = scores.masked_fill(~vis, float("-inf"))
    probs = torch.softmax(scores.masked_fill(~vis, float("-inf")) if vis is not None else scores, -1)
    probs[0, 1, 5] = 0.0                                                  # an exact zero weight
    for chunk in (rows.ROW_CHUNK, 2 * L):
        a = rows.row_summary(scores, probs, q, k, 0.5, vis, chunk=chunk)
        b = oracle.row_summary(scores, probs, q, k, 0.5, vis)
        for key in b:
            _close(a[key].double(), b[key].double(), atol=1e-6)


def test_row_summary_names_a_bad_value_wherever_it_is():
    """The block-by-block check finds what the full checks find, masked keys included."""
    g = torch.Generator().manual_seed(5)
    L, D = 6, 3
    q, k = torch.randn(1, 2, L, D, generator=g), torch.randn(1, 2, L, D, generator=g)
    vis = torch.tril(torch.ones(L, L, dtype=torch.bool))
    scores = (0.5 * q @ k.transpose(-1, -2)).masked_fill(~vis, float("-inf"))
    probs = torch.softmax(scores, -1)
    bad = scores.clone()
    bad[0, 1, 2, 4] = math.nan                                            # on a masked key
    with pytest.raises(ValueError, match=r"scores have NaN or \+inf at position \(0, 1, 2, 4\)"):
        rows.row_summary(bad, probs, q, k, 0.5, vis)
    for value, what in ((math.nan, "NaN"), (-math.inf, "an infinity")):
        badp = probs.clone()
        badp[0, 0, 3, 1] = value
        with pytest.raises(ValueError, match=f"probs has {what} at position \\(0, 0, 3, 1\\)"):
            rows.row_summary(scores, badp, q, k, 0.5, vis)
        with pytest.raises(ValueError, match=f"probs has {what} at position \\(0, 0, 3, 1\\)"):
            rows.row_summary(scores.masked_fill(~vis, 0.0), badp, q, k, 0.5, None)    # all finite scores


def test_span_blocks_leave_out_only_keys_no_row_of_the_block_sees():
    """Causal rows: every (head, row) once, in `engine.blocks`' order, each block's keys cover its rows' visible keys
    and rows x keys stays within the chunk (one row at least); other visibility keeps every key."""
    B, Q, chunk = 3, 50, 200
    causal = torch.ones(Q, Q, dtype=torch.bool).tril()
    last = engine.last_keys(causal)
    got = list(engine.span_blocks(B, Q, Q, chunk, last))
    assert [(b.start, q) for b, qs, _ in got for q in range(qs.start, qs.stop)] == [(b, q) for b in range(B)
                                                                                   for q in range(Q)]
    assert all(hi >= last[qs.stop - 1] and ((qs.stop - qs.start) * hi <= chunk or qs.stop - qs.start == 1)
               for _, qs, hi in got)
    assert len({(qs.start, qs.stop) for _, qs, _ in got}) < len(list(engine.blocks(1, Q, Q, chunk)))  # more rows early
    assert engine.last_keys(torch.ones(Q, Q, dtype=torch.bool)) is None
    assert engine.last_keys(causal.flip(0)) is None                  # rows that see fewer keys as they go
    assert {hi for _, _, hi in engine.span_blocks(B, Q, Q, chunk, None)} == {Q}


def test_row_blocks_cut_causal_rows_inside_the_head_blocks():
    """distance_stats' blocks: causal rows cut at each N (rows valid for the same N together), never more heads per
    block than `engine.blocks` gives (per-head tables are made per block); bidirectional rows are not cut."""
    B, Q, chunk = 12, 64, 64 * 64 * 3
    causal = torch.ones(Q, Q, dtype=torch.bool).tril()
    got = list(distance.row_blocks(B, Q, Q, chunk, causal.sum(-1), [5, 32, 63], engine.last_keys(causal)))
    plain = list(engine.blocks(B, Q, Q, chunk))
    assert max(b.stop - b.start for b, _, _ in got) == max(b.stop - b.start for b, _ in plain) == 3
    assert {(q.start, q.stop) for _, q, _ in got} == {(0, 5), (5, 32), (32, 63), (63, 64)}
    assert sum((b.stop - b.start) * (q.stop - q.start) for b, q, _ in got) == B * Q
    assert all(hi == q.stop for _, q, hi in got)                     # a causal block sees the keys below its last row
    full = torch.ones(Q, Q, dtype=torch.bool)
    assert list(distance.row_blocks(B, Q, Q, chunk, full.sum(-1), [5, 32], engine.last_keys(full))) == \
        [(b, q, Q) for b, q in plain]


def test_fd_grad_norms_leave_out_keys_no_causal_row_sees():
    """Causal rows are cut into spans that leave out the keys none of their rows sees (`engine.key_spans`): same
    values as the oracle; other visibility is one span over every key a row sees."""
    g = torch.Generator().manual_seed(3)
    L = 48
    tril = torch.tril(torch.ones(L, L, dtype=torch.bool))
    spans = engine.key_spans(tril)
    assert len(spans) == 8 and spans[0] == (slice(0, 6), 6) and spans[-1] == (slice(42, 48), 48)
    assert engine.key_spans(torch.ones(L, L, dtype=torch.bool)) == [(slice(0, L), L)]
    scores = torch.randn(2, 3, L, L, generator=g, dtype=torch.float64).masked_fill(~tril, float("-inf"))
    Ts, Es = [0.003, 1.0, 30.0], [1e-3, 10.0]
    _close(gradients.fd_grad_norms(scores, Ts, Es, tril, seed=1), oracle.fd_grad_norms(scores, Ts, Es, tril, seed=1),
           atol=1e-9)


@pytest.mark.parametrize("fused", [True, False])
def test_secular_top_eigenvalue_equals_eigvalsh(monkeypatch, fused):
    """The secular solver (CPU kernel: safeguarded Newton; torch: bisection) == eigvalsh to 1e-12 absolute, on soft
    and near one-hot rows, a tie at the top, one visible key and masked keys."""
    from attnlab.normalization.metrics import engine

    monkeypatch.setattr(engine, "FUSED", fused)
    g = torch.Generator().manual_seed(7)
    L = 40
    vis = torch.rand(L, L, generator=g) > 0.3
    vis[:, 0] = True
    vis[3] = False
    vis[3, 0] = True                                        # one visible key
    s = torch.randn(2, L, L, generator=g, dtype=torch.float64) * 3
    s[0, 5, :2] = 10.0                                       # a tie at the top
    vis[5, :2] = True
    for T in (1e-3, 0.05, 1.0, 100.0):
        a = torch.softmax((s / T).masked_fill(~vis, float("-inf")), -1)
        ref = oracle.softmax_jacobian_norm(a, T, vis)
        got = gradients.softmax_jacobian_norm(a, T, vis, method="secular")
        _close(got * T, ref * T, atol=1e-12)


def test_metrics_match_bounds_formulas_row_by_row():
    _, probs, x, _, _ = _inputs(seed=3, layers=1, heads=1, L=9, causal=False)
    N = 3
    E = distance.expectation(probs, x, N)[0, 0]
    J = distance.jensen_gap_bound(probs, x, N)[0, 0]
    for t in range(9):
        a, xx = probs[0, 0, t].double(), x[0, 0].double()
        # sums of roots are taken in float32 (engine.root_sum): ~1e-7 relative
        assert float(E[t]) == pytest.approx(float(bounds.theorem1_random_main(a, xx, N)), rel=1e-6)
        assert float(J[t]) == pytest.approx(float(bounds.theorem1_jensen_bound(a, xx, N)), rel=1e-6)
        ing = bounds.fixed_set_ingredients(a, xx, N)
        expect = bounds.theorem1_fixed_bound(ing["abar"], ing["d1"], ing["R"], 9, N, "B")
        assert float(distance.dmax(probs, x, N)[0, 0, t]) == pytest.approx(float(expect), rel=1e-9)


def test_causal_prefix_rows_are_skipped_and_lengths_counted():
    _, probs, x, _, vis = _inputs(layers=1, heads=1, L=8)
    d = distance.dtilde(probs, x, 3, vis)[0, 0]
    assert torch.isnan(d[:3]).all() and not torch.isnan(d[3:]).any()      # rows t <= N (1-based) skipped
    d_all = distance.dtilde(probs, x, 3, None)[0, 0]
    assert not torch.isnan(d_all).any()                                     # masked keys included: every row


# ------------------------------------------------------------------------------------- edge cases

def test_ties_break_to_lower_index_and_top_n():
    p = torch.tensor([[0.1, 0.3, 0.3, 0.0, 0.3]])
    assert engine.top_n(p, 3).tolist() == [[1, 2, 4]]
    vis = torch.tensor([[True, False, True, True, True]])
    assert engine.top_n(p, 2, vis).tolist() == [[2, 4]]
    order, rank = engine.sort_rows(p)
    assert torch.equal(rank.gather(-1, order), torch.arange(5)[None])


def test_top_k_kernel_equals_stable_sort_with_ties():
    """The insertion top-k (CPU kernel) keeps the tie rule: weight descending, lower index first,
    invisible keys last, also where rows have fewer visible keys than k."""
    from attnlab.normalization.kernels import metrics as kernels

    g = torch.Generator().manual_seed(3)
    p = (torch.rand(3, 9, 40, generator=g) * 4).floor() / 4          # many exact ties, zeros
    for vis in (torch.tril(torch.ones(9, 40, dtype=torch.bool), diagonal=2),   # rows with 3..11 keys
                torch.rand(9, 40, generator=g) > 0.5, torch.ones(9, 40, dtype=torch.bool)):
        order = engine.sort_keys(p, vis)[0]
        for k in (1, 5, engine.SMALL_N):
            top = kernels.top_k(p, None if bool(vis.all()) else vis, k)
            n_vis = vis.sum(-1).view(1, -1, 1)
            first = torch.arange(k).view(1, 1, -1) < n_vis                # the visible part is exact
            assert torch.equal(top[first.expand_as(top)], order[..., :k][first.expand_as(top)])
            assert bool((top.sort(-1).values.diff(dim=-1) > 0).all())    # distinct keys in every row
            assert bool(vis.gather(-1, top[0]).eq(first[0]).all())         # invisible keys only after the visible


def test_far_rows_kernel_equals_cummax():
    """far2 of the d1 tables: the numba running maximum equals torch.cummax's values (+ ||x_j||^2) bit for bit."""
    from attnlab.normalization.kernels import metrics as kernels

    g = torch.Generator().manual_seed(5)
    H = ((torch.rand(2, 30, 30, generator=g, dtype=torch.float64) - 0.5) * 8).round()   # ties, zeros
    xn2 = torch.rand(2, 30, generator=g, dtype=torch.float64)
    assert torch.equal(kernels.far_rows(H, xn2), torch.cummax(H, dim=-1).values + xn2.unsqueeze(-1))


def test_equal_x_share_one_table_and_give_the_same_stats():
    """GQA: the value vectors repeated per query head map to one x (`engine.same_x`); the statistics are those
    of the heads computed one by one."""
    g = torch.Generator().manual_seed(6)
    K = 40
    vis = torch.ones(K, K, dtype=torch.bool).tril()
    p = torch.randn(1, 4, K, K, generator=g).masked_fill(~vis, float("-inf")).softmax(-1)
    x = torch.randn(1, 2, K, 8, generator=g).repeat_interleave(2, dim=1)
    _, _, X, xmap = engine.flatten_heads(p, x)
    assert engine.same_x(X, xmap).tolist() == [0, 0, 2, 2]
    z = torch.zeros(3, 2, 1)
    z[1, 0, 0] = -0.0                                   # 0.0 and -0.0: equal numbers, not the same bits
    assert engine.same_x(z, torch.arange(3)).tolist() == [0, 1, 0]
    both = distance.distance_stats(p, x, [3], vis, stats=distance.DISTANCE_STATS, chunk=K * 8)
    for h in range(4):
        one = distance.distance_stats(p[:, h:h + 1], x[:, h:h + 1], [3], vis, stats=distance.DISTANCE_STATS,
                                      chunk=K * 8)
        for k in distance.DISTANCE_STATS:
            assert torch.equal(both[k][:, h:h + 1].nan_to_num(-1.0), one[k].nan_to_num(-1.0)), k


def test_partial_sort_equals_full_sort_with_ties():
    g = torch.Generator().manual_seed(0)
    p = (torch.rand(3, 7, 40, generator=g) * 4).floor() / 4          # many exact ties, zeros
    vis = torch.tril(torch.ones(7, 40, dtype=torch.bool), diagonal=30)
    order, rank = engine.sort_keys(p, vis)
    for k in (1, 3, 5):
        o2, r2 = engine.sort_top_keys(p, vis, k)
        assert torch.equal(o2, order[..., :k])
        assert torch.equal(torch.where(rank < k, rank, 40), r2)
    # both paths of the engine agree (n_max small -> partial sort)
    x = torch.randn(3, 40, 4, generator=g)
    full = distance.distance_stats(p, x, [2, 30], vis, stats=distance.DISTANCE_STATS)
    part = distance.distance_stats(p, x, [2], vis, stats=distance.DISTANCE_STATS)
    for k in distance.DISTANCE_STATS:
        _close(part[k][..., 0], full[k][..., 0])


def test_one_hot_row():
    L, D = 6, 3
    probs = torch.zeros(1, L)
    probs[0, 2] = 1
    x = torch.randn(L, D)
    s = engine.context_vector(probs, x, 1)
    assert torch.allclose(s[0].float(), x[2])
    d = distance.dtilde(probs, x, 1)
    assert float(d) == pytest.approx((L - 1) * float(x[2].norm()), rel=1e-6)
    assert float(distance.dmax(probs, x, 1, form="B")) == pytest.approx(float(d), rel=1e-6)    # equality
    assert float(rows.entropy(probs)) == 0.0 and float(rows.max_weight(probs)) == 1.0
    norm = gradients.softmax_jacobian_norm(probs.double(), 1.0, method="secular")
    assert float(norm) == pytest.approx(0.0, abs=1e-12)


def test_N_equals_L_minus_1():
    _, probs, x, _, _ = _inputs(seed=4, layers=1, heads=1, L=7, causal=False)
    N = 6
    p, xx = probs[0, 0].double(), x[0, 0].double()
    d = distance.dtilde(probs, x, N)[0, 0]
    for t in range(7):
        last = int(torch.argmin(p[t]))  # the single non-selected key
        s = (p[t, :, None] * xx).sum(0) - p[t, last] * xx[last]
        assert float(d[t]) == pytest.approx(float((p[t, last] * xx[last] - s).norm()), rel=1e-6)
    with pytest.raises(ValueError, match="N must be < L"):
        distance.dtilde(probs, x, 7)


def test_uniform_row_entropy_and_N1():
    L = 16
    probs = torch.full((1, L), 1.0 / L)
    assert float(rows.entropy(probs)) == pytest.approx(math.log(L))
    x = torch.randn(L, 2)
    sep = separability.separability(probs, x, 1)
    assert float(sep) in (0.0, 1.0)


@pytest.mark.parametrize("seed", range(4))
def test_finite_difference_bounded_by_theorems(seed):
    scores, _, _, _, vis = _inputs(seed=seed, L=9, sharp=4.0)
    Ts, Es = [0.01, 0.3, 3.0], [1e-3, 0.1, 10.0]
    g = gradients.fd_grad_norms(scores, Ts, Es, vis, seed=seed)
    for ti, T in enumerate(Ts):
        for ei, e in enumerate(Es):
            col = g[..., ti, ei]
            col = col[~torch.isnan(col)]
            assert bool((col <= 1 / (2 * T) * (1 + 1e-9)).all())
            assert bool((col <= math.sqrt(2) / e * (1 + 1e-9)).all())
    # small eps approximates ||J v|| <= ||J||
    g0 = gradients.fd_grad_norms(scores, [1.0], [1e-6], vis, seed=seed)[..., 0, 0]
    jn = gradients.softmax_jacobian_norm(torch.softmax(scores.double(), -1), 1.0, vis)
    m = ~torch.isnan(g0)
    assert bool((g0[m] <= jn[m] * (1 + 1e-4) + 1e-9).all())


def test_directions_are_seeded_unit_vectors_on_visible_keys():
    vis = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    v1 = gradients.random_directions((2,), vis, seed=7)
    v2 = gradients.random_directions((2,), vis, seed=7)
    assert torch.equal(v1, v2)
    assert torch.allclose(v1.norm(dim=-1), torch.ones(2, 5, dtype=torch.float64))
    assert bool((v1[:, ~vis] == 0).all())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [64, 1 << 18])
def test_top_orders_kept_between_vector_readings_give_the_same_numbers(causal, chunk):
    """`distance_stats(top_orders=...)`: the row blocks' top orders made by the first call (value vectors) and reused by
    the next (hidden states, another x on the same weights) give every stat bit for bit as fresh calls do."""
    _, probs, x, hidden, vis = _inputs(seed=4, L=16, causal=causal)
    ns, stats = [1, 3, 5, 15], ("dtilde_a", "dtilde_b", "E", "E2", "E3", "E5", "d1", "abar")
    kept: dict = {}
    for xv in (x, hidden, x):
        fresh = distance.distance_stats(probs, xv, ns, vis, stats=stats, chunk=chunk, dtype=torch.float32)
        again = distance.distance_stats(probs, xv, ns, vis, stats=stats, chunk=chunk, dtype=torch.float32,
                                        top_orders=kept)
        for k in stats:
            torch.testing.assert_close(again[k], fresh[k], rtol=0, atol=0, equal_nan=True)
    assert kept and all(o.dtype == torch.long for o in kept.values())


def test_min_pairwise_distance_prefix_and_general_agree():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 3, generator=g, dtype=torch.float64)
    vis = torch.tril(torch.ones(7, 7, dtype=torch.bool))
    fast = separability.min_pairwise_distance(x, vis)
    odd = vis.clone()
    odd[6, 0] = False  # not prefix-shaped: general path
    slow = separability.min_pairwise_distance(x, odd)
    assert torch.isnan(fast[:, 0]).all()
    assert torch.allclose(fast[:, 1:6], slow[:, 1:6])
    d = torch.cdist(x[0, 1:7], x[0, 1:7]) + torch.eye(6, dtype=torch.float64) * 1e9
    assert float(slow[0, 6]) == pytest.approx(float(d.min()))


@pytest.mark.parametrize("w", [1, 2, 3, 6])
def test_min_pairwise_distance_over_runs_of_keys_is_the_row_by_row_minimum(w):
    """Sliding-window rows (each sees one run of consecutive keys): the pass over spans gives, bit for bit, the
    minimum the row-by-row path takes over each row's keys; a row that sees one key is NaN; a mask with a gap goes
    row by row."""
    g = torch.Generator().manual_seed(3)
    K = 11
    x = torch.randn(3, K, 4, generator=g, dtype=torch.float64)
    i = torch.arange(K)
    vis = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - w)        # causal, the last w keys
    assert separability.key_runs(vis) is not None
    got = separability.min_pairwise_distance(x, vis)
    D = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist") + torch.diag_embed(torch.full((K,), math.inf,
                                                                                                    dtype=torch.float64))
    want = separability._row_minima(D, vis)
    torch.testing.assert_close(got, want.masked_fill(~torch.isfinite(want), float("nan")), rtol=0, atol=0,
                               equal_nan=True)                               # (bit for bit)
    assert torch.isnan(got[:, 0]).all() and (w > 1 or torch.isnan(got).all())
    gap = vis.clone()
    gap[K - 1, K - 2] = w < 3                         # (w >= 3: a hole inside row K - 1's run)
    if w >= 3:
        assert separability.key_runs(gap) is None
        torch.testing.assert_close(separability.min_pairwise_distance(x, gap)[:, :-1], got[:, :-1], rtol=0, atol=0,
                                   equal_nan=True)


# ------------------------------------------------------------------------------------- critical N


def test_ks_first_indistinguishable_known_answer():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(60, 1))
    ns = list(range(1, 9))
    shift = np.array([[10.0 if n < 4 else 0.0 for n in ns]])
    d, e = base + shift, base.copy() + 0 * shift
    n, ps, ks = critical_n.ks_first_indistinguishable(d, e, ns, 0.01)
    assert n == 4 and len(ps) == 4 and all(p <= 0.01 for p in ps[:3]) and ps[3] > 0.01
    n, ps, _ = critical_n.ks_first_indistinguishable(base + 10 + 0 * shift, e, ns, 0.01)
    assert n == -1 and len(ps) == len(ns)
    with pytest.raises(ValueError):
        critical_n.ks_first_indistinguishable(d, e[:, :3], ns)


def test_critical_n_scans_every_N_and_matches_oracle(fused):
    _, probs, x, _, vis = _inputs(seed=5, layers=4, heads=5, L=14, sharp=1.0, causal=False)
    ref = oracle.critical_n(probs, x, vis, alpha=0.01)
    plain = critical_n.critical_n(probs, x, vis, alpha=0.01, block=2, certify=False)
    assert plain["n"] == ref["n"] and all(plain["exact"])
    np.testing.assert_allclose(plain["pvalues"], ref["pvalues"], rtol=1e-6)
    res = critical_n.critical_n(probs, x, vis, alpha=0.01, block=2)  # certified rejections
    assert res["n"] == ref["n"] and res["ns"] == ref["ns"]
    assert res["ns"] == list(range(1, len(res["ns"]) + 1))  # dense scan, no gaps
    assert not all(res["exact"])  # some N were certified
    for p, p_up, exact, p_ref in zip(res["pvalues"], res["p_upper"], res["exact"], ref["pvalues"]):
        if exact:
            assert p == pytest.approx(p_ref, rel=1e-6)
        else:  # the bracket bound is valid
            assert p_ref <= p_up * (1 + 1e-3) + 1e-12 and p_up <= 0.005  # (1 - x) rounding at tiny p
    if res["n"] > 0:
        assert res["pvalues"][-1] > 0.01 and all(p <= 0.01 for p in ref["pvalues"][:-1])
    # reading (a) is available too
    ra = critical_n.critical_n(probs, x, vis, reading="a")
    assert ra["n"] == oracle.critical_n(probs, x, vis, reading="a")["n"]


def test_critical_n_identical_samples_accept_at_N1():
    """Bidirectional rows where d~ and E coincide for every head: uniform weights, L = 2 keys, N = 1:
    d~ = ||a x_2 - a x_1|| and E = (1/2)(||a x_1 - a x_2|| + ||a x_2 - a x_1||): identical."""
    g = torch.Generator().manual_seed(0)
    probs = torch.full((30, 2, 2), 0.5)
    x = torch.randn(30, 2, 3, generator=g)
    res = critical_n.critical_n(probs, x)
    assert res["n"] == 1 and res["pvalues"][0] == pytest.approx(1.0)


def test_distance_bounds_bracket_exact_values():
    for causal in (True, False):
        _, probs, x, hidden, vis = _inputs(seed=6, L=16, sharp=3.0, causal=causal)
        ns = [1, 2, 5, 9, 15]
        for xx in (x, hidden):
            ex = distance.distance_stats(probs, xx, ns, vis, stats=("dtilde_b", "dtilde_a", "E"))
            for reading in ("a", "b"):
                bd = critical_n.distance_bounds(probs, xx, ns, vis, reading=reading)
                d = ex[f"dtilde_{reading}"]
                m = ~torch.isnan(d)
                assert torch.equal(m, ~torch.isnan(bd["d_lo"]))
                assert bool((bd["d_lo"][m] <= d[m]).all() and (d[m] <= bd["d_hi"][m]).all())
                assert bool((bd["e_lo"][m] <= ex["E"][m]).all() and (ex["E"][m] <= bd["e_hi"][m]).all())


def test_ks_sf_matches_scipy_and_lower_statistic():
    from scipy.stats import ks_2samp

    rng = np.random.default_rng(1)
    for n, m in ((8, 8), (30, 30), (12, 19)):
        a, b = rng.normal(size=n), rng.normal(size=m) + 0.8
        r = ks_2samp(a, b)
        assert critical_n.ks_sf(r.statistic, n, m) == pytest.approx(r.pvalue, rel=1e-9)
        assert critical_n.ks_lower_statistic(a, a, b, b) == pytest.approx(r.statistic)  # exact intervals
        w = 0.05
        assert critical_n.ks_lower_statistic(a - w, a + w, b - w, b + w) <= r.statistic + 1e-12


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda p, x, s: distance.dtilde(p, x, 12), "N must be < L"),
        (lambda p, x, s: distance.dtilde(p, x, 0), "N must be >= 1"),
        (lambda p, x, s: gradients.fd_grad_norms(s, [0.0], [0.1]), "temperatures"),
        (lambda p, x, s: gradients.fd_grad_norms(s, [1.0], [-1.0]), "epsilons"),
        (lambda p, x, s: gradients.softmax_jacobian_norm(p, T=0), "temperature"),
        (lambda p, x, s: gradients.fd_grad_norms(s.masked_fill(s > 1, float("nan")), [1.0], [0.1]), "NaN"),
        (lambda p, x, s: distance.dtilde(p.masked_fill(p > 0.5, float("nan")), x, 2), "NaN"),
        (lambda p, x, s: distance.dtilde(p, x[..., :5, :], 2), "x must be"),
        (lambda p, x, s: distance.dtilde(p, torch.randn(3, 2, 12, 4), 2), "broadcast"),
        (lambda p, x, s: distance.dtilde(p, x, 2, torch.ones(3, 3, dtype=torch.bool)), "visible"),
        (lambda p, x, s: distance.dtilde(p, x, 2, reading="c"), "reading"),
        (lambda p, x, s: distance.distance_stats(p, x, [2], stats=["nope"]), "unknown stats"),
        (lambda p, x, s: critical_n.critical_n(p, x, alpha=2.0), "alpha"),
    ],
)
def test_bad_input_raises_helpfully(call, match):
    scores, probs, x, _, _ = _inputs()
    with pytest.raises(ValueError, match=match):
        call(probs, x, scores)


@pytest.mark.parametrize("causal", [True, False])
def test_temperature_row_stats_against_softmax(causal):
    """Chapter 1's row statistics at tau x the model's temperature: max weight and normalized entropy
    equal those of softmax(scores / tau) row by row; at tau = 1 the Corollary 1 band holds (a theorem)."""
    g = torch.Generator().manual_seed(5)
    Lq, D = 10, 4
    q, k = torch.randn(2, 3, Lq, D, generator=g), torch.randn(2, 3, Lq, D, generator=g)
    scaling = 0.5
    vis = torch.ones(Lq, Lq).tril().bool() if causal else torch.ones(Lq, Lq, dtype=torch.bool)
    scores = (scaling * q @ k.transpose(-1, -2)).masked_fill(~vis, float("-inf"))
    for tau in (0.5, 1.0, 2.0):
        mw, hn, inside = rows.temperature_row_stats(scores, q, k, scaling, tau, vis)
        p = torch.softmax(scores.double() / tau, dim=-1)
        assert torch.allclose(mw, p.amax(-1))
        Lt = vis.sum(-1).double()
        H = -(torch.special.xlogy(p, p)).sum(-1)
        ok = Lt > 1
        assert torch.allclose(hn[..., ok], (H / Lt.log())[..., ok])
        if tau == 1.0:
            assert bool(inside.all())
        # the scores checked once: bit for bit the numbers of log_weights and entropy, block by block
        lw = rows.log_weights(scores, tau, vis)
        assert torch.equal(mw, lw.exp().amax(-1))
        assert torch.equal(hn[..., ok], (rows.entropy(lw.exp(), vis) / Lt.log())[..., ok])
    with pytest.raises(ValueError):
        rows.temperature_row_stats(scores, q, k, scaling, 0.0, vis)
    with pytest.raises(ValueError, match="NaN"):
        rows.temperature_row_stats(scores.masked_fill(torch.eye(Lq, dtype=torch.bool), float("nan")), q, k,
                                   scaling, 1.0, vis)


def test_d1s_exact_fallback_over_a_sliding_band_equals_it_over_every_key(monkeypatch):
    """A sliding-window row's d1 falls back to the exact max over keys (its farthest keys lie outside its window):
    over its band of keys only (`distance.key_span`), one product per head, the numbers are those of the fallback
    over every key, bit for bit (Gemma 3's Fig. 2b: 53.9 s -> 17.2 s, the same rows)."""
    g = torch.Generator().manual_seed(11)
    L, D, w = 96, 8, 16
    x = torch.randn(3, L, D, generator=g, dtype=torch.float64)
    scores = torch.randn(3, L, L, generator=g)
    vis = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).clamp_min(0).lt(w) & torch.ones(L, L).tril().bool()
    probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), -1)
    stats = ("dmax_B", "dmax_R")
    assert distance.key_span(vis[40:48]) == (25, 48)
    spans, key_span = [], distance.key_span
    monkeypatch.setattr(distance, "key_span", lambda v: spans.append(key_span(v)) or spans[-1])
    banded = distance.distance_stats(probs, x, [1, 5, 12], vis, stats=stats)
    assert any(hi - lo < L for lo, hi in spans), spans             # the fallback ran, over bands
    monkeypatch.setattr(distance, "key_span", lambda v: (0, v.shape[-1]))
    every = distance.distance_stats(probs, x, [1, 5, 12], vis, stats=stats)
    for k in stats:
        assert torch.equal(banded[k].nan_to_num(-1.0), every[k].nan_to_num(-1.0)), k


def test_fewer_heads_than_fewest_heads_accept_every_N_and_that_many_can_reject():
    """`fewest_heads`: two samples of 4 entirely apart have KS p = 2/70 > 0.01, so 4 heads accept N = 1 whatever
    their values (the sink claims of Gemma 3's full layers without their sink heads once read as a tiny critical
    N); 5 apart reject."""
    from scipy.stats import ks_2samp

    assert critical_n.fewest_heads(0.01) == 5 and critical_n.fewest_heads(0.05) == 4
    assert ks_2samp(np.arange(4.0), np.arange(4.0) + 10).pvalue > 0.01
    assert ks_2samp(np.arange(5.0), np.arange(5.0) + 10).pvalue <= 0.01
    ns = list(range(1, 5))
    far = np.full((4, len(ns)), 100.0)                       # d~ far above E at every N, on 4 heads
    assert critical_n.ks_first_indistinguishable(far, np.zeros_like(far), ns, 0.01)[0] == 1
    far5 = np.full((5, len(ns)), 100.0) + np.arange(5.0)[:, None]
    assert critical_n.ks_first_indistinguishable(far5, np.zeros_like(far5), ns, 0.01)[0] == -1
