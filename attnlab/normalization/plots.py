"""One plot per figure of arXiv 2508.17821: `plot_<id>(result) -> matplotlib.figure.Figure`.

Views only: they read a Result (rows + provenance) and never recompute science. Figures are built
with `matplotlib.figure.Figure` (no pyplot state, no plt.show), so they work under the Agg backend,
in notebooks and in the CLI (`fig.savefig(...)`). With several windows, curves are the mean over
windows of the head aggregate, shaded by the spread (std) over windows.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from attnlab.core.models import weights_label
from attnlab.core.result import Result
from attnlab.core.style import literal
from attnlab.core.text import text_title
from attnlab.core.util import figure_row
from attnlab.normalization.claim_kinds import threshold
from attnlab.normalization.paper import CRITICAL_FRAC, SEPARABILITY_BAND

COLORS = {"dtilde": "tab:green", "E": "tab:blue", "dmax_B": "tab:red", "dmax_R": "darkred", "bound": "black"}


def _figure(ncols: int = 1, width: float = 5.0, height: float = 3.8):
    return figure_row(ncols, width, height)


#: the vectors x and the keys of a run, as a reader reads them in a title (the provenance keeps "v", "visible", ...)
X_WORDS = {"v": "value vectors", "hidden": "layer inputs (hidden states)"}
KEYS_WORDS = {"visible": "visible ones", "all": "all (masked ones at zero weight)"}


def _window_words(p: dict) -> str:
    """Which tokens of the text were read: "first 1024 tokens", "1024 tokens from token 5000", "4 windows of 512
    tokens" ('' when the provenance does not say)."""
    size, count, offsets = p.get("window_tokens"), p.get("n_windows") or 1, p.get("window_offsets")
    if not size:
        return ""
    if count > 1:
        return f"{count} windows of {size} tokens"
    offset = offsets[0] if isinstance(offsets, (list, tuple)) and offsets else offsets
    return f"first {size} tokens" if not offset else f"{size} tokens from token {offset}"


def title(result: Result, what: str) -> str:
    """'<what>' + model, text and protocol from the provenance, in a reader's words: "smollm2 (4-bit weights) on
    War and Peace, first 1024 tokens; x = value vectors, keys = visible ones" (no ids, no parameter names)."""
    p = result.provenance
    where = text_title(p.get("text") or "a text")
    words = _window_words(p)
    where += f", {words}" if words else ""
    extra = f"; x = {X_WORDS.get(p['x'], p['x'])}, keys = {KEYS_WORDS.get(p.get('keys'), p.get('keys'))}" \
        if p.get("x") else ""
    quick = ", quick grid" if p.get("quick") else ""
    weights = weights_label(p.get("model_info"))
    return f"{what}\n" + literal(f"{p.get('model', '?')}{weights} on {where}{extra}{quick}")


def aggregate_curve(result: Result, key: str, by: str, agg: str = "mean", **where) -> tuple[np.ndarray, ...]:
    """x, centre, lo, hi: aggregate over heads (mean/median/max) per window, then mean over windows;
    lo/hi = the 25th/75th percentile over heads (one window) or mean -+ std over windows."""
    f = {"mean": np.nanmean, "median": np.nanmedian, "max": np.nanmax}[agg]
    rows = result.select(**where)
    xs = sorted({r[by] for r in rows})
    cen, lo, hi = [], [], []
    for x in xs:
        per = {}
        for r in rows:
            if r[by] == x:
                per.setdefault(r.get("window", 0), []).append(r[key])
        vals = [np.asarray(v, float) for v in per.values()]
        wv = np.array([f(v) for v in vals])
        cen.append(np.mean(wv))
        if len(vals) == 1:
            lo.append(np.nanpercentile(vals[0], 25))
            hi.append(np.nanpercentile(vals[0], 75))
        else:
            lo.append(np.mean(wv) - np.std(wv))
            hi.append(np.mean(wv) + np.std(wv))
    return np.array(xs, float), np.array(cen), np.array(lo), np.array(hi)


def _band(ax, result, key, by, color, label, agg="mean", ls="-", marker="o", **where):
    x, c, lo, hi = aggregate_curve(result, key, by, agg, **where)
    ax.plot(x, c, ls=ls, marker=marker, ms=3.5, color=color, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)
    return x, c


# ------------------------------------------------------------------------------------------- figures

def plot_fig1(result: Result):
    """Max weight and 1/L, entropy and log L, and the Corollary-1 band (log10) against L."""
    fig, (a1, a2, a3) = _figure(3, 4.4)
    x, _ = _band(a1, result, "max_weight", "L", "tab:purple", "max weight (mean over heads, IQR)")
    a1.plot(x, 1 / x, "k--", lw=1, label="uniform 1/L")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("L")
    a1.set_ylabel("weight")
    a1.legend()
    _band(a2, result, "entropy", "L", "tab:orange", "entropy (nats)")
    a2.plot(x, np.log(x), "k--", lw=1, label="log L (uniform)")
    a2.set_xscale("log", base=2)
    a2.set_xlabel("L")
    a2.set_ylabel("entropy")
    a2.legend()
    _band(a3, result, "log10_max_w", "L", "tab:purple", "log10 max weight")
    _band(a3, result, "log10_min_w", "L", "tab:olive", "log10 min weight")
    _band(a3, result, "log10_cor1_hi", "L", "black", "Corollary 1 band", ls="--", marker="")
    _band(a3, result, "log10_cor1_lo", "L", "black", None, ls="--", marker="")
    a3.plot(x, -np.log10(x), ":", color="grey", label="log10(1/L)")
    a3.set_xscale("log", base=2)
    a3.set_xlabel("L")
    a3.set_ylabel("log10 weight")
    holds = np.mean(result.column("cor1_holds"))
    a3.legend(title=f"rows inside band: {holds:.2%}")
    fig.suptitle(title(result, "Fig. 1: vanishing attention (Lemma 1 / Corollary 1)"), fontsize=9)
    return fig


def _distance_panel(ax, result, by, log=True):
    _band(ax, result, "dtilde_b", by, COLORS["dtilde"], "true distance d~ (reading b)")
    _band(ax, result, "E", by, COLORS["E"], "expectation E (random top-N)")
    _band(ax, result, "dmax_B", by, COLORS["dmax_B"], "upper bound d_max [B]")
    _band(ax, result, "dmax_R", by, COLORS["dmax_R"], "upper bound d_max [R]", ls="--", marker="")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("distance (mean over heads, IQR)")
    ax.legend()


def plot_fig2a(result: Result):
    """d~, E and d_max against L at N = 5."""
    fig, (ax,) = _figure(1)
    _distance_panel(ax, result, "L")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length L")
    N = result.rows[0]["N"] if result.rows else "?"
    fig.suptitle(title(result, f"Fig. 2a: distance vs L (N = {N})"), fontsize=9)
    return fig


def plot_fig2b(result: Result):
    """d~, E and d_max against N at the largest L."""
    fig, (ax,) = _figure(1)
    _distance_panel(ax, result, "N")
    ax.set_xscale("log")
    ax.set_xlabel("top-N")
    L = result.rows[0]["L"] if result.rows else "?"
    fig.suptitle(title(result, f"Fig. 2b: distance vs N (L = {L})"), fontsize=9)
    return fig


def plot_fig2c(result: Result, frac: Optional[float] = None):
    """Critical N against L, with the line frac L (default: the claim registry's CRITICAL_FRAC, 0.06, read when
    plotted, as `views.describe.fig2c` says it); right: critical N / L."""
    frac = threshold("CRITICAL_FRAC") if frac is None else frac
    fig, (a1, a2) = _figure(2, 4.6)
    per = {}
    for r in result.rows:
        per.setdefault(r["L"], {})[r.get("window", 0)] = r["critical_n"]
    L = np.array(sorted(per), float)
    vals = [np.array([c if c > 0 else np.nan for c in per[int(x)].values()], float) for x in L]
    mean = np.array([np.nanmean(v) if np.isfinite(v).any() else np.nan for v in vals])
    sd = np.array([np.nanstd(v) if np.isfinite(v).any() else 0.0 for v in vals])
    a1.errorbar(L, mean, yerr=sd, fmt="o-", color="tab:green", capsize=3, label="critical N (KS, alpha = "
                f"{result.provenance.get('alpha', 0.01)})")
    a1.plot(L, frac * L, "k--", lw=1, label=f"{frac} L")
    none = [x for x, m in zip(L, mean) if not np.isfinite(m)]
    if none:
        a1.plot(none, [1] * len(none), "rx", label="no N accepted")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("sequence length L")
    a1.set_ylabel("critical N")
    a1.legend()
    a2.errorbar(L, mean / L, yerr=sd / L, fmt="o-", color="tab:green", capsize=3)
    a2.axhline(frac, color="k", ls="--", lw=1, label=f"{frac}")
    a2.set_xscale("log", base=2)
    a2.set_xlabel("sequence length L")
    a2.set_ylabel("critical N / L")
    a2.legend()
    fig.suptitle(title(result, "Fig. 2c: critical top-N"), fontsize=9)
    return fig


def plot_fig3(result: Result, band: tuple = SEPARABILITY_BAND):
    """Box plots over heads of N_s/N against N, with the Theorem-2 bounds (head means)."""
    fig, (ax,) = _figure(1, 6.8)
    ns = sorted(result.unique("N"))
    data = []
    for n in ns:
        per = {}
        for r in result.select(N=n):
            per.setdefault((r["layer"], r["head"]), []).append(r["ns_frac"])
        data.append([np.nanmean(v) for v in per.values()])
    ax.axhspan(*band, color="tab:green", alpha=0.08, label=f"paper: {band[0]}-{band[1]}")
    ax.boxplot(data, positions=ns, widths=0.6, showfliers=False, patch_artist=True,
               boxprops={"facecolor": "tab:green", "alpha": 0.5}, medianprops={"color": "black"})
    for key, color, label in (("upper_B_row", "tab:red", "upper bound [B], xi = row"),
                              ("upper_R_row", "darkred", "upper bound [R], xi = row"),
                              ("lower_row", "tab:blue", "lower bound, xi = row"),
                              ("lower_pair", "tab:cyan", "lower bound, xi = pair")):
        if key in result.rows[0]:
            x, c, _, _ = aggregate_curve(result, key, "N")
            ax.plot(x, c, "-", color=color, lw=1.2, label=label)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("top-N")
    ax.set_ylabel("N_s / N (token mean per head)")
    ax.set_xticks(ns[:: max(1, len(ns) // 16)])
    ax.set_xticklabels([str(n) for n in ns[:: max(1, len(ns) // 16)]])
    ax.legend(loc="lower left")
    L = result.rows[0]["L"] if result.rows else "?"
    fig.suptitle(title(result, f"Fig. 3: geometric separability (L = {L})"), fontsize=9)
    return fig


def plot_fig4(result: Result):
    """Max over heads of the token-mean g(T, eps) (log-log), with min{1/(4T), sqrt 2} and 1/(2T)."""
    fig, (ax,) = _figure(1, 5.6)
    eps = sorted(result.unique("eps"))
    cmap = ["tab:purple", "tab:orange", "tab:green", "tab:blue", "tab:brown"]
    for i, e in enumerate(eps):
        x, c, _, _ = aggregate_curve(result, "g_max", "T", **{"eps": e})
        ax.plot(x, c, "o-", ms=3, color=cmap[i % len(cmap)], label=f"max g, eps = {e:g}")
    T = np.array(sorted(result.unique("T")), float)
    ax.plot(T, np.minimum(1 / (4 * T), np.sqrt(2)), "k--", lw=1.2, label="min{1/(4T), sqrt 2} (paper)")
    ax.plot(T, 1 / (2 * T), "k:", lw=1.2, label="1/(2T) (exact spectral bound)")
    if "jac_max" in result.rows[0] and np.isfinite(result.column("jac_max")).any():
        x, c, _, _ = aggregate_curve(result, "jac_max", "T", eps=eps[0])
        ax.plot(x, np.maximum(c, 1e-300), "-", color="grey", lw=1, alpha=0.8, label="max exact ||J|| (row sample)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    g = result.column("g_max")
    g = g[np.isfinite(g) & (g > 0)]
    lo = max(g.min() / 3, 1e-12) if len(g) else 1e-12
    ax.set_ylim(lo, 1 / (2 * T.min()) * 2)
    ax.set_xlabel("temperature T")
    ax.set_ylabel("g(T, eps)")
    ax.legend()
    L = result.rows[0]["L"] if result.rows else "?"
    fig.suptitle(title(result, f"Fig. 4: gradient sensitivity (L = {L})"), fontsize=9)
    return fig


def plot_thm1_readings(result: Result, vectors: str = "v"):
    """Theorem 1 under every reading (`readings.theorem1`): left, the critical N / L against L for every E reading
    (d~ reading b solid, a dashed) with 0.06 L; right, Fig. 2a's head-mean curves at N = 5 (d~ b and every E)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from attnlab.normalization.readings import E_READINGS

    fig, (a1, a2) = _figure(2, 3.4, 3.2)
    crit = [r for r in result.rows if r["kind"] == "critical" and r["vectors"] == vectors]
    colors = dict(zip(E_READINGS, ("tab:blue", "tab:orange", "tab:purple", "tab:cyan", "tab:brown")))
    kinds = sorted({r.get("layer_kind") for r in crit}, key=str)       # [None]: every layer full
    markers = {None: "o", "full": "o", "sliding": "^"}
    for e in E_READINGS:
        for d, ls in (("b", "-"), ("a", "--")):
            for kind in kinds:                  # a model with sliding layers: one line per kind, over its own keys
                rs = sorted((r for r in crit if r["e"] == e and r["d"] == d and r.get("layer_kind") == kind),
                            key=lambda r: r["L"])
                if rs:
                    a1.plot([r["L"] for r in rs], [r["critical_frac"] for r in rs], ls=ls, marker=markers[kind],
                            ms=3, color=colors[e], label=f"{e}" if d == "b" and kind == kinds[0] else None)
    a1.axhline(CRITICAL_FRAC, color="k", ls=":", lw=1, label="0.06 (paper)")
    what = "critical N (b solid, a dashed" + ("; full o, sliding ^)" if len(kinds) > 1 else ")")
    a1.set(xscale="log", ylim=(0, 1.02), xlabel="L", ylabel="critical N / L", title=what)
    a1.legend(ncol=2, loc="center right")
    curve = result.select(kind="curve", vectors=vectors, N=5)
    for key, color, label in [("d_b", "tab:green", "true d~ (b)")] + [
            (e if e != "E4" else "E4_b", colors[e], e) for e in E_READINGS]:
        x, c, _, _ = aggregate_curve(Result(result.name, curve, result.provenance), key, "L")
        a2.plot(x, c, marker="o", ms=3, color=color, label=label, lw=2.2 if key == "d_b" else 1.2)
    a2.set(xscale="log", yscale="log", xlabel="L", ylabel="head mean at N = 5", title="Fig. 2a, every reading of E")
    a2.legend(ncol=2)
    for axis in (a1.xaxis, a2.xaxis, a2.yaxis):                          # plain labels, none on the minor ticks
        if axis is not a2.yaxis:
            axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    fig.suptitle(title(result, f"Theorem 1 under every reading (x = {vectors})"))
    return fig


def plot_cor2_curves(result: Result, vectors: str = "v"):
    """Corollary 2(ii) (`readings.theorem1`): each reading of E and the true d~ (b) against N / L at the largest L,
    relative to their value at N = 1 (head means), with the test's level COR2_VANISH."""
    from attnlab.normalization.claim_kinds import threshold
    from attnlab.normalization.readings import E_READINGS

    COR2_VANISH = threshold("COR2_VANISH")

    curve = [r for r in result.rows if r["kind"] == "curve" and r["vectors"] == vectors]
    L = max(r["L"] for r in curve)
    top = Result(result.name, [r for r in curve if r["L"] == L], result.provenance)
    fig, (ax,) = _figure(1, 5.0, 3.6)
    colors = dict(zip(E_READINGS, ("tab:blue", "tab:orange", "tab:purple", "tab:cyan", "tab:brown")))
    for key, color, label in [("d_b", "tab:green", "true d~ (b)")] + [
            (e if e != "E4" else "E4_b", colors[e], e) for e in E_READINGS]:
        n, c, _, _ = aggregate_curve(top, key, "N")
        ax.plot(n / L, c / c[0], marker="o", ms=3, color=color, label=label, lw=2.2 if key == "d_b" else 1.2)
    ax.axhline(COR2_VANISH, color="k", ls=":", lw=1, label=f"{COR2_VANISH:g} x E(1): the test's level")
    ax.set(yscale="log", xlabel="N / L", ylabel="head mean / its value at N = 1",
           title=f"Corollary 2(ii): E as N -> L (L = {L})")
    ax.legend(ncol=2, fontsize="small")
    fig.suptitle(title(result, f"Corollary 2(ii), x = {vectors}"))
    return fig
