"""Views for chapter 5 (Gradient sensitivity): one row's weights, Jacobian and g(T, ε), Figure 4's table, the live
one-head histogram and the readings tables. Views only: every number comes from
`attnlab.normalization.metrics.gradients` on a row or a Trace, or from the fig4 / gradient_readings Results."""
from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from attnlab.book import markup
from attnlab.normalization import bounds, readings
from attnlab.normalization.metrics import gradients
from attnlab.tools import normalizers


def row_frame(row, T: float, eps: float, T_grid: np.ndarray, g_row: np.ndarray, J_row: Sequence[float],
              E_vals: Sequence[float], figsize=(6.8, 2.6)):
    """Figure for one row of logits [K] at temperature T: its weights, its softmax Jacobian, and g(T, ε) against
    T (`g_row` [T, eps] on `T_grid` x `E_vals`) beside the exact Jacobian norm `J_row` and both bounds."""
    a = normalizers.softmax(row, T=T)
    J = normalizers.softmax_jacobian(a, T)
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=figsize, layout="constrained",
                                        gridspec_kw={"width_ratios": [1, 1, 1.25]})
    ax0.bar(np.arange(len(a)), a.numpy(), color="tab:purple", width=0.9)
    ax0.set(ylim=(0, 1.02), xlabel="key", ylabel=r"$\alpha_i$", title=f"weights at T = {T:g}")
    m = float(J.abs().max()) or 1.0
    ax1.imshow(J.numpy(), cmap="RdBu_r", vmin=-m, vmax=m)
    ax1.set(xticks=[], yticks=[], title=f"Jacobian: ‖J‖ = {float(normalizers.spectral_norm(J)):.3g}")
    ax1.set_xlabel(f"1/(4T) = {1 / (4 * T):.3g},  1/(2T) = {1 / (2 * T):.3g}")
    e = list(E_vals).index(eps)
    ax2.loglog(T_grid, g_row[:, e], "o-", ms=2.5, color="tab:orange", label=f"g(T, ε = {eps:g})")
    ax2.loglog(T_grid, J_row, "-", color="0.5", lw=1, label="exact ‖J‖")
    ax2.loglog(T_grid, np.minimum(1 / (4 * T_grid), math.sqrt(2)), "k--", lw=1, label="min{1/(4T), √2}")
    ax2.loglog(T_grid, 1 / (2 * T_grid), "k:", lw=1, label="1/(2T)")
    ax2.plot([T], [float(g_row[list(T_grid).index(min(T_grid, key=lambda x: abs(math.log(x / T))))][e])],
             "o", ms=7, mfc="none", mec="r")
    ax2.set(ylim=(1e-6, 1e3), xlabel="T", title="this row")
    ax2.legend(loc="lower left")
    return fig


def gmax_table(res4, temperatures: Sequence[float] = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)):
    """HTML table: the largest g over rows at each ε, at the grid temperatures nearest `temperatures`, beside the
    paper's curve and 1/(2T)."""
    eps4 = sorted(res4.unique("eps"))
    T4 = np.array(sorted(res4.unique("T")))

    def gmax(T, e):
        return res4.select(T=T, eps=e)[0]["g_max"]

    pick = [T4[np.argmin(abs(np.log(T4 / t)))] for t in temperatures]
    return markup.table(["T"] + [f"max g, ε = {e:g}" for e in eps4] + ["paper's curve min{1/(4T), √2}", "1/(2T)"],
                      [[f"{T:.3g}"] + [f"{gmax(T, e):.3g}" for e in eps4]
                       + [f"{float(bounds.corollary3_bound(T)):.3g}", f"{1 / (2 * T):.3g}"] for T in pick])


def live_g_histogram(trace):
    """The live one-head figure for Trace `trace` (scores kept): returns draw(layer, head, T, eps) -> Figure, the
    histogram of log10 g(T, ε) over the query rows with 1/(4T), 1/(2T) and √2/ε."""
    vis = trace.visible()

    def draw(layer, head, T, eps):
        li, hi = trace.layers.index(layer), trace.heads.index(head)
        g = gradients.fd_grad_norms(trace.scores[li, hi].cpu(), [T], [eps], vis, seed=0)[:, 0, 0].numpy()
        g = g[np.isfinite(g) & (g > 0)]
        fig, ax = plt.subplots(figsize=(5.2, 2.6))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.18, top=0.89)          # fixed layout: fast redraws
        ax.hist(np.log10(g), bins=40, color="tab:orange", alpha=0.85)
        for val, style, lab in ((1 / (4 * T), "--", "1/(4T)"), (1 / (2 * T), ":", "1/(2T)"),
                                (math.sqrt(2) / eps, "-.", "√2/ε")):
            ax.axvline(math.log10(val), color="k", ls=style, lw=1, label=lab)
        ax.set(xlabel="log10 g(T, ε) of each query row", ylabel="rows",
               title=f"layer {layer}, head {head}, T = {T:.3g}, ε = {eps:.3g}, L = {trace.n_tokens}")
        ax.legend(loc="upper left")
        return fig

    return draw


def readings_table():
    """HTML table of every reading of g: the summary over rows and heads, and the direction v."""
    return markup.registry_table((("summary", readings.G_AGGREGATES), ("direction v", readings.DIRECTIONS)))


def slope_table(slopes: dict, eps_g: Sequence[float], L: int, model_name: str):
    """HTML table: the log-log slope of g below T = 0.1 and its verdict per summary, direction and ε (`slopes`:
    reading -> p1-fig4-slope claim row)."""
    def cell(agg, d, e):
        r = slopes[f"{agg} / {d} / " + ("eps->0" if d == "worst" else f"eps={e:g}")]
        return f"{r['measured'].split(' (')[0].replace('slope ', '')}<br><b>{r['verdict']}</b>"

    return markup.table(["summary", "direction"] + [f"eps = {e:g}" for e in eps_g],
                      [[readings.G_AGGREGATES[agg].label if j == 0 else "", f"<code>{d}</code>"]
                       + ([cell(agg, d, 0.0), "(eps -> 0)", ""] if d == "worst" else [cell(agg, d, e) for e in eps_g])
                       for agg in readings.G_AGGREGATES for j, d in enumerate(readings.DIRECTIONS)],
                      caption=f"log-log slope of g over T < 0.1 ({model_name}, L = {L}); paper: -1")
