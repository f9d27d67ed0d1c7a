"""Views for chapter 9 (Attention on infinitely many tokens): the chapter's cached experiments, the map against
its limit, and the frames of the uniform-map, moment, hardmax, reference and fit Results. Views only: the
numbers come from `attnlab.sample_complexity` (the map frame draws a few tokens itself, seeded)."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch

from attnlab.book import markup, running
from attnlab.computations import version
from attnlab.sample_complexity import experiments as te
from attnlab.sample_complexity import montecarlo as mc
from attnlab.sample_complexity import sphere, theory

#: experiment -> (the name of the Result it returns, which is its cache name; its function; its version, declared
#: in attnlab.computations)
EXPERIMENTS = {"uniform_map": ("tsc_uniform", te.uniform_map, version("tsc_uniform")),
               "moment_convergence": ("tsc_moments", te.moment_convergence, version("tsc_moments")),
               "sample_reference_effect": ("tsc_sample_reference_effect", te.sample_reference_effect,
                                           version("tsc_sample_reference_effect")),
               "hardmax": ("tsc_hardmax", sphere.hardmax, version("tsc_hardmax"))}
QUERIES = torch.linspace(-4, 4, 161, dtype=torch.float64)[:, None]       # queries of the map frame [161, 1]


def run(experiment: str, device: str, **params):
    """An experiment's Result, cached on disk under its own name (running.cached_result: keyed by its version, every
    parameter and the device), so a rebuild reuses it."""
    name, fn, version = EXPERIMENTS[experiment]
    key = {"experiment": experiment, "params": params, "device": device}
    return running.cached_result(name, key, lambda: fn(device=device, **params), version=version)


#: solution 9.3's moment run: the default preset against both the exact limit and a sample
BOTH_REFERENCES = {**te.MOMENT_PRESETS["default"], "reference": "both"}
#: the runs chapter 9 shows, (experiment, params) of `run`: each preset's default and BOTH_REFERENCES
CHAPTER_RUNS = (("uniform_map", te.UNIFORM_MAP_PRESETS["default"]),
                ("moment_convergence", te.MOMENT_PRESETS["default"]), ("hardmax", sphere.HARDMAX_PRESETS["default"]),
                ("sample_reference_effect", te.SAMPLE_REFERENCE_PRESETS["default"]),
                ("moment_convergence", BOTH_REFERENCES))


def authors_reference(device: str):
    """The authors' sphere reference against this book's (Result "tsc_authors_sphere_reference", default preset)."""
    return running.result("tsc_authors_sphere_reference", {"preset": "default", "device": device})


def chapter_results(device: str) -> list:
    """Every Result chapter 9 reads (`CHAPTER_RUNS`, `authors_reference`): what `attnlab.results.book_plan` fills."""
    return [run(e, device, **params) for e, params in CHAPTER_RUNS] + [authors_reference(device)]


def map_frame(H: float, n: int, R: float = 4.0, draws: int = 3, figsize=(4.6, 2.7)):
    """Figure: Gamma_{mu_n} for `draws` sets of n tokens ~ N(0, 1) against the exact limit H x, with the
    delta-method RMS band and the largest and smallest token of the first draw."""
    x = QUERIES * (R / 4.0)
    A, m, S = torch.tensor([[float(H)]], dtype=torch.float64), torch.zeros(1), torch.eye(1)
    exact = theory.gaussian_map(x, m, S, A)[:, 0]
    band = (theory.map_error_constant(x, m, S, A) / math.sqrt(n)).clamp(max=1e3)
    gen = mc.make_generator(mc.derive_seed(0, int(n), int(round(100 * H))))
    tokens = mc.sample_gaussian(int(n), m, S, batch=(draws,), generator=gen)   # [draws, n, 1]
    emp = theory.attention_map(x, tokens, A)[..., 0]                               # [draws, 161]
    xs = x[:, 0].numpy()
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    ax.fill_between(xs, exact - band, exact + band, color="C0", alpha=0.18, lw=0,
                    label=r"$\pm$ RMS error (delta method)")
    ax.plot(xs, exact, color="k", lw=1.4, label=r"limit $\Gamma_\mu(x) = Hx$")
    for i, e in enumerate(emp):
        ax.plot(xs, e.numpy(), color="C1", lw=0.9,
                label=r"$\Gamma_{\mu_n}$, 3 draws" if i == 0 else None)
    ax.axhline(float(tokens[0].max()), color="C1", ls=":", lw=1,
               label=r"$\max_i y_i$, $\min_i y_i$ (draw 1)")
    ax.axhline(float(tokens[0].min()), color="C1", ls=":", lw=1)
    lim = 1.15 * H * R + 0.6
    ax.set(xlim=(xs[0], xs[-1]), ylim=(-lim, lim), xlabel="query $x$", ylabel="output",
           title=f"H = {H:g}, n = {n:,}")
    ax.legend(loc="upper left", framealpha=0.9)
    return fig


def uniform_frame(res_u, R: float):
    """Figure: the sup error against n at radius R (every other radius in grey) with its fit, and C(R)."""
    fits_u = sorted(res_u.select(kind="fit"), key=lambda f: f["R"])
    points = res_u.select(kind="point")
    n_all = np.array(sorted({p["n"] for p in points}), dtype=float)
    y_lo, y_hi = min(p["err_mean"] for p in points) / 1.5, max(p["err_mean"] for p in points) * 1.5
    radii = [f["R"] for f in fits_u]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.3, 2.6), layout="constrained",
                                  gridspec_kw={"width_ratios": [1.4, 1]})
    for f in fits_u:                                      # every radius, in grey
        pts = sorted(res_u.select(kind="point", R=f["R"]), key=lambda p: p["n"])
        ax.plot([p["n"] for p in pts], [p["err_mean"] for p in pts], color="0.8", lw=0.8)
    f = next(f for f in fits_u if f["R"] == R)
    pts = sorted(res_u.select(kind="point", R=R), key=lambda p: p["n"])
    ax.errorbar([p["n"] for p in pts], [p["err_mean"] for p in pts], yerr=[p["err_se"] for p in pts],
                fmt="o", ms=3.5, color="C3", capsize=2, label=f"R = {R:g}")
    ax.plot(n_all, f["C"] * n_all ** f["slope"], "--", color="C3", lw=1,
            label=f"fit: slope {f['slope']:.2f}")
    ax.set(xscale="log", yscale="log", ylim=(y_lo, y_hi), xlabel="n (tokens)",
           ylabel=r"$\sup_{\|x\|\leq R}\|\Gamma_{\mu_n}(x)-\Gamma_\mu(x)\|$")
    ax.legend()
    markup.plain_log(ax)
    ax2.plot(radii, [g["C"] for g in fits_u], "o-", color="C0", ms=4, label="fitted C(R)")
    ax2.plot(radii, [g["C_pred"] for g in fits_u], "s--", color="C2", ms=3.5, label="delta method")
    ax2.plot([R], [f["C"]], "o", ms=10, mfc="none", mec="C3", mew=2)
    ax2.set(yscale="log", xlabel="R (ball radius)", ylabel="C(R)")
    markup.plain_log(ax2, nice="y")
    ax2.legend()
    return fig


MOMENT_STYLE = {"mean": ("o", "tab:purple"), "cov": ("s", "tab:orange")}


def moment_fits(res_m) -> dict:
    """(scale, moment) -> the fit against the exact limit."""
    return {(f["scale"], f["moment"]): f for f in res_m.select(kind="fit", reference="exact")}


def moment_table(res_m):
    """HTML table per scale: both horizons, beta(H) and the fitted |beta| of the mean and the covariance."""
    fit_of = moment_fits(res_m)

    def pm(f):
        return f"{f['beta']:.3f} ± {f['slope_se']:.3f}"

    return markup.table(["scale s", "H (ours)", "H (authors' code)", "β(H) [CODE curve]", "|β| mean", "|β| cov"],
                      [[f"{s:.3g}", f"{fit_of[s, 'mean']['horizon']:.3g}",
                        f"{fit_of[s, 'mean']['horizon_authors']:.3g}", f"{fit_of[s, 'mean']['beta_ref']:.3f}",
                        pm(fit_of[s, "mean"]), pm(fit_of[s, "cov"])] for s in res_m.unique("scale")])


def moment_frame(res_m, s: float):
    """Figure: the moment errors against n at scale s with their fits and beta(H), and every scale's |beta|
    against H."""
    fit_of = moment_fits(res_m)
    scales = res_m.unique("scale")
    Hm = [f["horizon"] for f in res_m.select(kind="fit", reference="exact")]
    H_grid = np.geomspace(min(Hm) / 1.5, max(Hm) * 1.5, 200)
    n_m = np.array(sorted({p["n"] for p in res_m.select(kind="point")}), dtype=float)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.4, 2.7), layout="constrained")
    H = fit_of[s, "mean"]["horizon"]
    for mom, (mk, col) in MOMENT_STYLE.items():
        f = fit_of[s, mom]
        pts = sorted(res_m.select(kind="point", scale=s, moment=mom, reference="exact"), key=lambda p: p["n"])
        y = np.array([p["err_mean"] for p in pts])
        ax.errorbar(n_m, y, yerr=[p["err_se"] for p in pts], fmt=mk, ms=3.5, color=col, capsize=2,
                    label=f"{mom}: slope {f['slope']:.2f}")
        ax.plot(n_m, np.exp(f["intercept"]) * n_m ** f["slope"], "--", color=col, lw=1)
        ax.plot(n_m, y[0] * (n_m / n_m[0]) ** -f["beta_ref"], ":", color=col, lw=1,
                label=r"slope $-\beta(H)$" if mom == "cov" else None)
    ax.set(xscale="log", yscale="log", xlabel="n (tokens)", ylabel="moment error",
           title=f"s = {s:.3g}, H = {H:.3g}, β(H) = {theory.beta_reference(H):.2f}")
    ax.title.set_fontsize(9)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3)   # below: covers no point
    markup.plain_log(ax, nice="x")
    for mom, (mk, col) in MOMENT_STYLE.items():
        sel = [fit_of[t, mom] for t in scales]
        ax2.errorbar([f["horizon"] for f in sel], [f["beta"] for f in sel], yerr=[f["slope_se"] for f in sel],
                     fmt=mk, ms=4, color=col, capsize=2, label=rf"$|\beta_{{\rm {mom}}}|$")
        ax2.plot([H], [fit_of[s, mom]["beta"]], "o", ms=11, mfc="none", mec="k", mew=1.5)
    ax2.plot(H_grid, theory.beta_reference(H_grid), color="darkred", lw=1.3, label=r"$\beta(H)=\frac{1}{2(1+H^2)}$")
    ax2.axhline(0.5, color="grey", ls="--", lw=1)
    ax2.set(xscale="log", yscale="log", ylim=(0.05, 0.9), xlabel="horizon H (ours)", ylabel=r"fitted $|\beta|$")
    ax2.legend(loc="lower left")
    markup.plain_log(ax2, nice="y")
    return fig


def live_moments(log10_scale: float, device: str) -> bytes:
    """PNG: a small moment-convergence run at scale 10^log10_scale (the live slider computes it)."""
    from attnlab.sample_complexity import plots as scp

    r = te.moment_convergence(scales=[10 ** log10_scale], n_values=(128, 256, 512, 1024), k=8, device=device)
    return markup.png(scp.plot_moment_convergence(r))


def hardmax_table(res_h):
    """HTML table per scale of the sphere run: horizon, beta(H), covariance slope and curvature, the relative
    covariance error at the largest n, and the mean's slope."""
    fh = {(f["scale"], f["moment"]): f for f in res_h.select(kind="fit", reference="exact")}

    def rel_err(s):
        # covariance error at the largest n, relative to the size of the limit covariance
        pts = res_h.select(kind="point", scale=s, moment="cov", reference="exact")
        return max(pts, key=lambda p: p["n"])["err_mean"] / fh[s, "cov"]["ref_norm"]

    return markup.table(["scale s", "H (ours)", "β(H) [CODE curve]", "cov slope", "cov curvature",
                       "relative cov error at largest n", "mean slope"],
                      [[f"{s:g}", f"{fh[s, 'cov']['horizon']:.3g}", f"{fh[s, 'cov']['beta_ref']:.2g}",
                        f"{fh[s, 'cov']['slope']:.3f} ± {fh[s, 'cov']['slope_se']:.3f}",
                        f"{fh[s, 'cov']['curvature']:.3f} ± {fh[s, 'cov']['curvature_se']:.3f}",
                        f"{rel_err(s):.2f}", f"{fh[s, 'mean']['slope']:.3f}"] for s in res_h.unique("scale")])


REFERENCES = {"exact limit": "exact", "finite sample": "sample"}
MOMENTS = {"mean": "mean", "covariance": "cov"}
REF_STYLE = {"exact": ("o", "tab:blue"), "sample": ("s", "tab:red")}


def _few_log_ticks(ax, n) -> None:
    """x ticks at the n of the grid, four plain y ticks spread over a log axis that spans less than a decade."""
    lo, hi = ax.get_ylim()
    ys = sorted({float(f"{t:.2g}") for t in np.geomspace(lo * 1.1, hi / 1.1, 4)})
    ax.set_xticks(n, [f"{v:g}" for v in n])
    ax.set_yticks(ys, [f"{v:g}" for v in ys])
    ax.minorticks_off()


def reference_frame(res_ref, ref: str, mom: str):
    """Figure: the moment error against n with the exact limit or a finite sample as the reference (the other in
    grey), and the four fitted |beta|."""
    fr = {(f["moment"], f["reference"]): f for f in res_ref.select(kind="fit")}
    ref_label = {"exact": "exact limit [DERIVED]", "sample": f"{res_ref.provenance.get('n_ref'):,}-token sample [CODE]"}
    n_r = np.array(sorted(res_ref.unique("n")), dtype=float)
    H_ref = fr["mean", "exact"]["horizon"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.6, 2.9), layout="constrained",
                                  gridspec_kw={"width_ratios": [1.45, 1]})
    for r, (mk, col) in REF_STYLE.items():              # the other reference in grey, for comparison
        f = fr[mom, r]
        c = col if r == ref else "0.7"
        pts = sorted(res_ref.select(kind="point", moment=mom, reference=r), key=lambda p: p["n"])
        ax.errorbar(n_r, [p["err_mean"] for p in pts], yerr=[p["err_se"] for p in pts], fmt=mk, ms=3.5,
                    color=c, capsize=2, label=f"{ref_label[r]}: slope {f['slope']:.3f}")
        ax.plot(n_r, np.exp(f["intercept"]) * n_r ** f["slope"], "--", color=c, lw=1)
    ax.set(xscale="log", yscale="log", xlabel="n (tokens)",
           ylabel=r"$\|m_n - m_{\rm ref}\|_2$" if mom == "mean" else r"$\|C_n - C_{\rm ref}\|_F$",
           title=f"{'mean' if mom == 'mean' else 'covariance'} error, s = 50, H = {H_ref:.2f}")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (hi / lo) ** 0.6)                # room for the legend above the points
    ax.legend(loc="upper right")
    _few_log_ticks(ax, n_r)
    combos = [(m, r) for m in ("mean", "cov") for r in ("exact", "sample")]
    for i, (m, r) in enumerate(combos):
        mk, col = REF_STYLE[r]
        ax2.errorbar([i], [fr[m, r]["beta"]], yerr=[fr[m, r]["slope_se"]], fmt=mk, ms=5, color=col, capsize=2)
    ax2.plot([combos.index((mom, ref))], [fr[mom, ref]["beta"]], "o", ms=13, mfc="none", mec="k", mew=1.5)
    ax2.axhline(fr[mom, ref]["beta_ref"], color="darkred", lw=1.2, label=r"$\beta(H)$ [CODE]")
    ax2.axhline(0.5, color="grey", ls="--", lw=1)
    ax2.set_xticks(range(4), ["mean\nexact", "mean\nsample", "cov\nexact", "cov\nsample"])
    ax2.set(xlim=(-0.6, 3.6), ylim=(0, 0.55), ylabel=r"fitted $|\beta|$", title="all four fits")
    ax2.legend(loc="lower left")
    return fig


def fit_frame(res_h, ols_wls: dict, method: str):
    """Figure: the sphere's covariance error against n with `method` ("ols" or "wls") fits at every scale, and
    both fits' slopes. `ols_wls`: (scale, moment, method) -> `protocol.fit_row`."""
    scales_h = res_h.unique("scale")
    n_h = np.array(sorted(res_h.unique("n")), dtype=float)
    scale_col = dict(zip(scales_h, ("tab:olive", "tab:orange", "tab:red")))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.6, 2.9), layout="constrained",
                                  gridspec_kw={"width_ratios": [1.45, 1]})
    for s in scales_h:
        f = ols_wls[s, "cov", method]
        pts = sorted(res_h.select(kind="point", scale=s, moment="cov", reference="exact"), key=lambda p: p["n"])
        ax.errorbar(n_h, [p["err_mean"] for p in pts], yerr=[p["err_se"] for p in pts], fmt="s", ms=3.5,
                    color=scale_col[s], capsize=2, label=f"s = {s:g}: slope {f['slope']:.3f}")
        ax.plot(n_h, np.exp(f["intercept"]) * n_h ** f["slope"], "--", color=scale_col[s], lw=1)
    ax.set(xscale="log", yscale="log", xlabel="n (tokens)", ylabel=r"$\|C_n - C\|_2$",
           title=f"sphere, covariance error, {method.upper()} fit")
    ax.legend(loc="lower left")
    markup.plain_log(ax, nice="y")
    ax.set_xticks(n_h, [f"{n:g}" for n in n_h])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    for other, shift, mk in (("ols", 0.8, "o"), ("wls", 1.25, "D")):
        for s in scales_h:
            f = ols_wls[s, "cov", other]
            ax2.errorbar([s * shift], [f["slope"]], yerr=[f["slope_se"]], fmt=mk, ms=5, capsize=2,
                         color=scale_col[s], mfc=scale_col[s] if other == method else "white")
        ax2.plot([], [], mk, color="k", mfc="k" if other == method else "white", label=other.upper())
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set(xscale="log", xlabel="scale s", ylabel="fitted slope (covariance)", title="both fits, every scale")
    markup.plain_log(ax2)
    ax2.legend(loc="lower right")
    return fig


def map_departure(H: float, n: int, tol: float = 0.05, draws: int = 3) -> dict:
    """Where the n-token map (`draws` seeded sets, as in `map_frame`) leaves the limit H x for good on x >= 0 (the
    map is odd): x_away, the first query from which the mean relative error over the draws stays above `tol`;
    y_max, the mean over the draws of the largest token; band, the delta-method RMS error at x_away."""
    A, m, S = torch.tensor([[H]], dtype=torch.float64), torch.zeros(1), torch.eye(1)
    x = QUERIES[QUERIES[:, 0] >= 0]
    exact = theory.gaussian_map(x, m, S, A)[:, 0]
    band = theory.map_error_constant(x, m, S, A) / math.sqrt(n)
    gen = mc.make_generator(mc.derive_seed(0, n, int(100 * H)))
    tokens = mc.sample_gaussian(n, m, S, batch=(draws,), generator=gen)        # [draws, n, 1]
    emp = theory.attention_map(x, tokens, A)[..., 0]                           # [draws, len(x)]
    rel = ((emp - exact).abs() / exact.abs().clamp_min(1e-12)).mean(0)         # mean relative error over the draws
    away = torch.flip(torch.cummin(torch.flip((rel > tol).int(), [0]), 0).values, [0]).bool()   # off from here on
    i_away = int(away.int().argmax()) if bool(away.any()) else len(x) - 1
    return {"x_away": float(x[i_away, 0]), "y_max": float(tokens.amax(dim=(1, 2)).mean()),
            "band": float(band[i_away])}
