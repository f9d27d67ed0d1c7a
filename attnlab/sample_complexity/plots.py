"""Plots of the token-sample-complexity experiments (arXiv 2512.10656): views only, they read Results
and never recompute science. `plot_<experiment>(result) -> matplotlib.figure.Figure`."""
from __future__ import annotations

from typing import Optional

import numpy as np

from attnlab.core.result import Result
from attnlab.core.text import text_title
from attnlab.core.util import figure_row
from attnlab.sample_complexity.theory import beta_reference


def _figure(ncols: int, width: float = 4.6, height: float = 3.6):
    return figure_row(ncols, width, height)


def _colors(count: int, cmap: str = "viridis"):
    import matplotlib

    cm = matplotlib.colormaps[cmap]
    return [cm(x) for x in np.linspace(0.05, 0.9, max(count, 1))]


def _loglog(ax) -> None:
    """Log-log axes without crowded minor tick labels."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())


def _curve(ax, pts: list[dict], fit: Optional[dict], color, label: str) -> None:
    pts = sorted(pts, key=lambda r: r["n"])
    n = np.array([p["n"] for p in pts], dtype=float)
    ax.errorbar(n, [p["err_mean"] for p in pts], yerr=[p["err_se"] for p in pts], fmt="o", ms=3.5,
                color=color, capsize=2, label=label)
    if fit is not None and np.isfinite(fit.get("slope", np.nan)):
        ax.plot(n, np.exp(fit["intercept"]) * n ** fit["slope"], "--", color=color, lw=1)


#: a preset and a device as a reader reads them in a title
PRESET_WORDS = {"default": "default grid", "quick": "quick grid", "paper": "the paper's grid"}
DEVICE_WORDS = {"cpu": "CPU", "cuda": "GPU", "mps": "Apple GPU"}


def _title(result: Result, what: str) -> str:
    """'<what>' + the run in a reader's words: "(default grid, 24 draws per point, CPU)" (no experiment ids or
    parameter names: the provenance keeps them)."""
    p = result.provenance
    preset = p.get("preset")
    parts = [PRESET_WORDS.get(preset, f"{preset} grid")] if preset else []
    if p.get("k"):
        parts.append(f"{p['k']} draws per point")
    device = str(p.get("device") or "cpu")
    parts.append(DEVICE_WORDS.get(device.split(":")[0], device))
    return f"{what}\n({', '.join(parts)})"


def _beta_panel(ax, fits: list[dict], hkey: str = "horizon") -> None:
    """|beta| against H (log-log) with the beta(H) reference curve and the 1/2 line."""
    markers = {"mean": ("o", "tab:purple"), "cov": ("s", "tab:orange")}
    H_all = [f[hkey] for f in fits if f[hkey] > 0]
    for mom, (mk, col) in markers.items():
        sel = [f for f in fits if f["moment"] == mom and np.isfinite(f["beta"])]
        if sel:
            ax.errorbar([f[hkey] for f in sel], [max(f["beta"], 1e-4) for f in sel],
                        yerr=[f["slope_se"] for f in sel], fmt=mk, color=col, capsize=2, ms=5,
                        label=rf"$|\beta_{{\rm {mom}}}|$")
    if H_all:
        Hg = np.geomspace(min(H_all) / 1.5, max(H_all) * 1.5, 200)
        ax.plot(Hg, beta_reference(Hg), color="darkred", lw=1.5,
                label=r"$\beta(H)=\frac{1}{2(1+H^2)}$ (authors' reference)")
        ax.axhline(0.5, color="grey", ls="--", lw=1, label=r"$|\beta|=1/2$")
    _loglog(ax)
    ax.set_xlabel(
        r"horizon $H=\|\Sigma^{1/2}A\Sigma^{1/2}\|_2$"
        + (" (authors: no temperature)" if hkey == "horizon_authors" else " (A incl. temperature)")
    )
    ax.set_ylabel(r"fitted $|\beta|$ (error $\propto n^{-|\beta|}$)")
    ax.legend()


def plot_uniform_map(result: Result):
    """Left: sup-error against n per R (log-log, error bars, fitted lines, n^-1/2 guide).
    Right: the fitted constant C(R) and the [DERIVED] delta-method constant against R."""
    fig, (ax, ax2) = _figure(2)
    radii = result.unique("R")
    cols = _colors(len(radii), "plasma")
    for R, c in zip(radii, cols):
        fit = result.select(kind="fit", R=R)
        fit = fit[0] if fit else None
        lab = f"R={R:g}" + (f": slope {fit['slope']:.2f}±{fit['slope_se']:.2f}" if fit else "")
        _curve(ax, result.select(kind="point", R=R), fit, c, lab)
    pts = result.select(kind="point")
    if pts:
        n = np.array(sorted({p["n"] for p in pts}), dtype=float)
        y0 = min(p["err_mean"] for p in pts)
        ax.plot(n, y0 * (n / n[-1]) ** -0.5 * 0.6, color="grey", ls=":", label=r"$n^{-1/2}$")
    _loglog(ax)
    ax.set(xlabel="n (tokens)", ylabel=r"$\sup_{\|x\|\leq R}\|\Gamma_{\mu_n}(x)-\Gamma_\mu(x)\|$")
    ax.legend()
    fits = result.select(kind="fit")
    ax2.plot([f["R"] for f in fits], [f["C"] for f in fits], "o-", label=r"fitted $C(R)=e^{\rm intercept}$")
    ax2.plot([f["R"] for f in fits], [f["C_pred"] for f in fits], "s--", label="delta-method RMS constant [DERIVED]")
    ax2.set(yscale="log", xlabel="R (ball radius)", ylabel="C(R)")
    ax2.legend()
    fig.suptitle(
        _title(
            result,
            f"Uniform map convergence, {result.provenance.get('tokens', '')}, H={result.provenance.get('horizon')}",
        ),
        fontsize=9,
    )
    return fig


def plot_moment_convergence(result: Result, reference: Optional[str] = None, horizon_key: str = "horizon"):
    """Mean and covariance errors against n (one curve per scale, colour by H) and fitted |beta|
    against H with beta(H) and the 1/2 line.  `reference`: which reference to show (default the
    exact one when present)."""
    fits_all = result.select(kind="fit")
    refs = list(dict.fromkeys(f["reference"] for f in fits_all))
    ref = reference or ("exact" if "exact" in refs else refs[0])
    fig, axes = _figure(3)
    scales = result.unique("scale")
    cols = _colors(len(scales), "autumn")
    for ax, mom in zip(axes[:2], ("mean", "cov")):
        for s, c in zip(scales, cols):
            fit = result.select(kind="fit", scale=s, moment=mom, reference=ref)
            fit = fit[0] if fit else None
            H = fit[horizon_key] if fit else float("nan")
            _curve(ax, result.select(kind="point", scale=s, moment=mom, reference=ref), fit, c, f"H={H:.3g}")
        _loglog(ax)
        ax.set(
            xlabel="n (tokens)",
            ylabel=r"$\|m_n-m_\infty\|_2$" if mom == "mean" else r"$\|C_n-C_\infty\|$",
            title=f"{mom} error vs {ref} reference",
        )
    # the two error panels share their curves' legend: once, below the panels (inside, it covered the lowest curve)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3)
    _beta_panel(axes[2], [f for f in fits_all if f["reference"] == ref], horizon_key)
    fig.suptitle(_title(result, f"Moment convergence, {result.provenance.get('tokens', '')}"), fontsize=9)
    return fig


def plot_hardmax(result: Result, reference: Optional[str] = None):
    """Mean and covariance errors against n on the sphere, one curve per scale (log-log, fitted
    power-law lines: a straight dashed line that misses the points' bend signals a non-power law)."""
    fits_all = result.select(kind="fit")
    refs = list(dict.fromkeys(f["reference"] for f in fits_all))
    ref = reference or ("exact" if "exact" in refs else refs[0])
    fig, axes = _figure(2)
    scales = result.unique("scale")
    cols = _colors(len(scales), "autumn")
    for ax, mom in zip(axes, ("mean", "cov")):
        for s, c in zip(scales, cols):
            fit = result.select(kind="fit", scale=s, moment=mom, reference=ref)
            fit = fit[0] if fit else None
            lab = f"s={s:g}, H={fit['horizon']:.3g}: slope {fit['slope']:.3f}" if fit else f"s={s:g}"
            _curve(ax, result.select(kind="point", scale=s, moment=mom, reference=ref), fit, c, lab)
        _loglog(ax)
        ax.set(
            xlabel="n (tokens)",
            ylabel=r"$\|m_n-m_\infty\|_2$" if mom == "mean" else r"$\|C_n-C_\infty\|_2$",
            title=f"{mom} error vs {ref} reference",
        )
        ax.legend()
    fig.suptitle(_title(result, f"Hardmax regime, {result.provenance.get('tokens', '')}"), fontsize=9)
    return fig


def plot_real_encoder(result: Result, horizon_key: str = "horizon"):
    """Mean and covariance errors against n (one curve per layer) and |beta| against the layer's H
    with beta(H) and the 1/2 line."""
    fig, axes = _figure(3)
    layers = result.unique("layer")
    cols = _colors(len(layers), "viridis")
    for ax, mom in zip(axes[:2], ("mean", "cov")):
        for l, c in zip(layers, cols):
            fit = result.select(kind="fit", layer=l, moment=mom)
            fit = fit[0] if fit else None
            lab = f"layer {l}" + (f": H={fit[horizon_key]:.2g}, slope {fit['slope']:.2f}" if fit else "")
            _curve(ax, result.select(kind="point", layer=l, moment=mom), fit, c, lab)
        _loglog(ax)
        ax.set(
            xlabel="n (subsampled tokens)",
            ylabel=r"$\|m_n-m_L\|_2$" if mom == "mean" else r"$\|C_n-C_L\|$",
            title=f"{mom} error",
        )
        ax.legend()
    _beta_panel(axes[2], result.select(kind="fit"), horizon_key)
    p = result.provenance
    fig.suptitle(
        _title(
            result,
            f"{p.get('model')} on {text_title(p.get('text') or 'a text')} ({p.get('window_tokens')} tokens), "
            "i.i.d. subsamples with replacement",
        ),
        fontsize=9,
    )
    return fig


def plot_sample_reference_effect(result: Result):
    """Mean and covariance errors against n with the exact limit and with the finite sample as the
    reference (largest scale; fitted lines), and the squared-error decomposition of the covariance:
    ``mse_sample = mse_exact + ref_dev2 - 2 cross`` (the reference's own error adds, the shared bias
    removes)."""
    fig, axes = _figure(3)
    s = max(result.unique("scale"))
    styles = {"exact": ("o", "tab:blue"), "sample": ("s", "tab:red")}
    for ax, mom in zip(axes[:2], ("mean", "cov")):
        for ref, (_, col) in styles.items():
            fit = result.select(kind="fit", scale=s, moment=mom, reference=ref)
            fit = fit[0] if fit else None
            lab = f"{ref} reference" + (f": slope {fit['slope']:.3f}±{fit['slope_se']:.3f}" if fit else "")
            _curve(ax, result.select(kind="point", scale=s, moment=mom, reference=ref), fit, col, lab)
        _loglog(ax)
        ax.set(xlabel="n (tokens)", ylabel=r"$\|m_n-m_{\rm ref}\|_2$" if mom == "mean" else r"$\|C_n-C_{\rm ref}\|_F$",
               title=f"{mom} error, scale {s:g}")
        ax.legend()
    dec = sorted(result.select(kind="decomposition", scale=s, moment="cov"), key=lambda r: r["n"])
    n = np.array([r["n"] for r in dec], dtype=float)
    ax = axes[2]
    terms = (("mse_exact", "E||C_n - C||^2 (exact)", "o-"),
             ("mse_sample", "E||C_n - C_ref||^2 (sample)", "s-"),
             ("ref_dev2", "||C_ref - C||^2 (adds)", "--"),
             ("cross", "<E C_n - C, C_ref - C> (x2 removes)", ":"))
    for key, lab, st in terms:
        ax.plot(n, [r[key] for r in dec], st, label=lab)
    _loglog(ax)
    ax.set(xlabel="n (tokens)", ylabel="squared error (Frobenius)", title="covariance: the shared bias cancels")
    ax.legend()
    p = result.provenance
    fig.suptitle(_title(result, f"Finite reference ({p.get('n_ref')} tokens) vs exact limit, {p.get('tokens', '')}"),
                 fontsize=9)
    return fig


def plot_real_heads(result: Result, layer, horizon_key: str = "horizon"):
    """One layer of :func:`real_encoder`: each head's fitted |beta| (mean, covariance; error bars =
    slope se) against the head's own horizon H_h, with the other layers' heads in grey, the layer's
    own exponent at the layer's H (all heads together, a star) and beta(H) = 1/(2(1+H^2)) [CODE]."""
    fig, axes = figure_row(2, 3.35, 3.4)
    heads = result.select(kind="head")
    mine = [h for h in heads if h["layer"] == layer]
    H_all = [h[horizon_key] for h in heads] + [f[horizon_key] for f in result.select(kind="fit")]
    Hg = np.geomspace(min(H_all) / 1.5, max(H_all) * 1.5, 200)
    for ax, mom, (mk, col) in zip(axes, ("mean", "cov"), (("o", "tab:purple"), ("s", "tab:orange"))):
        others = [h for h in heads if h["layer"] != layer]
        ax.plot([h[horizon_key] for h in others], [max(h[f"beta_{mom}"], 1e-3) for h in others], mk, ms=3,
                color="0.75", label="other layers' heads")
        ax.errorbar([h[horizon_key] for h in mine], [max(h[f"beta_{mom}"], 1e-3) for h in mine],
                    yerr=[h[f"beta_{mom}_se"] for h in mine], fmt=mk, ms=4, color=col, capsize=2,
                    label=f"layer {layer}'s heads, one point each")
        lay = result.select(kind="fit", layer=layer, moment=mom)
        if lay:
            ax.plot([lay[0][horizon_key]], [lay[0]["beta"]], "*", ms=11, color="k", label="layer (heads together)")
        ax.plot(Hg, beta_reference(Hg), color="darkred", lw=1.3, label=r"$\beta(H)=\frac{1}{2(1+H^2)}$ [CODE]")
        ax.axhline(0.5, color="grey", ls="--", lw=1)
        _loglog(ax)
        ax.set(ylim=(0.01, 1.2), title=f"layer {layer}, {mom} error: fitted exponent",
               xlabel="horizon $H_h$" + (" (authors: no temperature)" if horizon_key == "horizon_authors" else ""),
               ylabel=r"fitted $|\beta|$")
    fig.legend(*axes[1].get_legend_handles_labels(), loc="outside lower center", ncols=2)
    return fig


def plot_authors_sphere_reference(result: Result):
    """||C||_2 of the sphere limit covariance against the scale: attnlab's, the authors' code's (zero
    where every Bessel argument passes 2**30 and their A_d guard returns 0) and the hardmax limit;
    shaded, the scales where all their Dirichlet samples are past 2**30."""
    from matplotlib.ticker import NullFormatter

    fig, (ax,) = figure_row(1, 5.2, 2.8)
    ref = sorted(result.select(kind="reference"), key=lambda r: r["scale"])
    s = np.array([r["scale"] for r in ref])
    ax.plot(s, [r["cov_norm"] for r in ref], "o-", color="tab:blue", ms=4,
            label="attnlab: the [CODE] formula, A_d finite")
    ax.plot(s, [r["cov_norm_authors"] for r in ref], "s--", color="tab:red", ms=4,
            label="authors' code: A_d = 0 past $2^{30}$ [CODE]")
    hard = result.select(kind="hardmax")
    if hard:
        ax.axhline(hard[0]["cov_norm"], color="k", ls=":", lw=1, label="hardmax limit (Monte Carlo)")
    zero = [r["scale"] for r in ref if r["frac_beyond_ive"] >= 1.0]
    if zero:
        ax.axvspan(min(zero) / 1.3, max(zero) * 1.3, color="tab:red", alpha=0.1, lw=0,
                   label="every sample past $2^{30}$")
    ax.set(xscale="log", xlabel="attention scale s", ylabel=r"$\|C\|_2$ of the limit")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(bottom=0)
    ax.legend(loc="center left")
    return fig
