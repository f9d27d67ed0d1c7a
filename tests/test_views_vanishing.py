"""Chapter 1's views: Figure 1's table, the row-statistics frames and the live one-head figure."""
import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from attnlab import widgets as aw  # noqa: E402
from attnlab.core.result import Result  # noqa: E402
from attnlab.views import vanishing as views  # noqa: E402


def test_fig1_table_reads_the_bands_and_the_slope():
    rows = [{"L": L, "layer": 0, "head": h, "max_weight": 2.0 / L, "entropy_norm": 0.9, "cor1_holds": 1.0,
             "lemma1_holds": 1.0, "log10_cor1_hi": 1.0, "log10_cor1_lo": -2.0} for L in (64, 128, 256) for h in (0, 1)]
    html = views.fig1_table(Result("fig1", rows), "m").data
    assert "this book (m)" in html and "0.031 → 0.008" in html and ">−1.00<" in html and ">1.5: weights" in html


class _Trace:
    causal, scaling, layers, heads, n_tokens = True, 0.5, [0], [3], 16

    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.q, self.k = torch.randn(1, 1, 16, 4, generator=g), torch.randn(1, 1, 16, 4, generator=g)
        self.scores = self.scaling * self.q @ self.k.transpose(-1, -2)

    def visible(self):
        return torch.tril(torch.ones(16, 16, dtype=torch.bool))


def test_row_stats_frames_and_sorted_weights():
    tr = _Trace()
    mw, hn, inside = views.row_stats(tr, 1.0)
    assert mw.shape == (1, 1, 16) and bool(inside.all())                 # Corollary 1 is a theorem
    fig = views.length_frame(tr, 0.5, 64)
    assert fig.axes[1].get_title() == "L = 16, temperature 0.5 x model's"
    assert fig.axes[0].get_title().endswith("rows in Cor. 1 band: 100%")
    srt = views.sorted_weights(tr, 0, 0, 1.0)
    assert srt.shape == (16, 16) and np.allclose(srt.sum(-1), 1) and (np.diff(srt, axis=-1) <= 0).all()
    assert srt[0, 0] == 1.0                                              # the first row sees one key


def test_head_figure_redraws_one_figure():
    draw = views.head_figure(_Trace())
    first = draw(0, 0, 1.0)
    assert first[:4] == b"\x89PNG" and draw(0, 0, 0.25) != first and draw(0, 0, 1.0) == first
    fresh = draw.new_figure(0, 0, 1.0)                  # the site's frame: a new Figure, the kept one untouched
    assert aw.fig_to_png(fresh, close=False) == first and aw.render(fresh).phone and draw(0, 0, 1.0) == first


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")
