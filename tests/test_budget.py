"""The torch path (the path a GPU runs: ATTNLAB_KERNELS=0) makes a fixed number of torch operator calls and host
transfers per paper-1 figure: they grow with the layers and row blocks, not with L, N, T or the key steps (issue 41).
Counted on this CPU with `core.budget.count_calls` (tiny-gpt2: 2 layers x 4 heads, one row block per figure), at
two sizes of each grid, and pinned: a per-step loop that creeps back changes the counts and fails here."""
import numpy as np
import pytest
import torch

from attnlab.core.budget import count_calls, sync_free
from attnlab.normalization import experiments as ex
from attnlab.normalization.metrics import critical_n, distance, engine, gradients, separability

# (figure, L, protocol) -> counts; measured 2026-11-27 (torch 2.13 CPU); before issue 41 fig3 made 1,823 / 3,311 ops
# and 162 / 314 transfers at N <= 8 / 16, fig4 2,951 / 5,565 ops and 167 / 295 transfers with 2 / 4 temperatures;
# before distance_stats took every N at once, fig2a 611 / 49, fig2b 1,587 / 60 and 3,257 / 88 at N = 1, 20 / 1, 5,
# 10, 20, fig2c 3,628 / 182 and 3,936 / 192 at L = 64 / 128 (exact batches of 8 N; bracket windows of 32 N)
PINNED = {
    "fig1": {"ops": 278, "transfers": 29},
    "fig2a": {"ops": 547, "transfers": 43},     # (d1's exact fallback: its rows' key band, one product per head)
    "fig2b": {"ops": 765, "transfers": 43},
    "fig2c": {"ops": 854, "transfers": 70},
    "fig3": {"ops": 614, "transfers": 30},
    "fig4": {"ops": 1442, "transfers": 47},
}
# fig2c: per window of `scan_windows` one bracket pass and at most one exact call (every uncertified N of the window
# at once), so its counts grow with the number of windows the scan reaches (x8 each: O(log L)), not with L or N;
# here the scan stops in its second window at both L
GRIDS = {   # the second size of each figure's own grid (N of fig2b and fig3, T of fig4), at L = 128; fig2b's N on both
            # sides of SMALL_N in both (d1 then needs both of its tables: each kind of table costs its own operators)
    "fig2b": ({"ns": [1, 20]}, {"ns": [1, 5, 10, 20]}),
    "fig3": ({"ns": list(range(1, 9))}, {"ns": list(range(1, 17))}),
    "fig4": ({"temperatures": [0.01, 1.0]}, {"temperatures": [0.001, 0.01, 0.1, 1.0]}),
}
TILES = ((gradients, "GRAD_ELEMENTS"), (separability, "SEP_ELEMENTS"), (distance, "DIST_ELEMENTS"),
         (critical_n, "BRACKET_ELEMENTS"))   # tile budgets: a GPU's ("other") in the count tests


@pytest.fixture(scope="module")
def caps(tiny):
    from attnlab.core.text import load_corpus

    text = load_corpus("war_and_peace").text
    out = {}
    for L in (64, 128):
        out[L] = ex.Captures(tiny, tiny.window(text, L), {"probs", "scores", "q", "k", "v"})
        out[L].get(L)
    return out


def _counts(tiny, cap, fig, L, proto):
    run = lambda: ex.FIGURE_FUNCS[fig](tiny, None, quick=True, progress=False, captures=[cap], lengths=[L], **proto)
    run()                                                   # first call: lazy set-up apart
    with count_calls() as c:
        run()
    return {k: c[k] for k in ("ops", "transfers")}


@pytest.mark.parametrize("fig", list(PINNED))
def test_torch_path_counts_do_not_grow_with_L_N_T(tiny, caps, fig, monkeypatch):
    monkeypatch.setattr(engine, "FUSED", False)             # the torch path, as on a GPU, with a GPU's tiles
    monkeypatch.setattr(engine, "TILES_ON_CPU", True)
    for mod, name in TILES:
        monkeypatch.setitem(getattr(mod, name), "cpu", getattr(mod, name)["other"])
    small, large = GRIDS.get(fig, ({}, {}))
    at64 = _counts(tiny, caps[64], fig, 64, small)
    at128 = _counts(tiny, caps[128], fig, 128, small)
    grown = _counts(tiny, caps[128], fig, 128, large)
    assert at64 == at128 == grown, f"{fig}: L=64 {at64}, L=128 {at128}, larger grid {grown}"
    assert at128 == PINNED[fig], f"{fig}: counts moved from {PINNED[fig]} to {at128} (update PINNED if intended)"


def test_tiles_equal_the_step_loops(tiny, caps, monkeypatch):
    """The GPU's batched tiles give Alg. 5's g bit for bit and Theorem 2's stats to 1 ulp (N_s/N exactly) of the
    CPU's step loops."""
    from attnlab.normalization.metrics.gradients import fd_grad_norms
    from attnlab.normalization.metrics.separability import SEPARABILITY_STATS, separability_stats

    tr = caps[128].get(128)
    vis = tr.visible()
    mask = vis & (torch.rand(vis.shape, generator=torch.Generator().manual_seed(0)) > 0.3)
    mask[:, 0] = True

    def both(f):
        monkeypatch.setattr(engine, "TILES_ON_CPU", False)
        a = f()
        monkeypatch.setattr(engine, "TILES_ON_CPU", True)
        return a, f()
    for v in (vis, mask):
        a, b = both(lambda: fd_grad_norms(tr.scores, [1e-3, 0.1, 1.0, 100.0], [1e-3, 10.0], v))
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
        a, b = both(lambda: separability_stats(tr.probs, tr.v, range(1, 12), v, stats=SEPARABILITY_STATS))
        assert torch.equal(a["ns_frac"].nan_to_num(7.0), b["ns_frac"].nan_to_num(7.0))
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-14, atol=1e-14, equal_nan=True)


ROOT_SUMS = ("dtilde_b", "E", "jensen", "E2", "E3", "E5")   # sums of float32 roots (`engine.root_sum`)


@pytest.mark.parametrize("L, budget", [(128, "other"), (64, 1 << 7)])    # 1 << 7: a row per block, N in groups
def test_distance_tiles_equal_the_loop_over_n(tiny, caps, monkeypatch, L, budget):
    """distance_stats' tiles (every N at once, off the CPU) against its loop over N (the CPU's torch path), on
    tiny-gpt2 (L=128: causal, bidirectional and a random mask, float64 and float32, the critical-N scan's; L=64 in
    tiny tiles, layer 0: causal, float64): NaN rows, abar and R identical; d1, dtilde_a and the d_max bounds within
    1e-14 relative (measured: 3.7e-16; d1 moves in rows whose candidates or exact fallback come from a matrix
    product of another shape: another block, another N); the root sums within 1e-6 (measured 4.5e-7: their float32
    roots round a square that moved by 1e-16 to the next float32)."""
    from attnlab.normalization.metrics.distance import DIST_ELEMENTS, DISTANCE_STATS, distance_means, distance_stats

    monkeypatch.setattr(engine, "FUSED", False)
    monkeypatch.setitem(DIST_ELEMENTS, "cpu", DIST_ELEMENTS["other"] if budget == "other" else budget)
    tr = caps[L].get(L)
    causal = tr.visible()
    mask = causal & (torch.rand(causal.shape, generator=torch.Generator().manual_seed(0)) > 0.3)
    mask[:, 0] = True
    large = L == 128
    ns = [1, 2, 5, 10, 16, 17, 20, 40, 100] if large else [1, 5, 17, 40]   # both sides of SMALL_N (d1's tables)
    cases = [(torch.float64, DISTANCE_STATS), (torch.float32, ("dtilde_b", "E"))]
    for vis in (causal, torch.ones_like(causal), mask) if large else (causal,):
        for dtype, stats in cases if large else cases[:1]:
            got = {}
            for tiles in (False, True):
                monkeypatch.setattr(engine, "TILES_ON_CPU", tiles)
                probs, v = (tr.probs, tr.v) if large else (tr.probs[0], tr.v[0])
                got[tiles] = distance_stats(probs, v, ns, vis, stats=stats, dtype=dtype)
            loop, tile = got[False], got[True]
            for k in stats:
                assert torch.equal(loop[k].isnan(), tile[k].isnan()), k
                if k in ("abar", "R"):
                    assert torch.equal(loop[k].nan_to_num(7.0), tile[k].nan_to_num(7.0)), k
                tol = 1e-6 if k in ROOT_SUMS else 1e-14
                torch.testing.assert_close(tile[k], loop[k], rtol=tol, atol=0.0, equal_nan=True, msg=k)
            if dtype == torch.float32:                          # the critical-N scan's per-head means, summed by tile
                means = distance_means(probs, v, ns, vis, stats=stats, dtype=dtype)
                for k in stats:
                    torch.testing.assert_close(means[k], engine.row_mean(loop[k], -2), rtol=1e-6, atol=0.0,
                                               equal_nan=True, msg=k)


def test_critical_n_windows_equal_the_batches(tiny, caps, monkeypatch):
    """critical_n's torch path off the CPU (brackets of a window in one program, its uncertified N in one exact call)
    against the CPU's (bracket windows of 32 N, exact batches of 8 N), tiny-gpt2 L=128, causal and a random mask:
    the brackets bit for bit; the same N, certified/exact sets, p-values and KS statistics; the exact d~ and E means
    (float32, `critical_n`'s dtype) within 1e-7 relative (measured 3.7e-9)."""
    monkeypatch.setattr(engine, "FUSED", False)
    for mod, name in TILES:
        monkeypatch.setitem(getattr(mod, name), "cpu", getattr(mod, name)["other"])
    tr = caps[128].get(128)
    causal = tr.visible()
    mask = causal & (torch.rand(causal.shape, generator=torch.Generator().manual_seed(0)) > 0.3)
    mask[:, 0] = True
    for vis in (causal, mask):
        got = {}
        for tiles in (False, True):
            monkeypatch.setattr(engine, "TILES_ON_CPU", tiles)
            got[tiles] = (critical_n.bounds_head_means(tr.probs, tr.v, list(range(9, 128)), vis, "b"),
                          critical_n.critical_n(tr.probs, tr.v, vis))
        (hm0, r0), (hm1, r1) = got[False], got[True]
        for k in hm0:
            assert np.array_equal(hm0[k], hm1[k], equal_nan=True), k
        for k in ("n", "ns", "exact"):
            assert r0[k] == r1[k], k
        for k in ("pvalues", "ks", "p_upper"):
            assert np.array_equal(r0[k], r1[k], equal_nan=True), k
        for k in ("d_mean", "e_mean"):
            np.testing.assert_allclose(r1[k], r0[k], rtol=1e-7, atol=0)


def test_count_calls_sees_ops_and_transfers():
    x = torch.arange(6.0)
    with count_calls() as c:
        y = (x * 2).sum()
        float(y)
        y.item()
        x.tolist()
    assert c["ops"] >= 2 and c["transfers"] == 3


def test_sync_free_is_a_no_op_off_cuda(monkeypatch):
    monkeypatch.setenv("ATTNLAB_SYNC_DEBUG", "1")
    with sync_free(torch.zeros(2)):                         # CPU: nothing to check (CUDA only; untested here)
        assert float(torch.ones(1)) == 1.0
