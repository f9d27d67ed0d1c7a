"""Views for chapter 1 (Vanishing attention): Figure 1's summary table, the row-statistics frames over length and
temperature, and the live one-head figure. Views only: every number is read from the fig1 Result or from
`attnlab.normalization.metrics.rows` on cached Traces."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from attnlab.book import markup
from attnlab.core.verdicts import percent
from attnlab.normalization.metrics import rows


def fig1_table(r1, model_name: str):
    """HTML table: the Corollary 1 and Lemma 1 bands, the largest weight and the entropy against the paper."""
    Ls = sorted(r1.unique("L"))
    L0, L1 = Ls[0], Ls[-1]

    def head_mean(key, L):
        return markup.head_mean(r1, key, L=L)

    cor, lem = np.mean(r1.column("cor1_holds")), np.mean(r1.column("lemma1_holds"))
    mw0, mw1 = head_mean("max_weight", L0), head_mean("max_weight", L1)
    slope = np.polyfit(np.log(Ls), np.log([head_mean("max_weight", L) for L in Ls]), 1)[0]
    band = np.median(r1.column("log10_cor1_hi", L=L1) - r1.column("log10_cor1_lo", L=L1)) / 2
    return markup.table(
        ["", "paper", f"this book ({model_name})"],
        [["Corollary 1 band contains every weight", "theorem", f"{percent(cor)} of rows (all heads, all L)"],
         ["Lemma 1 band, softmax, a = maxᵢ |lᵢ|", "theorem", f"{percent(lem)} of rows"],
         [f"mean largest weight, L = {L0} → {L1}", "vanishes like O(1/L)",
          f"{mw0:.3f} → {mw1:.3f} (uniform: {1 / L0:.3f} → {1 / L1:.4f})"],
         ["log-log slope of the mean largest weight against L", "−1 once L is large (fixed C₁, C₂)",
          f"{slope:.2f}".replace("-", "−")],
         [f"mean normalized entropy H / log L at L = {L1}", "→ 1 when weights vanish to 1/L",
          f"{head_mean('entropy_norm', L1):.2f}"],
         [f"half-width of the Corollary 1 band at L = {L1} (median, decades)", "—",
          f"{band:.1f}: weights may lie a factor 10<sup>{band:.0f}</sup> from 1/L"]])


def row_stats(tr, tau: float):
    """Per (layer, head, row) of Trace `tr` (scores, q, k kept) at temperature tau x the model's: largest
    weight, normalized entropy, inside the Corollary 1 band."""
    return rows.temperature_row_stats(tr.scores, tr.q, tr.k, tr.scaling, tau, tr.visible())


def length_frame(tr, tau: float, L_max: int, figsize=(6.2, 2.4)):
    """Figure: histograms of every row's largest weight (against 1/L) and normalized entropy, for Trace `tr` at
    temperature tau; `L_max` fixes the weight axis across frames."""
    L = tr.n_tokens
    mw, hn, inside = row_stats(tr, tau)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=figsize, layout="constrained")
    bins = np.geomspace(1 / L_max / 1.5, 1.0, 40)
    a1.hist(mw.flatten().numpy(), bins=bins, color="tab:purple", alpha=0.8)
    a1.axvline(1 / L, color="k", ls="--", lw=1, label="1/L")
    a1.set(xscale="log", xlabel="largest weight of a row", ylabel="rows", yticks=[])
    a1.legend(loc="upper right")
    markup.plain_log(a1)
    a1.set_title(f"median {mw.median():.3f}; rows in Cor. 1 band: {inside.double().mean():.0%}")
    a2.hist(hn.flatten().numpy(), bins=np.linspace(0, 1, 41), color="tab:orange", alpha=0.8)
    a2.set(xlabel="normalized entropy H / log L", yticks=[], xlim=(0, 1))
    a2.set_title(f"L = {L}, temperature {tau:g} x model's")
    return fig


def sorted_weights(tr, layer: int, head: int, tau: float) -> np.ndarray:
    """One head's rows of Trace `tr` at temperature tau x the model's: weights sorted per row, [rows, keys]."""
    s = tr.scores[layer, head].double().div(tau).masked_fill(~tr.visible(), float("-inf"))   # raw scores: mask here
    w = torch.softmax(s, dim=-1)                  # a masked key gets exactly 0
    return w.sort(dim=-1, descending=True).values.numpy()


def head_figure(tr, ranks: Sequence[int] | None = None):
    """The live figure for Trace `tr`, built once: returns draw(layer, head, tau) -> PNG bytes (the 10-90% band
    and median of the sorted weights against rank, and every row's largest weight), which only sets the new data
    (a new figure per update spent most of its time building axes, ticks and texts).
    ``draw.new_figure(layer, head, tau)``: the same frame in a new Figure (what `attnlab.widgets.live_slider`
    lays out for a phone)."""
    from matplotlib.figure import Figure

    from attnlab.widgets import fig_to_png

    L = tr.n_tokens
    ranks = np.unique(np.geomspace(1, L, 400).round().astype(int)) if ranks is None else np.asarray(ranks)
    rank = ranks[ranks <= L]

    def build():                                   # the figure and its update(...) -> Figure
        fig = Figure(figsize=(6.4, 2.5))           # not pyplot's: it stays open and is never shown by itself
        a1, a2 = fig.subplots(1, 2)
        fig.subplots_adjust(left=0.13, right=0.98, bottom=0.19, top=0.88, wspace=0.35)
        floor = np.full(len(rank), 1e-12)
        band = a1.fill_between(rank, floor, floor, color="tab:purple", alpha=0.25, lw=0, label="10-90% of rows")
        (median,) = a1.plot(rank, floor, color="tab:purple", lw=1.2, label="median row")
        a1.axhline(1 / L, color="k", ls="--", lw=1, label="1/L")
        a1.set(xscale="log", yscale="log", ylim=(1e-8, 1.2), xlabel="rank of the key in its row", ylabel="weight")
        a1.legend()
        (top,) = a2.plot(np.arange(L), np.ones(L), ".", ms=2, color="tab:purple")
        a2.axhline(1 / L, color="k", ls="--", lw=1)
        a2.set(yscale="log", ylim=(1 / L / 2, 1.2), xlabel="query position t", ylabel="largest weight")
        markup.plain_log(a1, a2)
        title = fig.suptitle("")

        def update(layer, head, tau):
            srt = sorted_weights(tr, layer, head, tau)
            lo, med, hi = np.maximum(np.percentile(srt[:, rank - 1], [10, 50, 90], axis=0), 1e-12)   # over rows
            band.set_verts([np.column_stack([np.r_[rank, rank[::-1]], np.r_[lo, hi[::-1]]])])
            median.set_ydata(med)
            top.set_ydata(srt[:, 0])
            title.set_text(f"layer {tr.layers[layer]}, head {tr.heads[head]}, L = {L}, temperature {tau:g} x model's")
            return fig

        return update

    kept = build()

    def draw(layer, head, tau):
        return fig_to_png(kept(layer, head, tau), close=False)

    draw.new_figure = lambda layer, head, tau: build()(layer, head, tau)   # the site's frame, drawn for phones too
    return draw
