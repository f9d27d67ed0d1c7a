"""Every reading of Theorem 1's open formulas (`attnlab.normalization.readings`): the closed forms E2, E3, E5 and the
random-subset d~ of E4 (vectorised == direct formula == per-row oracle, with and without the CPU kernels), the
multi-reading critical-N scan (kernels == torch == oracle, certified or not), and the vector readings."""
import numpy as np
import pytest
import torch
from test_critical_n_incremental import _inputs

from attnlab.core.capture import Trace
from attnlab.normalization import bounds, oracle, readings
from attnlab.normalization.metrics import critical_n, distance, engine
from attnlab.normalization.readings import six_percent


def _rows_direct(probs, x, vis, N, fn):
    """fn(alpha [L_t], x [L_t, D]) per row over its visible keys -> [B, Q] (NaN where L_t <= N)."""
    _, P, X, xmap = engine.flatten_heads(probs, x)
    out = torch.full(P.shape[:2], float("nan"), dtype=torch.float64)
    for b in range(P.shape[0]):
        for t in range(P.shape[1]):
            idx = vis[t].nonzero().squeeze(-1)
            if len(idx) > N:
                out[b, t] = fn(P[b, t, idx].double(), X[xmap[b]][idx].double())
    return out


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("vis", ["causal", "bidirectional", "irregular"])
def test_printed_forms_equal_formula_and_oracle(vis, fused, monkeypatch):
    monkeypatch.setattr(engine, "FUSED", fused)
    probs, x, visible = _inputs(seed=5, heads=8, L=12, D=5, vis=vis, shared=vis == "irregular")
    v = engine.check_inputs(probs, x, visible)
    ns = [1, 3, 7]
    st = distance.distance_stats(probs, x, ns, visible, stats=("E2", "E3", "E5", "E"))
    ref = oracle.distance_stats(probs, x, ns, visible, stats=("E2", "E3", "E5", "E"))
    for k in ("E2", "E3", "E5", "E"):
        np.testing.assert_allclose(st[k].numpy(), ref[k].numpy(), rtol=1e-5, err_msg=k)
    for name, xbar in bounds.PRINTED_XBAR.items():
        for c, N in enumerate(ns):
            want = _rows_direct(probs, x, v, N, lambda a, X: bounds.theorem1_random_printed(a, X, N, xbar))
            np.testing.assert_allclose(st[name][..., c].reshape(want.shape).numpy(), want.numpy(), rtol=1e-5)


def test_printed_forms_grow_as_derived():
    """E5 ~ (L - N) ||o|| and E3 stays bounded: for vectors with a common offset, E5 and E2 grow about linearly in L,
    E1 and E3 stay below (1 + 2N) max ||x|| (the derivation of chapter 2)."""
    g = torch.Generator().manual_seed(0)
    N = 5
    for L in (64, 256, 1024):
        a = torch.softmax(torch.randn(L, generator=g, dtype=torch.float64) * 2, -1)
        x = torch.randn(L, 8, generator=g, dtype=torch.float64) + 3.0
        xmax = float(x.norm(dim=-1).max())
        e1 = float(bounds.theorem1_random_main(a, x, N))
        e3 = float(bounds.theorem1_random_printed(a, x, N, "scaled"))
        e5 = float(bounds.theorem1_random_printed(a, x, N, "weighted"))
        o = float((a.unsqueeze(-1) * x).sum(0).norm())
        assert e1 <= (1 + N) * xmax and e3 <= (1 + 2 * N * L / (L - 1)) * xmax
        assert abs(e5 / ((L - N) * o) - 1) < 0.2


@pytest.mark.parametrize("fused", [True, False])
def test_random_subset_distance_equals_oracle(fused, monkeypatch):
    monkeypatch.setattr(engine, "FUSED", fused)
    probs, x, visible = _inputs(seed=6, heads=8, L=11, D=4, vis="causal")
    order = readings.random_orders(probs.shape[:-2], visible, seed=3, sample=1)
    st = distance.distance_stats(probs, x, [1, 4, 9], visible, stats=("dtilde_a", "dtilde_b"), order=order)
    ref = oracle.distance_stats(probs, x, [1, 4, 9], visible, stats=("dtilde_a", "dtilde_b"), order=order)
    for k in st:
        np.testing.assert_allclose(st[k].numpy(), ref[k].numpy(), rtol=1e-5, err_msg=k)
    with pytest.raises(ValueError, match="top-N"):
        distance.distance_stats(probs, x, [1], visible, stats=("d1",), order=order)


def test_random_orders_are_seeded_permutations_of_the_visible_keys():
    vis = torch.tril(torch.ones(9, 9, dtype=torch.bool))
    o = readings.random_orders((2, 3), vis, seed=1, sample=0)
    assert o.shape == (2, 3, 9, 9) and o.dtype == torch.int16
    for t in range(9):
        row = o[1, 2, t].long()
        assert sorted(row.tolist()) == list(range(9))
        assert set(row[: t + 1].tolist()) == set(range(t + 1))          # visible keys first
        assert row[t + 1:].tolist() == list(range(t + 1, 9))             # then the invisible ones, by index
    assert torch.equal(o, readings.random_orders((2, 3), vis, seed=1, sample=0))
    assert not torch.equal(o, readings.random_orders((2, 3), vis, seed=1, sample=1))
    # uniform: over many rows each visible key leads about equally often
    first = readings.random_orders((400,), torch.ones(1, 4, dtype=torch.bool), seed=0)[:, 0, 0]
    assert np.allclose(np.bincount(first.numpy(), minlength=4) / 400, 0.25, atol=0.07)


def _agree(res, ref, rtol=1e-5):
    assert res["n"] == ref["n"] and res["ns"] == ref["ns"]
    at = np.asarray(res["exact"], bool)
    for k in ("pvalues", "d_mean", "e_mean"):
        a, b = np.asarray(res[k], float)[at], np.asarray(ref[k], float)[at]
        np.testing.assert_allclose(a, b, rtol=rtol, err_msg=k)


@pytest.mark.parametrize("vis", ["causal", "bidirectional", "irregular"])
def test_reading_scan_equals_oracle_and_torch_path(vis, monkeypatch):
    probs, x, visible = _inputs(seed=7, heads=16, L=13, D=4, sharp=1.5, vis=vis, shared=vis == "bidirectional")
    pairs = six_percent.ALL_PAIRS
    ref = oracle.critical_n_readings(probs, x, visible, pairs=pairs, seed=2)
    got = {}
    for certify in (True, False):
        got[certify] = six_percent.critical_n_readings(probs, x, visible, pairs=pairs, seed=2, certify=certify, block=2)
        for p in pairs:
            _agree(got[certify][p], ref[p])
            if not certify:
                assert all(got[certify][p]["exact"])
    monkeypatch.setattr(engine, "FUSED", False)
    torch_path = six_percent.critical_n_readings(probs, x, visible, pairs=pairs, seed=2, block=2)
    for p in pairs:
        _agree(torch_path[p], ref[p])
        assert torch_path[p]["exact"] == got[True][p]["exact"]     # the same brackets certify the same N


def test_reading_scan_longer_rows_certifies_and_matches_the_default_scan():
    """L = 40: most N certified for some pairs, the rest exact; the pair (E1, b) is the book's default scan."""
    probs, x, visible = _inputs(seed=1, heads=24, L=40, D=6, sharp=2.0, vis="causal")
    pairs = [("E1", "b"), ("E1", "a"), ("E2", "b"), ("E4", "b"), ("E5", "a")]
    got = six_percent.critical_n_readings(probs, x, visible, pairs=pairs, seed=0)
    ref = oracle.critical_n_readings(probs, x, visible, pairs=pairs, seed=0)
    for p in pairs:
        _agree(got[p], ref[p])
    assert any(not all(got[p]["exact"]) for p in pairs)
    default = critical_n.critical_n(probs, x, visible)
    assert got[("E1", "b")]["n"] == default["n"] and got[("E1", "b")]["ns"] == default["ns"]
    se = [v for v in got[("E4", "b")]["e_rel_se"] if np.isfinite(v)]
    assert se and all(0 <= v < 1 for v in se)


def test_formula_brackets_contain_the_exact_values():
    """Per head, the mean over rows of the closed-form brackets contains the mean of the exact E2, E3, E5 (one head
    per row, so that per-head means are per-row values)."""
    probs, x, visible = _inputs(seed=9, heads=8, L=30, D=5, sharp=2.0, vis="causal")
    v = engine.check_inputs(probs, x, visible)
    for t in (3, 11, 29):                                            # one query row at a time: head mean == row
        p1, v1 = probs[..., t:t + 1, :], v[t:t + 1]
        scan = critical_n.RunningTopN(p1, x, v1, 29)
        rows = six_percent.FormulaRows.of_scan(scan)
        ns = list(range(1, int(v1.sum())))
        br = rows.brackets(("E2", "E3", "E5"), ns)
        st = distance.distance_stats(p1, x, ns, v1, stats=("E2", "E3", "E5"))
        for e in ("E2", "E3", "E5"):
            exact = st[e].reshape(-1, len(ns)).numpy()
            lo, hi = br[e]
            assert (lo <= exact).all() and (exact <= hi).all(), (e, t)
            assert (hi / lo < 50).all()                              # not vacuous
    with pytest.raises(ValueError, match="consecutive"):
        rows.brackets(("E2",), [1, 3])


def test_reading_scan_rejects_bad_input():
    probs, x, visible = _inputs(seed=0, heads=4, L=6, D=3)
    with pytest.raises(ValueError, match="unknown reading pair"):
        six_percent.critical_n_readings(probs, x, visible, pairs=[("E9", "b")])
    with pytest.raises(ValueError, match="samples"):
        six_percent.critical_n_readings(probs, x, visible, samples=0)


def test_vector_readings():
    g = torch.Generator().manual_seed(0)
    Lr, H, K, dh = 2, 3, 5, 4
    v, k = torch.randn(Lr, H, K, dh, generator=g), torch.randn(Lr, H, K, dh, generator=g)
    hidden = torch.randn(Lr, K, H * dh, generator=g)
    tr = Trace("m", torch.arange(K), [0, 1], [0, 1, 2], False, 1.0, v=v, k=k, hidden=hidden)
    assert torch.equal(readings.vectors(tr, "v"), v) and torch.equal(readings.vectors(tr, "k"), k)
    hh = readings.vectors(tr, "hidden_head")
    assert hh.shape == (Lr, H, K, dh) and torch.equal(hh[1, 2], hidden[1, :, 2 * dh:3 * dh])
    assert readings.vectors(tr, "hidden").shape == (Lr, 1, K, H * dh)
    for name in readings.VECTORS:
        if name.endswith("_unit"):
            np.testing.assert_allclose(readings.vectors(tr, name).norm(dim=-1).numpy(), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown vectors"):
        readings.vectors(tr, "q")
    with pytest.raises(ValueError, match="kept"):
        readings.vectors(Trace("m", torch.arange(K), [0], [0], False, 1.0, v=v), "k")
    assert readings.needs(["v_unit", "hidden_head"]) == {"v", "hidden"}


def test_thm1_readings_experiment_and_claims(tiny, war_and_peace):
    """The experiment on a causal model (one pass, prefixes): rows of both kinds for every reading, the default pair
    equal to fig2c's scan, claim rows with their reading, and the derived bound [R] holding for E1, E3 and E4."""
    from attnlab.normalization import experiments
    from attnlab.normalization.claims import paper1_claims
    from attnlab.normalization.readings import theorem1

    ids = tiny.window(war_and_peace.text, 128)
    vecs = ["v", "k_unit", "hidden_head"]
    res = theorem1.thm1_readings(tiny, ids, quick=True, progress=False, vectors=vecs, lengths=[64, 128],
                                      curve_lengths=[32, 64, 128])
    crit = res.select(kind="critical")
    assert len(crit) == 2 * len(vecs) * len(six_percent.ALL_PAIRS)
    assert {r["vectors"] for r in crit} == set(vecs) and res.provenance["samples"] == 2
    fig2c = experiments.fig2c(tiny, ids, lengths=[64, 128], progress=False)
    for L in (64, 128):
        want = fig2c.select(L=L)[0]["critical_n"]
        assert res.select(kind="critical", vectors="v", L=L, e="E1", d="b")[0]["critical_n"] == want
    curve = res.select(kind="curve", vectors="v")
    assert {r["N"] for r in curve if r["L"] == 128} == set(theorem1.cor2_ns(128)) == {1, 5, 16, 32, 48, 64, 80,
                                                                                          96, 112, 127}
    assert all(np.isfinite(r["E4_b_se"]) and r["E4_b_se"] >= 0 for r in curve)
    rows = theorem1.reading_claims({"thm1_readings": res})
    assert rows and all(r["reading"] for r in rows)
    ids_ = {r["id"] for r in rows}
    assert ids_ == {"p1-fig2c-critical", "p1-fig2a-linear", "p1-cor2-i", "p1-cor2-bounded", "p1-cor2-ii"}
    assert len({(r["id"], r["reading"]) for r in rows}) == len(rows)
    for r in rows:                                    # a theorem [R]: E1, E3, E4 below (1 + 2N L/(L-1)) max ||x||
        if r["id"] == "p1-cor2-bounded" and r["reading"].split(" / ")[0] in ("E1", "E3", "E4"):
            assert r["verdict"] == "holds", r
    default = {r["id"]: r for r in paper1_claims({"fig2c": fig2c})}
    crit_v = {r["reading"]: r["verdict"] for r in rows if r["id"] == "p1-fig2c-critical"}
    assert crit_v["E1 / b / v"] == default["p1-fig2c-critical"]["verdict"]
    with pytest.raises(ValueError, match="unknown vectors"):
        theorem1.thm1_readings(tiny, ids, vectors=["q"], progress=False)


def test_thm1_curves_in_float32_products_equal_float64(tiny, war_and_peace, monkeypatch):
    """The curves' matrix products run in float32 (2x faster): every head mean within 1e-5 of the float64 ones, the
    E4 samples (random subsets, both d~ readings in one pass) included."""
    import torch

    from attnlab.normalization.experiments import Captures
    from attnlab.normalization.readings import theorem1

    ids = tiny.window(war_and_peace.text, 96)
    tr = Captures(tiny, ids, {"probs", "v", "hidden"}).get(96)
    for vec in ("v", "hidden"):
        fast = theorem1.curve_rows(tr, vec, 96, [5, 48, 95], 0, 2)
        monkeypatch.setattr(theorem1, "CURVE_DTYPE", torch.float64)
        ref = theorem1.curve_rows(tr, vec, 96, [5, 48, 95], 0, 2)
        monkeypatch.undo()
        assert len(fast) == len(ref)
        for a, b in zip(fast, ref):
            for k, v in b.items():
                if isinstance(v, float) and not k.endswith("_se"):
                    np.testing.assert_allclose(a[k], v, rtol=1e-5, atol=1e-9, err_msg=k)


def test_linear_growth_tells_a_line_from_a_logarithm():
    from attnlab.normalization.claims import linear_growth

    L = np.array([32, 64, 128, 256, 512], float)
    assert linear_growth(L, 3.0 * L + 5)["ok"]
    slow = np.array([18.54, 20.02, 21.89, 24.38, 27.89])          # E1 on MiniLM's keys: a line fits, growth x1.5
    assert linear_growth(L, slow)["r2"] > 0.95 and not linear_growth(L, slow)["ok"]
    assert not linear_growth(L, 100 - 0.1 * L)["ok"]


def test_cor2_ii_measures_e_against_its_value_at_n_1_not_its_peak():
    """Cor. 2(ii) says E -> 0 as N -> L. A curve that rises to a peak at N = L/2 and falls back to its N = 1 value
    does not vanish: measured against its peak (the old test) it passed; against E(1) it does not."""
    from attnlab.core.result import Result
    from attnlab.normalization.readings import theorem1

    L = 64

    def rows(e_of_n):
        return [{"kind": "curve", "window": 0, "vectors": "v", "L": ell, "N": n, "layer": 0, "head": 0, "sum_y": 1.0,
                 "x_max": 1.0, "d_a": 1.0, "d_b": 1.0, "E4_a": 1.0, "E4_b": 1.0,
                 **{e: e_of_n(n) for e in ("E1", "E2", "E3", "E5")}}
                for ell, ns in ((16, [5]), (32, [5]), (L, theorem1.cor2_ns(L))) for n in ns]

    def verdict(e_of_n):
        res = Result("thm1_readings", rows(e_of_n), {"pairs": [("E1", "b")], "vectors": ["v"]})
        return next(r for r in theorem1.reading_claims({"thm1_readings": res})
                    if r["id"] == "p1-cor2-ii" and r["reading"].startswith("E1"))

    peaked = verdict(lambda n: 1.0 + 40.0 * (n / L) * (1 - n / L))        # E(L - 1) ~ E(1), peak 10x higher
    assert peaked["verdict"] == "does not hold" and peaked["value"] == pytest.approx(1.0, abs=0.7)
    vanishing = verdict(lambda n: 1.0 - n / L)
    assert vanishing["verdict"] == "holds" and vanishing["value"] < 0.1
