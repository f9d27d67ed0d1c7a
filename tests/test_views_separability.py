"""Chapter 4's views: the circle example, Figure 3's summary and grid, the live histogram and the readings tables."""
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
