"""The incremental critical-N scan (CPU kernels: running top-N sums) == the per-row oracle == the old path
(`distance_bounds` brackets + `distance_stats`), on causal, bidirectional and irregular visibility, masked keys
counted as zero-weight keys, heads sharing x, readings a and b, tied weights."""
import numpy as np
import pytest
import torch

from attnlab.normalization import oracle
from attnlab.normalization.kernels import metrics as kernels
from attnlab.normalization.metrics import critical_n, distance, engine


def _inputs(seed=0, heads=20, L=14, D=4, sharp=1.0, vis="causal", ties=False, shared=False, dtype=torch.float32):
    """probs [4, heads // 4, L, L], x [4, heads // 4 or 1, L, D], visible [L, L] (None: every key, zero weights
    where causally masked)."""
    g = torch.Generator().manual_seed(seed)
    tril = torch.tril(torch.ones(L, L, dtype=torch.bool))
    mask = {"causal": tril, "bidirectional": torch.ones(L, L, dtype=torch.bool),
            "irregular": torch.rand(L, L, generator=g) > 0.3, "all": tril}[vis]
    mask[:, 0] = True
    scores = torch.randn(4, heads // 4, L, L, generator=g, dtype=torch.float64) * sharp
    if ties:
        scores = scores.round()                                      # equal weights within rows
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).to(dtype)
    x = torch.randn(4, 1 if shared else heads // 4, L, D, generator=g)
    return probs, x, (None if vis == "all" else mask)


def _agree(res, ref, rtol=1e-5):
    """Same n and scanned N; p-values, d_mean and e_mean within rtol (against the oracle: at the N computed exactly,
    not at the certified ones, whose d_mean and e_mean are bracket midpoints)."""
    assert res["n"] == ref["n"] and res["ns"] == ref["ns"]
    at = np.asarray(res["exact"], bool) if "exact" not in ref else np.ones(len(res["ns"]), bool)
    for k in ("pvalues", "d_mean", "e_mean"):
        a, b = np.asarray(res[k], float)[at], np.asarray(ref[k], float)[at]
        assert np.array_equal(np.isfinite(a), np.isfinite(b)), k
        np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=rtol, err_msg=k)


@pytest.mark.parametrize("vis", ["causal", "bidirectional", "irregular", "all"])
@pytest.mark.parametrize("reading", ["b", "a"])
def test_incremental_equals_oracle_and_old_path(vis, reading):
    f32, f64 = torch.float32, torch.float64
    for shared, ties, dtype in ((False, False, f32), (True, True, f32), (False, True, f64)):
        probs, x, visible = _inputs(seed=3, vis=vis, shared=shared, ties=ties, dtype=dtype)
        ref = oracle.critical_n(probs, x, visible, reading=reading)
        for certify in (True, False):
            new = critical_n.critical_n(probs, x, visible, reading=reading, certify=certify, block=2)
            old = critical_n.critical_n(probs, x, visible, reading=reading, certify=certify, block=2, incremental=False)
            _agree(new, ref)
            _agree(new, old)
            assert new["exact"] == old["exact"]
            np.testing.assert_allclose(new["p_upper"], old["p_upper"], rtol=1e-5)
            if not certify:                                          # every N exact: all equal the oracle
                assert all(new["exact"]) and len(new["pvalues"]) == len(ref["pvalues"])


def test_incremental_longer_rows_with_certified_and_exact_N():
    """L = 40, N certified in bulk and computed exactly in batches: the same scan as the oracle's."""
    probs, x, visible = _inputs(seed=1, heads=24, L=40, D=6, sharp=2.0, vis="causal")
    ref = oracle.critical_n(probs, x, visible)
    new = critical_n.critical_n(probs, x, visible)
    _agree(new, ref)
    _agree(new, critical_n.critical_n(probs, x, visible, incremental=False))
    assert not all(new["exact"]) and any(new["exact"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sorted_keys_equal_sort_keys(dtype):
    """Stable order: by weight descending, ties to the lower index, invisible keys last by index; -0.0 ties +0.0."""
    g = torch.Generator().manual_seed(0)
    L = 50
    a = (torch.randn(3, L, L, generator=g) * 2).round().to(dtype) / 4        # many ties, negative values, zeros
    a[0, 0, :4] = torch.tensor([-0.0, 0.0, -0.0, 0.0], dtype=dtype)
    for vis in (None, torch.tril(torch.ones(L, L, dtype=torch.bool)), torch.rand(L, L, generator=g) > 0.5):
        full = engine.sort_keys(a, torch.ones(L, L, dtype=torch.bool) if vis is None else vis)[0]
        for k in (1, 7, L - 1, L):
            assert torch.equal(kernels.sorted_keys(a, vis, k).long(), full[..., :k])


@pytest.mark.parametrize("vis", ["causal", "bidirectional", "irregular"])
def test_running_sums_equal_brackets_and_distance_stats(vis):
    """The kernels' per-head means: brackets == `bounds_head_means`, exact == `distance_stats` (float64)."""
    probs, x, visible = _inputs(seed=4, heads=8, L=24, vis=vis, shared=vis == "irregular")
    v = engine.check_inputs(probs, x, visible)
    for reading in ("a", "b"):
        scan = critical_n.RunningTopN(probs, x, v, 23)
        for ns in ([1, 2, 3], list(range(4, 21)), [21, 22, 23]):
            got = critical_n.brackets_for(scan.brackets(ns), reading)
            want = critical_n.bounds_head_means(probs, x, ns, v, reading)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12, err_msg=k)
        for ns in ([1], [2, 5, 6, 20], list(range(3, 23))):
            ex = scan.exact(ns, need=(f"d_{reading}", "E1"))
            st = distance.distance_stats(probs, x, ns, visible, stats=(f"dtilde_{reading}", "E"))
            np.testing.assert_allclose(ex[f"d_{reading}"], engine.row_mean(st[f"dtilde_{reading}"], -2).reshape(
                -1, len(ns)), rtol=1e-6)
            np.testing.assert_allclose(ex["E1"], engine.row_mean(st["E"], -2).reshape(-1, len(ns)), rtol=1e-6)
        with pytest.raises(ValueError, match="follow"):
            scan.brackets([1, 2])


@pytest.mark.parametrize("D", [4, 16])
def test_exact_state_kept_or_made_per_call(monkeypatch, D):
    """The running x_i.s kept between exact calls (stepped on, or reset when a call goes back) == made afresh in
    each call (no room to keep it: zero and stepped for small N, else from s (small D) or from X X^T (large D))."""
    probs, x, visible = _inputs(seed=5, heads=8, L=24, D=D, vis="causal", shared=D == 16)
    v = engine.check_inputs(probs, x, visible)
    calls = ([1, 2], [3, 9], [10, 11, 18], [4, 12], [15, 22, 23])
    need = ("d_a", "d_b", "E1", "E2")
    kept = critical_n.RunningTopN(probs, x, v, 23)
    got = [kept.exact(ns, need=need) for ns in calls]
    monkeypatch.setattr(critical_n, "STATE_ELEMENTS", 0)
    fresh = critical_n.RunningTopN(probs, x, v, 23)
    for ns, g in zip(calls, got):
        f = fresh.exact(ns, need=need)
        st = distance.distance_stats(probs, x, ns, visible, stats=("dtilde_a", "dtilde_b", "E", "E2"))
        for k, s in zip(need, ("dtilde_a", "dtilde_b", "E", "E2")):
            np.testing.assert_allclose(g[k], f[k], rtol=1e-9, err_msg=k)
            np.testing.assert_allclose(g[k], engine.row_mean(st[s], -2).reshape(-1, len(ns)), rtol=1e-6, err_msg=k)
    assert not hasattr(fresh, "tv_state") and kept.n_state == 14


def test_fallback_without_kernels(monkeypatch):
    """ATTNLAB_KERNELS=0 (or a GPU): the old path, same answer."""
    probs, x, visible = _inputs(seed=2, vis="bidirectional")
    new = critical_n.critical_n(probs, x, visible, block=2)
    monkeypatch.setattr(engine, "FUSED", False)
    called = []
    monkeypatch.setattr(critical_n, "RunningTopN", lambda *a: called.append(1))
    old = critical_n.critical_n(probs, x, visible, block=2)
    assert not called
    _agree(new, old)


def test_ks_columns_give_scipys_statistic_and_p_value_for_every_column():
    """The batched KS statistics (one sort, one searchsorted) and the cached p-values equal scipy's ks_2samp column
    by column: ties (rounded samples), NaN and inf entries left out, equal samples, unequal sizes."""
    import warnings

    import numpy as np
    from scipy.stats import ks_2samp

    from attnlab.normalization.metrics.critical_n import ks_2samp_counts, ks_columns

    rng = np.random.default_rng(1)
    for trial in range(60):
        H, C = int(rng.integers(2, 30)), int(rng.integers(1, 8))
        d, e = rng.normal(size=(H, C)), rng.normal(0.5 * rng.random(), 1, size=(H, C))
        if trial % 3 == 0:
            d, e = np.round(d, 1), np.round(e, 1)
        if trial % 4 == 1:
            d[rng.random((H, C)) < 0.2] = np.nan
            e[rng.random((H, C)) < 0.2] = np.inf
        if trial % 5 == 2:
            e = d.copy()
        i, j, n, m = ks_columns(d, e)
        for c in range(C):
            dc, ec = d[:, c][np.isfinite(d[:, c])], e[:, c][np.isfinite(e[:, c])]
            if len(dc) == 0 or len(ec) == 0:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = ks_2samp(dc, ec)
            assert ks_2samp_counts(int(i[c]), int(j[c]), int(n[c]), int(m[c])) == (float(ref.statistic),
                                                                                      float(ref.pvalue))
