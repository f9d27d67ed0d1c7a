"""Captions a learner can trust (issue 50): no figure caption, table caption or alt text holds an internal id (a
sha256 prefix in parentheses, a parameter dump such as "x=v, keys=visible" or "preset default, k=24, cpu") or an
unformatted template ("{alpha}", "10^log10_alpha"). Checked on the code that writes them (the figure titles, which
are the captions' default, and the live sliders' alt text) and on the committed chapters' outputs."""
from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np

from attnlab.core.result import Result

ROOT = Path(__file__).resolve().parent.parent
#: what a reader should never read in a caption: name -> pattern
INTERNAL = {
    "sha prefix": re.compile(r"\([0-9a-f]{8}\)"),
    "parameter dump": re.compile(r"\b(?:x|keys)=\w|preset \w+, k=\d+|\b[a-z][a-z0-9]*_[a-z0-9_]+ = -?\d"),
    "template": re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}|10\^log10_"),
}

def internal(text: str) -> list[str]:
    """The kinds of internal text in `text` ([] when it reads as a reader's)."""
    return [name for name, pattern in INTERNAL.items() if pattern.search(text)]


def _provenance(**extra) -> dict:
    return {"model": "smollm2", "model_info": {"model_note": "SmolLM2, 4-bit (Q4_1) weights"}, "text": "war_and_peace",
            "text_sha256": "aa4a454fb73861c0c84c662ed1fa3ddd71bbd7a237783932c05d5f3b2cdd6718", "x": "v",
            "keys": "visible", "window_tokens": 1024, "n_windows": 1, "window_offsets": 0, **extra}


def test_the_pattern_finds_the_old_captions():
    assert internal("smollm2 (4-bit weights) on war_and_peace (aa4a454f), x=v, keys=visible") == \
        ["sha prefix", "parameter dump"]
    assert internal("Uniform map convergence, d=4 (uniform_map, preset default, k=24, cpu)") == ["parameter dump"]
    assert internal("the critical N at the level α = 10^log10_α (L = 1024, log10_alpha = -2.0)") == \
        ["parameter dump", "template"]
    assert internal("critical N at α = {alpha}") == ["template"]
    assert internal("Fig. 2a: distance vs L (N = 5), d=4, rho=1.0, \\(d_{\\max}\\)") == []


def test_paper_one_figure_titles_name_the_text_and_the_vectors_in_words():
    from attnlab.normalization.plots import title
    from attnlab.views.describe import _who

    line = title(Result("fig1", [], _provenance()), "Fig. 1: vanishing attention").split("\n")[1]
    assert line == ("smollm2 (4-bit weights) on War and Peace, first 1024 tokens; x = value vectors, "
                    "keys = visible ones"), line
    several = title(Result("fig1", [], _provenance(n_windows=4, window_tokens=512, text="wikitext2",
                                                   x="hidden", keys="all")), "t")
    assert "on WikiText-2, 4 windows of 512 tokens; x = layer inputs (hidden states), keys = all" in several
    assert "1024 tokens from token 5000" in title(Result("fig1", [], _provenance(window_offsets=[5000])), "t")
    assert _who(Result("fig1", [], _provenance())) == "smollm2 (4-bit weights) on War and Peace"
    for text in (line, several, _who(Result("fig1", [], _provenance()))):
        assert not internal(text), text


def test_claim_rows_name_the_vectors_in_words():
    from attnlab.normalization.claims import _model

    assert _model(Result("fig1", [], _provenance())) == "smollm2; x = value vectors, keys = visible ones"


def test_sample_complexity_titles_say_grid_draws_and_device():
    from attnlab.sample_complexity.plots import _title

    prov = {"experiment": "uniform_map", "preset": "default", "k": 24, "device": "cpu"}
    text = _title(Result("tsc_uniform", [], prov), "Uniform map convergence, N(0, rho I_d), d=4, rho=1.0, H=0.4")
    assert text.endswith("\n(default grid, 24 draws per point, CPU)"), text
    assert _title(Result("t", [], {**prov, "preset": "quick", "device": "cuda:0"}), "w").endswith(
        "(quick grid, 24 draws per point, GPU)")
    assert not internal(text)


def test_the_level_figure_lists_each_level_once():
    """Fig. 3.1 at α = 0.01 once listed "α = 0.01" twice (the reference curve and the level's own)."""
    import matplotlib.pyplot as plt

    from attnlab.views.six_percent import alpha_frame

    scan = {L: [{"N": n, "pvalue": p, "p_upper": p, "n_heads": 30, "critical_n": 3 * L // 8}
                for n, p in zip(range(1, L // 2, L // 8), np.geomspace(1e-30, 0.5, 4))] for L in (32, 64, 128)}
    for alpha, want in ((0.01, ["0.06 L (paper)", "α = 0.01"]), (1e-5, ["0.06 L (paper)", "α = 0.01", "α = 1e-05"])):
        fig = alpha_frame(scan, alpha)
        labels = [t.get_text() for t in fig.legends[0].get_texts()][:len(want)]   # first panel's, then the kinds'
        plt.close(fig)
        assert labels == want, (alpha, labels)


def test_a_live_sliders_alt_text_and_note_name_the_sliders_as_they_read():
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from attnlab import widgets as aw

    def draw(L, log10_alpha):
        fig, ax = plt.subplots(figsize=(2, 1.5))
        ax.plot([0, 1], [0, L * log10_alpha])
        return fig

    box = aw.live_slider(draw, caption="The p-value against N at the level α the slider sets (as log10 α)",
                         L=widgets.SelectionSlider(options=[64, 128], value=128, description="L"),
                         log10_alpha=widgets.FloatSlider(value=-2.0, min=-4, max=-2, description="log10 α"))
    page = box._repr_mimebundle_()["text/html"]
    plt.close("all")
    assert "L = 128, log10 α = -2.0" in page and "A live slider (L, log10 α)" in page, page[-400:]
    assert "log10_alpha" not in page
    for _, text in _captions(page):
        assert not internal(text), text


def _captions(page: str) -> list[tuple[str, str]]:
    """(kind, text) of every figure caption, table caption and alt text in an HTML output (slider frames' too)."""
    found = [("figcaption", m) for m in re.findall(r"<figcaption[^>]*>(.*?)</figcaption>", page, re.S)]
    found += [("caption", m) for m in re.findall(r"<caption[^>]*>(.*?)</caption>", page, re.S)]
    found += [("alt", m) for m in re.findall(r'\balt="([^"]*)"', page)]
    for alts in re.findall(r'"alts": (\[.*?\])', page):
        found += [("slider alt", m) for m in re.findall(r'"((?:[^"\\]|\\.)*)"', alts)]
    return [(kind, html.unescape(re.sub(r"<[^>]+>", "", text))) for kind, text in found]


def _committed_captions() -> list[tuple[str, str, str]]:
    import nbformat

    out = []
    for path in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for output in cell.get("outputs", []):
                page = output.get("data", {}).get("text/html")
                if page:
                    out += [(path.name[:2], kind, text) for kind, text in _captions("".join(page))]
    return out


def test_the_committed_chapters_captions_hold_no_internal_ids():
    """Every caption and alt text stored in book/*.ipynb reads as a reader's: none holds an internal id or an
    unformatted template (the chapters' outputs as the last build refreshed them)."""
    found = _committed_captions()
    assert found, "no captions found in the committed chapters"
    bad = [(ch, kind, text) for ch, kind, text in found if internal(text)]
    assert not bad, f"{len(bad)} captions hold internal ids, e.g. {bad[:3]}"


def test_the_appendix_lists_each_gap_once_per_paper():
    """book/readings.md: one row per gap label in each paper's table (the second paper once had two G10 rows)."""
    page = (ROOT / "book" / "readings.md").read_text(encoding="utf-8")
    for table in re.split(r"\n## ", page):
        labels = re.findall(r"^\| (G\d+) \|", table, re.M)
        assert len(labels) == len(set(labels)), sorted(g for g in set(labels) if labels.count(g) > 1)


def test_chapter_1_and_the_appendix_say_what_the_text_cleaning_does():
    """War and Peace is read without its Gutenberg header and footer, from its first line (core/text.py), and both
    chapter 1 and the appendix say so (chapter 1 once said "header included")."""
    import nbformat

    from attnlab.core.text import CORPORA, strip_gutenberg

    spec = CORPORA["war_and_peace"]
    raw = (f"The Project Gutenberg eBook\n*** START OF THE PROJECT ***\nContents\n{spec.start}\n\n"
           f"{spec.start}\n\nCHAPTER I\n\nWell, Prince\n*** END OF THE PROJECT ***\nlicense\n")
    assert strip_gutenberg(raw, spec.start) == f"{spec.start}\n\nCHAPTER I\n\nWell, Prince\n"
    chapter = " ".join(c.source for c in nbformat.read(ROOT / "book" / "01_vanishing.ipynb", as_version=4).cells
                       if c.cell_type == "markdown")
    assert "header and footer and the table of contents\n  are stripped" in chapter
    assert not re.search(r"header\s+included", chapter)
    assert "Gutenberg header and footer stripped" in (ROOT / "book" / "readings.md").read_text(encoding="utf-8")



def test_chapter_7_says_what_its_censored_critical_n_reads():
    """Chapter 7's table shows "> x", x the largest scanned N over L (views.normalizers.cell): the text says so, with
    the compare scan's own grid at L = 1024 (it once said "> 0.25" where the table read "> 0.24")."""
    import nbformat

    from attnlab.tools.compare import CRIT_MAX_FRAC_COMPARE
    from attnlab.tools.diagnose import CRIT_STEP_FRAC, critical_grid
    from attnlab.views.normalizers import cell

    last = max(critical_grid(1024, max_frac=CRIT_MAX_FRAC_COMPARE, step_frac=CRIT_STEP_FRAC))
    shown = cell({"critical_n_censored": True, "critical_n_max": last, "L": 1024}, "critical_n_frac", "cost")
    text = " ".join(c.source for c in nbformat.read(ROOT / "book" / "07_beyond_softmax.ipynb", as_version=4).cells
                    if c.cell_type == "markdown")
    assert shown == "> 0.24" and f"$N = {last}$" in text and "$0.24$ at $L = 1024$" in text, (shown, last)
