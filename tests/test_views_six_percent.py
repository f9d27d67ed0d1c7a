"""Chapter 3's views: the critical N read from stored KS scans, its tables and frames, on synthetic Results."""
import math

import matplotlib
import matplotlib.pyplot
import pytest

matplotlib.use("Agg")

from attnlab.core.result import Result  # noqa: E402
from attnlab.views import six_percent as views  # noqa: E402


def _fig2c():
    """Two lengths; p-values rise with N. L = 64: first p > 0.01 at N = 8; L = 128: never above 0.01."""
    rows = []
    for L, ps in ((64, (1e-30, 1e-8, 0.5)), (128, (1e-40, 1e-20, 1e-3))):
        crit = next((n for n, p in zip((2, 4, 8), ps) if p > 0.01), -1)
        rows += [{"L": L, "N": n, "pvalue": p, "p_upper": p, "critical_n": crit, "n_heads": 4, "d_mean": 10 / n,
                  "e_mean": 1.0} for n, p in zip((8, 2, 4), (ps[2], ps[0], ps[1]))]       # stored out of order
    return Result("fig2c", rows)


def test_scans_sort_by_N_and_critical_reads_the_level():
    scan = views.scans(_fig2c())
    assert list(scan) == [64, 128] and [r["N"] for r in scan[64]] == [2, 4, 8]
    assert views.critical(scan[64], 0.01) == 8 and views.critical(scan[64], 1e-10) == 4
    assert views.critical(scan[128], 0.01) == -1 and views.critical(scan[128], 1e-30) == 4
    assert views.p_floor(4) == 2 / math.comb(8, 4)


def test_a_certified_row_settles_only_the_levels_its_bound_is_below():
    """Figs 3.1/3.4: a row the brackets certified stores p <= p_upper, no p-value; it settles a rejection at
    alpha only when p_upper <= alpha, so below that level N* is a range, and the title says so."""
    scan = [{"N": 1, "pvalue": math.nan, "p_upper": 1e-14}, {"N": 2, "pvalue": math.nan, "p_upper": 1e-3},
            {"N": 3, "pvalue": 0.02, "p_upper": 0.02}]
    assert views.critical_bounds(scan, 0.01) == (3, 3)
    assert views.critical_bounds(scan, 1e-5) == (2, 3) and views.critical_bounds(scan, 1e-20) == (1, 3)
    assert views.alpha_title(1e-20, [32], [(1, 3)]).startswith("α = 1e-20: N*/L between 0.031 and 0.09")
    fig = views.alpha_frame({32: [dict(r, n_heads=4, critical_n=3) for r in scan]}, 1e-20)
    p_axis = fig.axes[1]
    assert [ln.get_linestyle() for ln in p_axis.get_lines()[:2]] == [":", "-"]   # the bound dotted, p solid
    assert "upper bound of p" in " ".join(t.get_text() for t in fig.legends[0].get_texts())


def test_critical_table_says_none_found_and_within_six_percent():
    html = views.critical_table(views.scans(_fig2c())).data
    assert "8 (12.5% of L)" in html and "none found" in html
    assert "≤ 3.8" in html and "≤ 7.7" in html and ">yes<" not in html


def test_frames_title_the_critical_n():
    scan = views.scans(_fig2c())
    fig = views.alpha_frame(scan, 1e-10)
    assert fig.axes[1].get_title() == "α = 1e-10: N*/L from 0.06 to 0.06"   # L = 64: 4 / 64; L = 128: none
    assert views.alpha_frame(scan, 1e-50).axes[1].get_title() == "α = 1e-50: N*/L from 0.02 to 0.03"
    fig = views.level_figure(scan, 64, -2.0)
    assert fig.axes[0].get_title() == "L = 64, α = 0.01"
    assert any("N* = 8 (12.5% of L)" in t.get_text() for t in fig.axes[0].get_legend().get_texts())



def test_ratio_figure_and_ratio_at_read_the_exact_curve():
    rows = [{"window": 0, "L": L, "N": n, "ratio": 10 / n} for L in (64, 128) for n in (1, 3, 4, 8, 40)]
    ratio = Result("fig2c_ratio", rows)
    assert len(views.ratio_figure(ratio).axes[0].get_lines()) == 2 + 2      # two lengths, two reference lines
    assert [(L, r["N"]) for L, r in views.ratio_at(ratio, 0.06)] == [(64, 4), (128, 8)]   # first N >= 0.06 L


def test_ecdf_frame_runs_the_ks_test():
    rows = [{"L": 256, "N": n, "layer": 0, "head": h, "dtilde_b": 1.0 + h + (100 if n == 1 else 0), "E": 1.0 + h}
            for n in (1, 5) for h in range(20)]
    rb = Result("fig2b", rows)
    assert views.ecdf_frame(rb, 5).axes[0].get_title().endswith("not rejected at α = 0.01")
    assert views.ecdf_frame(rb, 1).axes[0].get_title().endswith(": rejected at α = 0.01")


def _thm1():
    rows = [{"kind": "critical", "e": e, "d": d, "vectors": v, "L": L, "critical_n": n, "critical_frac": n / L}
            for e in ("E1", "E4") for d in ("a", "b") for v in ("v", "k") for L, n in ((64, 2), (128, -1))]
    return Result("thm1_readings", rows, {"vectors": ["v", "k"]})


def test_readings_table_and_holding_pairs():
    rclaims = [{"id": "p1-fig2c-critical", "reading": "E1 / b / v", "verdict": "holds"},
               {"id": "p1-fig2c-critical", "reading": "E1 / a / v", "verdict": "holds"},     # a cross pair
               {"id": "p1-fig2c-critical", "reading": "E4 / a / k", "verdict": "does not hold"}]
    assert views.paper_pairs_holding(rclaims) == ["E1 / b / v"]
    assert views.reading_fracs(_thm1(), "E1", "b", "v")[0] == 2 / 64
    assert math.isnan(views.reading_fracs(_thm1(), "E1", "b", "v")[1])
    html = views.readings_table(_thm1(), rclaims, "m").data
    assert "critical N / L at L = 64, 128, m" in html and html.count("#d7f5dd") == 2
    assert "0.03<br>–" in html


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


def test_expectation_note_reads_e1_over_the_sum_and_says_where_it_sits(monkeypatch):
    from attnlab.views import distance

    rr = Result("thm1_readings", [], {"vectors": ["v", "k"], "grids": {"curve_N": 5, "curve_lengths": [32, 512]}})
    monkeypatch.setattr(distance, "head_curve", lambda rr, x, key: ([32, 512], [1, {"v": 3.3, "k": 4.3}[x]]
                                                                       if key == "E1" else [1, 1]))
    html = views.expectation_note(rr, "m").data
    assert "N = 5, L = 512): E1, the head mean, is 3.3–4.3 times" in html and "(value vectors: 3.3)" in html
    assert "not within 25% of it for any" in html and "its proved bound" in html and "6 times the sum" in html
    monkeypatch.setattr(distance, "head_curve", lambda rr, x, key: ([32, 512], [1, {"v": 1.1, "k": 4.3}[x]]
                                                                       if key == "E1" else [1, 1]))
    html = views.expectation_note(rr, "m").data
    assert "within 25% of it for 1 (v)" in html and "proved bound" not in html


class _Model:
    name, n_layers, n_heads, causal = "m", 30, 9, True


def test_differs_prose_reads_the_critical_n_the_heads_and_the_readings():
    scan = views.scans(_fig2c())
    rc = Result("fig2c", [], {"runtime_seconds": 40.2, "device": "cpu"})
    rclaims = [{"id": "p1-fig2c-critical", "reading": r, "verdict": v}
               for r, v in (("E4 / a / v", "holds"), ("E1 / b / v", "does not hold"), ("E2 / b / v", "holds"))]
    html = views.differs_prose(scan, rclaims, rc, _Model()).data
    assert "it is 0.12 L at L = 64, 128 (none found below L at L = 128)" in html
    assert "the claim does not reproduce under this reading" in html
    assert "270 on this model against GPT-2's 144. More heads make a stronger test" in html
    assert "1 meet the 6% rule at every length (<code>E4 / a / v</code>) — with reading a only" in html
    assert 'this Result took <span class="attnlab-volatile" data-attnlab-volatile="">40 s</span> (cpu' in html


def test_heads_note_follows_the_count_against_gpt2():
    from attnlab.normalization.claim_kinds import heads_note

    assert "270 on this model against GPT-2's 144. More heads make a stronger test" in heads_note(270)
    assert "72 on this model against GPT-2's 144. Fewer heads make a weaker test" in heads_note(72)
    assert heads_note(144) == "The KS test has GPT-2's sample size here (144 heads)." and heads_note(0) == ""
