"""Legends that cover no data (issue 50 item 5: Figs 3.1, 3.4, 9.5, 9.6 at 1280 px), and phone x labels that fit
(Figs 9.6, 9.7): each legend drawn inside a panel holds none of that panel's data points, and on the phone layout
every x label lies inside the image."""
import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from attnlab.core.result import Result  # noqa: E402
from attnlab.sample_complexity import plots as scp  # noqa: E402
from attnlab.views import six_percent, tokens  # noqa: E402
from attnlab.widgets import phone_layout  # noqa: E402


def covered_points(fig) -> list[tuple[str, int]]:
    """(panel title, number of its data points inside its own legend's box) for every panel with a legend that
    covers any: the points of its lines and error bars, in display coordinates after a draw."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None:
            continue
        box = leg.get_window_extent().padded(-2)
        xy = [ax.transData.transform(np.column_stack(ln.get_data()).astype(float)) for ln in ax.get_lines()
              if len(ln.get_xdata())]
        xy = np.concatenate(xy) if xy else np.empty((0, 2))
        xy = xy[np.isfinite(xy).all(1)]
        n = int(sum(box.contains(x, y) for x, y in xy))
        if n:
            out.append((ax.get_title(), n))
    return out


def _fit(**kw):
    return dict({"kind": "fit", "reference": "exact", "slope": -0.5, "slope_se": 0.01, "intercept": 0.0, "beta": 0.5,
                 "beta_ref": 0.4, "horizon": 1.0, "horizon_authors": 2.0}, **kw)


def _moments(scales=(0.05, 0.2, 0.5, 1.0, 2.0, 4.0), ns=(128, 256, 512, 1024, 2048)):
    """Six scales' mean and covariance errors like Fig. 9.6's: the covariance curves spread over six decades."""
    rows = []
    for i, s in enumerate(scales):
        H = 0.004 * 3 ** i           # up to 0.97: |beta| within one decade, tick labels "3 x 10^-1"
        for mom in ("mean", "cov"):
            beta = 0.5 / (1 + H ** 2)
            c = 0.2 * (1 + H) if mom == "mean" else 10.0 ** (i - 5.5)
            rows.append(_fit(scale=s, moment=mom, horizon=H, beta=beta, slope=-beta, intercept=math.log(c) + 0.0))
            rows += [{"kind": "point", "reference": "exact", "scale": s, "moment": mom, "n": n,
                      "err_mean": c * (n / 100) ** -beta, "err_se": 0.02 * c * (n / 100) ** -beta} for n in ns]
    return Result("tsc_moments", rows, {"tokens": "N(0, rho I_d), d=50, rho=0.1", "preset": "default",
                                        "device": "cpu", "draws": 24})


def _scan():
    """Fig. 3.1's stored scans: certified bounds (no p-value) at small N, exact p-values near N*."""
    scan = {}
    for L in (32, 64, 128, 256, 512, 1024):
        crit = int(0.8 * L)
        rows = [{"N": n, "pvalue": math.nan, "p_upper": min(5.7e-14 * 10 ** (12 * n / crit), 4e-3)}
                for n in range(1, crit - 2)]
        rows += [{"N": n, "pvalue": p, "p_upper": p} for n, p in zip(range(crit - 2, crit + 1), (1e-4, 2e-3, 0.02))]
        scan[L] = [dict(r, n_heads=270, critical_n=crit) for r in rows]
    return scan


FIGURES = {
    "Fig 3.1 (alpha 1e-20)": lambda: six_percent.alpha_frame(_scan(), 1e-20),
    "Fig 3.1 (alpha 0.01)": lambda: six_percent.alpha_frame(_scan(), 0.01),
    "Fig 3.4": lambda: six_percent.level_figure(_scan(), 256, -10),
    "Fig 9.5": lambda: tokens.moment_frame(_moments(), 0.05),
    "Fig 9.6": lambda: scp.plot_moment_convergence(_moments()),
}


@pytest.mark.parametrize("name", FIGURES)
def test_no_legend_covers_data(name):
    fig = FIGURES[name]()
    assert not covered_points(fig), f"{name}: legends cover data points {covered_points(fig)}"


def test_the_check_sees_a_legend_on_the_data():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.plot(np.linspace(0, 1, 50), np.zeros(50) + 0.5, "o", label="points across the middle")
    ax.legend(loc="center")
    assert covered_points(fig)


@pytest.mark.parametrize("name", ["Fig 9.6"])
def test_phone_x_labels_lie_inside_the_image(name):
    fig = FIGURES[name]()
    assert phone_layout(fig)
    fig.canvas.draw()
    width = fig.bbox.width
    for ax in fig.axes:
        box = ax.xaxis.label.get_window_extent()
        assert box.x0 >= -1 and box.x1 <= width + 1, f"{name}: x label {ax.get_xlabel()!r} runs off the image"
