"""Views for chapter 5 (Gradient sensitivity): one row's weights, Jacobian and g(T, ε), Figure 4's table, the live
one-head histogram and the readings tables. Views only: every number comes from
`attnlab.normalization.metrics.gradients` on a row or a Trace, or from the fig4 / gradient_readings Results."""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

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


# ------------------------------------------------------------------------ the chapter's folded cells, as views

def temperature_table(eps0: float = 1e-3):
    """HTML table: how far apart the softmax weights of two logit vectors `eps0` apart are, against T, beside
    1/(4T) and 1/(2T)."""
    l1 = torch.tensor([1 + eps0, 1.0, 0.2, -0.5, -1.0], dtype=torch.float64)
    l2 = torch.tensor([1 - eps0, 1 + eps0, 0.2, -0.5, -1.0], dtype=torch.float64)
    rows = []
    for T in (10.0, 1.0, 0.1, 0.01, 1e-3, 1e-4):
        d = float((normalizers.softmax(l1, T=T) - normalizers.softmax(l2, T=T)).norm())
        rows.append([f"{T:g}", f"{d:.2e}", f"{d / (math.sqrt(5) * eps0):.3g}", f"{1 / (4 * T):.3g}",
                     f"{1 / (2 * T):.3g}"])
    return markup.table(["T", "‖α⁽¹⁾ − α⁽²⁾‖", "‖α⁽¹⁾ − α⁽²⁾‖ / (√5 ε)", "1/(4T)", "1/(2T)"], rows)


def print_jacobian_checks(Ts: Sequence[float] = (0.05, 0.1, 0.3, 1.0, 3.0)) -> None:
    """Prints three checks at the temperatures Ts: two tied top logits reach ||J|| = 1/(2T), above the paper's
    curve; Lemma 2 [R] bounds ||J|| of a row, whose general normalizer Jacobian equals the softmax one."""
    tie = torch.tensor([2.0, 2.0, -200.0, -200.0, -200.0], dtype=torch.float64)
    J_tie = [float(normalizers.spectral_norm(normalizers.softmax_jacobian(normalizers.softmax(tie, T=T), T)))
             for T in Ts]
    print("two tied top logits: ||J|| = 1/(2T) at every T:", all(math.isclose(j * 2 * T, 1, rel_tol=1e-9)
                                                               for j, T in zip(J_tie, Ts)))
    print("... so the paper's curve min{1/(4T), sqrt 2} is exceeded there:",
          all(j > float(bounds.corollary3_bound(T)) for j, T in zip(J_tie, Ts)))
    l_chk = torch.tensor([1.3, 0.7, 0.2, -0.4, -1.1, 0.05], dtype=torch.float64)
    ok = []
    for T in Ts:
        a = normalizers.softmax(l_chk, T=T)
        J = normalizers.softmax_jacobian(a, T)
        F = torch.exp((l_chk - l_chk.max()) / T)                 # softmax as F(l) = exp(l/T), shifted
        ok.append(float(normalizers.spectral_norm(J)) <= float(bounds.lemma2_bound(F, F / T)) + 1e-12
                  and torch.allclose(bounds.normalizer_jacobian(F, F / T), J)
                  and float(J.abs().max()) <= 1 / (4 * T) + 1e-12)
    print("Lemma 2 [R] bounds ||J||, the general Jacobian equals the softmax one, entries <= 1/(4T):", all(ok))


def near_tie_row(trace, tie: float = 0.01, min_keys: int = 16) -> SimpleNamespace:
    """The row of Trace `trace` (scores kept) whose gap between its two largest logits is nearest `tie` in log scale
    (rows with at least `min_keys` keys), printed, with g(T, ε) on a T grid (`gradients.fd_grad_norms`) and the exact
    Jacobian norm: row [K] (its logits), gap (float), T_grid [26], E_vals, g_row [T, ε], J_row [T]."""
    vis = trace.visible()
    S = trace.scores.double().cpu().masked_fill(~vis, float("-inf"))          # [layer, head, Q, K]
    top2 = S.topk(2, dim=-1).values
    gap = top2[..., 0] - top2[..., 1]
    dist = (gap.clamp_min(1e-12) / tie).log().abs().masked_fill(vis.sum(-1) < min_keys, float("inf"))
    li, hi, t = np.unravel_index(int(dist.argmin()), dist.shape)
    row = S[li, hi, t, vis[t]]                                                 # the row's logits [K]
    print(f"row {t} of layer {trace.layers[li]}, head {trace.heads[hi]}: {len(row)} keys, "
          f"gap between its two largest logits {float(gap[li, hi, t]):.2g}")
    T_grid = np.logspace(-3, 2, 26)
    E_vals = [1e-3, 1e-1, 10.0]
    g_row = gradients.fd_grad_norms(row[None], T_grid, E_vals, seed=0)[0]           # [T, eps]
    J_row = [float(gradients.softmax_jacobian_norm(normalizers.softmax(row, T=T)[None], T)[0]) for T in T_grid]
    return SimpleNamespace(row=row, gap=float(gap[li, hi, t]), T_grid=T_grid, E_vals=E_vals, g_row=g_row,
                           J_row=J_row)


def row_slider(pick: SimpleNamespace, T_frames: Sequence[float] = (1e-3, 1e-2, 1e-1, 1.0, 10.0)):
    """Two sliders (T, ε) over `row_frame` of the `near_tie_row` `pick`."""
    from attnlab.widgets import frame_slider_2d

    T_frames, E_vals = list(T_frames), pick.E_vals
    return frame_slider_2d([[markup.png(row_frame(pick.row, T, e, pick.T_grid, pick.g_row, pick.J_row, E_vals))
                             for e in E_vals] for T in T_frames], T_frames, E_vals, "T", "ε", readout_format1="g",
                           readout_format2="g",
                           alt=("One attention row of the model at temperature T and step ε: its weights, its "
                                "Jacobian, and g(T, ε) against T with the exact norm and both bounds"))


def live_box(trace):
    """Kernel sliders (layer, head, T, ε) over `live_g_histogram` of Trace `trace`, timed (in Jupyter only)."""
    import ipywidgets as widgets

    from attnlab.widgets import live_slider, time_updates

    live_g = live_g_histogram(trace)
    box = live_slider(live_g,
                      caption=("One head: the histogram of log10 g(T, ε) over its query rows, with "
                               "1/(4T), 1/(2T) and √2/ε"),
                      layer=(trace.layers[0], trace.layers[-1], 1), head=(trace.heads[0], trace.heads[-1], 1),
                      T=widgets.FloatLogSlider(value=0.1, base=10, min=-3, max=2, step=0.25, description="T"),
                      eps=widgets.FloatLogSlider(value=1e-3, base=10, min=-3, max=1, step=1, description="ε"))
    time_updates(live_g, trace.layers[0], trace.heads[0], 0.1, 1e-3, what="compute + draw")   # in Jupyter only
    return box


def readings_slider(res_g, g_tab: dict):
    """Two sliders (summary, direction) over `lemma2.plot_gradient_readings` of the gradient_readings Result `res_g`
    (`lemma2.g_table` `g_tab`)."""
    from attnlab.normalization.readings import lemma2
    from attnlab.widgets import frame_slider_2d

    aggs_g, dirs_g = list(readings.G_AGGREGATES), list(readings.DIRECTIONS)
    return frame_slider_2d([[markup.png(lemma2.plot_gradient_readings(res_g, aggregate=a, direction=d, table=g_tab))
                             for d in dirs_g] for a in aggs_g], aggs_g, dirs_g, "summary", "direction",
                           alt="g(T, eps) against T for one summary and direction reading")


def readings_prose(res_g, rows_g: Sequence[dict]):
    """A paragraph: what the gradient_readings Result `res_g` holds (its grids) and how long it took."""
    prov = res_g.provenance
    eps_g = prov["grids"]["epsilons"]
    return markup.prose(f"<p>{len(res_g.rows)} head rows ({len(prov['grids']['temperatures'])} temperatures, eps = "
                      f"{', '.join(f'{e:g}' for e in eps_g)}, L = {prov['window_tokens']}, worst direction on "
                      f"{prov['jac_rows']} rows per head), {len(rows_g)} claim rows; computed in "
                      f"{markup.seconds(prov['runtime_seconds'])}.</p>")


def limit_table(res_g, g_tab: dict, eps_g: Sequence[float]):
    """Prints how many rows sit within T of a tie (the worst direction) and the smallest top-2 gap; returns the HTML
    table of g at the smallest T against its exact T -> 0 limit, the rows whose argmax flips and the near-tie level,
    per direction and ε (`lemma2.g_table` `g_tab` and `lemma2.g_limit` of the gradient_readings Result `res_g`)."""
    from attnlab.normalization.claims import linear_fit
    from attnlab.normalization.readings import lemma2

    worst = g_tab[("worst", 0.0)]
    share = np.nanmean(worst["near_tie_frac"], axis=1)                  # mean over heads, per T
    small = (worst["T"] < 0.1) & (share > 0)
    share_slope = linear_fit(np.log10(worst["T"][small]), np.log10(share[small]))[0]
    gap_min = min(r["gap_min"] for r in res_g.rows if r["T"] == 0.0)
    print("share of rows whose two largest logits are less than T apart: "
          + ", ".join(f"{s:.2%} at T = {t:g}" for t, s in zip(worst["T"], share) if t in worst["T"][small][::3])
          + f"\n  log-log slope below T = 0.1: {share_slope:.2f} (1 = proportional to T); rho = share / T = "
          f"{share[0] / worst['T'][0]:.2f} per unit of logit at T = {worst['T'][0]:g}"
          f"\nsmallest top-2 gap of any row: {gap_min:.2g}")
    rows_m = []
    for d in ("gaussian", "rademacher"):
        for e in eps_g:
            gt = g_tab[(d, e)]
            i0, i1 = int(np.argmin(gt["T"])), int(np.argmin(np.abs(np.log(gt["T"] / 0.01))))
            meas, near_g = gt["g_mean"][i0], gt["g_near_tie"][i1]         # near-tie level: rho from the gaps < 0.01
            lim = [lemma2.g_limit(res_g, d, e, a) for a in ("max_head_mean", "median_head_mean")]
            lim_mean = lemma2.g_limit(res_g, d, e, "", key="g_mean")
            flips = lemma2.g_limit(res_g, d, e, "", key="flip_frac")
            rows_m.append([f"<code>{d}</code>", f"{e:g}", f"{np.nanmax(meas):.3g} / {np.nanmean(meas):.3g}",
                           f"{lim[0]:.3g} / {lim_mean:.3g}", f"{flips:.2%}",
                           f"{np.nanmax(near_g):.3g} / {np.nanmean(near_g):.3g}", f"{math.sqrt(2) / e:.3g}"])
    return markup.table(["direction", "eps", f"measured token mean at T = {gt['T'][i0]:g}", "exact limit T -> 0",
                       "rows whose argmax flips", f"near-tie level (gaps < {gt['T'][i1]:.2g})", "cap sqrt(2)/eps"],
                      rows_m, caption="max over heads / mean over heads of the token mean g; flips: mean over heads")


def slope_verdicts(slopes: dict):
    """HTML: the readings whose slope is within -1 ± 0.25 and the flatter ones (`slopes`: reading -> p1-fig4-slope
    claim row)."""
    from IPython.display import HTML

    ok = [r for r in slopes.values() if r["verdict"] == "holds"]
    no = [r for r in slopes.values() if r["verdict"] != "holds"]

    def slope_list(rs):
        return ", ".join(f"<code>{r['reading']}</code> ({r['measured'].split(' (')[0]})" for r in rs) or "none"

    return HTML(f"<p><b>Slope within -1 ± 0.25</b> ({len(ok)} of {len(slopes)} readings): {slope_list(ok)}.</p>"
                f"<p><b>Flatter</b>: {slope_list(no)}.</p>")


def print_limit_checks(res_g, slopes: dict, rows_g: Sequence[dict], rows4: Sequence[dict]) -> None:
    """Prints the checks of g's T -> 0 limit: it equals g at T = 1e-4 on synthetic rows away from ties and is
    sqrt(2)/eps times 'the argmax moves', never above sqrt(2)/eps on the model (`res_g`); one claim row per reading
    (`slopes`, `rows_g`), the default reading's verdict that of the claim table (`rows4`)."""
    from attnlab.normalization.readings import lemma2

    eps_g = res_g.provenance["grids"]["epsilons"]
    gen = torch.Generator().manual_seed(0)
    l_syn = torch.randn(4, 48, 48, generator=gen, dtype=torch.float64) * 3        # 4 heads x 48 rows x 48 keys
    all_keys = torch.ones(48, 48, dtype=torch.bool)
    v_syn = gradients.random_directions((4,), all_keys, 0)
    same, flips_ok = [], []
    for e in (1e-3, 0.1, 10.0):
        g_tiny = gradients.fd_grad_norms(l_syn, [1e-4], [e], seed=0)[..., 0, 0]
        g_lim = gradients.fd_grad_limit(l_syn, [e], seed=0)[..., 0]
        far = (lemma2.top2_gaps(l_syn, all_keys)[0] > 5e-3) & (lemma2.top2_gaps(l_syn + e * v_syn, all_keys)[0] > 5e-3)
        same.append(torch.allclose(g_tiny[far], g_lim[far], rtol=1e-6, atol=1e-12))
        moved = (l_syn + e * v_syn).argmax(-1) != l_syn.argmax(-1)
        flips_ok.append(torch.allclose(g_lim, math.sqrt(2) / e * moved.double()))
    print("g(T = 1e-4, eps) equals its exact T -> 0 limit on synthetic rows away from ties:", all(same))
    print("that limit is sqrt(2)/eps times 'the argmax moves':", all(flips_ok))
    print("the limit never exceeds sqrt(2)/eps on this page's model:",
          all(r["g_max_row"] <= math.sqrt(2) / r["eps"] * (1 + 1e-12) for r in res_g.rows if r["T"] == 0.0))
    n_slopes = len(readings.G_AGGREGATES) * (len(readings.DIRECTIONS) - 1) * len(eps_g) + len(readings.G_AGGREGATES)
    print("one claim row per reading:", len(slopes) == len(rows_g) == n_slopes)
    default = slopes["max_head_mean / gaussian / eps=" + f"{min(eps_g):g}"]
    print("the default reading gives the claim table's verdict:",
          default["verdict"] == next(r["verdict"] for r in rows4 if r["id"] == "p1-fig4-slope"))
