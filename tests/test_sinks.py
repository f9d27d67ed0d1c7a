"""Attention sinks: the definitions on hand-made tensors, the per-head Result on a real (tiny) model, and the
claims per head subset equal to the paper-1 engine's own numbers when every head is kept."""
from functools import lru_cache

import numpy as np
import pytest
import torch

from attnlab import figures
from attnlab.core.result import Result
from attnlab.normalization import claims as paper_claims
from attnlab.normalization import experiments
from attnlab.normalization.experiments import temperature_grid
from attnlab.tools import sinks
from attnlab.views import sinks as views


def test_repeated_keys_are_later_occurrences_of_an_earlier_id():
    ids = torch.tensor([5, 3, 5, 5, 2, 3])
    assert sinks.repeated_keys(ids).tolist() == [False, False, True, True, False, True]
    with pytest.raises(ValueError, match="one window"):
        sinks.repeated_keys(ids[None])


def test_shares_of_uniform_rows_are_the_baselines_and_a_one_hot_first_row_is_one():
    ids = torch.tensor([7, 1, 7, 2, 1])
    vis = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    uniform = vis.float() / vis.sum(-1, keepdim=True)
    st = sinks.row_shares(uniform[None], ids, vis)
    torch.testing.assert_close(st["first"][0], st["first_uniform"])
    torch.testing.assert_close(st["repeated"][0], st["repeated_uniform"])
    assert st["repeated_uniform"].tolist() == [0, 0, 1 / 3, 1 / 4, 2 / 5]
    onehot = torch.zeros(2, 5, 5)
    onehot[..., 0] = 1
    hs = sinks.head_shares(onehot, ids, vis)
    assert hs["first"].tolist() == [1.0, 1.0] and hs["repeated"].tolist() == [0.0, 0.0]
    assert sinks.sink_heads(hs["first"]).all()
    # row 0 of a causal head (it sees only the first token) is left out of the head mean
    only_row0 = torch.zeros(1, 5, 5)
    only_row0[0, 0, 0] = 1
    only_row0[0, 1:, 1] = 1
    assert float(sinks.head_shares(only_row0, ids, vis)["first"]) == 0.0


def test_sink_heads_threshold_holds_at_equality():
    assert sinks.sink_heads(torch.tensor([0.5, 0.4999, 0.9])).tolist() == [True, False, True]


@lru_cache(maxsize=1)
def _paper1():
    inp = figures.Inputs("tiny-gpt2", "cpu", max_length=64)
    return inp, figures.compute_figures(["fig2c", "fig3", "fig4"], inp, quick=True, progress=False)


def test_sink_shares_rows_and_causal_prefixes(tiny):
    inp, _ = _paper1()                       # its model: tiny-gpt2, loaded by name
    ids = inp.ids()
    res = sinks.sink_shares(tiny, ids, lengths=[32, 64])
    assert len(res.rows) == 2 * tiny.n_layers * tiny.n_heads
    short = sinks.sink_shares(tiny, ids[:32], lengths=[32])
    for a, b in zip(short.rows, res.select(L=32)):
        assert a["first"] == pytest.approx(b["first"], rel=1e-6) and a["repeated"] == pytest.approx(b["repeated"],
                                                                                                  rel=1e-6)
    assert all(0 <= r["first"] <= 1 and 0 <= r["repeated"] <= 1 and r["sep"] is None for r in res.rows)
    assert all(r["sink"] == (r["first"] >= sinks.SINK_RULE) for r in res.rows)
    header, rows = views.layer_table(res)
    assert header == ["layer", "L = 32", "L = 64"] and len(rows) == tiny.n_layers + 5
    assert rows[tiny.n_layers][2] == f"<b>{np.mean([r['first'] for r in res.select(L=64)]):.2f}</b>"
    swapped = sinks.sink_shares(tiny, ids, lengths=[64], normalizer="sigmoid")
    assert {r["normalizer"] for r in swapped.rows} == {"sigmoid"}
    assert [r["first"] for r in swapped.rows] != [r["first"] for r in res.select(L=64)]


def test_claims_with_every_head_equal_the_engines_own(tiny):
    inp, figs = _paper1()
    fig3 = experiments.fig3(tiny, inp.ids(), quick=True, ns=[1, 16, 17], progress=False)   # N >= 16: Fig. 3's band
    res = sinks.sink_claims(tiny, inp.ids(), fig3=fig3, lengths=[32, 64], temperatures=temperature_grid(quick=True))
    for L in (32, 64):
        crit = {r["critical_n"] for r in figs["fig2c"].rows if r["L"] == L}
        got = res.select(quantity="critical_frac", subset="all heads", L=L)[0]["value"]
        assert got == pytest.approx(crit.pop() / L)
    meds = [float(np.nanmedian(fig3.column("ns_frac", N=n))) for n in (16, 17)]
    assert views._value(res, "fig3_median_lo", "all heads") == pytest.approx(min(meds))
    assert views._value(res, "fig3_median_hi", "all heads") == pytest.approx(max(meds))
    slope = next(r for r in paper_claims.paper1_claims(figs) if r["id"] == "p1-fig4-slope")
    assert slope["verdict"] != "not applicable"
    assert views._value(res, "fig4_slope", "all heads") == pytest.approx(slope["value"], rel=1e-6)
    n = {s: res.select(quantity="critical_frac", subset=s, L=64)[0]["n_heads"] for s in sinks.SUBSETS}
    assert n["without sink heads"] + n["sink heads only"] == n["all heads"] == tiny.n_layers * tiny.n_heads


def _claims(all_heads: dict, without: dict) -> Result:
    rows = []
    for subset, vals in (("all heads", all_heads), ("without sink heads", without), ("sink heads only", {})):
        for (q, L), v in vals.items():
            rows.append({"subset": subset, "quantity": q, "L": L, "value": v, "n_heads": 1, "detail": ""})
    return Result("sink_claims", rows, {"model": "m"})


def test_verdicts_say_which_way_a_claim_moves_and_whether_sinks_explain_it():
    res = _claims({("critical_frac", 64): 0.8, ("fig4_slope", 64): -0.2, ("fig3_median_lo", 64): 0.5,
                   ("fig3_median_hi", 64): 0.6},
                  {("critical_frac", 64): 0.05, ("fig4_slope", 64): -0.1, ("fig3_median_lo", 64): 0.5,
                   ("fig3_median_hi", 64): 0.6})
    v = {r["quantity"]: r for r in views.verdicts(res)}
    assert v["critical_frac"]["move"] == "toward" and v["critical_frac"]["explains"]
    assert v["fig4_slope"]["move"] == "away" and not v["fig4_slope"]["explains"]
    assert v["fig3_median_lo"]["move"] == "unchanged" and not v["fig3_median_lo"]["explains"]
    # both inside Fig. 3's band (0.7-0.85): as far from the paper's number, so it does not move relative to it
    inside = _claims({("fig3_median_lo", 64): 0.71, ("fig3_median_hi", 64): 0.75},
                     {("fig3_median_lo", 64): 0.73, ("fig3_median_hi", 64): 0.77})
    assert {r["move"] for r in views.verdicts(inside)} == {"unchanged"}
    assert "moves away" not in views.summary(inside)
    # at the paper's number exactly (0.06 L): reached, so explained
    eq = _claims({("critical_frac", 64): 0.8}, {("critical_frac", 64): 0.06})
    assert views.verdicts(eq)[0]["explains"]
    assert "sinks explain it: yes" in views.summary(eq)


def test_a_claim_that_holds_with_every_head_needs_no_explaining():
    """Gemma 3's Fig. 3 medians are inside the paper's band with all heads: the sinks explain nothing there, and the
    sentence said "no" as if the claim failed. A claim missed at some lengths only is judged where it misses."""
    inside = _claims({("fig3_median_lo", 512): 0.77, ("fig3_median_hi", 512): 0.79},
                     {("fig3_median_lo", 512): 0.77, ("fig3_median_hi", 512): 0.80})
    assert all(r["holds"] and not r["explains"] for r in views.verdicts(inside))
    assert "sinks explain it: not needed (it holds with every head)" in views.summary(inside)
    mixed = _claims({("critical_frac", 64): 0.05, ("critical_frac", 128): 0.8},
                    {("critical_frac", 64): 0.05, ("critical_frac", 128): 0.04})
    assert "sinks explain it: yes" in views.summary(mixed)
    missed = _claims({("critical_frac", 64): 0.05, ("critical_frac", 128): 0.8},
                     {("critical_frac", 64): 0.05, ("critical_frac", 128): 0.5})
    assert "sinks explain it: no" in views.summary(missed)


def test_a_critical_n_on_too_few_heads_is_not_a_verdict():
    """Gemma 3's full layers keep 2-4 heads without their sink heads, too few for the KS test to reject at alpha
    0.01 (`fewest_heads`: 5): their critical N is not measured (NaN), and the sentence says so instead of "sinks
    explain it: yes" (which a critical N of 1 / L once gave)."""
    rows = []
    for L, few in ((64, 2), (512, 4)):
        rows += [{"subset": "all heads", "quantity": "critical_frac", "L": L, "value": 0.5, "n_heads": 12,
                  "detail": ""},
                 {"subset": "without sink heads", "quantity": "critical_frac", "L": L, "value": float("nan"),
                  "n_heads": few, "detail": ""},
                 {"subset": "sink heads only", "quantity": "critical_frac", "L": L, "value": 0.3,
                  "n_heads": 12 - few, "detail": ""}]
    res = Result("sink_claims", rows, {"model": "gemma3"})
    assert [r["move"] for r in views.verdicts(res)] == ["untested", "untested"]
    text = views.summary(res)
    assert "sinks explain it: cannot tell" in text and "2-4 heads are left" in text and "0.50 -> n/a" in text
    assert "nan" not in text
    assert "n/a (4)" in views.claims_table(res).data
    # one length measured, one not: the verdict is the measured one's
    rows[1] = dict(rows[1], value=0.05, n_heads=5)
    assert "sinks explain it: yes" in views.summary(Result("sink_claims", rows, {"model": "gemma3"}))


def test_a_model_with_sliding_window_layers_gets_a_table_and_a_summary_per_kind():
    """`per_kind`: Gemma 3's claims are measured per kind of layer (rows carrying `layer_kind`); each kind gets its
    own table and sentences, named by its kind and window, and no kind's rows are dropped (a table once showed the
    first kind's only)."""
    sliding = _claims({("critical_frac", 64): 0.7}, {("critical_frac", 64): 0.75})
    full = _claims({("critical_frac", 64): 0.5}, {("critical_frac", 64): 0.05})
    rows = ([dict(r, layer_kind="sliding", sliding_window=512) for r in sliding.rows]
            + [dict(r, layer_kind="full", sliding_window=None) for r in full.rows])
    kinds = views.per_kind(Result("sink_claims", rows, {"model": "gemma3"}))
    assert [k.provenance["layer_kind"] for k in kinds] == ["sliding", "full"]
    assert sum(len(k.rows) for k in kinds) == len(rows)
    assert "<b>gemma3, sliding layers (w = 512), W&amp;P #1</b>" in views.summary(kinds[0]) or \
        "<b>gemma3, sliding layers (w = 512), W&P #1</b>" in views.summary(kinds[0])
    assert "0.70 -> 0.75" in views.summary(kinds[0]) and "0.50 -> 0.05" in views.summary(kinds[1])
    kinds[1].rows.append(dict(kinds[1].rows[0], subset="sink heads only", value=0.9))
    assert "gemma3, full layers, W&amp;P #1" in views.claims_table(kinds[1]).data or \
        "gemma3, full layers, W&P #1" in views.claims_table(kinds[1]).data
    assert views.per_kind(sliding) == [sliding]
