"""Views for chapter 2 (Distance collapse): the Figure 2 / Theorem 1 tables, the L and N frames, the live
one-head figure, and every reading of E against L. Views only: every number is read from the fig2a / fig2b /
thm1_readings Results, their claim rows, or a cached Trace."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from attnlab.book import markup
from attnlab.core.verdicts import percent
from attnlab.normalization import readings
from attnlab.normalization.claim_kinds import ALL_CLAIMS, threshold
from attnlab.normalization.claims import linear_growth
from attnlab.normalization.readings import theorem1

COLORS = {"dtilde_b": "tab:green", "E": "tab:blue", "dmax_B": "tab:red", "dmax_R": "darkred"}
LABELS = {"dtilde_b": "true d~", "E": "expectation E", "dmax_B": "bound (summary)", "dmax_R": "bound (reconstr.)"}
E_COLORS = {"E1": "tab:blue", "E2": "tab:orange", "E3": "tab:purple", "E4_b": "tab:cyan", "E5": "tab:brown"}
# the chapter's claims in the order its table shows them, with their labels (the claim registry's)
CLAIM_LABELS = tuple((cid, ALL_CLAIMS[cid].label)
                     for cid in ("p1-fig2a-linear", "p1-fig2b-plateau", "p1-thm1-R", "p1-thm1-B", "p1-thm1-a"))


def claims_table(claims: dict, ra):
    """HTML table of the chapter's claim rows ({id: row}), with the linear-growth test applied to E's head means
    too (the claim table checks only d~ for Fig. 2a)."""
    rows = [[label, claims[cid]["paper"], claims[cid]["measured"], f"<b>{claims[cid]['verdict']}</b>"]
            for cid, label in CLAIM_LABELS]
    Ls = sorted(ra.unique("L"))
    growth_e = linear_growth(Ls, [markup.head_mean(ra, "E", L=L) for L in Ls])
    rows.insert(1, ["Fig. 2a: E grows about linearly in L (N = 5; same test, computed here)",
                    ALL_CLAIMS["p1-fig2a-linear"].paper,
                    f"E: {growth_e['text']}", f"<b>{'holds' if growth_e['ok'] else 'does not hold'}</b>"])
    return markup.table(["claim", "paper", "this book", "verdict"], rows)


def means_table(result, by: str, caption: str):
    """HTML table per value of `by` (L or N): head means of d~, E and both bounds, and the share of rows under
    the summary's bound."""
    def mean(key, x):
        return markup.head_mean(result, key, **{by: x})

    return markup.table(
        [by, "true d~", "expectation E", "bound, summary", "bound, reconstruction", "d~ / bound (summary)",
         "rows under the summary's bound"],
        [[x, f"{mean('dtilde_b', x):.3g}", f"{mean('E', x):.3g}", f"{mean('dmax_B', x):.3g}",
          f"{mean('dmax_R', x):.3g}", f"{mean('dtilde_b', x) / mean('dmax_B', x):.2f}",
          percent(np.average(result.column('holds_B', **{by: x}), weights=result.column('n_rows', **{by: x})))]
         for x in sorted(result.unique(by))], caption)


def _curves(ax, result, by: str, mark) -> None:
    xs = sorted(result.unique(by))
    for key in ("dtilde_b", "E", "dmax_B", "dmax_R"):
        ys = [markup.head_mean(result, key, **{by: x}) for x in xs]
        ax.plot(xs, ys, "--" if key == "dmax_R" else "o-", ms=3, lw=1.2, color=COLORS[key], label=LABELS[key])
    ax.axvline(mark, color="0.4", lw=4, alpha=0.25)
    ax.set(xscale="log", yscale="log", xlabel=by, ylabel="distance (mean over heads)")
    markup.plain_log(ax)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.legend(loc="best")


def _limits(result) -> tuple[float, float]:
    vals = np.concatenate([result.column(k) for k in ("dtilde_b", "E", "dmax_B")])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    return vals.min() / 1.5, vals.max() * 1.5


def _scatter(ax, result, **where) -> float:
    """Per head: E and the summary's bound against d~; returns the share of rows under that bound."""
    lim = _limits(result)
    d = result.column("dtilde_b", **where)
    ax.plot(lim, lim, "k-", lw=0.8)
    ax.plot(d, result.column("E", **where), ".", ms=3, color=COLORS["E"], label="E")
    ax.plot(d, result.column("dmax_B", **where), ".", ms=3, color=COLORS["dmax_B"], label="bound (summary)")
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="true d~ (one point per head)")
    markup.plain_log(ax)
    ax.legend(loc="upper left")
    return np.average(result.column("holds_B", **where), weights=result.column("n_rows", **where))


def sweep_frame(result, by: str, x):
    """Figure for one value x of `by` (fig2a: by="L"; fig2b: by="N"): the head means against `by` with x
    marked, and every head's E and summary bound against its d~ at x."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(6.4, 2.7), layout="constrained")
    _curves(a1, result, by, x)
    held = _scatter(a2, result, **{by: x})
    L, N = (x, result.rows[0]["N"]) if by == "L" else (result.rows[0]["L"], x)
    a2.set_title(f"L = {L}, N = {N}: bound (summary) holds: {held:.1%}")
    return fig


def head_distance_figure(tr, keys: Sequence[str] = ("dmax_R", "dmax_B", "E", "dtilde_b")):
    """The live one-head figure, built once: returns draw(layer, head, N) -> PNG bytes of d~, E and both bounds
    per query row of Trace `tr`, which only sets the new data (a new figure per update spent most of its time
    building axes, ticks and texts). ``draw.new_figure(layer, head, N)``:
    the same frame in a new Figure (what `attnlab.widgets.live_slider` lays out for a phone)."""
    from matplotlib.figure import Figure

    from attnlab.normalization.metrics import distance
    from attnlab.widgets import fig_to_png

    vis = tr.visible()
    t = np.arange(tr.n_tokens)

    def build():                                   # the figure and its update(...) -> Figure
        fig = Figure(figsize=(6.0, 2.6))           # not pyplot's: it stays open and is never shown by itself
        ax = fig.subplots()
        fig.subplots_adjust(left=0.13, right=0.98, bottom=0.17, top=0.9)   # room for 5-digit tick labels
        lines = {key: ax.plot(t, np.ones(len(t)), "-" if key != "dtilde_b" else ".", ms=2, lw=0.8,
                              color=COLORS[key], label=LABELS[key])[0] for key in keys}
        ax.set(yscale="log", xlabel="query position t", ylabel="distance")
        markup.plain_log(ax)
        ax.legend(ncol=2, loc="upper left")            # two rows: four labels do not fit one line
        title = ax.set_title("")

        def update(layer, head, N):
            st = distance.distance_stats(tr.probs[layer, head], tr.v[layer, head], [N], vis, stats=tuple(keys))
            ys = {key: st[key][:, 0].numpy() for key in keys}
            for key in keys:
                lines[key].set_ydata(ys[key])
            shown = np.concatenate([y[np.isfinite(y) & (y > 0)] for y in ys.values()])
            if len(shown):
                ax.set_ylim(shown.min() / 1.5, shown.max() * 40)      # room for the legend at the top
            title.set_text(f"layer {tr.layers[layer]}, head {tr.heads[head]}, L = {tr.n_tokens}, N = {N}")
            return fig

        return update

    kept = build()

    def draw(layer, head, N):
        return fig_to_png(kept(layer, head, N), close=False)

    draw.new_figure = lambda layer, head, N: build()(layer, head, N)   # the site's frame, drawn for phones too
    return draw


def readings_table():
    """HTML table of every reading of E, d~ and the vectors x_i: name, label, source, formula."""
    return markup.registry_table((("expectation E", readings.E_READINGS), ("distance d~", readings.D_READINGS),
                                ("vectors x_i", readings.VECTORS)), first="what")


def head_curve(rr, vec: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """L and the mean over heads of `key` at N = 5 for one vector choice (thm1_readings Result `rr`)."""
    curve = [r for r in rr.rows if r["kind"] == "curve" and r["N"] == 5 and r["vectors"] == vec]
    Ls = sorted({r["L"] for r in curve})
    return np.array(Ls), np.array([np.nanmean([r[key] for r in curve if r["L"] == L]) for L in Ls])


def vectors_frame(rr, vec: str) -> bytes:
    """PNG: Figure 2a's head means against L for one vector choice: d~ (a, b), every reading of E, the bound on
    E1/E3/E4 and sum ||a_i x_i||."""
    fig, ax = plt.subplots(figsize=(6.2, 3.4), layout="constrained")
    L, d = head_curve(rr, vec, "d_b")
    ax.plot(L, d, "o-", color="tab:green", lw=2.4, ms=3, label="true d~ (b)")
    ax.plot(*head_curve(rr, vec, "d_a"), "o--", color="tab:green", lw=1, ms=2, label="true d~ (a)")
    for key, col in E_COLORS.items():
        ax.plot(*head_curve(rr, vec, key), "o-", color=col, lw=1.2, ms=2.5, label=key.replace("_b", ""))
    _, xm = head_curve(rr, vec, "x_max")
    ax.plot(L, [theorem1.expectation_bound(5, int(n)) * v for n, v in zip(L, xm)], ":", color="0.3",
            label="bound (E1, E3, E4)")
    ax.plot(*head_curve(rr, vec, "sum_y"), "--", color="0.3", label="sum ||a_i x_i||")
    ax.set(xscale="log", yscale="log", xlabel="L", ylabel="head mean at N = 5")
    markup.plain_log(ax)
    ax.set_xticks(L, [str(int(v)) for v in L])
    ax.legend(ncol=3, loc="upper left", handlelength=1.5, columnspacing=0.8)
    ax.set_ylim(top=ax.get_ylim()[1] * 30)            # room for the legend above the curves
    ax.set_title(f"x = {vec} ({readings.VECTORS[vec].label})")
    return markup.png(fig, colors=32)


def verdict_grid(rclaims: Sequence[dict], cid: str, vecs: Sequence[str]):
    """HTML table: ✔ / ✘ of the claim rows `cid` for each reading pair of E and d~ (rows) and vector choice."""
    v = {r["reading"]: r["verdict"] for r in rclaims if r["id"] == cid}
    mark = {"holds": "✔", "does not hold": "✘"}
    pairs = [(e, d) for e in readings.E_READINGS for d in readings.D_READINGS]
    return markup.table(["E / d~"] + [f"<code>{x}</code>" for x in vecs],
                      [[f"{e} / {d}"] + [mark.get(v.get(f"{e} / {d} / {x}"), "–") for x in vecs] for e, d in pairs])


COR2_STATEMENTS = (("p1-fig2a-linear", "both curves linear (d~: b)"), ("p1-cor2-bounded", "bounded in L [R]"),
                   ("p1-cor2-i", "Cor. 2(i): E → sum ||a x||"), ("p1-cor2-ii", "Cor. 2(ii): E → 0 as N → L"))
# (E reading, its d~ part in the Cor. 2 rows, its d~ part in the Fig. 2a rows)
COR2_ROWS = (("E1", "-", "b"), ("E2", "-", "b"), ("E3", "-", "b"), ("E4", "b", "b"), ("E4", "a", "a"),
             ("E5", "-", "b"))


def cor2_counts(rclaims: Sequence[dict]):
    """HTML table: per reading of E, for how many vector choices each Corollary 2 / Fig. 2a statement holds."""
    def count(cid, e, dcol, dpair):
        d = dpair if cid == "p1-fig2a-linear" else dcol
        v = [r["verdict"] == "holds" for r in rclaims if r["id"] == cid and r["reading"].startswith(f"{e} / {d} / ")]
        return f"{sum(v)} of {len(v)}"

    return markup.table(["E reading"] + [label for _, label in COR2_STATEMENTS],
                      [[f"{e}" + (f" (d~ {dc})" if e == "E4" else "")] + [count(cid, e, dc, dp)
                                                                           for cid, _ in COR2_STATEMENTS]
                       for e, dc, dp in COR2_ROWS])


def _e1_against_bound(rr, vecs) -> tuple[list, ...]:
    """E1 against its bound (1 + 2NL/(L-1)) max ||x|| (the p1-cor2-bounded rows) and against sum_i ||a_i x_i||
    (p1-cor2-i), per vector choice, from the same head means as those claim rows: (E1 / bound at the first L,
    at the last L, the most E1 could grow, E1's growth, whether it passes the linear test, E1 / the sum)."""
    start, end, room, e1_growth, e1_linear, over_sum = [], [], [], [], [], []
    for x in vecs:
        L_x, e1 = head_curve(rr, x, "E1")
        bound = np.array([theorem1.expectation_bound(5, int(n)) for n in L_x]) * head_curve(rr, x, "x_max")[1]
        start.append(e1[0] / bound[0])
        end.append(e1[-1] / bound[-1])
        room.append(bound[-1] / e1[0])                       # the most E1 could grow from the first L to the last
        e1_growth.append(e1[-1] / e1[0])
        e1_linear.append(linear_growth(L_x, e1)["ok"])
        over_sum.append(e1[-1] / head_curve(rr, x, "sum_y")[1][-1])
    return start, end, room, e1_growth, e1_linear, over_sum


def cor2_prose(model_name: str, rr, rclaims: Sequence[dict]):
    """HTML: which readings make both Fig. 2a curves linear, how far E1 sits below its proved bound (so whether
    that bound rules the linear test out over these lengths), and how Corollary 2(i) fares, from the
    thm1_readings Result `rr` and its claim rows."""
    VECS = rr.provenance["vectors"]

    def statement_holds(cid, reading):
        return any(r["verdict"] == "holds" for r in rclaims if r["id"] == cid and r["reading"] == reading)


    both = [r["reading"] for r in rclaims if r["id"] == "p1-fig2a-linear" and r["verdict"] == "holds"
            and statement_holds("p1-cor2-bounded", "{} / - / {}".format(*r["reading"].split(" / ")[::2]))]
    linear = sorted({r["reading"].split(" / ")[0] for r in rclaims if r["id"] == "p1-fig2a-linear"
                     and r["verdict"] == "holds"})
    gap = {e: np.median([r["value"] for r in rclaims if r["id"] == "p1-cor2-i" and r["reading"].startswith(f"{e} / ")])
           for e in ("E1", "E2", "E5")}
    growth = {e: np.median([linear_growth(*head_curve(rr, x, e))["ratio"] for x in VECS])
              for e in ("E1", "E4_b", "E2", "E5")}
    Lc = rr.provenance["grids"]["curve_lengths"]
    start, end, room, e1_growth, e1_linear, over_sum = _e1_against_bound(rr, VECS)
    need = threshold("LINEAR_RATIO") * Lc[-1] / Lc[0]                     # the growth the linear test asks for
    ruled = [r < need for r in room]
    free = [(g, ok) for g, ok, r in zip(e1_growth, e1_linear, ruled) if not r]
    cor2_i = [r for r in rclaims if r["id"] == "p1-cor2-i"]
    cor2_ok = [r["reading"] for r in cor2_i if r["verdict"] == "holds"]
    lin_ok = {r["reading"] for r in rclaims if r["id"] == "p1-fig2a-linear" and r["verdict"] == "holds"}
    cor2_and_linear = [c for c in cor2_ok if any(f"{c.split(' / ')[0]} / {d} / {c.split(' / ')[2]}" in lin_ok
                                                 for d in readings.D_READINGS if c.split(" / ")[1] in ("-", d))]


    def span(v, fmt="{:.2f}"):
        lo, hi = fmt.format(min(v)), fmt.format(max(v))
        return lo if lo == hi else f"{lo}–{hi}"


    if not free:
        rest = ""
    elif not any(ok for _, ok in free):
        rest = (f"; for the other {len(free)} it is E1's measured growth, ×{span([g for g, _ in free], '{:.2g}')}, "
                "that fails it")
    else:
        rest = f"; of the other {len(free)}, E1 passes it for {sum(ok for _, ok in free)}"
    return markup.prose(
        f"<p><b>On {model_name}:</b> both curves grow about linearly only under "
        f"{' and '.join(linear) or 'no reading'}; from L = {Lc[0]} to {Lc[-1]} (×{Lc[-1] // Lc[0]}) E2 and E5 grow "
        f"×{growth['E2']:.3g} and ×{growth['E5']:.3g} (median over the vector choices), E1 only ×{growth['E1']:.2g} "
        "and "
        f"E4 ×{growth['E4_b']:.2g}. E2 and E5 are also the readings that break the bound, and at the largest L they "
        f"are {1 + gap['E2']:.0f} and {1 + gap['E5']:.0f} times the limit of Corollary 2(i) as read here "
        f"(median over the vector choices; E1: {1 + gap['E1']:.1f} times). "
        f"Readings that pass both the linear test and the bound: {len(both)}.</p>"
        f"<p>The bound is proved; what it decides over these lengths is measured. At L = {Lc[0]} E1 sits at "
        f"{span(start)} of its bound (over the {len(VECS)} vector choices; claim rows <code>p1-cor2-bounded</code>) "
        "and "
        f"at L = {Lc[-1]} at {span(end)}, so the bound leaves it room to grow ×{span(room, '{:.3g}')} from L = {Lc[0]} "
        f"to {Lc[-1]}, against the ×{need:.3g} that the linear test asks for. On this model the bound alone rules the "
        f"test out for {sum(ruled)} of the {len(VECS)} vector choices{rest}. On a model whose E1 started further below "
        "its bound, the bound would not rule out linear growth over these lengths.</p>"
        f"<p>Corollary 2(i), read as E → Σ<sub>i</sub> ‖α<sub>i</sub> x<sub>i</sub>‖ (claim rows "
        f"<code>p1-cor2-i</code>: relative gap at most {threshold('COR2_GAP'):.0%} at the largest L), holds for "
        f"{len(cor2_ok)} of the {len(cor2_i)} reading rows here"
        + (f" ({', '.join(f'<code>{c}</code>' for c in cor2_ok)})" if cor2_ok else "")
        + f"; at L = {Lc[-1]} E1 itself is {span(over_sum)} times that sum. "
        + ("So, read this way, the corollary fails under every reading on this model, whatever the growth. "
           if not cor2_ok else
           "None of them also passes the linear test. " if not cor2_and_linear else
           f"Of them, {len(cor2_and_linear)} also pass the linear test: {', '.join(cor2_and_linear)}. ")
        + "The paper's Sec. 3.1 reads Corollary 2(i) as predicting linear growth instead; read that way, the "
        "corollary and the "
        f"text on Figure 2a agree, and the question is only which reading of E grows linearly "
        f"({' and '.join(linear) or 'none'} on this model).</p>")
