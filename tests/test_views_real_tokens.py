"""Chapter 10's views (attnlab.views.real_tokens) on a small hand-made Result: exact cells and the head test."""
import re

import numpy as np

from attnlab.core.result import Result
from attnlab.sample_complexity import claims as scc
from attnlab.views import real_tokens as views


def _cells(html: str) -> list[str]:
    return re.findall(r"<td [^>]*>(.*?)</td>", html)


def _result():
    rows = []
    for layer, H in ((0, 0.5), (1, 2.0)):
        beta_ref = 1 / (2 * (1 + H * H))
        for mom, beta in (("mean", 0.45), ("cov", 0.30)):
            rows.append(dict(kind="fit", layer=layer, moment=mom, horizon=H, horizon_authors=2 * H, beta_ref=beta_ref,
                             beta=beta, slope=-beta, slope_se=0.01, intercept=0.0))
            for n, err in ((16, 1.0), (64, 0.5)):
                rows.append(dict(kind="point", layer=layer, moment=mom, n=n, err_mean=err, err_se=0.01))
        for head, (bm, bc) in enumerate(((0.5, 0.4), (0.05, 0.4))):
            rows.append(dict(kind="head", layer=layer, head=head, horizon=0.2, beta_ref=0.48, beta_mean=bm,
                             beta_mean_se=0.01, beta_cov=bc, beta_cov_se=0.01))
    return Result("tsc_real", rows, {"model": "m"})


def test_fit_table_reads_each_layer():
    assert _cells(views.fit_table(_result()).data)[:6] == ["0", "0.5", "1", "0.400", "0.45 ± 0.01", "0.30 ± 0.01"]


def test_at_or_above_uses_the_checkers_margin():
    h = dict(beta_ref=0.48, beta_mean=0.48 - scc.threshold("BETA_TOL_FLOOR"), beta_mean_se=0.0)
    assert views.at_or_above(h, "mean") and not views.at_or_above(dict(h, beta_mean=0.3), "mean")


def test_heads_table_and_the_heads_below():
    cells = _cells(views.heads_table(_result()).data)
    assert cells[:6] == ["0", "0.5", "0.2 / 0.2 / 0.2", "0.28 (0.05–0.50)", "0.40 (0.40–0.40)", "1, 0 of 2"]
    text = views.heads_below(_result())
    assert text.splitlines()[0].startswith("4 of 4 heads have an exponent below beta(H_j)")
    assert "layer 1 head  1: H_j = 0.20" in text
    assert "(below)" in views.every_head(_result()).data


def test_layer_frame_draws_errors_and_exponents():
    fig = views.layer_frame(_result(), 1)
    left, right = fig.axes[:2]
    assert left.get_title().startswith("layer 1: H = 2")
    assert np.allclose(right.lines[-2].get_ydata()[[0, -1]] > 0, True)           # the beta(H) curve
