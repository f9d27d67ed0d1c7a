"""Chapter 8's views (attnlab.views.diagnose) on a small hand-made Result: exact cells."""
import re

import numpy as np

from attnlab.core.result import Result
from attnlab.views import diagnose as views


def _cells(html: str) -> list[str]:
    return re.findall(r"<td [^>]*>(.*?)</td>", html)


def _result():
    head = dict(kind="head", L=64, paper_ns_below_band=False, flag_near_uniform=False, flag_low_separability=False,
                flagged=False)
    rows = [dict(head, paper_ns_below_band=True), dict(head, flag_near_uniform=True, flagged=True), dict(head)]
    layer = dict(kind="layer", L=64, paper_critical_above=True, flag_critical_n=False, critical_n_testable=True,
                 critical_n_censored=False, critical_n=40, critical_n_frac=0.625, critical_n_max=63,
                 critical_n_uniform_testable=True, critical_n_uniform_censored=True, critical_n_uniform=None,
                 critical_n_uniform_frac=None)
    rows += [dict(layer, layer=0), dict(layer, layer=1, critical_n=20, critical_n_frac=0.3125)]
    rows += [dict(layer, kind="model", flag_critical_n=True)]
    return Result("diagnose", rows, {"model": "m"})


def test_calibration_table_counts_fixed_cuts_and_calibrated_flags():
    assert _cells(views.calibration_table(_result(), [64]).data) == [
        "64", "2 of 3", "2 of 2", "1", "0", "1 of 3", "0 of 2"]


def test_critical_table_reads_each_layer_and_the_uniform_reference():
    cells = _cells(views.critical_table(_result(), [64]).data)
    assert cells == ["64", "40 (62.5%); uniform: > 63 (> 98%) (flagged)",
                     "layer 0: 40 (62.5%); layer 1: 20 (31.2%); uniform: >, >"], cells
    assert views.critical_text({"critical_n_testable": False}) == "too few heads"


def test_temperature_path_figure_has_both_panels_and_the_references():
    Ts = [0.1, 1.0, 10.0]
    path = {"entropy score": [np.full((2, 3), v) for v in (0.1, 0.5, 0.9)],
            "N_s/N": [np.full((2, 3), v) for v in (0.2, 0.6, 0.4)]}
    fig = views.temperature_path_figure(path, Ts, np.array([0.3, 0.5]), "m", 128)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["entropy score", "N_s/N"]
    assert "m, L = 128" in fig._suptitle.get_text()
    assert np.allclose(fig.axes[0].lines[0].get_ydata(), [0.1, 0.5, 0.9])
