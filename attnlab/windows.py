"""Text windows as a dimension of every paper-1 claim: the same claims on several non-overlapping windows of
War and Peace and of the WikiText-2 test split, each claim's verdict per window, and a summary (median and range
of the number the verdict turns on; "robust" when every window gives the same verdict, else "depends on the
window"). Data flow: corpus -> `text_windows` (stated character offsets) -> `figures.Inputs(start=...)` -> cached
Results per window -> claim rows per window -> `window_summary`. `pooled_critical_n` runs Fig. 2c's KS test once
on the heads of every window together.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from attnlab.core.cache import cached, model_key
from attnlab.core.result import Result
from attnlab.core.util import progress as progress_bar
from attnlab.core.verdicts import holds_le
from attnlab.figures import Inputs, claim_rows, model_kind
from attnlab.normalization.claim_kinds import threshold, thresholds

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


def window_inputs(model: str, device: str, windows: Sequence[TextWindow], max_length: int) -> list[Inputs]:
    """One `figures.Inputs` per window, sharing one loaded model (one load and weights checksum, not one per
    window)."""
    out = [Inputs(model, device, text=w.corpus, max_length=max_length, start=w.start) for w in windows]
    for inp in out[1:]:
        inp._model = out[0].model
    return out


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
    Rows: L, critical_n, critical_frac, n_samples. Value vectors, visible keys, as the book's Fig. 2c."""
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
        probs = torch.cat([t.probs for t in cut])            # [window x layer, head, query, key]
        x = torch.cat([t.v for t in cut])
        res = critical_n(probs, x, cut[0].visible(), alpha=alpha or KS_ALPHA, reading=reading)
        n = int(res["n"])
        rows.append({"L": L, "critical_n": n, "critical_frac": n / L if n > 0 else float("nan"),
                     "n_samples": int(probs.shape[0] * probs.shape[1]), "n_windows": len(cut)})
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
    return cached("pooled_ks", key, version=1, compute=lambda: Result(
        "pooled_ks", pooled_critical_n(model.name, windows, BOOK_LENGTHS, device=device, progress=False),
        {"model": model.name, "windows": [w.label for w in windows], "test": "KS, alpha 0.01, heads pooled"}))


def reading_result(model, windows: Sequence[TextWindow], reading: str, *, device: str = "cpu") -> Result:
    """`reading_critical_over_windows` at BOOK_LENGTHS as a cached Result "reading_windows"."""
    key = {"reading": reading, "windows": [(w.corpus, w.start) for w in windows], "lengths": list(BOOK_LENGTHS),
           **model_key(model)}
    return cached("reading_windows", key, version=1, compute=lambda: Result(
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
