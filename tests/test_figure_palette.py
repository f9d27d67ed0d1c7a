"""Chapter 7's figures stay readable under deuteranopia (issue 50 item 5): a colour-blind-safe palette, checked
with a simulation (Machado et al. 2009's matrix on linear RGB, distances in CIELAB), and a dash and a marker per
line so that lines differ without colour."""
import numpy as np

from attnlab.core.result import Result
from attnlab.core.style import OKABE_ITO, min_color_distance, series_style, simulate_deuteranopia
from attnlab.tools import report

#: CIELAB distance (Delta E 1976) two series' colours keep as a deuteranope sees them
APART = 15.0


def test_the_simulation_keeps_grey_and_merges_red_with_green():
    grey = np.array([0.5, 0.5, 0.5])
    assert np.allclose(simulate_deuteranopia(grey), simulate_deuteranopia(grey)[..., :1], atol=2e-3)
    assert min_color_distance(["#d62728", "#2ca02c"], deuteranopia=False) > 50        # tab10's red and green
    assert min_color_distance(["#d62728", "#2ca02c"]) < 10                            # ... as a deuteranope sees them


def test_matplotlib_default_colours_would_fail_and_the_palette_passes():
    assert min_color_distance([f"C{i}" for i in range(7)]) < APART          # what Figs 7.1-7.3 used
    assert min_color_distance(OKABE_ITO) >= APART


def _normalizer_result(names, Ls=(64, 128)):
    return Result("compare_normalizers", [dict(normalizer=n, L=L, swap="all", max_weight=0.5 / (i + 1),
                                               entropy_norm=0.5, jac_norm_mean=1.0 + i, drift=0.1 * i, ns_frac=0.7)
                                          for i, n in enumerate(names) for L in Ls], {"model": "tiny"})


def test_chapter_7_lines_differ_in_colour_dash_and_marker():
    names = ["softmax(T=0.5)", "softmax(T=1.0)", "softmax(T=2.0)", "sparsemax", "entmax15", "ssmax", "sa_softmax"]
    fig = report.length_figure(_normalizer_result(names))
    lines = fig.axes[0].get_lines()
    assert len(lines) == len(names)
    assert min_color_distance([ln.get_color() for ln in lines]) >= APART
    assert len({(ln.get_linestyle(), ln.get_marker()) for ln in lines}) == len(names)   # apart without colour
    bars = report.comparison_figure(_normalizer_result(names), 64).axes[0].patches
    assert min_color_distance([b.get_facecolor()[:3] for b in bars]) >= APART
    assert [series_style(i)["color"] for i in range(len(names))] == list(OKABE_ITO[:len(names)])
