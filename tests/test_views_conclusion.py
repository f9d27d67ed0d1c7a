"""The closing chapter's advice: every number and direction read from the claim rows (synthetic rows here)."""
from attnlab.views import conclusion


def test_temperature_item_reads_the_slope_and_the_near_tie():
    flat = conclusion.temperature_item("m", {"value": -0.115, "verdict": "does not hold"}, 0.001, 0.9999, 4.8e-7)
    assert "at T = 0.001 the worst row's norm is 1.000 × 1/(2T)" in flat and "is 4.8e-07" in flat
    assert "grows as T falls, like T^-0.12 below T = 0.1 (where 1/T would be T^-1" in flat
    follows = conclusion.temperature_item("m", {"value": -0.98, "verdict": "holds"}, 0.001, 0.5, 0.1)
    assert "like T^-0.98" in follows and "as the paper's 1/T" in follows
    assert "does not grow as T falls (slope +0.20)" in conclusion.temperature_item("m", {"value": 0.2}, 0.01, 0.5, 0.1)


def test_retrieval_item_gives_the_advice_as_the_papers_unless_a_model_reproduces_the_figure():
    far = conclusion.retrieval_item({"a": (0.78, 0.82, 1024, True, 270), "b": (0.81, 0.91, 512, False, 72)})
    assert "0.78–0.82 L on a (L ≤ 1024); 0.81–0.91 L on b (L ≤ 512)" in far
    assert "no model of this book reproduces the 6% figure" in far and "is therefore the paper's too" in far
    near = conclusion.retrieval_item({"a": (0.02, 0.05, 1024, True, 144), "b": (0.8, 0.9, 512, False, 72)})
    assert "a reproduces the 6% figure" in near and "no model" not in near
    assert "No critical N was measured" in conclusion.retrieval_item({})
