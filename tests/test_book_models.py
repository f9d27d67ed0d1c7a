"""The landing page's chapter map and the closing chapter's summary put each claim under the model its Result was
computed with (its provenance), not under the build's model: chapter 9's claims are read from Results on synthetic
tokens (no model), chapter 10's from an encoder's."""
from __future__ import annotations

import re

import pytest

from attnlab import book
from attnlab.core.result import Result
from attnlab.core.verdicts import with_model
from attnlab.sample_complexity.claims import tsc_claims


def _sample_complexity_results(real_model: str = "minilm") -> dict[str, Result]:
    """The four Results chapter 9 and 10's claims read, small: three on synthetic tokens (no `model` in their
    provenance, as `sample_complexity.experiments` writes them), one on `real_model`."""
    fit = {"kind": "fit", "reference": "exact", "slope_se": 0.01, "horizon": 0.5}
    return {
        "tsc_uniform": Result("tsc_uniform", [dict(fit, R=1.0, slope=-0.5, C=1.0, C_pred=1.0),
                                              dict(fit, R=2.0, slope=-0.5, C=2.0, C_pred=2.0)],
                              {"experiment": "uniform_map", "tokens": "N(0, rho I_d)"}),
        "tsc_moments": Result("tsc_moments", [dict(fit, scale=1.0, moment="mean", beta=0.45, beta_ref=0.4)],
                              {"experiment": "moment_convergence"}),
        "tsc_hardmax": Result("tsc_hardmax", [dict(fit, scale=1.0, moment="cov", slope=-0.05)],
                              {"experiment": "hardmax"}),
        "tsc_real": Result("tsc_real", [dict(fit, layer=0, moment="mean", beta=0.45, beta_ref=0.4)],
                           {"experiment": "real_encoder", "model": real_model, "text": "wikitext2"}),
    }


def _paper1_rows(model: str) -> list[dict]:
    return [{"id": "p1-cor1", "claim": "c", "paper": "p", "measured": "m", "verdict": "holds", "model": model,
             "model_kind": "causal decoder"}]


def _columns(html: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(column names, {claim label: {column: cell text}}) of a chapter map."""
    text = lambda h: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", h)).strip()  # noqa: E731
    names = [text(h) for h in re.findall(r"<th [^>]*>(.*?)</th>", html)]
    rows = {}
    for tr in re.findall(r"<tr>(<td.*?)</tr>", html):
        cells = [text(c) for c in re.findall(r"<td [^>]*>(.*?)</td>", tr)]
        rows[cells[0]] = dict(zip(names[1:], cells[1:]))
    return names, rows


def test_each_sample_complexity_row_carries_its_results_model():
    results = _sample_complexity_results()
    rows = tsc_claims(results)
    source = {"tsc-uniform": "tsc_uniform", "tsc-moments": "tsc_moments", "tsc-hardmax": "tsc_hardmax",
              "tsc-real": "tsc_real"}
    for r in rows:
        fig = next(f for prefix, f in source.items() if r["id"].startswith(prefix))
        assert r["model"] == results[fig].provenance.get("model"), r
    assert {r["model"] for r in rows} == {None, "minilm"}
    assert all(r["model"] is None for r in tsc_claims({}))          # not run: no Result, no model


def test_rows_from_results_of_two_models_are_refused():
    a, b = Result("a", [], {"model": "smollm2"}), Result("b", [], {"model": "minilm"})
    assert with_model([{"id": "x"}], a, None) == [{"id": "x", "model": "smollm2"}]
    with pytest.raises(ValueError, match="several models"):
        with_model([{"id": "x"}], a, b)


@pytest.mark.parametrize("real_model", ["minilm", "some/encoder"])
def test_chapter_map_puts_each_claim_under_the_model_of_its_result(real_model):
    """SmolLM2 is the build's model; chapter 9's verdicts stand only in the no-model column, chapter 10's only
    in the column of the encoder its Result names (a column of its own when the map has none for it)."""
    per_model = {"smollm2": _paper1_rows("smollm2"), "minilm": _paper1_rows("minilm")}
    rows = _paper1_rows("smollm2") + tsc_claims(_sample_complexity_results(real_model))
    names, table = _columns(book.chapter_map(rows, per_model).data)
    synthetic = next(n for n in names if n.startswith("synthetic tokens"))
    encoder = next(n for n in names if n.split()[0] == real_model)
    assert names[-1] == synthetic
    for label in ("the map converges like C(R)/√n", "C(R) grows with R", "near the hardmax"):
        row = next(v for k, v in table.items() if label in k)
        assert row[synthetic] == "holds" and all(v == "—" for n, v in row.items() if n != synthetic), row
    for label in ("per-layer β on a real encoder", "per-head β"):
        row = next(v for k, v in table.items() if label in k)
        assert row[encoder] != "—" and all(v == "—" for n, v in row.items() if n != encoder), row
    cor1 = next(v for k, v in table.items() if "Corollary 1" in k)
    assert cor1[names[1]] == "holds" and cor1[synthetic] == "—"


def test_verdict_summary_groups_the_claims_by_the_model_of_their_result():
    rows = _paper1_rows("smollm2") + tsc_claims(_sample_complexity_results())
    html = book.verdict_summary(rows).data
    groups = re.split(r'<p class="attnlab-model-group">', html)[1:]
    titles = [re.sub(r"<[^>]+>", "", g[:g.index("</p>")]) for g in groups]
    assert titles[0].startswith("Computed with SmolLM2") and titles[1].startswith("Computed with all-MiniLM")
    assert titles[2] == "Computed on synthetic tokens (no model)", titles
    chapters = [set(re.findall(r"chapter (\d+)</a>", g)) for g in groups]
    assert "9" not in chapters[0] | chapters[1] and "10" not in chapters[0] | chapters[2]
    assert chapters[1] == {"10"} and chapters[2] == {"9"}


def test_a_row_without_a_model_is_an_error_not_the_builds_model():
    with pytest.raises(ValueError, match="has no `model`"):
        book.chapter_map([{"id": "tsc-hardmax", "verdict": "holds"}])
