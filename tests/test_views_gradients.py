"""Chapter 5's views: one row's frame, Figure 4's table, the live histogram and the readings tables."""
import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from attnlab.core.result import Result  # noqa: E402
from attnlab.normalization import readings  # noqa: E402
from attnlab.views import gradients as views  # noqa: E402


def test_row_frame_shows_weights_jacobian_and_g():
    row = torch.tensor([1.0, 0.999, 0.2, -0.5], dtype=torch.float64)
    T_grid = np.logspace(-3, 2, 6)
    g_row = np.ones((6, 2))
    fig = views.row_frame(row, 0.1, 1e-3, T_grid, g_row, [1.0] * 6, [1e-3, 0.1])
    ax0, ax1, ax2 = fig.axes[:3]
    assert ax0.get_title() == "weights at T = 0.1" and ax1.get_xlabel() == "1/(4T) = 2.5,  1/(2T) = 5"
    assert ax1.get_title().startswith("Jacobian: ‖J‖ = ") and float(ax1.get_title().split("= ")[1]) <= 5
    assert ax2.get_legend().get_texts()[0].get_text() == "g(T, ε = 0.001)"


def test_gmax_table_picks_the_nearest_temperatures():
    rows = [{"T": T, "eps": e, "g_max": T * e} for T in (1e-3, 0.5, 100.0) for e in (1e-3, 0.1)]
    html = views.gmax_table(Result("fig4", rows), temperatures=(1e-3, 1.0)).data
    assert html.count("<tr>") == 3 and ">0.5<" in html and ">0.05<" in html and "max g, ε = 0.1" in html


class _Trace:
    layers, heads, n_tokens = [0], [4], 10

    def __init__(self):
        self.scores = torch.randn(1, 1, 10, 10, generator=torch.Generator().manual_seed(2))

    def visible(self):
        return torch.tril(torch.ones(10, 10, dtype=torch.bool))


def test_live_g_histogram_titles_the_head():
    fig = views.live_g_histogram(_Trace())(0, 4, 0.1, 1e-3)
    assert fig.axes[0].get_title() == "layer 0, head 4, T = 0.1, ε = 0.001, L = 10"
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["1/(4T)", "1/(2T)", "√2/ε"]


def test_slope_table_reads_every_reading():
    eps_g = [1e-3, 0.1]
    slopes = {}
    for agg in readings.G_AGGREGATES:
        for d in readings.DIRECTIONS:
            for e in ([0.0] if d == "worst" else eps_g):
                reading = f"{agg} / {d} / " + ("eps->0" if d == "worst" else f"eps={e:g}")
                slopes[reading] = {"measured": "slope -0.98 (R^2 1)", "verdict": "holds"}
    html = views.slope_table(slopes, eps_g, 256, "m").data
    assert html.count("-0.98<br><b>holds</b>") == len(slopes)
    assert "(m, L = 256); paper: -1" in html
    assert html.count("<tr>") == 1 + len(readings.G_AGGREGATES) * len(readings.DIRECTIONS)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


def test_the_chapters_checks_and_tables_as_views(capsys):
    """The folded cells of chapter 5 moved into views (issue 47 item 6): the temperature table, the Jacobian checks
    (all True), and the row nearest a tie of 0.01 with its g(T, ε) curve."""
    html = views.temperature_table().data
    assert html.count("<tr>") == 7 and ">0.25<" in html and ">2.5e+03<" in html      # 1/(4T) at T = 1, 1e-4
    views.print_jacobian_checks()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(line.endswith(": True") for line in out)
    tr = _Trace()
    tr.scores[0, 0, 9] = torch.linspace(-3.0, 0.0, 10)
    tr.scores[0, 0, 9, :2] = torch.tensor([2.0, 2.01])             # a row of 10 keys, its top two 0.01 apart
    pick = views.near_tie_row(tr, min_keys=10)
    assert capsys.readouterr().out.startswith("row 9 of layer 0, head 4: 10 keys, gap between its two largest logits")
    assert len(pick.row) == 10 and abs(pick.gap - 0.01) < 1e-6 and pick.g_row.shape == (26, 3) and len(pick.J_row) == 26
