"""Chapter 3's d~ / E curve (`experiments.fig2c_ratio`): exact head means at every N. Fig. 2c's scan records exact
means only where it computed N exactly (certified rejections hold the brackets' midpoints), so the curve is computed
on its own; at the N the scan computed exactly the two agree."""
import math

import numpy as np
import pytest

from attnlab.normalization import experiments as ex


@pytest.fixture(scope="module")
def cap(tiny):
    from attnlab.core.text import load_corpus

    c = ex.Captures(tiny, tiny.window(load_corpus("war_and_peace").text, 128), {"probs", "v"})
    c.get(128)
    return c


def test_ratio_ns_spread_and_the_six_percent_point():
    ns = ex.ratio_ns(512, fracs=(0.06,))
    assert ns[0] == 1 and ns[-1] == 511 and math.ceil(0.06 * 512) in ns and ns == sorted(set(ns))
    assert len(ex.ratio_ns(512)) == ex.RATIO_POINTS
    assert ex.ratio_ns(4, points=24) == [1, 2, 3]


def test_ratio_rows_equal_the_scan_where_it_is_exact(tiny, cap):
    res = ex.fig2c(tiny, None, captures=[cap], lengths=[128], progress=False)
    exact = [r for r in res.rows if r["pvalue"] == r["pvalue"]]          # computed, not certified
    assert exact, "the scan computed no N exactly"
    ns = sorted({r["N"] for r in res.rows})
    p = ex.resolve_protocol(False, {})
    mine = {r["N"]: r for r in ex.ratio_rows(cap.get(128), p, 128, ns)}
    for r in exact:
        assert mine[r["N"]]["d_mean"] == pytest.approx(r["d_mean"], rel=1e-6)
        assert mine[r["N"]]["e_mean"] == pytest.approx(r["e_mean"], rel=1e-6)
    certified = [r for r in res.rows if r["pvalue"] != r["pvalue"]]
    moved = [abs(mine[r["N"]]["d_mean"] / r["d_mean"] - 1) for r in certified]
    assert not certified or max(moved) > 1e-3      # the midpoints are not the means (why the curve is its own Result)


def test_fig2c_ratio_rows(tiny, cap):
    r = ex.fig2c_ratio(tiny, None, captures=[cap], lengths=[64, 128], fracs=(0.06,), progress=False)
    assert sorted(r.unique("L")) == [64, 128]
    for L in (64, 128):
        rows = r.select(L=L)
        assert [x["N"] for x in rows] == ex.ratio_ns(L, (0.06,))
        assert all(np.isfinite(x["ratio"]) and x["ratio"] == x["d_mean"] / x["e_mean"] for x in rows)
    assert r.provenance["figure"] == "fig2c_ratio" and r.provenance["grids"]["fracs"] == [0.06]
