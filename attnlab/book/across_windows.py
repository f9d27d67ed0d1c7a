"""The book's views of text windows (`attnlab.windows`): each claim's spread and verdicts over the windows of the
offline models, the pooled and per-reading critical N, and the windows that start on markup."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from attnlab.book.markup import prose, table
from attnlab.book.models import OFFLINE_MODELS, missing_models
from attnlab.book.running import heavy, inputs
from attnlab.figures import Inputs


@heavy()         # computes Results when the cache lacks them: torch's default thread count
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


@heavy()         # computes Results when the cache lacks them: torch's default thread count
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


@heavy()         # computes Results when the cache lacks them: torch's default thread count
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
                                         + [cell(find(rows, cid)) for rows in per.values()] for cid in ids],
                 caption=missing_models())


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
@heavy()         # computes `windows.repeats_result` when the cache lacks it: seconds per flagged window
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
