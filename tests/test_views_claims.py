"""The claim-kind table (one copy, read by chapter 6) and the views chapter 6 draws from claim rows."""
import math
from pathlib import Path

import matplotlib
import matplotlib.pyplot
import pytest

matplotlib.use("Agg")

from attnlab import book, widgets  # noqa: E402
from attnlab.core.result import Result  # noqa: E402
from attnlab.normalization import claim_kinds  # noqa: E402
from attnlab.normalization.claim_kinds import EMPIRICAL, PRINTED, THEOREM, by_kind, claim_kind, is_theorem, why  # noqa: E402
from attnlab.views import claims as claim_views  # noqa: E402


def test_every_claim_in_the_table_is_one_the_checker_makes():
    source = (Path(claim_kinds.__file__).parent / "claims.py").read_text()
    for cid in claim_kinds.CLAIMS:
        assert f'"{cid}"' in source, cid


def test_theorems_are_the_ones_the_chapter_map_calls_theorems():
    """book.CHAPTER_CLAIMS labels the same five claims 'theorem': the two views cannot disagree."""
    labelled = {cid for *_, labels in book.CHAPTER_CLAIMS for cid, label in labels.items() if "theorem)" in label}
    assert labelled == {cid for cid in claim_kinds.CLAIMS if is_theorem(cid)}


def test_kinds_group_rows_in_order_and_unknown_ids_are_empirical():
    rows = [{"id": "p1-fig3-saturation"}, {"id": "p1-cor1"}, {"id": "p1-new"}, {"id": "p1-thm1-B"}]
    groups = by_kind(rows)
    assert list(groups) == [THEOREM, PRINTED, EMPIRICAL]
    assert [r["id"] for r in groups[EMPIRICAL]] == ["p1-fig3-saturation", "p1-new"]
    assert [r["id"] for r in groups[THEOREM]] == ["p1-cor1"] and claim_kind("p1-thm1-B") == PRINTED
    assert by_kind([]) == {THEOREM: [], PRINTED: [], EMPIRICAL: []}


def _fig1_fig4(T_bad, sign=-1):
    """fig1 and fig3 with ten heads at L = 128 whose N_s/N falls (sign -1) or rises (+1) with the largest weight."""
    heads = range(10)
    fig1 = Result("fig1", [{"L": 64, "layer": 0, "head": h, "max_weight": 0.5} for h in heads]
                  + [{"L": 128, "layer": 0, "head": h, "max_weight": 0.1 + 0.05 * h} for h in heads])
    fig3 = Result("fig3", [{"L": 128, "N": N, "layer": 0, "head": h, "ns_frac": 0.5 + sign * 0.04 * (h - 4.5)}
                           for N in (1, 16, 32) for h in heads])
    fig4 = Result("fig4", [{"T": T, "holds_paper": 0.5 if T in T_bad else 1.0} for T in (0.01, 0.1, 1.0)])
    return {"fig1": fig1, "fig3": fig3, "fig4": fig4}


def test_explanations_quote_the_measured_numbers():
    facts = claim_kinds.failure_facts(_fig1_fig4({0.01, 0.1}))
    assert facts["L_top"] == 128 and math.isclose(facts["max_weight"], 0.325)
    falls = why("p1-fig3-saturation", facts)
    assert "N_s/N at N = 32 falls as a head's attention concentrates (Spearman ρ = -1.00" in falls
    assert "at L = 128, over 10 heads; median 0.32 in the most concentrated tenth, 0.68 in the least" in falls
    assert "diffuse rows do not explain the level" in falls
    rises = why("p1-fig3-saturation", claim_kinds.failure_facts(_fig1_fig4(set(), sign=+1)))
    assert "rises as a head's attention concentrates (Spearman ρ = +1.00" in rises
    assert "the more diffuse heads do lose separable tokens" in rises and "do not explain" not in rises
    flat = why("p1-fig3-saturation", claim_kinds.failure_facts(_fig1_fig4(set(), sign=0)))
    assert "hardly changes" in flat
    assert "sample size is the number of heads: 10 on this model against GPT-2's 144. Fewer heads" in \
        why("p1-fig2c-critical", facts)
    assert why("p1-cor3-paper", facts).endswith("holds. Here every failing row is at T ≤ 0.1, where the curve is √2.")
    late = claim_kinds.failure_facts(_fig1_fig4({1.0}))            # a failure above T = 0.17: no such sentence
    assert why("p1-cor3-paper", late).endswith("holds. ")
    assert "1{X < r} ≥ 1 − X/r" in why("p1-thm2-lower", facts)      # literal braces survive the formatting
    assert why("p1-unknown", facts) == claim_kinds.NO_EXPLANATION


def test_failures_say_why_or_that_every_claim_holds():
    results = _fig1_fig4(set())
    ok = claim_views.failures([{"id": "p1-cor1", "verdict": "holds"}], results)
    assert [h.data for h in ok] == ["<p>Every claim holds on this model.</p>"]
    (bad,) = claim_views.failures([{"id": "p1-thm1-a", "claim": "c", "measured": "m", "verdict": "does not hold"},
                                   {"id": "p1-cor1", "verdict": "holds"}], results)
    assert "<code>p1-thm1-a</code>" in bad.data and "<b>Why:</b> A failure would be a bug." in bad.data


def test_claim_tables_colour_the_verdicts_and_count_each_kind():
    rows = [{"id": "p1-cor1", "claim": "c", "paper": "p", "measured": "m", "verdict": "holds"},
            {"id": "p1-fig2b-plateau", "claim": "c", "paper": "p", "measured": "m", "verdict": "does not hold"}]
    html = claim_views.claim_table(rows).data
    assert '<b class="attnlab-verdict" data-verdict="does not hold" style="color:#cf222e">does not hold</b>' in html
    assert '<td data-label="verdict" ' in html and '<td data-label="id" ' in html      # the phone's card labels
    summary = claim_views.kind_summary(rows).data
    cells = [c.rsplit(">", 1)[1] for c in summary.split("</td>")[:-1]]
    assert cells == [THEOREM, "1", "1", "0", "0", PRINTED, "0", "0", "0", "0", EMPIRICAL, "1", "0", "1", "0"]


def _reading_rows():
    rows = []
    for e in ("E1", "E4"):
        for x, v in (("v", "holds"), ("hidden", "does not hold")):
            rows.append({"id": "p1-cor2-bounded", "reading": f"{e} / {'b' if e == 'E4' else '-'} / {x}", "verdict": v})
    return rows


def test_verdict_matrix_and_counts_read_the_reading_rows(monkeypatch):
    monkeypatch.setattr(claim_views.readings, "E_READINGS", {"E1": None, "E4": None})
    monkeypatch.setattr(claim_views.readings, "D_READINGS", {"a": None, "b": None})
    monkeypatch.setattr(claim_views.readings, "VECTORS", {"v": None, "hidden": None})
    m = claim_views.verdict_matrix(_reading_rows(), "p1-cor2-bounded")
    # rows E1/a, E1/b (both read E1's '-' row), E4/a (no row), E4/b
    assert m.tolist()[:2] == [[1.0, 0.0], [1.0, 0.0]] and all(math.isnan(x) for x in m[2]) and m[3].tolist() == [1, 0]
    assert claim_views.holding_count(_reading_rows(), "p1-cor2-bounded", "E1 / ") == "1 of 2"
    assert claim_views.holding_count(_reading_rows(), "p1-cor2-bounded", "E9 / ") == "–"


def test_live_head_draws_one_head_against_the_mean():
    rows = [{"layer": 0, "head": h, "L": L, "N": N, "max_weight": 1 / L, "dtilde_b": 0.1 * h, "ns_frac": 0.5}
            for h in (0, 1) for L in (64, 128, 256) for N in (1, 16)]
    res = Result("x", rows)
    curves = claim_views.head_curves({"fig1": res, "fig2a": res, "fig3": res})
    xs, mean, per, by, _ = curves[1]
    assert xs == [64, 128, 256] and by == "L" and mean == pytest.approx([0.05] * 3) and per[(0, 1)] == [0.1] * 3
    fig = claim_views.live_head(curves, 0, 1)
    assert len(fig.axes) == 3 and fig.axes[2].get_ylim() == (0, 1.02)


def test_first_flips_restore_the_threshold(monkeypatch):
    from attnlab.normalization import claims

    def checker(results):
        return [{"id": "p1-x", "verdict": "holds" if claims.PLATEAU_REL < 1 else "does not hold"}]

    monkeypatch.setattr(claims, "paper1_claims", checker)
    before = claims.PLATEAU_REL
    (line,) = claim_views.first_flips({}, {"PLATEAU_REL": [0.5, 2.0, 5.0]})
    assert line == f"PLATEAU_REL = {before}: at 2.0 -> p1-x flips" and claims.PLATEAU_REL == before
    (line,) = claim_views.first_flips({}, {"PLATEAU_REL": [0.5]})
    assert line.endswith("no verdict flips over [0.5]")


def test_time_updates_draws_n_times_and_reports_the_median(capsys):
    from matplotlib.figure import Figure

    calls = []

    def draw(a, b):
        calls.append((a, b))
        return Figure(figsize=(1, 1))

    ms = widgets.time_updates(draw, 1, 2, n=3, what="compute + draw")
    assert calls == [(1, 2)] * 3 and ms >= 0
    assert "one update of the live slider (compute + draw): median" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


def test_the_registry_has_one_entry_per_claim_the_checker_makes_and_the_chapter_map_reads_it():
    """normalization.claim_kinds.CLAIMS is the one table: every default claim id of `paper1_claims` is in it (with a
    chapter), the chapter map's paper-1 labels are its labels, and its thresholds are the checker's constants."""
    from attnlab.normalization import claims as checker

    ids = [r["id"] for r in checker.paper1_claims({})]
    assert sorted(ids) == sorted(claim_kinds.CLAIMS)
    mapped = {cid: label for _, _, _, labels in book.CHAPTER_CLAIMS for cid, label in labels.items()
              if cid.startswith("p1-")}
    assert mapped == {cid: c.label for cid, c in claim_kinds.CLAIMS.items()}
    assert claim_kinds.thresholds()["p1-fig2c-critical"] == [checker.CRITICAL_FRAC]
    assert claim_kinds.thresholds()["p1-fig4-slope"] == [-1 - checker.SLOPE_TOL, -1 + checker.SLOPE_TOL]


def test_theorem1_counts_mark_the_cross_pairs_as_not_counted():
    """Chapter 6's counts table marks the pairs of E and d~ that no formula of the paper makes, as chapter 3 does."""
    from attnlab.normalization import readings

    html = claim_views.theorem1_counts([], {}).data
    for e in readings.E_READINGS:
        for d in readings.D_READINGS:
            marked = f"{e} / {d}<br><small>cross pair: not counted" in html
            assert marked == (not readings.is_paper_pair(e, d)), (e, d)


def test_e4a_spans_read_every_length_and_count_none_found_as_l():
    rows = [{"kind": "critical", "e": "E4", "d": "a", "vectors": v, "L": L, "critical_n": n, "critical_frac": n / L}
            for v, L, n in (("v", 128, 1), ("v", 64, 1), ("k", 64, -1), ("k", 128, 8))]
    rows.append({"kind": "critical", "e": "E1", "d": "a", "vectors": "v", "L": 64, "critical_n": 60,
                 "critical_frac": 60 / 64})
    got = claim_views._e4a_by_vectors(rows)
    assert got == {"v": [1 / 64, 1 / 128], "k": [1.0, 8 / 128]}
    assert claim_views._frac_span(got["v"]) == "0.0078–0.016 L" and claim_views._frac_span([]) == "–"


def test_verdict_table_shows_claim_paper_measured_and_a_bold_verdict():
    rows = [{"id": "p1-fig4-slope", "claim": "g falls as 1/T", "paper": "-1", "measured": "-0.9", "verdict": "holds"}]
    html = claim_views.verdict_table(rows).data
    assert html.count("<tr>") == 2 and "<b>holds</b>" in html and "p1-fig4-slope" not in html
