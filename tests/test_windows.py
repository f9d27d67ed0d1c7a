"""Text windows as a dimension: the encoder's window rule at every L, the stated window offsets, the per-window
summary (median, range, robust / depends), `check --windows`, and the readings tally that counts only pairs that
read a formula of the paper."""
import math

import pytest
import torch

from attnlab import windows as W
from attnlab.core.text import WINDOW_RULE, window, window_prefix
from attnlab.normalization import experiments as ex
from attnlab.normalization import readings


def test_encoder_window_rule_is_the_same_at_every_length(minilm, war_and_peace):
    """[CLS] + L - 2 text tokens + [SEP] at every L: the prefix of the longest window equals the window built at L
    (before, L < 512 was [CLS] + L - 1 tokens and no [SEP], L = 512 [CLS] + 510 + [SEP])."""
    tok = minilm.tokenizer
    full = minilm.window(war_and_peace.text, 512)
    for L in (32, 64, 511):
        cut = window_prefix(full, L, tok.sep_token_id)
        assert torch.equal(cut, window(tok, war_and_peace.text, L, special_tokens=True))
        assert int(cut[0]) == tok.cls_token_id and int(cut[-1]) == tok.sep_token_id and len(cut) == L
    assert torch.equal(window_prefix(full, 64, None), full[:64])          # causal models: the first L tokens


def test_captures_cut_encoder_windows_by_the_rule(minilm, war_and_peace):
    seen = []

    class Spy:
        causal, name, max_positions, tokenizer = False, "spy", 512, minilm.tokenizer

        def capture(self, ids, **kw):
            seen.append(ids.clone())
            return None

    ids = minilm.window(war_and_peace.text, 128)
    cap = ex.Captures(Spy(), ids, {"probs"})
    cap.get(32)
    cap.get(128)
    assert int(seen[0][-1]) == minilm.tokenizer.sep_token_id and len(seen[0]) == 32
    assert torch.equal(seen[1], ids)
    assert "[SEP]" in WINDOW_RULE


def test_window_starts_are_paragraph_starts_and_stated():
    text = "one\n\n" + "a" * 50 + "\n\nsecond paragraph\n\n" + "b" * 50 + "\n\nthird"
    starts = W.window_starts(text, 3)
    assert starts[0] == 0 and starts == sorted(starts) and len(set(starts)) == 3
    assert all(text[s - 2:s] == "\n\n" for s in starts[1:])
    lines = W.window_starts("x\n" * 100, 4)                    # no blank lines (WikiText-2): line starts
    assert all(("x\n" * 100)[s - 1] == "\n" for s in lines[1:])
    with pytest.raises(ValueError, match="at least 1"):
        W.window_starts(text, 0)
    with pytest.raises(ValueError, match="paragraph"):
        W.window_starts("no breaks at all", 2)


def _rows(value, verdict, rid="p1-x"):
    return [{"id": rid, "reading": "", "claim": "c", "paper": "p", "measured": "m", "verdict": verdict,
             "value": value, "unit": "largest N*/L"}]


def test_window_summary_median_range_and_robustness():
    ws = [W.TextWindow("war_and_peace", i, 100 * i) for i in range(3)] + [W.TextWindow("wikitext2", 0, 0)]
    same = W.window_summary({w: _rows(v, "does not hold") for w, v in zip(ws, (0.8, 0.9, 0.7, 0.85))})[0]
    assert (same["median"], same["low"], same["high"]) == (pytest.approx(0.825), 0.7, 0.9)
    assert same["robust"] == W.ROBUST and same["verdict"] == "does not hold" and same["n_windows"] == 4
    assert "all 4 windows" in W.spread_text(same)
    mixed = W.window_summary({w: _rows(v, "holds" if v < 0.06 else "does not hold")
                              for w, v in zip(ws, (0.05, 0.3, 0.04, 0.2))})[0]
    assert mixed["robust"] == W.DEPENDS and mixed["verdict"] == "mixed"
    assert "holds in 2" in W.spread_text(mixed) and "does not hold in 2" in W.spread_text(mixed)
    none = W.window_summary({ws[0]: _rows(None, "not applicable")})[0]
    assert math.isnan(none["median"]) and none["robust"] == W.ROBUST


def test_every_paper1_claim_row_carries_its_number(tiny, war_and_peace):
    from attnlab.normalization.claims import paper1_claims

    ids = tiny.window(war_and_peace.text, 64)
    res = ex.run_figures(tiny, ids, quick=True, progress=False)
    rows = paper1_claims(res)
    assert rows and all(r["unit"] and r["value"] is not None and math.isfinite(r["value"])
                        for r in rows if r["verdict"] != "not applicable")
    crit = next(r for r in rows if r["id"] == "p1-fig2c-critical")
    fracs = [row["critical_frac"] for row in res["fig2c"].rows if row["is_critical"]]
    assert crit["value"] == pytest.approx(max(f if f == f else 1.0 for f in fracs))


def test_readings_tally_counts_only_pairs_that_read_a_formula_of_the_paper():
    """E1, E2, E3 and E5 are expectations of a sum of distances: paired with d~ (a), a distance of a sum, they read
    no formula of the paper; E4 (the expectation of d~ itself) reads one with either d~."""
    assert set(readings.PAPER_PAIRS) == {("E1", "b"), ("E2", "b"), ("E3", "b"), ("E4", "b"), ("E5", "b"),
                                         ("E4", "a")}
    n_vec = len(readings.VECTORS)
    rows = [{"reading": f"{e} / {d} / {v}", "verdict": "holds"} for e in readings.E_READINGS
            for d in readings.D_READINGS for v in readings.VECTORS]
    tally = readings.paper_tally(rows)
    assert tally == {"holds": 6 * n_vec, "of": 6 * n_vec, "cross_pairs": 4 * n_vec}


def test_check_windows_prints_a_verdict_per_window(tmp_path, monkeypatch, capsys):
    from attnlab.cli import main

    ws = [W.TextWindow("war_and_peace", 0, 0), W.TextWindow("wikitext2", 0, 0)]
    monkeypatch.setattr(W, "text_windows", lambda k: ws)
    monkeypatch.setattr(W, "claims_over_windows", lambda model, windows, **kw: {
        w: _rows(v, "does not hold" if v > 0.06 else "holds", "p1-fig2c-critical")
        for w, v in zip(windows, (0.8, 0.05))})
    assert main(["check", "--model", "tiny-gpt2", "--windows", "1"]) == 0
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "W&P #1 0.8 does not hold" in lines and "WikiText-2 #1 0.05 holds" in lines
    assert "depends on the window" in out and "1 of 1 claims depend on the window" in out
    assert "flagged: WikiText-2 #1 starts on a heading line '= Robert Boulter =' (tiny-gpt2's tokens)" in lines
    assert main(["check", "--model", "tiny-gpt2", "--windows", "1", "--strict"]) == 1
    assert main(["check", "--model", "tiny-gpt2", "--windows", "0"]) == 2
    assert "--windows must be at least 1" in capsys.readouterr().err


def test_ks_p_value_with_more_samples_than_float64_path_counts_allow():
    """Pooled windows give ~1,000 head samples a side: the exact lattice-path count (comb(2160, 1080) ~ 1e648)
    overflowed float64; rescaled, it agrees with scipy."""
    import numpy as np
    from scipy.stats import ks_2samp

    from attnlab.normalization.metrics.critical_n import ks_sf

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=1080), rng.normal(0.1, 1, size=1080)
    r = ks_2samp(a, b)
    assert ks_sf(r.statistic, 1080, 1080) == pytest.approx(r.pvalue, rel=1e-6)
    small = ks_2samp(a[:300], b[:300], method="exact")
    assert ks_sf(small.statistic, 300, 300) == pytest.approx(small.pvalue, rel=1e-8)


# ------------------------------------------------------------------ windows that start on markup (issue 39, item 3)


def _book_window_flags(model, skip):
    from attnlab.core.text import load_corpus

    out = {}
    for w in W.book_windows():
        text = load_corpus(w.corpus).text[w.start:]
        out[w.label] = W.markup_flag(text, model.window(text, 64), skip)
    return out


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_markup_flag_pins_wikitext2_4_and_leaves_war_and_peace_unflagged(which, request):
    """WikiText-2 #4 opens on the heading ' = = = Tourism = = = ', three identical ' =' tokens (GPT-2's and MiniLM's
    tokens; SmolLM2's too, `check --windows`); WikiText-2 #1 on a heading with no repeated token; the four War and
    Peace windows and the other two WikiText-2 windows start on prose (the novel's first window on its title lines:
    no heading of WikiText's kind, no repeated token)."""
    model = request.getfixturevalue(which)
    flags = _book_window_flags(model, skip=0 if model.causal else 1)
    f4 = flags["WikiText-2 #4"]
    assert f4["flagged"] and f4["heading"] == "= = = Tourism = = =" and f4["run"] == 3
    assert "3 identical tokens" in f4["why"] and "heading" in f4["why"]
    f1 = flags["WikiText-2 #1"]
    assert f1["flagged"] and f1["heading"] == "= Robert Boulter =" and f1["run"] == 1
    assert [lab for lab, f in flags.items() if f["flagged"]] == ["WikiText-2 #1", "WikiText-2 #4"]
    assert all(f["why"] == "" and f["run"] == 1 for lab, f in flags.items() if lab.startswith("W&P"))


def test_markup_flag_and_leading_run_on_plain_inputs():
    assert W.leading_run([5, 5, 5, 7, 5]) == 3 and W.leading_run([5, 6]) == 1 and W.leading_run([101, 5, 5], 1) == 2
    with pytest.raises(ValueError, match="no token"):
        W.leading_run([101], 1)
    assert W.markup_flag("It was a dark night.\n = A = \n", [1, 2, 3])["flagged"] is False   # a heading later
    assert W.markup_flag(" = = Early life = = \n He was", [9, 9, 4])["why"] == (
        "starts on a heading line '= = Early life = ='; starts with 2 identical tokens")
    assert W.markup_flag("x = y = z\n", [1, 2])["heading"] == ""                  # an equation is not a heading
    assert W.markup_flag("so so so\n", [4, 4, 4])["why"] == "starts with 3 identical tokens"


def test_degenerate_rows_are_rows_whose_two_largest_logits_fall_on_the_run():
    vis = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    s = torch.tensor([[0.0, 0, 0, 0, 0],
                      [1.0, 1.0, 0, 0, 0],            # keys 0, 1: both on the run
                      [2.0, 1.9, 0.0, 0, 0],          # the two largest on the run
                      [2.0, 0.0, 1.5, 0.0, 0],        # the second largest on key 2, off the run 0..1
                      [0.0, 0.0, 0.0, 9.0, 8.0]])     # nowhere near the run
    bad = W.degenerate_rows(s[None, None], vis, 0, 2)[0, 0]
    assert bad.tolist() == [False, True, True, False, False]          # row 0 has one key: never degenerate
    assert W.degenerate_rows(s, vis, 0, 3).tolist() == [False, True, True, True, False]
    with pytest.raises(ValueError, match="inside"):
        W.degenerate_rows(s, vis, 0, 6)


def test_gradient_rows_leave_out_exactly_the_rows_not_kept(tiny, war_and_peace):
    """keep = every row gives fig4's rows; leaving rows out gives the means over the kept rows only."""
    from attnlab.core.result import differences
    from attnlab.normalization.metrics.gradients import fd_grad_norms

    trace = tiny.capture(tiny.window(war_and_peace.text, 32), keep=("scores",))
    p = ex.resolve_protocol(False, {"jac_rows": 0})
    Ts, Es = [0.01, 1.0], [1e-3]
    base = ex.gradient_rows(trace, p, Ts, Es, 32)
    shape = trace.scores.shape[:-1]
    every = ex.gradient_rows(trace, p, Ts, Es, 32, keep=torch.ones(shape, dtype=torch.bool))
    assert differences(every, base) == [] and [r["g_max"] for r in every] == [r["g_max"] for r in base]
    keep = torch.ones(shape, dtype=torch.bool)
    keep[..., 1:6] = False
    cut = ex.gradient_rows(trace, p, Ts, Es, 32, keep=keep)
    g = fd_grad_norms(trace.scores, Ts, Es, trace.visible())[..., 6:, 0, 0]     # T = 0.01: rows 6.. only
    assert cut[0]["g_max"] == pytest.approx(float(g.nanmean(-1).max()), rel=1e-12)
    assert cut[0]["g_max"] != base[0]["g_max"]


def test_fig4_without_repeats_on_wikitext2_4_and_on_a_window_without_a_run(tiny):
    """On WikiText-2 #4 (a run of 3) the rows of queries 1 and 2 of every head (keys only on the run) are left out at
    least; on W&P #1 (no run) nothing is, and the rows are fig4's."""
    from attnlab.figures import Inputs

    ws = {w.label: w for w in W.book_windows()}
    res = {}
    for lab in ("WikiText-2 #4", "W&P #1"):
        inp = Inputs.around(tiny, text=ws[lab].corpus, max_length=64, start=ws[lab].start)
        res[lab] = W.fig4_without_repeats(inp)
    assert res["WikiText-2 #4"].rows[0]["run"] == 3 and res["WikiText-2 #4"].rows[0]["degenerate_share"] >= 2 / 63
    assert res["W&P #1"].rows[0]["degenerate_share"] == 0.0
    inp = Inputs.around(tiny, max_length=64)
    full = ex.fig4(tiny, inp.ids(), progress=False, jac_rows=0)
    assert [r["g_max"] for r in res["W&P #1"].rows] == [r["g_max"] for r in full.rows]


def test_verdicts_that_repeated_tokens_decide_are_named():
    ws = [W.TextWindow("war_and_peace", 0, 0), W.TextWindow("wikitext2", 3, 9)]
    summary = W.window_summary({ws[0]: _rows(-0.2, "does not hold", "p1-fig4-slope"),
                                ws[1]: _rows(-0.9, "holds", "p1-fig4-slope")})
    notes = {"W&P #1": {"without": []},
             "WikiText-2 #4": {"without": [{"id": "p1-fig4-slope", "value": -0.28, "verdict": "does not hold"}],
                               "degenerate_share": 0.419, "run": 3}}
    assert W.verdicts_without_repeats(summary[0], notes) == {"W&P #1": "does not hold",
                                                             "WikiText-2 #4": "does not hold"}
    (d,) = W.driven_by_repeats(summary, notes)
    assert d["windows"] == ["WikiText-2 #4"] and d["one_verdict_without"] == "does not hold"
    assert W.driven_text(d) == ("p1-fig4-slope in WikiText-2 #4: holds with those rows, does not hold without; "
                                "without them it does not hold in all 2 windows")
    assert W.without_text(notes["WikiText-2 #4"], "p1-fig4-slope") == (
        "without the 41.9% of rows on the 3 repeated tokens: -0.28, does not hold")
    assert W.driven_by_repeats(summary, {"W&P #1": {"without": []}, "WikiText-2 #4": {"without": []}}) == []


def test_book_names_the_rows_that_decide_a_window_verdict(monkeypatch):
    """Chapter 6's table and each chapter's window spread say which window's repeated-token rows flip a verdict, from
    the rows (monkeypatched summaries and notes: no model runs)."""
    from attnlab import book
    from attnlab.book import across_windows

    ws = [W.TextWindow("war_and_peace", 0, 0), W.TextWindow("wikitext2", 3, 9)]
    summary = W.window_summary({ws[0]: _rows(-0.2, "does not hold", "p1-fig4-slope"),
                                ws[1]: _rows(-0.9, "holds", "p1-fig4-slope")})
    notes = {"W&P #1": {"flagged": False, "without": [], "run": 1, "why": "", "degenerate_share": 0.0},
             "WikiText-2 #4": {"flagged": True, "run": 3, "why": "starts with 3 identical tokens",
                               "degenerate_share": 0.419,
                               "without": [{"id": "p1-fig4-slope", "value": -0.28, "verdict": "does not hold"}]}}
    monkeypatch.setattr(across_windows, "window_summaries", lambda: {"smollm2": summary})
    monkeypatch.setattr(across_windows, "window_markup", lambda: {"smollm2": notes})
    monkeypatch.setattr(W, "book_windows", lambda: ws)
    monkeypatch.setattr(across_windows, "windows_described", lambda: "2 text windows")
    spread = book.window_spread("p1-fig4-slope").data
    assert "in WikiText-2 #4 the rows on its leading repeated tokens decide it (holds with them" in spread
    tab, said = book.markup_table()
    assert "41.9%" in tab.data and "-0.9: <b>holds</b> → -0.28: <b>does not hold</b>" in tab.data
    assert "W&amp;P #1" not in tab.data                                   # not flagged: not in the table
    assert "<code>p1-fig4-slope</code> in WikiText-2 #4: holds with those rows, does not hold without" in said.data
