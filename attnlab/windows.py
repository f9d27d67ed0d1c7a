"""Text windows as a dimension of every paper-1 claim: the same claims on several non-overlapping windows of
War and Peace and of the WikiText-2 test split, each claim's verdict per window, and a summary (median and range
of the number the verdict turns on; "robust" when every window gives the same verdict, else "depends on the
window"). Data flow: corpus -> `text_windows` (stated character offsets) -> `Workspace(start=...)` -> cached
Results per window -> claim rows per window -> `window_summary`. `pooled_critical_n` runs Fig. 2c's KS test once
on the heads of every window together.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from attnlab.core.cache import cached, model_key
from attnlab.core.result import Result
from attnlab.core.util import progress as progress_bar
from attnlab.core.verdicts import holds_le
from attnlab.figures import claim_rows, model_kind
from attnlab.normalization.claim_kinds import threshold, thresholds
from attnlab.workspace import Workspace

#: the corpora every window set draws from: the paper's novel, and a second corpus of another kind
WINDOW_CORPORA = ("war_and_peace", "wikitext2")
#: the book's window set: this many windows of each corpus, lengths up to BOOK_MAX_LENGTH
BOOK_WINDOWS, BOOK_MAX_LENGTH = 4, 512
ROBUST, DEPENDS = "robust", "depends on the window"


@dataclass(frozen=True)
class TextWindow:
    """One window: `corpus` (a `core.text.CORPORA` name), its index among the corpus's windows, and `start`, the
    character of the cleaned text where its tokens begin (the start of a paragraph)."""

    corpus: str
    index: int
    start: int

    @property
    def label(self) -> str:
        short = {"war_and_peace": "W&P", "wikitext2": "WikiText-2"}.get(self.corpus, self.corpus)
        return f"{short} #{self.index + 1}"


def window_starts(text: str, k: int) -> list[int]:
    """k character offsets that cut `text` into k equal parts, each moved forward to the next paragraph start
    (after a blank line; after a line break in texts without blank lines, such as WikiText-2, whose paragraphs
    are lines); the first is 0 (the text's start: the novel's first chapter, the book's usual window)."""
    if k < 1:
        raise ValueError(f"the number of windows must be at least 1, got {k}")
    sep = "\n\n" if "\n\n" in text else "\n"
    starts = [0]
    for i in range(1, k):
        at = text.find(sep, len(text) * i // k)
        if at < 0:
            raise ValueError(f"the text has no paragraph start after {i}/{k} of its length: use fewer windows")
        starts.append(at + len(sep))
    return starts


def text_windows(k: int, corpora: Sequence[str] = WINDOW_CORPORA) -> list[TextWindow]:
    """k windows of each corpus in `corpora` (`window_starts` of its cleaned text)."""
    from attnlab.core.text import load_corpus

    return [TextWindow(name, i, start) for name in corpora
            for i, start in enumerate(window_starts(load_corpus(name).text, k))]


def window_inputs(model: str, device: str, windows: Sequence[TextWindow], max_length: int) -> list[Workspace]:
    """One `Workspace` per window, sharing one loaded model (one load and weights checksum, not one per window:
    `Workspace.with_window`)."""
    if not windows:
        return []
    first = Workspace(model, device, text=windows[0].corpus, max_length=max_length, start=windows[0].start)
    if len(windows) > 1:
        first.model                                  # loaded once, here, for every sibling
    return [first] + [first.with_window(text=w.corpus, start=w.start) for w in windows[1:]]


def claims_over_windows(model: str, windows: Sequence[TextWindow], *, device: str = "cpu",
                        max_length: int = BOOK_MAX_LENGTH, readings: bool = False, refresh: bool = False,
                        progress: bool = True) -> dict[TextWindow, list[dict]]:
    """{window: paper-1 claim rows of `model` on that window} (each window's Results from the results cache where
    there); every row gains `window` (its label), `start` and `model_kind`."""
    out = {}
    pairs = list(zip(windows, window_inputs(model, device, windows, max_length)))
    for w, inp in progress_bar(pairs, progress and len(pairs) > 1, f"windows ({model})"):
        rows = claim_rows(inp, quick=False, paper="normalization", readings=readings, refresh=refresh,
                          progress=False)
        kind = model_kind(inp.model)
        out[w] = [dict(r, window=w.label, start=w.start, corpus=w.corpus, model_kind=kind) for r in rows
                  if readings or not r.get("reading")]
    return out


def window_summary(per_window: dict[TextWindow, list[dict]]) -> list[dict]:
    """One row per claim (id, reading) of `claims_over_windows`, in first-seen order: id, reading, claim, paper,
    unit; per window label its `values` and `verdicts`; `median`, `low`, `high` of the values (NaN where no
    window has one); `verdict` (the one verdict of every window, or "mixed"); `robust` (ROBUST or DEPENDS) and
    `n_windows`. Windows where the claim is "not applicable" count as windows with their own verdict."""
    out: dict[tuple, dict] = {}
    for w, rows in per_window.items():
        for r in rows:
            s = out.setdefault((r["id"], r.get("reading", "")), {
                "id": r["id"], "reading": r.get("reading", ""), "claim": r["claim"], "paper": r["paper"],
                "unit": r.get("unit", ""), "values": {}, "verdicts": {}, "corpora": {}})
            s["values"][w.label] = r.get("value")
            s["verdicts"][w.label] = r["verdict"]
            s["corpora"][w.label] = w.corpus
    for s in out.values():
        vals = np.array([v for v in s["values"].values() if v is not None and np.isfinite(v)], float)
        s["median"], s["low"], s["high"] = ((float(np.median(vals)), float(vals.min()), float(vals.max()))
                                            if len(vals) else (float("nan"),) * 3)
        kinds = set(s["verdicts"].values())
        s["verdict"] = kinds.pop() if len(kinds) == 1 else "mixed"
        s["robust"] = ROBUST if s["verdict"] != "mixed" else DEPENDS
        s["n_windows"] = len(s["verdicts"])
    return list(out.values())


def spread_text(s: dict, digits: int = 3) -> str:
    """'largest N*/L: median 0.812, range 0.781 to 0.836 over 8 windows; does not hold in all 8 windows' for a
    `window_summary` row."""
    def f(x):
        return f"{x:.{digits}g}"

    if np.isfinite(s["median"]):
        nums = f"{s['unit'] or 'value'}: median {f(s['median'])}, range {f(s['low'])} to {f(s['high'])}"
    else:
        nums = "no number"
    if s["robust"] == ROBUST:
        tail = f"{s['verdict']} in all {s['n_windows']} windows"
    else:
        counts = {v: list(s["verdicts"].values()).count(v) for v in dict.fromkeys(s["verdicts"].values())}
        tail = "depends on the window: " + ", ".join(f"{v} in {n}" for v, n in counts.items())
    return f"{nums} over {s['n_windows']} windows; {tail}"


def critical_by_window(model: str, windows: Sequence[TextWindow], *, device: str = "cpu",
                       max_length: int = BOOK_MAX_LENGTH) -> dict[int, list[float]]:
    """{L: Fig. 2c's critical N / L in each window (NaN where none was found)} from each window's cached fig2c."""
    from attnlab.figures import cached_figures

    out: dict[int, list[float]] = {}
    for inp in window_inputs(model, device, windows, max_length):
        res = cached_figures(["fig2c"], inp)["fig2c"]
        first = {}
        for r in res.rows:                           # every row of one L carries that L's critical N
            first.setdefault(r["L"], r["critical_frac"])
        for L, frac in first.items():
            out.setdefault(L, []).append(frac)
    return out


def reading_critical_over_windows(model: str, windows: Sequence[TextWindow], reading: str, *, device: str = "cpu",
                                  max_length: int = BOOK_MAX_LENGTH, lengths: Sequence[int] = (64, 128, 256, 512)
                                  ) -> list[dict]:
    """Fig. 2c's critical N under one reading "E / d / vectors" (`readings.theorem1`) in each window: rows window
    (label), L, critical_n, critical_frac (NaN where none), holds (the 6% rule at that L: the claim registry's
    CRITICAL_FRAC)."""
    from attnlab.normalization.readings.theorem1 import thm1_readings

    e, d, vec = reading.split(" / ")
    rows = []
    for w, inp in zip(windows, window_inputs(model, device, windows, max_length)):
        ls = [L for L in lengths if L <= len(inp.ids())]
        res = thm1_readings(inp.model, inp.ids(), vectors=[vec], pairs=[(e, d)], lengths=ls, curve_lengths=[ls[0]],
                            progress=False)
        for r in res.rows:
            if r["kind"] == "critical":
                rows.append({"window": w.label, "corpus": w.corpus, "start": w.start, "L": r["L"],
                             "critical_n": r["critical_n"], "critical_frac": r["critical_frac"],
                             "holds": 0 < r["critical_n"] and holds_le(r["critical_n"],
                                                                       threshold("CRITICAL_FRAC") * r["L"])})
    return rows


def pooled_critical_n(model: str, windows: Sequence[TextWindow], lengths: Sequence[int], *, device: str = "cpu",
                      max_length: int = BOOK_MAX_LENGTH, reading: str = "b", alpha: Optional[float] = None,
                      progress: bool = True) -> list[dict]:
    """Fig. 2c's KS test with the windows pooled: at each L, the per-head token means of d~ and E of every window
    form the two samples (K windows x H heads each), and the critical N is the first N the test does not reject.
    Rows: L, critical_n, critical_frac, n_samples. Value vectors, visible keys, as the book's Fig. 2c. A model with
    sliding-window layers: one test per layer kind (`Trace.kind_groups`; each layer's rows over its own keys), rows
    carrying `layer_kind`, `sliding_window` and `longest_row` (min(L, w), which critical_frac divides by)."""
    import torch

    from attnlab.normalization.metrics.critical_n import critical_n
    from attnlab.normalization.paper import KS_ALPHA

    inputs = window_inputs(model, device, windows, max_length)
    m = inputs[0].model
    full = ([m.capture(inp.ids(), keep=("probs", "v")) for inp in progress_bar(inputs, progress, "pooled KS")]
            if m.causal else None)                  # causal: one pass per window, shorter L are exact prefixes
    rows = []
    for L in lengths:
        cut = ([t.prefix(L) for t in full] if m.causal else
               [m.capture(inp.ids(L), keep=("probs", "v")) for inp in inputs])
        groups = cut[0].kind_groups()
        for g in groups:
            part = cut if len(groups) == 1 else [t.select_layers(g) for t in cut]
            probs = torch.cat([t.probs for t in part])            # [window x layer, head, query, key]
            x = torch.cat([t.v for t in part])
            vis = part[0].visible()
            longest = L if len(groups) == 1 else int(vis[L - 1].sum())
            res = critical_n(probs, x, vis, alpha=alpha or KS_ALPHA, reading=reading,
                              n_max=None if len(groups) == 1 else longest - 1)
            n = int(res["n"])
            kind = {} if len(groups) == 1 else {"layer_kind": part[0].kinds[0][0] if part[0].kinds else "full",
                                                 "sliding_window": part[0].kinds[0][1] if part[0].kinds else None,
                                                 "longest_row": longest}
            rows.append({"L": L, "critical_n": n, "critical_frac": n / longest if n > 0 else float("nan"),
                         "n_samples": int(probs.shape[0] * probs.shape[1]), "n_windows": len(cut), **kind})
    return rows


# ------------------------------------------------------------------ the book's window set (chapters read these)

BOOK_LENGTHS = (64, 128, 256, BOOK_MAX_LENGTH)        # the critical-N lengths of the pooled test and the readings


def book_windows() -> list[TextWindow]:
    return text_windows(BOOK_WINDOWS)


@lru_cache(maxsize=4)
def book_summaries(models: tuple, device: str = "cpu") -> dict[str, list[dict]]:
    """{model: `window_summary` rows} on `book_windows()` at L <= BOOK_MAX_LENGTH, default readings, from the
    results cache; a model that is not installed is left out."""
    from attnlab.core.model_files import ModelUnavailable

    out = {}
    for m in models:
        try:
            per = claims_over_windows(m, book_windows(), device=device, progress=False)
        except ModelUnavailable:
            continue
        out[m] = window_summary(per)
    return out


def describe(windows: Sequence[TextWindow], max_length: int = BOOK_MAX_LENGTH) -> str:
    """'8 text windows: 4 of War and Peace (from characters 0, ...); 4 of the WikiText-2 test split (...); lengths L
    up to 512'."""
    names = {"war_and_peace": "War and Peace", "wikitext2": "the WikiText-2 test split"}
    parts = [f"{sum(w.corpus == c for w in windows)} of {names.get(c, c)} (from characters "
             f"{', '.join(f'{w.start:,}' for w in windows if w.corpus == c)})"
             for c in dict.fromkeys(w.corpus for w in windows)]
    return f"{len(windows)} text windows: {'; '.join(parts)}; lengths L up to {max_length}"


def fragile(summaries: dict[str, list[dict]]) -> dict[str, list[str]]:
    """{claim id: the models on which its verdict (default readings) depends on the window}."""
    out: dict[str, list[str]] = {}
    for m, rows in summaries.items():
        for s in rows:
            if s["verdict"] == "mixed" and not s["reading"]:
                out.setdefault(s["id"], []).append(m)
    return out


def pooled_result(model, windows: Sequence[TextWindow], *, device: str = "cpu") -> Result:
    """`pooled_critical_n` at BOOK_LENGTHS as a cached Result "pooled_ks" (`model`: a loaded AttnModel)."""
    key = {"windows": [(w.corpus, w.start) for w in windows], "lengths": list(BOOK_LENGTHS),
           "max_length": BOOK_MAX_LENGTH, **model_key(model)}
    return cached("pooled_ks", key, compute=lambda: Result(
        "pooled_ks", pooled_critical_n(model.name, windows, BOOK_LENGTHS, device=device, progress=False),
        {"model": model.name, "windows": [w.label for w in windows], "test": "KS, alpha 0.01, heads pooled"}))


def reading_result(model, windows: Sequence[TextWindow], reading: str, *, device: str = "cpu") -> Result:
    """`reading_critical_over_windows` at BOOK_LENGTHS as a cached Result "reading_windows"."""
    key = {"reading": reading, "windows": [(w.corpus, w.start) for w in windows], "lengths": list(BOOK_LENGTHS),
           **model_key(model)}
    return cached("reading_windows", key, compute=lambda: Result(
        "reading_windows", reading_critical_over_windows(model.name, windows, reading, device=device,
                                                         lengths=BOOK_LENGTHS),
        {"model": model.name, "reading": reading}))


def plot_strip(summaries: dict[str, list[dict]], claim_ids: Sequence[str]):
    """One panel per claim (stacked, for a phone's column): each window's number as a point per model (circles War
    and Peace, squares WikiText-2; filled where the claim holds in that window, hollow where it does not), and the
    paper's value or band (`claim_kinds.thresholds`) dashed."""
    import matplotlib.pyplot as plt

    names = list(summaries)
    fig, axes = plt.subplots(len(claim_ids), 1, figsize=(5.2, 0.9 + 0.55 * len(claim_ids) * max(2, len(names))),
                             squeeze=False)
    for ax, cid in zip(axes[:, 0], claim_ids):
        unit = ""
        for y, m in enumerate(names):
            s = next((r for r in summaries[m] if r["id"] == cid and not r["reading"]), None)
            if s is None:
                continue
            unit = s["unit"]
            for lab, v in s["values"].items():
                if v is None:
                    continue
                wp = s["corpora"][lab] == "war_and_peace"
                color = "tab:blue" if wp else "tab:orange"
                ax.plot([v], [y + (-0.12 if wp else 0.12)], marker="o" if wp else "s", ms=7, ls="", color=color,
                        mfc=color if s["verdicts"][lab] == "holds" else "white", alpha=0.85)
        for x in thresholds().get(cid, []):
            ax.axvline(x, color="k", ls="--", lw=1)
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(-0.6, len(names) - 0.4)
        ax.set_xlabel(f"{cid}: {unit}")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_title("○ War and Peace, □ WikiText-2; filled: the claim holds; dashed: the paper's value",
                         fontsize="small")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------ windows that start on markup (issue 39, item 3)
# A window may open on a WikiText heading line (" = = = Tourism = = = ") and, with it, on a run of identical tokens
# (" =", " =", " ="). In a causal model the run's tokens have identical hidden states in every layer (each attends
# only to copies of itself), so their keys differ by the position encoding alone: a head that puts its weight on
# the first token (an attention sink) sees two near-equal largest logits in most of its rows. Such near-ties are
# what a 1/T slope of g is made of (Fig. 4), so a few repeated tokens can decide a verdict. The window rule is
# kept (every cached Result stays valid); such a window is flagged, and Fig. 4's claims are computed again with the
# rows those tokens make degenerate left out (`fig4_without_repeats`), beside the verdicts with them.
# 2026-11-27: added (fig4_without_repeats v1; no existing number moves). Measured on SmolLM2, WikiText-2 #4 (L = 512):
# 41.9% of rows left out; Fig. 4's slope -0.908 with them, -0.280 without (the window started past the 3 tokens:
# -0.081; at the next line: -0.146); 0% in the other 7 windows (no run). Cost: one forward pass and Fig. 4's grid
# per flagged window with a run, 25-60 s on the shared 2-core CPU for SmolLM2, cached.

#: a WikiText heading line: " = Title = ", " = = = Section = = = " (as many "=" on each side as the level)
WIKITEXT_HEADING = re.compile(r"\s*(?:=\s+)+\S.*?(?:\s+=)+\s*")
#: a run of at least this many identical tokens at a window's start flags it
MIN_RUN = 2
#: the claims computed again without the degenerate rows (id prefixes): Fig. 4's and Corollary 3's
REPEAT_CLAIMS = ("p1-fig4", "p1-cor3")


def leading_run(ids, skip: int = 0) -> int:
    """How many identical token ids open `ids` [token] after its first `skip` ids (1 for an encoder's [CLS]): 1 for
    a window that starts on prose, 3 for " = = = Tourism"."""
    ids = [int(i) for i in ids][skip:]
    if not ids:
        raise ValueError(f"the window has no token after the first {skip}")
    n = 1
    while n < len(ids) and ids[n] == ids[0]:
        n += 1
    return n


def markup_flag(text: str, ids, skip: int = 0) -> dict:
    """Whether a window starts on markup: `heading` (its first line when that is a WikiText heading `= ... =`, else
    ""), `run` (`leading_run(ids, skip)`), `flagged` (a heading, or a run of >= MIN_RUN identical tokens) and `why`
    (one line; "" when not flagged). text: the window's text from its first character; ids [token]: its token
    ids; skip: leading special tokens ([CLS]) not counted."""
    first = text.lstrip("\n").split("\n", 1)[0]
    heading = first.strip() if WIKITEXT_HEADING.fullmatch(first) else ""
    run = leading_run(ids, skip)
    why = "; ".join(([f"starts on a heading line {heading!r}"] if heading else [])
                    + ([f"starts with {run} identical tokens"] if run >= MIN_RUN else []))
    return {"heading": heading, "run": run, "flagged": bool(why), "why": why}


def degenerate_rows(scores, visible, lo: int, hi: int):
    """Rows whose two largest visible logits both fall on keys lo..hi-1 (a window's leading run of identical
    tokens): bool [..., Q] of scores [..., Q, K] and visible bool [Q, K] (or [layer, 1, Q, K]: `Trace.visible_layers`).
    Rows with < 2 visible keys: False."""

    if not 0 <= lo < hi <= scores.shape[-1]:
        raise ValueError(f"the run must be keys lo..hi-1 inside the {scores.shape[-1]} keys, got {lo}..{hi - 1}")
    s = scores.masked_fill(~visible, float("-inf"))
    top = s.topk(2, dim=-1).indices                                   # [..., Q, 2]
    return ((top >= lo) & (top < hi)).all(-1) & (visible.sum(-1) >= 2)


def fig4_without_repeats(inp: Workspace) -> Result:
    """Fig. 4 (`experiments.fig4`'s T and eps grids, protocol and seeded directions; no Jacobian curve) on the
    window of `inp` at its full length with the rows that its leading run of identical tokens makes degenerate
    (`degenerate_rows`) left out of every mean and share. Rows: fig4's columns plus `degenerate_share` (of the
    rows with >= 2 keys, every head) and `run`. A window without such a run gives fig4's numbers."""
    from attnlab.normalization.experiments import gradient_rows, resolve_protocol, temperature_grid
    from attnlab.normalization.paper import EPSILONS

    m, ids = inp.model, inp.ids()
    skip = 0 if m.causal else 1
    run = leading_run(ids, skip)
    trace = m.capture(ids, keep=("scores",))
    vis = trace.visible_layers() if trace.kinds else trace.visible()   # [layer, 1, Q, K] where kinds differ; [Q, K]
    bad = degenerate_rows(trace.scores, vis, skip, skip + run) if run >= MIN_RUN else None
    rows = gradient_rows(trace, resolve_protocol(False, {"jac_rows": 0}), temperature_grid(), list(EPSILONS),
                         len(ids), keep=None if bad is None else ~bad)
    n_rows = int((vis.sum(-1) >= 2).expand(*trace.scores.shape[:-1]).sum())
    share = 0.0 if bad is None else int(bad.sum()) / n_rows
    return Result("fig4_without_repeats", [dict(r, degenerate_share=share, run=run) for r in rows],
                  {"model": m.name, "text": inp.corpus.name, "start_char": inp.start, "L": len(ids),
                   "left_out": "rows whose two largest logits fall on the window's leading run of identical tokens",
                   "x": "v", "keys": "visible"})         # fig4's protocol (g reads the scores alone)


def repeats_result(model: str, window: TextWindow, *, device: str = "cpu", max_length: int = BOOK_MAX_LENGTH
                   ) -> Result:
    """`fig4_without_repeats` on one window as a cached Result (seconds: one forward pass and Fig. 4's grid)."""
    inp = window_inputs(model, device, [window], max_length)[0]
    key = {"window": (window.corpus, window.start), "max_length": max_length, **model_key(inp.model)}
    return cached("fig4_without_repeats", key, compute=lambda: fig4_without_repeats(inp))


def markup_over_windows(model: str, windows: Sequence[TextWindow], *, device: str = "cpu",
                        max_length: int = BOOK_MAX_LENGTH) -> dict[str, dict]:
    """{window label: `markup_flag` of the window on `model`'s tokens, plus `degenerate_share` (0 without a run)
    and `without` (Fig. 4's claim rows with the degenerate rows left out; [] where no row is)}. Only windows with a
    run of >= MIN_RUN identical tokens compute anything (`repeats_result`)."""
    from attnlab.normalization.claims import paper1_claims

    out = {}
    for w, inp in zip(windows, window_inputs(model, device, windows, max_length)):
        skip = 0 if inp.model.causal else 1
        flag = markup_flag(inp.corpus.text[w.start:], inp.ids(), skip)
        share, without = 0.0, []
        if flag["run"] >= MIN_RUN:
            res = repeats_result(model, w, device=device, max_length=max_length)
            share = float(res.rows[0]["degenerate_share"])
            if share > 0:
                without = [r for r in paper1_claims({"fig4": res}) if r["id"].startswith(REPEAT_CLAIMS)]
        out[w.label] = dict(flag, degenerate_share=share, without=without)
    return out


def without_text(note: dict, claim_id: str) -> str:
    """'without the 41.9% of rows on the 3 repeated tokens: -0.28, does not hold' for one claim of a
    `markup_over_windows` entry; "" where no row was left out."""
    r = next((r for r in note["without"] if r["id"] == claim_id), None)
    if r is None:
        return ""
    v = "-" if r.get("value") is None else f"{r['value']:.3g}"
    return (f"without the {note['degenerate_share']:.1%} of rows on the {note['run']} repeated tokens: {v}, "
            f"{r['verdict']}")


def verdicts_without_repeats(s: dict, notes: dict[str, dict]) -> dict[str, str]:
    """{window label: the verdict of a `window_summary` row `s` with that window's degenerate rows left out} (the
    window's own verdict where `markup_over_windows` `notes` left no row out)."""
    out = {}
    for lab, v in s["verdicts"].items():
        r = next((r for r in notes.get(lab, {}).get("without", []) if r["id"] == s["id"]), None)
        out[lab] = v if r is None or s["reading"] else r["verdict"]
    return out


def driven_by_repeats(summary: list[dict], notes: dict[str, dict]) -> list[dict]:
    """The claims (default readings) whose verdict in some window flips when the rows on that window's leading
    repeated tokens are left out: the `window_summary` rows, each with `windows` (the labels where it flips),
    `verdicts_without` ({label: verdict}) and `one_verdict_without` (that verdict when it is the same in every
    window without those rows, else "")."""
    out = []
    for s in summary:
        if s["reading"]:
            continue
        wo = verdicts_without_repeats(s, notes)
        flips = [lab for lab, v in wo.items() if v != s["verdicts"][lab]]
        if flips:
            out.append(dict(s, windows=flips, verdicts_without=wo,
                            one_verdict_without=next(iter(wo.values())) if len(set(wo.values())) == 1 else ""))
    return out


def driven_text(d: dict) -> str:
    """'p1-fig4-slope in WikiText-2 #4: holds with those rows, does not hold without; without them it does not hold
    in all 8 windows' for a `driven_by_repeats` row."""
    flips = ", ".join(f"{lab}: {d['verdicts'][lab]} with those rows, {d['verdicts_without'][lab]} without"
                      for lab in d["windows"])
    tail = (f"without them it {d['one_verdict_without']} in all {len(d['verdicts_without'])} windows"
            if d["one_verdict_without"] else "without them it still depends on the window")
    return f"{d['id']} in {flips}; {tail}"
