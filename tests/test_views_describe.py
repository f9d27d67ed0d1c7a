"""The alt texts and captions of the first paper's static figures: the numbers the plots show."""
import math

import pytest

from attnlab.core.result import Result
from attnlab.views.describe import describe


def test_fig1_says_where_the_curves_start_and_end():
    rows = [{"window": 0, "L": L, "layer": 0, "head": h, "max_weight": 0.6 if h else 0.4,
             "entropy": math.log(L) / 2, "cor1_holds": 1.0} for L in (64, 1024) for h in (0, 1)]
    text = describe("fig1", Result("fig1", rows, {"model": "m", "text": "t"}))
    assert text.startswith("Fig. 1 (m on t): from L = 64 to 1024 tokens")
    assert "goes from 0.50 to 0.50" in text and "1/L falls from 0.016 to 0.0010" in text
    assert f"from {math.log(64) / 2:.1f} to {math.log(1024) / 2:.1f} nats" in text and "100% of the rows" in text


def test_fig2c_gives_the_critical_n_per_length_and_the_papers_line():
    rows = [{"window": 0, "L": 64, "N": 50, "critical_n": 52}, {"window": 0, "L": 128, "N": 1, "critical_n": 0}]
    text = describe("fig2c", Result("fig2c", rows, {"model": "m", "text": "t"}))
    assert "52 at L = 64 (81%), none at L = 128" in text and "paper's 6% of L" in text


def test_fig4_measures_the_slope_it_draws():
    rows = [{"window": 0, "T": T, "eps": 1e-3, "g_max": 0.5 / T} for T in (0.01, 1.0)]
    text = describe("fig4", Result("fig4", rows, {"model": "m", "text": "t"}))
    assert "from 50 at T = 0.01 to 0.5 at T = 1 (slope -1.00 end to end)" in text


def test_an_unknown_figure_is_one_line():
    with pytest.raises(ValueError, match="no description for figure 'fig9'"):
        describe("fig9", Result("fig9", []))
