"""Views for chapter 10 (Real tokens): the per-layer fit table and frame, the per-head table, every head's
exponents and the heads below their curve, from a `sample_complexity.real_tokens.real_encoder` Result.
Views only: the numbers come from the Result and `sample_complexity.theory`."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import HTML

from attnlab.book import markup
from attnlab.sample_complexity import claims as scc
from attnlab.sample_complexity import theory

STYLE = {"mean": ("o", "tab:purple"), "cov": ("s", "tab:orange")}


def fits(res) -> dict[tuple[int, str], dict]:
    """(layer, moment) -> the fit row."""
    return {(f["layer"], f["moment"]): f for f in res.select(kind="fit")}


def _pm(f: dict) -> str:
    return f"{f['beta']:.2f} ± {f['slope_se']:.2f}"


def fit_table(res):
    """HTML table per layer: H (ours and the authors'), beta(H) and the fitted |beta| of the mean and covariance."""
    fit = fits(res)
    return markup.table(["layer", "H (ours)", "H (authors' code)", "β(H) [CODE curve]", "|β| mean", "|β| cov"],
                      [[l, f"{fit[l, 'mean']['horizon']:.3g}", f"{fit[l, 'mean']['horizon_authors']:.3g}",
                        f"{fit[l, 'mean']['beta_ref']:.3f}", _pm(fit[l, "mean"]), _pm(fit[l, "cov"])]
                       for l in sorted(res.unique("layer"))])


def _errors_panel(ax, res, fit, layer, n_r):
    for mom, (mk, col) in STYLE.items():
        f = fit[layer, mom]
        pts = sorted(res.select(kind="point", layer=layer, moment=mom), key=lambda q: q["n"])
        y = np.array([q["err_mean"] for q in pts])
        ax.errorbar(n_r, y, yerr=[q["err_se"] for q in pts], fmt=mk, ms=3.5, color=col, capsize=2,
                    label=f"{mom}: slope {f['slope']:.2f}")
        ax.plot(n_r, np.exp(f["intercept"]) * n_r ** f["slope"], "--", color=col, lw=1)
        ax.plot(n_r, y[0] * (n_r / n_r[0]) ** -0.5, ":", color="grey", lw=1,
                label=r"slope $-1/2$" if mom == "cov" else None)
        ax.plot(n_r, y[0] * (n_r / n_r[0]) ** -f["beta_ref"], ":", color="darkred", lw=1,
                label=r"slope $-\beta(H)$" if mom == "cov" else None)
    H = fit[layer, "mean"]["horizon"]
    ax.set(xscale="log", yscale="log", xlabel="n (subsampled tokens)", ylabel="error against the window",
           title=f"layer {layer}: H = {H:.3g}, β(H) = {theory.beta_reference(H):.3f}")
    ax.title.set_fontsize(9)
    ax.legend(loc="lower left")
    markup.plain_log(ax, nice="y")
    ax.set_xticks(n_r, [f"{n:g}" for n in n_r])


def layer_frame(res, layer: int):
    """Figure: left, one layer's mean and covariance errors against n with their fits and the slopes -1/2 and
    -beta(H); right, every layer's fitted exponents against its horizon with beta(H), this layer circled."""
    fit, layers = fits(res), sorted(res.unique("layer"))
    n_r = np.array(sorted({q["n"] for q in res.select(kind="point")}), dtype=float)
    Hs = [fit[l, "mean"]["horizon"] for l in layers]
    H_grid = np.geomspace(min(Hs) / 1.5, max(Hs) * 1.5, 200)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.6, 2.8), layout="constrained")
    _errors_panel(ax, res, fit, layer, n_r)
    for mom, (mk, col) in STYLE.items():
        sel = [fit[l, mom] for l in layers]
        ax2.errorbar([f["horizon"] for f in sel], [f["beta"] for f in sel], yerr=[f["slope_se"] for f in sel],
                     fmt=mk, ms=4, color=col, capsize=2, label=rf"$|\beta_{{\rm {mom}}}|$")
        ax2.plot([fit[layer, "mean"]["horizon"]], [fit[layer, mom]["beta"]], "o", ms=11, mfc="none", mec="k",
                 mew=1.5)
    ax2.plot(H_grid, theory.beta_reference(H_grid), color="darkred", lw=1.3, label=r"$\beta(H)=\frac{1}{2(1+H^2)}$")
    ax2.axhline(0.5, color="grey", ls="--", lw=1)
    ax2.set(xscale="log", yscale="log", ylim=(1e-3, 1.5), xlabel="horizon H (ours)", ylabel=r"fitted $|\beta|$")
    ax2.legend(loc="lower left")
    markup.plain_log(ax2, nice="x")
    return fig


def at_or_above(h: dict, mom: str) -> bool:
    """The claim checker's test of one head: |beta| within `scc.margin_text` of beta(H_j) or above."""
    return scc.beta_at_or_above(h[f"beta_{mom}"], h["beta_ref"], h[f"beta_{mom}_se"])


def _spread(v) -> str:
    return f"{np.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"


def heads_table(res):
    """HTML table per layer: its H, its heads' H_j (min / median / max), their |beta| (median and range) and how
    many heads sit at or above beta(H_j)."""
    fit, heads = fits(res), res.select(kind="head")
    rows = []
    for l in sorted(res.unique("layer")):
        hs = [h for h in heads if h["layer"] == l]
        H_j = " / ".join(f"{v:.2g}" for v in np.percentile([h["horizon"] for h in hs], [0, 50, 100]))
        counts = f"{sum(at_or_above(h, 'mean') for h in hs)}, {sum(at_or_above(h, 'cov') for h in hs)} of {len(hs)}"
        rows.append([l, f"{fit[l, 'mean']['horizon']:.3g}", H_j, _spread([h["beta_mean"] for h in hs]),
                     _spread([h["beta_cov"] for h in hs]), counts])
    return markup.table(["layer", "H of the layer", r"\(H_j\) of its heads: min / median / max [CODE]",
                       "|β| mean per head: median (range)", "|β| cov per head: median (range)",
                       r"heads at or above \(\beta(H_j)\) [R]: mean, cov"], rows,
                      caption="Per-head horizons and exponents (WLS fits [CODE]); β(H) = 1/(2(1+H²)) [CODE]")


def every_head(res):
    """HTML: a folded table of every head's horizon, beta(H_j) and exponents (' (below)' where under its curve)."""
    heads = res.select(kind="head")

    def pm(h, mom):
        return f"{h[f'beta_{mom}']:.2f} ± {h[f'beta_{mom}_se']:.2f}" + ("" if at_or_above(h, mom) else " (below)")
    table = markup.table(["layer", "head", r"\(H_j\)", r"\(\beta(H_j)\) [CODE]", "|β| mean", "|β| cov"],
                       [[h["layer"], h["head"], f"{h['horizon']:.3g}", f"{h['beta_ref']:.3f}", pm(h, "mean"),
                         pm(h, "cov")] for h in heads])
    return HTML(f"<details><summary>Every head ({len(heads)} rows): its horizon and exponents</summary>{table.data}"
                "</details>")


def heads_below(res) -> str:
    """Text: the heads whose exponent (mean or covariance) is below beta(H_j) by more than the checker's margin."""
    heads = res.select(kind="head")
    below = [h for h in heads if not (at_or_above(h, "mean") and at_or_above(h, "cov"))]
    lines = [f"{len(below)} of {len(heads)} heads have an exponent below beta(H_j) by more than "
             f"{scc.margin_text()}:"]
    lines += [f"  layer {h['layer']} head {h['head']:2d}: H_j = {h['horizon']:.2f}, beta(H_j) = {h['beta_ref']:.2f}; "
              f"|beta| mean {h['beta_mean']:.2f} ± {h['beta_mean_se']:.2f}, cov {h['beta_cov']:.2f} ± "
              f"{h['beta_cov_se']:.2f}" for h in below]
    return "\n".join(lines)
