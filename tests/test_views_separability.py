"""Chapter 4's views: the circle example, Figure 3's summary and grid, the live histogram and the readings tables."""
import math

import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from attnlab.core.result import Result  # noqa: E402
from attnlab.normalization import readings  # noqa: E402
from attnlab.views import separability as views  # noqa: E402


def test_circle_view_agrees_with_the_package_and_the_bounds():
    x, a = views.circle_example()
    assert x.shape == (views.K, 2) and torch.isclose(a.sum(), torch.tensor(1.0, dtype=a.dtype))
    rows = [views.circle_view(x, a, N) for N in range(1, views.K)]
    assert all(v["agrees"] for v in rows) and rows[0]["ns_frac"] == 1.0
    assert all(v["lower_row"] <= v["ns_frac"] + 1e-12 for v in rows)
    v = rows[5]
    fig = views.draw_circle(x, a, 6)
    assert f"$N_s/N$ = {round(v['ns_frac'] * 6)}/6" in fig.axes[1].get_title()
    assert views.live_circle(6, 0.5, 8).axes[1].get_title() == fig.axes[1].get_title()   # same example


def _fig3():
    rows = [{"layer": la, "head": h, "L": 256, "N": n, "ns_frac": 1.0 if n == 1 else 0.5 + 0.1 * h}
            for la in (0, 1) for h in (0, 1, 2) for n in (1, 8, 16, 32) if (la, h) != (1, 2)]
    return Result("fig3", rows)


def test_fig3_summary_and_head_grid():
    html = views.fig3_summary(_fig3(), "m").data
    assert "this book (m, L = 256)" in html and "1.000 → 0.600" in html and "0.500 – 0.600" in html
    g = views.head_grid(_fig3(), 16)
    assert g.shape == (2, 3) and np.isnan(g[1, 2]) and g[0].tolist() == [0.5, 0.6, 0.7]
    assert views.heads_frame(_fig3(), 16, "m")._suptitle.get_text() == "m, L = 256, N = 16"


class _Trace:
    layers, heads, n_tokens = [0], [4], 10

    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.probs = torch.randn(1, 1, 10, 10, generator=g).masked_fill(~self.visible(), float("-inf")).softmax(-1)
        self.v = torch.randn(1, 1, 10, 3, generator=g)

    def visible(self):
        return torch.tril(torch.ones(10, 10, dtype=torch.bool))


def test_live_head_histogram_titles_the_head():
    fig = views.live_head_histogram(_Trace())(0, 4, 2)
    assert fig.axes[0].get_title() == "layer 0, head 4, N = 2, L = 10"


def test_saturation_reads_the_curve_from_sixteen_on(monkeypatch):
    monkeypatch.setattr(views.theorem2, "sep_curve",
                        lambda tab, name, radius, rows, agg: (np.array([1, 8, 16, 32]), np.array([1, 0.9, 0.8, 0.75])))
    rows_sep = [{"id": "p1-fig3-saturation", "reading": f"{a} / {n} / nearest / positive_r", "verdict": "holds"}
                for a in readings.SEP_AGGREGATES for n in readings.VECTORS]
    agg, name = next(iter(readings.SEP_AGGREGATES)), next(iter(readings.VECTORS))
    assert views.saturation({}, rows_sep, agg, name) == (0.75, 0.8, "holds")
    html = views.saturation_table({}, rows_sep, 256, "m").data
    assert html.count("0.750–0.800<br><b>holds</b>") == len(readings.SEP_AGGREGATES) * len(readings.VECTORS)
    assert "for N = 16..32, L = 256, m; paper: 0.7–0.85" in html


def test_bound_table_has_one_row_per_bound_and_xi():
    units = ["v_unit", "k_unit"]
    rows_sep = [{"id": cid, "reading": f"xi={xi} / {n} / nearest / positive_r", "measured": f"{cid} {xi}; more",
                 "verdict": "holds"}
                for cid in ("p1-thm2-lower", "p1-thm2-upper-B", "p1-thm2-upper-R") for xi in readings.XI_READINGS
                for n in units]
    html = views.bound_table(rows_sep, units).data
    assert html.count("<tr>") == 1 + 3 * len(readings.XI_READINGS) and "; more" not in html
    assert html.count("<b>holds</b>") == 3 * len(readings.XI_READINGS) * 2


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


# ------------------------------------------------------------- concentration against separability, head by head

def _fig1_fig3(sign: float, n_heads: int = 20, L: int = 64):
    """fig1 / fig3 of one window whose heads' N_s/N changes with their mean largest weight by `sign`; the last head
    has no fig1 row (left out), and fig1 also has a shorter L (not read)."""
    from attnlab.core.result import Result

    heads = range(n_heads)
    fig1 = Result("fig1", [{"window": 0, "L": L, "layer": h % 2, "head": h, "max_weight": 0.05 + 0.04 * h}
                           for h in heads if h != n_heads - 1]
                  + [{"window": 0, "L": 32, "layer": h % 2, "head": h, "max_weight": 0.9} for h in heads])
    fig3 = Result("fig3", [{"window": 0, "L": L, "N": N, "layer": h % 2, "head": h,
                            "ns_frac": 1.0 if N == 1 else 0.5 + sign * 0.02 * (h - 10)}
                           for N in (1, 8, 16, 32) for h in heads],
                  provenance={"model": "m", "text": "war_and_peace", "window_tokens": L, "x": "v"})
    return fig1, fig3


def test_concentration_rows_join_the_two_results_at_fig3s_length_from_n_16():
    from attnlab.normalization import experiments as ex

    fig1, fig3 = _fig1_fig3(-1)
    rows = ex.concentration_rows(fig1, fig3)
    assert sorted({r["N"] for r in rows}) == [16, 32] and len(rows) == 2 * 19       # the head without fig1: out
    r = next(r for r in rows if r["head"] == 3 and r["N"] == 16)
    assert math.isclose(r["max_weight"], 0.17) and math.isclose(r["ns_frac"], 0.64) and r["L"] == 64
    assert ex.relation_ns([1, 2, 8]) == [8] and ex.relation_ns([4, 16, 20]) == [16, 20]
    with pytest.raises(ValueError, match="fig1 has no row at Fig. 3's L = 64"):
        ex.concentration_rows(Result("fig1", [{"L": 32, "layer": 0, "head": 0, "max_weight": 0.5}]), fig3)


def test_concentration_relation_reads_rho_and_the_tenths():
    from attnlab.normalization import experiments as ex

    x = np.linspace(0.1, 0.9, 20)
    rel = ex.concentration_relation(np.append(x, np.nan), np.append(1 - x, 0.5))        # NaN pair: left out
    assert math.isclose(rel["rho"], -1.0) and rel["n_heads"] == 20 and rel["k"] == 2
    assert math.isclose(rel["ns_concentrated"], np.median((1 - x)[-2:]))
    assert math.isclose(rel["ns_diffuse"], np.median((1 - x)[:2]))
    assert ex.concentration_relation(x, x)["rho"] == 1.0
    assert [ex.concentration_direction(r, "u", "d", "f") for r in (0.5, -0.5, 0.05)] == ["u", "d", "f"]
    with pytest.raises(ValueError, match="1-D of one length"):
        ex.concentration_relation(x, x[:3])
    with pytest.raises(ValueError, match="at least 3 heads"):
        ex.concentration_relation([0.1, np.nan], [0.2, 0.3])


def test_relation_prose_follows_the_sign_of_each_model():
    from attnlab.normalization import experiments as ex

    res = {"falls": ex.separability_by_concentration(*_fig1_fig3(-1)),
           "rises": ex.separability_by_concentration(*_fig1_fig3(+1))}
    assert res["falls"].provenance["L"] == 64 and res["falls"].provenance["ns"] == [16, 32]
    html = views.relation_prose(res).data
    assert "<b>falls</b>: over its 19 heads, \\(N_s/N\\) at N = 32 falls as the mean largest weight grows " \
           "(Spearman ρ = -1.00; ρ from -1.00 to -1.00 over N = 16…32)" in html
    assert "<b>rises</b>: over its 19 heads, \\(N_s/N\\) at N = 32 rises" in html
    assert "On falls the concentrated heads are the ones that lose separability" in html
    assert "On rises the concentrated heads separate more" in html
    assert "m, War and Peace (first 64 tokens, L = 64); \\(N_s/N\\): value vectors" in html
    fig = views.relation_figure(res)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]         # (the colour bars have none)
    assert titles == ["falls, L = 64, N = 32\nSpearman ρ = -1.00 over 19 heads",
                      "rises, L = 64, N = 32\nSpearman ρ = +1.00 over 19 heads"]


def test_relation_prose_and_figure_take_the_offline_models_and_the_page_s_own():
    """Chapters 4 and 6 pass the offline models and the page's model when it is another (GPT-2 in the publishing
    workflow, tiny-gpt2 under `make nbval`): four models, one more than the committed outputs show."""
    from attnlab import book
    from attnlab.normalization import experiments as ex

    def res(n_heads):                 # median mean largest weight: 0.21 (10 heads), 0.31 (15), 0.41 (20)
        return ex.separability_by_concentration(*_fig1_fig3(+1, n_heads=n_heads))

    two = views.relation_prose({"sharp": res(20), "diffuse": res(10)}).data
    assert "Between the models: diffuse's heads are more diffuse than sharp's (median of the mean largest weight " \
           "0.21 against 0.41), and its median \\(N_s/N\\) at N = 32 is" in two
    assert "the two models' N and L are those of their panels" in two
    models = {"page": res(15), "sharp": res(20), "diffuse": res(10), "fourth": res(15)}
    assert len(models) == len(book.OFFLINE_MODELS) + 1
    four = views.relation_prose(models).data
    assert "Between the models: diffuse's heads are the most diffuse and sharp's the most concentrated (median of " \
           "the mean largest weight 0.21 against 0.41; page 0.31, fourth 0.31 in between), and diffuse's median " \
           "\\(N_s/N\\) at N = 32 is" in four
    assert all(f"<li><b>{m}</b>: over its" in four for m in models)
    fig = views.relation_figure(models)
    assert [ax.get_title().split(",")[0] for ax in fig.axes if ax.get_title()] == list(models)
    assert tuple(fig.get_size_inches()) == (2 * 3.4, 2 * 3.0)      # two panels a row: the page column's width
    assert sum(ax.get_visible() and bool(ax.get_title()) for ax in fig.axes) == 4
