"""Views for chapter 3 (The 6% rule): the critical N read from the stored KS scans of fig2c, its frames (per
level α, per N, the live level figure), and the same under every reading of E and d~ (thm1_readings). Views
only: every number is read from the Results and their claim rows."""
from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from attnlab.book import markup, running
from attnlab.core.result import Result
from attnlab.normalization import readings
from attnlab.normalization.claim_kinds import threshold
from attnlab.normalization.metrics import critical_n
from attnlab.normalization.paper import KS_ALPHA

ALPHAS = (1e-20, 1e-10, 1e-5, 1e-3, 1e-2)       # the levels of the α slider


def scans(rc) -> dict[int, list[dict]]:
    """L -> the stored KS scan of fig2c Result `rc` at that length, rows sorted by N."""
    return {L: sorted(rc.select(L=L), key=lambda r: r["N"]) for L in sorted(rc.unique("L"))}


def critical(scan: Sequence[dict], alpha: float) -> int:
    """The highest N* at level alpha <= 0.01 one stored scan allows: the first scanned N whose exact p-value is
    above alpha (-1: none). A certified row (p-value NaN, only p <= p_upper stored) counts as a rejection here;
    `critical_bounds` says where that is not settled."""
    return next((r["N"] for r in scan if r["pvalue"] > alpha), -1)


def settled(row: dict, alpha: float) -> bool:
    """Whether a stored scan row settles the test at level alpha: an exact p-value, or a certified upper bound
    p_upper <= alpha (a bound above alpha leaves the verdict open)."""
    return not math.isnan(row["pvalue"]) or row["p_upper"] <= alpha


def critical_bounds(scan: Sequence[dict], alpha: float) -> tuple[int, int]:
    """(lowest, highest) N* at level alpha that one stored scan allows: the lowest is the first N that is not a
    settled rejection (an exact p > alpha, or only a bound p_upper > alpha), the highest is `critical`. Equal
    when every row before the highest is settled at alpha (-1: none in the scan)."""
    lo = next((r["N"] for r in scan if r["pvalue"] > alpha or not settled(r, alpha)), -1)
    return lo, critical(scan, alpha)


def p_floor(n_heads: int) -> float:
    """The smallest p-value two samples of n_heads heads can give: complete separation."""
    return 2 / math.comb(2 * n_heads, n_heads)


def _shades(count: int):
    return plt.cm.viridis(np.linspace(0.85, 0.1, count))


def critical_table(scan: dict):
    """HTML table per L: the paper's 6% bound (the claim registry's CRITICAL_FRAC), the critical N at α = 0.01 and
    whether it is within it."""
    def fmt(n, L):
        return f"{n} ({n / L:.1%} of L)" if n > 0 else "none found"

    frac = threshold("CRITICAL_FRAC")
    crit = {L: s[0]["critical_n"] for L, s in scan.items()}
    return markup.table(
        ["L", f"paper: critical N ≤ {frac:g} L", "critical N at α = 0.01 (this book)", f"within {frac:g} L?"],
        [[L, f"≤ {frac * L:.1f}", fmt(crit[L], L), "yes" if 0 < crit[L] <= frac * L else "no"] for L in scan])


def _floor_line(ax, n_heads: int) -> None:
    ax.axhline(p_floor(n_heads), color="0.55", lw=4, alpha=0.35)
    ax.annotate(f"complete separation ({n_heads} vs {n_heads} heads)", (0.02, p_floor(n_heads)),
                xycoords=("axes fraction", "data"), xytext=(0, 4), textcoords="offset points", color="0.35",
                fontsize=9)


def _p_values(scan_L: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N, p-value of each scanned N (where the brackets certified the rejection: its upper bound), and whether
    the value is exact."""
    return (np.array([r["N"] for r in scan_L]), np.array([r["p_upper"] for r in scan_L]),
            np.array([not math.isnan(r["pvalue"]) for r in scan_L]))


def _p_curve(ax, x, ps, exact, color, label: str, lw: float = 1.2) -> None:
    """The exact p-values solid, the certified upper bounds dotted (the bound's segment reaches the first exact
    point, so the curve is continuous)."""
    first = int(np.argmax(exact)) if exact.any() else len(ps)
    if first:
        ax.plot(x[:first + 1], ps[:first + 1], ":", color=color, lw=lw)
    ax.plot(x[first:], ps[first:], "-", color=color, lw=lw, label=label)


def _kind_legend(fig, first: Sequence = ()) -> None:
    """The `first` panel's handles, then what solid and dotted mean, below the panels (covering no data)."""
    from matplotlib.lines import Line2D

    fig.legend(handles=[*first, Line2D([], [], color="0.3", ls="-", lw=1.2, label="p-value (exact)"),
                        Line2D([], [], color="0.3", ls=":", lw=1.2,
                               label="upper bound of p (rejection certified at α = 0.01)")],
               loc="outside lower center", ncols=3, fontsize=9, handlelength=1.6)


def alpha_frame(scan: dict, alpha: float):
    """Figure at level α: critical N against L (with α = 0.01, unless α is 0.01, and 0.06 L), and every length's
    p-values against N / L with its N* marked."""
    Ls = list(scan)
    H = scan[Ls[-1]][0]["n_heads"]
    crit01 = {L: s[0]["critical_n"] for L, s in scan.items()}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(6.4, 2.7), layout="constrained")
    xs, frac = np.array(Ls, float), threshold("CRITICAL_FRAC")
    a1.plot(xs, frac * xs, "k--", lw=1, label=f"{frac:g} L (paper)")
    if not np.isclose(alpha, 0.01):          # at 0.01 the level's own curve is this one: one legend entry, not two
        a1.plot(Ls, [crit01[L] for L in Ls], "o-", color="0.7", ms=3, label="α = 0.01")
    bounds = [critical_bounds(scan[L], alpha) for L in Ls]
    ys = [hi for _, hi in bounds]
    a1.plot(Ls, [y if y > 0 else np.nan for y in ys], "o-", color="tab:green", ms=4, label=f"α = {alpha:g}")
    open_ = [(L, lo, hi) for L, (lo, hi) in zip(Ls, bounds) if lo != hi]
    if open_:                                # the stored bounds cannot settle N* below its highest value
        a1.vlines([L for L, *_ in open_], [max(lo, 1) for _, lo, _ in open_],
                  [hi if hi > 0 else L for L, _, hi in open_],          # none found: open up to L
                  color="tab:green", lw=3, alpha=0.3, label="N* not settled")
    a1.set(xscale="log", yscale="log", xlabel="L", ylabel="critical N")
    a1.set_xticks(Ls, [str(L) for L in Ls])
    a1.xaxis.set_minor_formatter(NullFormatter())
    for L, col in zip(Ls, _shades(len(Ls))):
        ns, ps, exact = _p_values(scan[L])
        _p_curve(a2, ns / L, ps, exact, col, f"L = {L}")
        n = critical(scan[L], alpha)
        if n > 0:
            a2.plot(n / L, ps[list(ns).index(n)], "o", color=col, ms=4)
    a2.axhline(alpha, color="k", ls="--", lw=1)
    a2.axvline(frac, color="k", ls=":", lw=1)
    _floor_line(a2, H)
    a2.set(yscale="log", xlabel="N / L", ylabel="KS p-value, or its bound", ylim=(p_floor(H) / 1e6, 1), xlim=(0, 1))
    a2.legend(loc="center right", ncols=2, fontsize=9, handlelength=1.0, columnspacing=0.8)   # mid-height: no data
    _kind_legend(fig, a1.get_legend_handles_labels()[0])       # below the panels: covers no data
    a2.set_title(alpha_title(alpha, Ls, bounds))
    return fig


def alpha_title(alpha: float, Ls: Sequence[int], bounds: Sequence[tuple[int, int]]) -> str:
    """The α frame's title: N*/L over the lengths, and, where the stored bounds leave N* open, the range they
    allow ("α = 1e-20: N*/L between 0.00098 and 0.81 ...")."""
    hi = [h / L for (_, h), L in zip(bounds, Ls) if h > 0]
    if not hi:
        return f"α = {alpha:g}: no N* found"
    if all(lo == h for lo, h in bounds):
        return f"α = {alpha:g}: N*/L from {min(hi):.2f} to {max(hi):.2f}"
    lo = [max(lo_, 1) / L for (lo_, _), L in zip(bounds, Ls)]
    return f"α = {alpha:g}: N*/L between {min(lo):.2g} and {max(hi):.2f}\n(the stored bounds settle no more)"


def ecdf_frame(rb, N: int):
    """Figure: the per-head distributions of d~ and E at N (fig2b Result `rb`, its L) and their KS test."""
    L_b = rb.rows[0]["L"]
    lim = (min(rb.column("E").min(), rb.column("dtilde_b").min()) / 1.5,
           max(rb.column("E").max(), rb.column("dtilde_b").max()) * 1.5)
    d, e = np.sort(rb.column("dtilde_b", N=N)), np.sort(rb.column("E", N=N))
    first, ps, ks = critical_n.ks_first_indistinguishable(d[:, None], e[:, None], [N], alpha=0.01)
    fig, ax = plt.subplots(figsize=(5.6, 2.5), layout="constrained")
    ax.step(d, np.arange(1, len(d) + 1) / len(d), where="post", color="tab:green", label="true d~, one step per head")
    ax.step(e, np.arange(1, len(e) + 1) / len(e), where="post", color="tab:blue", label="expectation E, per head")
    ax.set(xscale="log", xlim=lim, ylim=(0, 1.02), xlabel="distance (token mean of one head)",
           ylabel="fraction of heads")
    ax.legend(loc="lower right")
    verdict = "not rejected" if first == N else "rejected"
    ax.set_title(f"L = {L_b}, N = {N}: D = {ks[0]:.2f}, p = {ps[0]:.2g}: {verdict} at α = 0.01")
    return fig


def ratio_curve(inp=None) -> Result:
    """`experiments.fig2c_ratio` on the book's default model and window (`inp`: those Inputs; None: the chapter's),
    cached (`running.cached_result`, keyed by the model, text and window, `Inputs.window_key`, and the N grid): d~ / E
    of the head means, exact at RATIO_POINTS N per length and at the first N >= CRITICAL_FRAC L. Fig. 2c's stored
    scan is not used for this: where its brackets certified a rejection it records their midpoints, not the means.
    65.7 s at L <= 1024 on SmolLM2 (2026-11-27)."""
    from attnlab.normalization import experiments

    inp = inp or running.inputs()
    fracs = (threshold("CRITICAL_FRAC"),)
    key = {**inp.window_key(), "points": experiments.RATIO_POINTS, "fracs": list(fracs)}
    return running.cached_result("fig2c_ratio", key,
                              lambda: experiments.fig2c_ratio(inp.model, inp.ids(), fracs=fracs, progress=False),
                              model=inp.model, text_sha256=inp.corpus.sha256)


def ratio_at(ratio, frac: float) -> list[tuple[int, dict]]:
    """(L, row) of a `ratio_curve` Result at the first N >= frac L of each length (window 0)."""
    out = []
    for L in sorted(ratio.unique("L")):
        row = next((r for r in sorted(ratio.select(L=L, window=0), key=lambda r: r["N"]) if r["N"] >= frac * L), None)
        if row is not None:
            out.append((L, row))
    return out


def ratio_figure(ratio):
    """Figure: d~ / E (exact head means, a `ratio_curve` Result) against N / L at every length."""
    fig, ax = plt.subplots(figsize=(5.2, 2.5), layout="constrained")
    Ls = sorted(ratio.unique("L"))
    for L, col in zip(Ls, _shades(len(Ls))):
        rows = sorted(ratio.select(L=L, window=0), key=lambda r: r["N"])
        ax.plot([r["N"] / L for r in rows], [r["ratio"] for r in rows], color=col, lw=1.2, marker=".", ms=3,
                label=f"L = {L}")
    ax.axhline(1, color="k", lw=0.8)
    ax.axvline(threshold("CRITICAL_FRAC"), color="k", ls=":", lw=1)
    ax.set(yscale="log", xlim=(0, 1), xlabel="N / L", ylabel="d~ / E (head means)")
    ax.legend()
    return fig


def level_figure(scan: dict, L: int, log10_alpha: float):
    """The live figure: the p-values of the scan at L against N, with N* at level 10^log10_alpha."""
    alpha = 10.0 ** log10_alpha
    H = scan[list(scan)[-1]][0]["n_heads"]
    ns, ps, exact = _p_values(scan[L])
    n = critical(scan[L], alpha)
    fig, ax = plt.subplots(figsize=(5.6, 2.5), layout="constrained")
    _p_curve(ax, ns, ps, exact, "tab:purple", "p-value (dotted: its certified upper bound)", lw=1)
    ax.axhline(alpha, color="k", ls="--", lw=1)
    frac = threshold("CRITICAL_FRAC")
    ax.axvline(frac * L, color="k", ls=":", lw=1, label=f"{frac:g} L")
    _floor_line(ax, H)
    if n > 0:
        ax.plot(n, ps[list(ns).index(n)], "o", color="tab:green", ms=5, label=f"N* = {n} ({n / L:.1%} of L)")
    ax.set(yscale="log", ylim=(p_floor(H) / 1e6, 1), xlabel="N", ylabel="KS p-value, or its bound")
    ax.legend(loc="center left")                # mid-height: the curve runs along the top, the floor at the bottom
    lo, _ = critical_bounds(scan[L], alpha)
    ax.set_title(f"L = {L}, α = {alpha:.2g}" + (f": N* between {lo} and {n} (only bounds below {n})"
                                                 if 0 < lo != n else ""))
    return fig


def _critical_rows(rr) -> list[dict]:
    return [r for r in rr.rows if r["kind"] == "critical"]


def _six(rclaims: Sequence[dict]) -> dict[str, bool]:
    """reading -> whether the 6% rule holds at every length under it."""
    return {r["reading"]: r["verdict"] == "holds" for r in rclaims if r["id"] == "p1-fig2c-critical"}


def reading_fracs(rr, e: str, d: str, vec: str) -> list[float]:
    """critical N / L at each length of thm1_readings Result `rr` under one reading (NaN: none found)."""
    rs = sorted((r for r in _critical_rows(rr) if (r["e"], r["d"], r["vectors"]) == (e, d, vec)), key=lambda r: r["L"])
    return [r["critical_frac"] if r["critical_n"] > 0 else np.nan for r in rs]


def readings_table(rr, rclaims: Sequence[dict], model_name: str):
    """HTML table: N*/L at each length for every reading pair of E and d~ (rows) and vector choice (columns),
    green where the 6% rule holds at every length; cross pairs marked as not counted."""
    six = _six(rclaims)
    vecs = rr.provenance["vectors"]
    L_crit = sorted({r["L"] for r in _critical_rows(rr)})

    def cell(e, d, vec):
        text = "<br>".join("–" if np.isnan(f) else f"{f:.2f}" if f >= 0.01 else f"{f:.3f}"
                           for f in reading_fracs(rr, e, d, vec))
        green = "background:#d7f5dd;color:#1f2328;" if six.get(f"{e} / {d} / {vec}") else ""
        return f'<span style="display:block;{green}padding:0 2px;white-space:nowrap">{text}</span>'

    def pair_label(e, d):
        return f"{e} / {d}" + ("" if readings.is_paper_pair(e, d) else "<br><small>cross pair: not counted</small>")

    pairs = [(e, d) for e in readings.E_READINGS for d in readings.D_READINGS]
    return markup.table(["E / d~"] + [f"<code>{v}</code>" for v in vecs],
                      [[pair_label(e, d)] + [cell(e, d, v) for v in vecs] for e, d in pairs],
                      caption=f"critical N / L at L = {', '.join(map(str, L_crit))}, {model_name}")


def reading_frame(rr, e: str, vec: str) -> bytes:
    """PNG: critical N / L against L under reading e of E (with d~ a and b) and vectors `vec`, beside the
    default (E1, b, v)."""
    L_crit = sorted({r["L"] for r in _critical_rows(rr)})
    fig, ax = plt.subplots(figsize=(5.4, 2.7), layout="constrained")
    ax.plot(L_crit, reading_fracs(rr, "E1", "b", "v"), "o-", color="0.75", lw=3, ms=3, label="default (E1, b, v)")
    ax.plot(L_crit, reading_fracs(rr, e, "b", vec), "o-", color="tab:blue", ms=4, label=f"{e}, b")
    ax.plot(L_crit, reading_fracs(rr, e, "a", vec), "s--", color="tab:orange", ms=4, label=f"{e}, a")
    frac = threshold("CRITICAL_FRAC")
    ax.axhline(frac, color="k", ls=":", lw=1, label=f"{frac:g} (paper)")
    ax.set(xscale="log", ylim=(0, 1.02), xlabel="L", ylabel="critical N / L")
    ax.set_xticks(L_crit, [str(L) for L in L_crit])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(loc="center right", ncol=2)
    ax.set_title(f"{e} ({readings.E_READINGS[e].label}), x = {vec}")
    return markup.png(fig, colors=32)


def paper_pairs_holding(rclaims: Sequence[dict]) -> list[str]:
    """The readings (paper pairs of E and d~, with vectors) under which the 6% rule holds at every length."""
    return sorted(k for k, v in _six(rclaims).items() if v and readings.is_paper_pair(*k.split(" / ")[:2]))


#: how many of `paper_pairs_holding` chapter 3 shows across the text windows (`readings_over_windows`)
SHOWN_OVER_WINDOWS = 3


def readings_over_windows(rr) -> list[str]:
    """The readings chapter 3 shows in every text window (`book.reading_over_windows`, a "reading_windows" Result
    each): the first SHOWN_OVER_WINDOWS of `paper_pairs_holding` in the thm1_readings Result `rr`."""
    from attnlab.normalization.readings import theorem1

    return paper_pairs_holding(theorem1.reading_claims({"thm1_readings": rr}))[:SHOWN_OVER_WINDOWS]


def readings_prose(rr, rclaims: Sequence[dict], model_name: str):
    """HTML: how many paper readings meet the 6% rule in this window, and why the Jensen gap, reading a and the
    printed formula do or do not move the critical N, from thm1_readings Result `rr` and its claim rows."""
    holds = paper_pairs_holding(rclaims)
    six = _six(rclaims)
    crit_rows = _critical_rows(rr)
    VECS = rr.provenance["vectors"]
    E_NAMES = list(readings.E_READINGS)
    tally = readings.paper_tally([r for r in rclaims if r["id"] == "p1-fig2c-critical"])
    e1 = {(r["vectors"], r["L"]): r["critical_frac"] for r in crit_rows if r["e"] == "E1" and r["d"] == "b"}
    e4 = {(r["vectors"], r["L"]): r["critical_frac"] for r in crit_rows if r["e"] == "E4" and r["d"] == "b"}
    shift = np.nanmedian([abs(e4[k] - e1[k]) for k in e1 if k in e4])
    se = np.nanmedian([r["e_rel_se"] for r in crit_rows if r["e"] == "E4"])
    first_a = [r["critical_n"] for r in crit_rows if r["e"] == "E4" and r["d"] == "a" and r["critical_n"] > 0]
    by_e = {e: sum(six.get(f"{e} / {d} / {v}", False) for d in readings.D_READINGS for v in VECS
                  if readings.is_paper_pair(e, d)) for e in E_NAMES}
    return markup.prose(
        f"<p>On {model_name}, in this one window (the novel's first tokens), the 6% rule holds at every length "
        f"for {tally['holds']} of the {tally['of']} combinations that read a formula of the paper (each E with d~ (b); "
        f"E4, the expectation of d~ itself, also with d~ (a)) and a choice of vectors: "
        f"{', '.join(f'<code>{h}</code>' for h in holds) or 'none'}. The table also shows the {tally['cross_pairs']} "
        "cross pairs (E1, E2, E3 or E5 with d~ (a)): they set a distance of a sum against an expectation of a sum of "
        "distances, which no formula of the paper does, and are not counted. The next table asks whether a combination "
        "that meets the rule here meets it in other windows of text. By reading of E: "
        + ", ".join(f"{e} {n}" for e, n in by_e.items()) + ".</p><ul>"
        f"<li><b>The Jensen gap is not the cause.</b> The exact expectation (E4, Monte Carlo with a median relative "
        f"standard error of {se:.1%} on the head means) moves the critical N of reading b by a median of "
        f"{shift:.2f} L from the main sum (E1): both stay near {np.nanmedian(list(e1.values())):.2f} L.</li>"
        f"<li><b>Reading a cannot tell the sets apart.</b> With E4 and reading a the test accepts at N = "
        f"{min(first_a)}..{max(first_a)}: d~ (a) = ||o − 2s|| hardly depends on which tokens are selected, so a "
        "random set looks like the top set from the start. Where that reading 'satisfies' the 6% rule, the test has "
        "no power, not the heads a small set.</li>"
        "<li><b>The literal printed formula (E2, E5) stops early</b> because it compares norms, not sets: d~ ≈ (L − N) "
        "||s|| and E2 ≈ (L − N) ||m|| (E5: ||o||), so the test accepts where the heads' ||s|| reaches the norm of the "
        "mean vector. That happens at a few percent of L for some vector choices and never for others.</li></ul>")


def expectation_note(rr, model_name: str):
    """HTML: how far E1 (head mean, Fig. 2a's N) stays from sum_i ||a_i x_i||, the limit of E as this book reads
    Corollary 2(i), at the largest curve length, per vector choice (thm1_readings Result `rr`, chapter 2's numbers)."""
    from attnlab.normalization.claim_kinds import threshold
    from attnlab.views.distance import head_curve

    COR2_GAP = threshold("COR2_GAP")                       # the claim registry's

    vecs = list(rr.provenance["vectors"])
    over = [head_curve(rr, x, "E1")[1][-1] / head_curve(rr, x, "sum_y")[1][-1] for x in vecs]   # at the largest L
    grids = rr.provenance["grids"]
    near = [v for v, r in zip(vecs, over) if abs(r - 1) <= COR2_GAP]
    lo, hi = min(over), max(over)
    return markup.prose(
        f"<p>Measured on {model_name} (chapter 2's Result of every reading, N = {grids['curve_N']}, "
        f"L = {grids['curve_lengths'][-1]}): E1, the head mean, is {lo:.2g}–{hi:.2g} times Σ<sub>i</sub> "
        f"‖α<sub>i</sub> x<sub>i</sub>‖ over the {len(vecs)} vector choices"
        + (f" (value vectors: {over[vecs.index('v')]:.2g})" if "v" in vecs else "")
        + (f", within {COR2_GAP:.0%} of it for {len(near)} ({', '.join(near)})" if near else
           f", not within {COR2_GAP:.0%} of it for any") + ". "
        + (f"So here it stays between the limit Corollary 2(i) gives it, as this book reads it, and its proved bound "
           f"(1 + N) Σ<sub>i</sub> ‖α<sub>i</sub> x<sub>i</sub>‖, {1 + grids['curve_N']} times the sum (chapter 2)."
           if lo > 1 + COR2_GAP and hi <= 1 + grids["curve_N"] else "") + "</p>")


def differs_prose(scan: dict, rclaims: Sequence[dict], rc, model):
    """HTML list for 'What differs from the paper': the critical N on this model at the default reading against the
    paper's, the test's sample size (`claim_kinds.heads_note`), which readings that are an expectation of d~ meet
    the 6% rule, and the scan's cost, each read from fig2c Result `rc`, its scans and the reading claim rows."""
    from attnlab.normalization.claim_kinds import heads_note

    fracs = {L: (n / L if (n := critical(rows, KS_ALPHA)) > 0 else None) for L, rows in scan.items()}
    found = [f for f in fracs.values() if f is not None]
    none = [L for L, f in fracs.items() if f is None]
    lo, hi = (f"{min(found):.2f}", f"{max(found):.2f}") if found else ("", "")
    span = ("not found below L" if not found else f"{lo} L" if lo == hi else f"{lo}–{hi} L")
    six = _six(rclaims)
    expectation = [f"{e} / {d}" for e, d in (("E1", "b"), ("E4", "b"), ("E4", "a"))]
    meet = sorted(k for k, ok in six.items() if ok and " / ".join(k.split(" / ")[:2]) in expectation)
    frac = threshold("CRITICAL_FRAC")                                     # the claim registry's, when used
    below = all(f is not None and f <= frac for f in fracs.values())
    prov = rc.provenance
    return markup.prose(
        "<ul>"
        f"<li><b>The result.</b> The paper's critical N stays below {frac} L; on {model.name}, at this "
        f"book's default reading, it is {span} at L = {', '.join(map(str, scan))}"
        + (f" (none found below L at L = {', '.join(map(str, none))})" if none and found else "")
        + (": the claim reproduces under this reading.</li>" if below else
           ": the claim does not reproduce under this reading.</li>")
        + f"<li><b>Model.</b> {model.n_layers * model.n_heads} heads, {'causal' if model.causal else 'bidirectional'}, "
        f"longest window L = {max(scan)}. {heads_note(model.n_layers * model.n_heads)}</li>"
        f"<li><b>Readings.</b> Of the combinations where E is an expectation of d~ over random sets "
        f"({', '.join(expectation)}) with each choice of vectors, "
        + (f"{len(meet)} meet the 6% rule at every length ({', '.join(f'<code>{m}</code>' for m in meet)})"
           if meet else "none meets the 6% rule at every length")
        + (" — with reading a only where the test has no power (above)" if meet and all("/ a /" in m for m in meet)
           else "") + ".</li>"
        f"<li><b>The scan's cost.</b> The paper reports 17 hours for its version; this Result took "
        f"{markup.seconds(prov['runtime_seconds'])} ({prov.get('device', 'cpu')}, every length).</li></ul>")
