"""The claim registries (normalization/claims.toml, read by `claim_kinds`; paper 2's sample_complexity/claims.toml,
read by the same loader) are the one source of what a claim is: every claim id the package, the views and the
chapters use is in them, every entry has every field, and the checks read their thresholds, texts and units (a
threshold changed in a registry moves the verdict)."""
import ast
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import attnlab
from attnlab import book
from attnlab.core.result import Result
from attnlab.normalization import claim_kinds as registry
from attnlab.normalization import claims as checker

ROOT = Path(attnlab.__file__).parent.parent
ID = re.compile(r"""["'](p1-[a-z0-9-]+)["']""")


def _used_ids() -> dict[str, list[str]]:
    """{claim id (or id prefix) quoted in a package module or a chapter's code cell: [where]}."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "attnlab").rglob("*.py")):
        for cid in ID.findall(path.read_text(encoding="utf-8")):
            found.setdefault(cid, []).append(path.name)
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                for cid in ID.findall("".join(cell["source"])):
                    found.setdefault(cid, []).append(path.name)
    return found


def test_every_claim_id_used_anywhere_is_in_the_registry():
    used = _used_ids()
    assert {"p1-cor1", "p1-fig2c-critical", "p1-cor2-i"} <= set(used)            # the scan sees the sources
    # an id, or a prefix the views match ids with (views.claims.OF_FIGURE: "p1-thm1" -> p1-thm1-R, -B, -a)
    unknown = {cid: where for cid, where in used.items()
               if cid not in registry.ALL_CLAIMS and not any(k.startswith(cid + "-") for k in registry.ALL_CLAIMS)}
    assert not unknown, unknown


def test_the_checker_the_views_the_chapter_map_and_the_windows_use_registry_ids():
    from attnlab.views import claims as claim_views
    from attnlab.views import distance

    assert sorted(r["id"] for r in checker.paper1_claims({})) == sorted(registry.CLAIMS)
    mapped = [cid for *_, labels in book.CHAPTER_CLAIMS for cid in labels if cid.startswith("p1-")]
    assert mapped == list(registry.CLAIMS)
    for cid, label in distance.CLAIM_LABELS:
        assert label == registry.CLAIMS[cid].label
    statements = [c for c, _ in claim_views.STATEMENTS] + [c for c, _ in distance.COR2_STATEMENTS]
    assert set(statements) <= set(registry.ALL_CLAIMS)
    assert set(registry.thresholds()) <= set(registry.CLAIMS)


def test_every_entry_has_every_field_filled():
    facts = {"L_top": 512, "max_weight": 0.25, "cor3_flat": "", "sep_relation": "", "heads_note": ""}
    chapters = {number for number, *_ in book.CHAPTER_CLAIMS}
    assert registry.READING_CLAIMS and set(registry.READING_CLAIMS).isdisjoint(registry.CLAIMS)
    for cid, c in registry.ALL_CLAIMS.items():
        for field in ("kind", "chapter", "label", "paper", "claim", "unit", "compare", "failure", "tolerance"):
            assert isinstance(getattr(c, field), str) and getattr(c, field).strip(), (cid, field)
        assert c.kind in registry.KINDS and c.chapter in chapters, cid
        assert (c.compare == "every row") == (c.threshold == ""), cid
        assert all(t in registry.THRESHOLDS for t in (c.threshold, *c.also) if t), cid
        assert not re.search(r"\{[A-Za-z_]", registry.claim_text(cid, eps=1e-3)), cid     # every field filled in
        assert registry.why(cid, facts) != registry.NO_EXPLANATION
    for t in registry.THRESHOLDS.values():
        assert t.means.strip() and t.source in ("paper", "book") and t.value is not None


def test_a_table_with_a_missing_or_empty_field_is_refused(tmp_path):
    text = registry.REGISTRY_FILE.read_text(encoding="utf-8")
    no_unit = tmp_path / "a.toml"
    no_unit.write_text(text.replace('unit = "drop factor"\n', ""), encoding="utf-8")
    with pytest.raises(ValueError, match="p1-fig4-drop.*unit"):
        registry.load(no_unit)
    empty = tmp_path / "b.toml"
    empty.write_text(text.replace('unit = "drop factor"', 'unit = " "'), encoding="utf-8")
    with pytest.raises(ValueError, match="p1-fig4-drop: empty or wrong unit"):
        registry.load(empty)
    bad = tmp_path / "c.toml"
    bad.write_text(text.replace('threshold = "DROP_FACTOR"', 'threshold = "DROP"'), encoding="utf-8")
    with pytest.raises(ValueError, match="p1-fig4-drop: empty or wrong threshold"):
        registry.load(bad)


def test_the_paper_s_numbers_stay_in_paper_py_and_the_book_s_only_in_the_registry():
    """No module assigns a number to a threshold name the registry holds as this book's reading (one place), and
    the paper's thresholds are `normalization.paper`'s values."""
    from attnlab.normalization import paper

    book_names = {n for n, t in registry.THRESHOLDS.items() if t.source == "book"}
    for path in sorted((ROOT / "attnlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                assert not names & book_names, (path.name, node.lineno, names & book_names)
    assert registry.THRESHOLDS["CRITICAL_FRAC"].value == paper.CRITICAL_FRAC
    assert registry.THRESHOLDS["SEPARABILITY_BAND"].value == paper.SEPARABILITY_BAND


# ------------------------------------------------------------- the checks read the registry's thresholds


def _heads(rows):
    return [dict(r, window=0, layer=0, head=h) for r in rows for h in (0, 1)]


def _results() -> dict[str, Result]:
    """Tiny Results whose claim numbers sit between the test values below: plateau 0.25, largest N*/L 0.125,
    median N_s/N 0.6, Fig. 4's slope -0.8 and drop 0.01^-0.8 ~ 39.8."""
    fig2b = _heads([dict(L=128, N=N, dtilde_b=d, dmax_B=1.0, dmax_R=1.0, n_rows=10, holds_B=1.0, holds_R=1.0,
                         holds_a=1.0) for N, d in ((1, 0.1), (20, 0.3), (100, 0.375))])
    fig2c = _heads([dict(L=L, critical_n=n, critical_frac=n / L) for L, n in ((64, 8), (128, 8))])
    fig3 = _heads([dict(L=128, N=N, ns_frac=f, lower_holds=1.0, upper_B_holds=1.0, upper_R_holds=1.0)
                   for N, f in ((1, 1.0), (16, 0.6), (32, 0.6))])
    Ts = [0.01, 0.02, 0.05, 0.1, 1.0, 2.0]
    fig4 = _heads([dict(T=T, eps=e, g_max=s * T ** -0.8, holds_paper=1.0, holds_exact=1.0)
                   for T in Ts for e, s in ((1e-3, 2.0), (1e-1, 1.0))])
    return {n: Result(n, rows, {"model": "m"}) for n, rows in
            (("fig2b", fig2b), ("fig2c", fig2c), ("fig3", fig3), ("fig4", fig4))}


def _moved(monkeypatch, thresholds: dict, check, results: dict, cid: str, name: str, good, bad):
    """Threshold `name` of registry `thresholds` set to `good`, then to `bad`: the row of claim `cid` that
    `check(results)` gives holds, then does not; yields (value, verdict, row) for the caller's own checks."""
    for value, verdict in ((good, "holds"), (bad, "does not hold")):
        monkeypatch.setitem(thresholds, name, replace(thresholds[name], value=value))
        row = next(r for r in check(results) if r["id"] == cid)
        assert row["verdict"] == verdict, (value, row["measured"])
        yield value, verdict, row


# (claim id, threshold, a value at which the claim holds, one at which it does not)
MOVES = [("p1-fig2b-plateau", "PLATEAU_REL", 0.3, 0.2), ("p1-fig2c-critical", "CRITICAL_FRAC", 0.2, 0.1),
         ("p1-fig3-saturation", "SEPARABILITY_BAND", (0.5, 0.9), (0.7, 0.85)),
         ("p1-fig4-slope", "SLOPE_TOL", 0.25, 0.1), ("p1-fig4-drop", "DROP_FACTOR", 30.0, 100.0)]


@pytest.mark.parametrize("cid, name, good, bad", MOVES)
def test_a_threshold_changed_in_the_registry_moves_the_verdict_and_the_text(monkeypatch, cid, name, good, bad):
    results, texts = _results(), set()
    for value, verdict, row in _moved(monkeypatch, registry.THRESHOLDS, checker.paper1_claims, results, cid, name,
                                      good, bad):
        assert row["claim"] == registry.claim_text(cid, eps=1e-3)
        texts.add(row["claim"])
        assert row["paper"] == registry.CLAIMS[cid].paper and row["unit"] == registry.CLAIMS[cid].unit
        assert registry.thresholds()[cid] == registry.lines(cid) and getattr(checker, name) == value
        with registry.trial(**{name: good if value == bad else bad}):     # a trial moves it back, then restores
            assert next(r for r in checker.paper1_claims(results) if r["id"] == cid)["verdict"] != verdict
        assert next(r for r in checker.paper1_claims(results) if r["id"] == cid)["verdict"] == verdict
    assert len(texts) == 2                                   # the test's text states the threshold it used


def test_the_six_percent_views_read_the_critical_frac_when_used(monkeypatch):
    """Chapter 3's table, prose and figures and the figure's alt text (`views.six_percent`, `views.describe`) read
    CRITICAL_FRAC from the registry when they run, not when imported: a patched threshold moves what they decide and
    say. Critical N: 8 of L = 64 (12.5%), 20 of L = 128 (15.6%): beyond 0.06 L, within 0.2 L."""
    from types import SimpleNamespace

    from attnlab.normalization.plots import plot_fig2c
    from attnlab.views import describe, six_percent

    rc = Result("fig2c", [dict(L=L, N=n, pvalue=p, p_upper=p, critical_n=crit, n_heads=4, d_mean=1.0, e_mean=1.0)
                          for L, crit in ((64, 8), (128, 20)) for n, p in ((crit // 2, 1e-9), (crit, 0.5))],
                {"model": "m", "text": "t", "runtime_seconds": 1.0})
    scan, model = six_percent.scans(rc), SimpleNamespace(name="m", n_layers=1, n_heads=4, causal=True)
    said = {}
    for value in (0.06, 0.2):
        monkeypatch.setitem(registry.THRESHOLDS, "CRITICAL_FRAC", replace(registry.THRESHOLDS["CRITICAL_FRAC"],
                                                                          value=value))
        table = six_percent.critical_table(scan).data
        prose = six_percent.differs_prose(scan, [], rc, model).data
        legend = [t.get_text() for t in plot_fig2c(rc).axes[0].get_legend().get_texts()]
        said[value] = (f"within {value:g} L?" in table, table.count(">yes<"), "the claim reproduces" in prose,
                       f"stays below {value} L" in prose, f"paper's {value:.0%} of L" in describe.describe("fig2c", rc),
                       f"{value} L" in legend)
    assert said == {0.06: (True, 0, False, True, True, True), 0.2: (True, 2, True, True, True, True)}


def test_the_sweep_tries_thresholds_through_the_registry_and_leaves_it_as_it_was():
    from attnlab.views import claims as claim_views

    results, before = _results(), dict(registry.THRESHOLDS)
    (line,) = claim_views.first_flips(results, {"PLATEAU_REL": [0.5, 0.2]})
    assert line == "PLATEAU_REL = 0.25: at 0.2 -> p1-fig2b-plateau flips"
    assert registry.THRESHOLDS == before and registry.threshold("PLATEAU_REL") == 0.25
    with pytest.raises(ValueError, match="no such threshold"), registry.trial(PLATEAU=1.0):
        pass


def test_the_reading_rows_read_the_registry_too(monkeypatch):
    """Chapter 2's Cor. 2(i) rows carry the gap their verdict reads (the view reads that number, not the text)."""
    from attnlab.normalization.readings import theorem1

    Ls, rows = (64, 128, 256), []
    for vec in ("v",):
        for L in Ls:
            for N in (1, 5, L - 1):
                e = {"E1": 1.2, "E2": 0.01 * L, "E3": 1.1, "E4_a": 1.0, "E4_b": 1.0, "E5": 0.02 * L}
                rows.append(dict(kind="curve", vectors=vec, L=L, N=N, layer=0, head=0, window=0, d_a=0.1 * L,
                                 d_b=0.2 * L, sum_y=1.0, x_max=2.0, **{k: v / N for k, v in e.items()}))
    res = Result("thm1_readings", rows, {"model": "m", "vectors": ["v"], "pairs": [["E1", "b"]]})
    cor2 = {r["reading"]: r for r in theorem1.reading_claims({"thm1_readings": res}) if r["id"] == "p1-cor2-i"}
    e1 = cor2["E1 / - / v"]
    assert e1["value"] == pytest.approx(abs(1.2 / 5 - 1.0)) and e1["verdict"] == "does not hold"    # gap 0.76
    assert e1["claim"] == registry.claim_text("p1-cor2-i") and e1["unit"] == registry.READING_CLAIMS["p1-cor2-i"].unit
    monkeypatch.setitem(registry.THRESHOLDS, "COR2_GAP", replace(registry.THRESHOLDS["COR2_GAP"], value=0.8))
    cor2 = {r["reading"]: r for r in theorem1.reading_claims({"thm1_readings": res}) if r["id"] == "p1-cor2-i"}
    assert cor2["E1 / - / v"]["verdict"] == "holds" and "80%" in cor2["E1 / - / v"]["claim"]
    assert np.isfinite(cor2["E2 / - / v"]["value"])


# ------------------------------------------------ paper 2's registry (sample_complexity/claims.toml, same loader)

TSC_ID = re.compile(r"""["'](tsc-[a-z0-9-]+)["']""")


def test_every_tsc_claim_id_used_anywhere_is_in_paper_2_s_registry():
    from attnlab.sample_complexity import claims as scc

    found: dict[str, list[str]] = {}
    sources = [(p.name, p.read_text(encoding="utf-8")) for p in sorted((ROOT / "attnlab").rglob("*.py"))]
    sources += [(p.name, "".join(c["source"])) for p in sorted((ROOT / "book").glob("*.ipynb"))
                for c in json.loads(p.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    for where, text in sources:
        for cid in TSC_ID.findall(text):
            found.setdefault(cid, []).append(where)
    assert {"tsc-uniform-rate", "tsc-hardmax", "tsc-real"} <= set(found)                 # the scan sees the sources
    unknown = {cid: where for cid, where in found.items()
               if cid not in scc.CLAIMS and not any(k.startswith(cid + "-") for k in scc.CLAIMS)}
    assert not unknown, unknown
    # the checker's rows, the chapter map and the registry: the same ids in the same order; paper 1's stay apart
    assert [r["id"] for r in scc.tsc_claims({})] == list(scc.CLAIMS)
    mapped = {cid: label for *_, labels in book.CHAPTER_CLAIMS for cid, label in labels.items()
              if cid.startswith("tsc-")}
    assert mapped == {cid: c.label for cid, c in scc.CLAIMS.items()}
    assert set(scc.CLAIMS).isdisjoint(registry.ALL_CLAIMS) and len(registry.CLAIMS) == 16


def test_every_tsc_entry_has_every_field_filled_and_its_numbers_only_there():
    from attnlab.sample_complexity import claims as scc

    chapters = {number for number, *_ in book.CHAPTER_CLAIMS}
    for cid, c in scc.CLAIMS.items():
        for field in ("kind", "chapter", "label", "paper", "claim", "unit", "compare", "failure", "tolerance"):
            assert isinstance(getattr(c, field), str) and getattr(c, field).strip(), (cid, field)
        assert c.kind in registry.KINDS and c.chapter in chapters and c.threshold in scc.THRESHOLDS, cid
        assert all(t in scc.THRESHOLDS for t in c.also), cid
        assert not re.search(r"[{}]", scc.claim_text(cid)) and scc.why(cid) == c.failure, cid
    for t in scc.THRESHOLDS.values():
        assert t.means.strip() and t.source == "book" and isinstance(t.value, float)
    for path in sorted((ROOT / "attnlab").rglob("*.py")):             # no module assigns a registry threshold's name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                assert not names & set(scc.THRESHOLDS), (path.name, node.lineno, names & set(scc.THRESHOLDS))


def _tsc_results() -> dict[str, Result]:
    """Tiny Results whose numbers sit between the test values below: uniform slopes -0.42 and measured/derived
    constants 1.5; a moment |beta| 0.40 against beta(H) 0.45 with se 0; the hardmax covariance slope -0.15."""
    uni = [dict(kind="fit", R=R, slope=-0.42, slope_se=0.01, C=1.5 * c, C_pred=c) for R, c in ((1.0, 2.0), (2.0, 5.0))]
    mom = [dict(kind="fit", reference="exact", scale=s, moment=m, beta=0.40, beta_ref=0.45, slope_se=0.0, horizon=1.0)
           for s in (1.0, 2.0) for m in ("mean", "cov")]
    hard = [dict(kind="fit", reference="exact", scale=s, moment=m, slope=-0.15, slope_se=0.01, horizon=10.0 * s)
            for s in (1.0, 2.0) for m in ("mean", "cov")]
    return {n: Result(n, rows, {"model": None}) for n, rows in
            (("tsc_uniform", uni), ("tsc_moments", mom), ("tsc_hardmax", hard))}


# (claim id, threshold, a value at which the claim holds, one at which it does not)
TSC_MOVES = [("tsc-uniform-rate", "RATE_TOL", 0.1, 0.05), ("tsc-uniform-constant", "C_FACTOR", 2.0, 1.2),
             ("tsc-moments-beta", "BETA_TOL_FLOOR", 0.06, 0.03), ("tsc-hardmax", "HARDMAX_SLOPE", 0.2, 0.1)]


@pytest.mark.parametrize("cid, name, good, bad", TSC_MOVES)
def test_a_tsc_threshold_changed_in_the_registry_moves_the_verdict(monkeypatch, cid, name, good, bad):
    from attnlab.sample_complexity import claims as scc

    texts = set()
    for _, _, row in _moved(monkeypatch, scc.THRESHOLDS, scc.tsc_claims, _tsc_results(), cid, name, good, bad):
        assert row["claim"].startswith(scc.claim_text(cid)) and row["paper"] == scc.CLAIMS[cid].paper
        texts.add(row["claim"] + row["measured"])
    assert len(texts) == 2                                   # the row states the threshold it used


def test_the_tsc_margin_reads_the_registry(monkeypatch):
    """The per-head margin max(BETA_SE_FACTOR se, BETA_TOL_FLOOR): a larger se factor turns a fit below beta(H)
    by 0.05 with se 0.03 from a failure (margin max(1 * 0.03, 0.03)) into a pass (max(2 * 0.03, 0.03))."""
    from attnlab.sample_complexity import claims as scc

    assert scc.beta_at_or_above(0.40, 0.45, 0.03) and scc.margin_text() == "max(2 se, 0.03)"
    monkeypatch.setitem(scc.THRESHOLDS, "BETA_SE_FACTOR", replace(scc.THRESHOLDS["BETA_SE_FACTOR"], value=1.0))
    assert not scc.beta_at_or_above(0.40, 0.45, 0.03) and scc.margin_text() == "max(1 se, 0.03)"
