"""The two paths of the critical-N scans on the same trace: the CPU kernels (`engine.FUSED`, the default) and torch
operations (GPU, ATTNLAB_KERNELS=0), which the GPU workflow publishes. Both scan the same N, certify the same N, give
the same exact p-values and KS statistics, the same head means (rounding: fig2c's torch path runs its exact d~ and E
in float32) and the same published rows of thm1_readings. A torch path that computes its exact values at other N
fails these checks (the last test)."""
import numpy as np
import pytest
import torch
from test_critical_n_incremental import _inputs

from attnlab.normalization import readings as R
from attnlab.normalization.experiments import Captures
from attnlab.normalization.metrics import critical_n, engine
from attnlab.normalization.readings import six_percent, theorem1

L = 64
VECTORS = ("v", "k", "hidden")


@pytest.fixture(scope="module")
def trace(tiny, war_and_peace):
    """tiny-gpt2 on the first 64 tokens of War and Peace (causal: the last N has one row per head)."""
    return Captures(tiny, tiny.window(war_and_peace.text, L), {"probs"} | R.needs(VECTORS)).get(L)


def _same_scan(k: dict, t: dict) -> None:
    """One scan on both paths: the same critical N, scanned N and certified N; the same p-value and KS statistic
    where exact (NaN where certified); the same p_upper and head means everywhere (certified: bracket midpoints)."""
    assert k["n"] == t["n"] and k["ns"] == t["ns"] and k["exact"] == t["exact"]
    ex = np.asarray(k["exact"], bool)
    for key in ("pvalues", "ks"):
        a, b = np.asarray(k[key], float), np.asarray(t[key], float)
        np.testing.assert_array_equal(a[ex], b[ex], err_msg=key)
        assert np.isnan(a[~ex]).all() and np.isnan(b[~ex]).all(), key
    for key in ("p_upper", "d_mean", "e_mean"):
        np.testing.assert_allclose(k[key], t[key], rtol=1e-6, err_msg=key)
    if "e_rel_se" in k:                    # E4: the spread of two samples' head means (1e-8 -> 1e-6 relative)
        np.testing.assert_allclose(k["e_rel_se"], t["e_rel_se"], rtol=1e-4, equal_nan=True, err_msg="e_rel_se")


def _both(monkeypatch, fn):
    """fn() on the kernel path, then on the torch path."""
    kernel = fn()
    monkeypatch.setattr(engine, "FUSED", False)
    try:
        return kernel, fn()
    finally:
        monkeypatch.setattr(engine, "FUSED", True)


def test_critical_n_paths_agree(trace, monkeypatch):
    """fig2c's scan (`critical_n`), readings a and b, three vector choices."""
    mixed = 0
    for vec in VECTORS:
        x = R.vectors(trace, vec)
        for reading in ("b", "a"):
            k, t = _both(monkeypatch, lambda: critical_n.critical_n(trace.probs, x, trace.visible(), reading=reading))
            _same_scan(k, t)
            mixed += any(k["exact"]) and not all(k["exact"])
    assert mixed                                                  # certified and exact N in one scan


def test_reading_scan_and_published_rows_agree(trace, monkeypatch):
    """thm1_readings' scan (`critical_n_readings`, every pair) per N, and its published rows column by column; a pair
    that finds no critical N ends on an exact N on both paths (a p-value, not NaN; means, not bracket midpoints)."""
    none_found = 0
    for vec in VECTORS:
        x = R.vectors(trace, vec)
        k, t = _both(monkeypatch, lambda: six_percent.critical_n_readings(trace.probs, x, trace.visible()))
        for p in six_percent.ALL_PAIRS:
            _same_scan(k[p], t[p])
            assert k[p]["exact"][-1]
            none_found += k[p]["n"] == -1
        rk, rt = _both(monkeypatch, lambda: theorem1.critical_rows(trace, vec, L, six_percent.ALL_PAIRS, 0.01, 0, 2))
        for a, b in zip(rk, rt):
            assert {c: a[c] for c in ("e", "d", "critical_n", "n_scanned", "n_exact")} == \
                   {c: b[c] for c in ("e", "d", "critical_n", "n_scanned", "n_exact")}
            assert np.isfinite(a["pvalue"]) and a["pvalue"] == b["pvalue"]
            np.testing.assert_allclose([a["d_mean"], a["e_mean"]], [b["d_mean"], b["e_mean"]], rtol=1e-6)
            np.testing.assert_allclose(a["e_rel_se"], b["e_rel_se"], rtol=1e-4, equal_nan=True)
    assert none_found                                             # rows that end at the last N are covered


@pytest.mark.parametrize("vis", ["causal", "bidirectional", "irregular"])
def test_torch_brackets_equal_the_kernels(vis):
    """The torch brackets of the readings scan equal the kernels': E2, E3, E5 (`formula_brackets`) and d~ over random
    orders (E4: `bounds_head_means(order=...)` == `RunningTopN.reordered(order).brackets`)."""
    probs, x, visible = _inputs(seed=8, heads=8, L=20, D=5, sharp=1.5, vis=vis, shared=vis == "irregular")
    v = engine.check_inputs(probs, x, visible)
    scan = critical_n.RunningTopN(probs, x, v, 19)
    ns = list(range(1, 20))
    kernel, torch_ = six_percent.FormulaRows.of_scan(scan), six_percent.FormulaRows.of_tensors(probs, x, v)
    for name, tsum in torch_.sums.items():
        torch.testing.assert_close(tsum, kernel.sums[name], rtol=1e-12, atol=1e-12, msg=name)
    want = kernel.brackets({"E2", "E3", "E5"}, ns)
    sums = six_percent.formula_brackets(torch_.sums, torch_.Lt, ns, {"E2", "E3", "E5"}, critical_n.BRACKET_SLACK)
    count = (torch_.Lt.unsqueeze(-1) > torch.tensor(ns, dtype=torch.float64)).sum(0)
    for i, e in enumerate(("E2", "E3", "E5")):
        np.testing.assert_allclose((sums[2 * i] / count).numpy(), want[e][0], rtol=1e-9, err_msg=e)
        np.testing.assert_allclose((sums[2 * i + 1] / count).numpy(), want[e][1], rtol=1e-9, err_msg=e)
    order = R.random_orders(probs.shape[:-2], v, seed=1, sample=0)
    rand = scan.reordered(order)
    for ns in ([1, 2, 3], list(range(4, 20))):
        got = rand.brackets(ns)
        for reading in ("a", "b"):
            br = critical_n.bounds_head_means(probs, x, ns, v, reading, order=order)
            for key, val in critical_n.brackets_for(got, reading).items():
                np.testing.assert_allclose(br[key], val, rtol=1e-9, atol=1e-12, err_msg=f"{reading} {key}")


def test_a_torch_path_at_other_n_fails(trace, monkeypatch):
    """The checks above have teeth: exact values computed one N off on the torch path (each scan's exact call,
    `distance_means` / `distance_stats`, asked for N + 1, or N - 1) change the p-values or means at the N both paths
    compute exactly."""
    x = R.vectors(trace, "v")
    PAIRS_OFF = [("E1", "b"), ("E1", "a"), ("E4", "b")]            # pairs with an exact N below the last
    k = critical_n.critical_n(trace.probs, x, trace.visible())
    kr = six_percent.critical_n_readings(trace.probs, x, trace.visible(), pairs=PAIRS_OFF)

    def shifted(orig):                     # N + 1 (N - 1 for a batch that holds the last N)
        def call(probs, x, ns, *args, **kw):
            step = 1 if max(ns) + 1 < probs.shape[-1] else -1 if min(ns) > 1 else 0
            return orig(probs, x, [N + step for N in ns], *args, **kw)
        return call
    monkeypatch.setattr(critical_n, "distance_means", shifted(critical_n.distance_means))
    monkeypatch.setattr(six_percent, "distance_stats", shifted(six_percent.distance_stats))
    monkeypatch.setattr(engine, "FUSED", False)
    with pytest.raises(AssertionError):
        _same_scan(k, critical_n.critical_n(trace.probs, x, trace.visible()))
    tr = six_percent.critical_n_readings(trace.probs, x, trace.visible(), pairs=PAIRS_OFF)
    for p in tr:
        with pytest.raises(AssertionError):
            _same_scan(kr[p], tr[p])
