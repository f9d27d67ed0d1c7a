"""Chapter 2's views: tables, frames and the live one-head figure, on small synthetic Results and Traces."""
import matplotlib
import matplotlib.pyplot
import pytest
import torch

matplotlib.use("Agg")

from attnlab import widgets as aw  # noqa: E402
from attnlab.core.result import Result  # noqa: E402
from attnlab.views import distance as views  # noqa: E402


def _fig2(by_L=True):
    """Two heads; d~ = 1, E = 2 (head 0) or 4 (head 1), bounds 2 and 3; head 1 under the summary's bound in
    none of its rows."""
    rows = []
    for h, (e, held) in enumerate(((2.0, 1.0), (4.0, 0.0))):
        for x in ((64, 128, 256) if by_L else (1, 5, 20)):
            L, N = (x, 5) if by_L else (256, x)
            rows.append({"layer": 0, "head": h, "L": L, "N": N, "dtilde_b": 1.0 * x, "E": e * x, "dmax_B": 2.0 * x,
                         "dmax_R": 3.0 * x, "holds_B": held, "n_rows": 10 + 30 * h})
    return Result("fig2a" if by_L else "fig2b", rows)


def test_means_table_reads_head_means_and_weights_rows():
    html = views.means_table(_fig2(), "L", "cap").data
    assert "<caption>cap</caption>" in html and html.count("<tr>") == 4
    # at L = 64: d~ 64, E 192, bounds 128 / 192, d~ / bound 0.50, 10 of 50 rows under the bound
    for cell in (">64<", ">192<", ">128<", ">0.50<", ">20.00%<"):
        assert cell in html, cell


def test_sweep_frame_titles_the_share_under_the_bound():
    fig = views.sweep_frame(_fig2(), "L", 128)
    assert len(fig.axes) == 2 and fig.axes[1].get_title() == "L = 128, N = 5: bound (summary) holds: 20.0%"
    fig = views.sweep_frame(_fig2(by_L=False), "N", 20)
    assert fig.axes[1].get_title() == "L = 256, N = 20: bound (summary) holds: 20.0%"
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "5", "20"]


def test_claims_table_adds_the_linear_test_on_E():
    claims = {cid: {"paper": "p", "measured": f"m {cid}", "verdict": "holds"} for cid, _ in views.CLAIM_LABELS}
    html = views.claims_table(claims, _fig2()).data
    assert html.count("<tr>") == 1 + len(views.CLAIM_LABELS) + 1
    second = html.split("<tr>")[3]                                  # header, first claim, then the E row
    assert "E grows about linearly" in second and "<b>holds</b>" in second      # E = 2 L (head 0), 4 L: linear


def test_verdict_grid_and_cor2_counts_read_the_reading_rows():
    rclaims = [{"id": "p1-fig2a-linear", "reading": "E1 / b / v", "verdict": "holds"},
               {"id": "p1-fig2a-linear", "reading": "E1 / b / k", "verdict": "does not hold"},
               {"id": "p1-cor2-bounded", "reading": "E1 / - / v", "verdict": "holds"}]
    grid = views.verdict_grid(rclaims, "p1-fig2a-linear", ["v", "k", "q"]).data
    e1b = grid.split("E1 / b")[1].split("</tr>")[0]
    assert e1b.count("✔") == 1 and e1b.count("✘") == 1 and e1b.count("–") == 1
    counts = views.cor2_counts(rclaims).data
    first = counts.split("<tr>")[2]
    assert ">E1<" in first and first.count("1 of 2") == 1 and first.count("1 of 1") == 1


def test_head_curve_averages_heads_per_L():
    rows = [{"kind": "curve", "N": 5, "vectors": "v", "L": L, "E1": L + h} for L in (64, 128) for h in (0, 2)]
    rows.append({"kind": "curve", "N": 10, "vectors": "v", "L": 64, "E1": 1e9})      # another N: ignored
    L, y = views.head_curve(Result("thm1_readings", rows), "v", "E1")
    assert L.tolist() == [64, 128] and y.tolist() == [65.0, 129.0]


class _Trace:
    causal, n_tokens, layers, heads = True, 12, [0], [3]

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        scores = torch.randn(1, 1, 12, 12, generator=g).masked_fill(~self.visible(), float("-inf"))
        self.probs, self.v = scores.softmax(-1), torch.randn(1, 1, 12, 4, generator=g)

    def visible(self):
        return torch.tril(torch.ones(12, 12, dtype=torch.bool))


def test_live_head_figure_redraws_the_same_figure():
    draw = views.head_distance_figure(_Trace())
    first = draw(0, 0, 2)
    assert first[:8] == b"\x89PNG\r\n\x1a\n" and draw(0, 0, 5) != first
    assert draw(0, 0, 2) == first                                   # only the data changed, and back
    fresh = draw.new_figure(0, 0, 2)                    # the site's frame: a new Figure, the kept one untouched
    assert aw.fig_to_png(fresh, close=False) == first and aw.render(fresh).phone and draw(0, 0, 2) == first


def test_vectors_frame_is_a_png():
    vec = "v"
    keys = ("d_b", "d_a", "E1", "E2", "E3", "E4_b", "E5", "x_max", "sum_y")
    rows = [{"kind": "curve", "N": 5, "vectors": vec, "L": L, "layer": 0, "head": 0, **{k: 0.1 * L for k in keys}}
            for L in (64, 128, 256)]
    assert views.vectors_frame(Result("thm1_readings", rows), vec)[:4] == b"\x89PNG"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


def test_the_readings_table_lists_every_registered_reading_under_its_group():
    from attnlab.normalization import readings

    html = views.readings_table().data
    assert html.count("<tr>") == 1 + len(readings.E_READINGS) + len(readings.D_READINGS) + len(readings.VECTORS)
    assert html.count("expectation E") == 1 and "<code>E1</code>" in html and 'data-label="what"' in html
