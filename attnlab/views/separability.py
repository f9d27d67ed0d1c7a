"""Views for chapter 4 (Geometric separability): the circle example, Figure 3's summary and head grid, the live
one-head histogram, and every reading of N_s/N and of Theorem 2's bounds. Views only: every number is read
from `attnlab.normalization.metrics.separability` on one row or Trace, or from the fig3 / separability_readings
Results and their claim rows."""
from __future__ import annotations

import textwrap
from typing import Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from attnlab.book import markup, running
from attnlab.core.result import Result
from attnlab.normalization import readings
from attnlab.normalization.concentration import (
    FLAT_RHO,
    concentration_direction,
    concentration_relation,
    separability_by_concentration,
)
from attnlab.normalization.metrics import engine, separability
from attnlab.normalization.paper import SATURATION_N, SEPARABILITY_BAND
from attnlab.normalization.readings import theorem2
from attnlab.tools import normalizers

K = 12                                      # points of the circle example


def circle_example(K: int = K, T: float = 0.5, seed: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """K points on the unit circle (evenly spread, jittered) [K, 2] and softmax(logits / T) of random logits [K]."""
    g = torch.Generator().manual_seed(seed)
    theta = (torch.arange(K) + 0.7 * torch.rand(K, generator=g)).double() * 2 * np.pi / K
    x = torch.stack([theta.cos(), theta.sin()], dim=-1)                  # [K, 2]
    logits = torch.randn(K, generator=g, dtype=torch.float64)
    return x, normalizers.softmax(logits, T=T)                           # weights [K]


def circle_view(x: torch.Tensor, a: torch.Tensor, N: int) -> dict:
    """`separability.separability_stats` on one row (weights [1, K], points [K, 2]), with what the drawing needs:
    s, the selected and (for drawing only) the inside points, the scaled points, and whether the two agree."""
    st = separability.separability_stats(a[None], x, [N], stats=("ns_frac", "r", "lower_row", "upper_B_row"))
    v = {k: float(t[0, 0]) for k, t in st.items()}
    s = engine.context_vector(a[None], x, N)[0]
    sel = torch.zeros(len(a), dtype=torch.bool)
    sel[engine.top_n(a[None], N)[0]] = True
    y = a[:, None] * x                                                   # scaled points
    inside = sel & ((y - s).norm(dim=-1) < v["r"])
    return dict(v, s=s, sel=sel, inside=inside, y=y, N=N, agrees=int(inside.sum()) == round(v["ns_frac"] * N))


def draw_circle(x: torch.Tensor, a: torch.Tensor, N: int, figsize=(6.4, 3.1)):
    """Figure: the tokens with their weights, and the scaled points a_i x_i with s and the ball B_r(s)."""
    v = circle_view(x, a, N)
    s, sel, inside, y, r = v["s"], v["sel"], v["inside"], v["y"], v["r"]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=figsize)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.09, top=0.91, wspace=0.04)   # fixed layout: fast redraws
    t = np.linspace(0, 2 * np.pi, 200)
    ax0.plot(np.cos(t), np.sin(t), color="0.8", lw=1)
    ax0.scatter(*x[~sel].T, c="k", s=14)
    ax0.scatter(*x[sel].T, c="m", marker="*", s=90)
    for i in range(len(a)):
        ax0.annotate(f"{a[i]:.2f}", x[i] * 1.2, ha="center", va="center", color="0.3")
    ax0.set(aspect="equal", xlim=(-1.45, 1.45), ylim=(-1.45, 1.45), xticks=[], yticks=[])
    ax0.set_title(r"tokens $x_i$ (labels: weights $\alpha_i$)", fontsize=9)
    ax1.add_patch(plt.Circle(s.tolist(), r, color="m", alpha=0.12, lw=0))
    ax1.add_patch(plt.Circle(s.tolist(), r, fill=False, color="m", lw=0.8, ls="--"))
    ax1.scatter(*y[~sel].T, c="k", s=14, label="not selected")
    ax1.scatter(*y[inside].T, c="m", marker="*", s=90, label="selected, inside")
    ax1.scatter(*y[sel & ~inside].T, facecolors="none", edgecolors="m", marker="*", s=90,
                label="selected, outside")
    ax1.scatter(*s.tolist(), c="r", marker="x", s=40, label="$s$")
    ax1.scatter(0, 0, c="0.5", marker="+", s=30)
    m = 1.1 * max(float(y.norm(dim=-1).max()), float(s.norm()) + r)
    ax1.set(aspect="equal", xlim=(-m, m), ylim=(-m, m), xticks=[], yticks=[])
    ax1.set_title(rf"$\alpha_i x_i$, $s$, $B_r(s)$:  $N = {N}$,  $N_s/N$ = {round(v['ns_frac'] * N)}/{N}",
                  fontsize=9)
    ax1.set_xlabel(f"Theorem 2 (ξ = row): lower {v['lower_row']:.2f}, upper [B] {v['upper_B_row']:.2f}")
    ax1.legend(loc="lower left", framealpha=0.8)
    return fig


def live_circle(N: int, T: float, seed: int):
    """The live circle figure: a new example at temperature T and seed."""
    return draw_circle(*circle_example(K, T, seed), N)


def fig3_summary(res3, model_name: str):
    """HTML table: the median over heads of N_s/N at the N the paper describes, against the paper's words."""
    ns3 = sorted(res3.unique("N"))
    med = {n: float(np.nanmedian(res3.column("ns_frac", N=n))) for n in ns3}
    q25, q75 = (float(np.nanpercentile(res3.column("ns_frac", N=ns3[-1]), q)) for q in (25, 75))
    late = [med[n] for n in ns3 if n >= 16]
    return markup.table(["quantity", "paper (GPT-2 124M, L = 1024)",
                       f"this book ({model_name}, L = {res3.rows[0]['L']})"],
                      [["N_s/N at N = 1", "1 (by definition)", f"{med[1]:.3f}"],
                       ["decline from N = 1 to N = 16", "declines up to N ≈ 16", f"{med[1]:.3f} → {med[16]:.3f}"],
                       ["change from N = 16 to N = 32", "then saturates", f"{med[16]:.3f} → {med[ns3[-1]]:.3f}"],
                       ["N_s/N for N ≥ 16", "between 0.70 and 0.85 (≈ 80%)", f"{min(late):.3f} – {max(late):.3f}"],
                       [f"N_s/N at N = {ns3[-1]}: IQR over heads", "—", f"{q25:.3f} – {q75:.3f}"]])


def head_grid(res3, N: int) -> np.ndarray:
    """[layer, head] N_s/N (token mean) at N from the fig3 Result (NaN where a head has no row)."""
    layers, heads = sorted(res3.unique("layer")), sorted(res3.unique("head"))
    g = np.full((len(layers), len(heads)), np.nan)
    for r in res3.select(N=N):
        g[layers.index(r["layer"]), heads.index(r["head"])] = r["ns_frac"]
    return g


def heads_frame(res3, N: int, model_name: str, figsize=(6.4, 2.6)):
    """Figure: N_s/N of every head at N as a layer x head grid, and its histogram against the paper's band."""
    layers, heads = sorted(res3.unique("layer")), sorted(res3.unique("head"))
    g = head_grid(res3, N)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=figsize, layout="constrained",
                                   gridspec_kw={"width_ratios": [1.15, 1]})
    im = ax0.imshow(g, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax0.set(xlabel="head", ylabel="layer", xticks=range(0, len(heads), 2), yticks=range(len(layers)))
    ax0.set_yticklabels(layers)
    ax0.set_xticklabels(heads[::2])
    fig.colorbar(im, ax=ax0, shrink=0.9, label="$N_s/N$")
    ax1.axvspan(0.70, 0.85, color="tab:green", alpha=0.15, label="paper 0.70–0.85")
    ax1.hist(g.ravel(), bins=np.linspace(0, 1, 21), color="tab:green", alpha=0.8)
    ax1.axvline(np.nanmedian(g), color="k", lw=1, label=f"median {np.nanmedian(g):.2f}")
    ax1.set(xlim=(0, 1), xlabel="$N_s/N$ (token mean)", ylabel="heads")
    ax1.legend(loc="upper left")
    fig.suptitle(f"{model_name}, L = {res3.rows[0]['L']}, N = {N}", fontsize=9)
    return fig


def live_head_histogram(trace):
    """The live one-head figure for Trace `trace`: returns draw(layer, head, N) -> Figure, the histogram of N_s/N
    over the query rows with its mean and the mean of both bounds."""
    vis = trace.visible()

    def draw(layer, head, N):
        li, hi = trace.layers.index(layer), trace.heads.index(head)
        st = separability.separability_stats(trace.probs[li, hi].cpu(), trace.v[li, hi].cpu(), [N], vis,
                                             stats=("ns_frac", "lower_row", "upper_B_row"))
        f = st["ns_frac"][:, 0].numpy()
        fig, ax = plt.subplots(figsize=(5.0, 2.6))
        fig.subplots_adjust(left=0.11, right=0.97, bottom=0.18, top=0.89)          # fixed layout: fast redraws
        ax.hist(f[np.isfinite(f)], bins=np.linspace(0, 1, 21), color="tab:green", alpha=0.8)
        ax.axvline(np.nanmean(f), color="k", lw=1.2, label=f"mean {np.nanmean(f):.2f}")
        ax.axvline(float(st["lower_row"].nanmean()), color="tab:blue", ls="--", lw=1, label="lower bound (mean)")
        ax.axvline(float(st["upper_B_row"].nanmean()), color="tab:red", ls="--", lw=1,
                   label="upper bound [B] (mean)")
        ax.set(xlim=(-0.02, 1.02), xlabel="$N_s/N$ of each query row", ylabel="rows",
               title=f"layer {layer}, head {head}, N = {N}, L = {trace.n_tokens}")
        ax.legend(loc="upper left")
        return fig

    return draw


def readings_table():
    """HTML table of every reading of separability: vectors, radius, rows, summary over heads, xi, constant."""
    return markup.registry_table((("vectors x_i", readings.VECTORS), ("radius", readings.RADII),
                                ("rows", readings.ROW_SETS), ("summary over heads", readings.SEP_AGGREGATES),
                                ("spread xi_i (bounds)", readings.XI_READINGS),
                                ("upper bound's constant", readings.UPPER_FORMS)))


def saturation(sep_tab: dict, rows_sep: Sequence[dict], agg: str, name: str, radius: str = "nearest",
               rows: str = "positive_r") -> tuple[float, float, str]:
    """(min, max) over N >= 16 of the summary `agg` over heads under one reading, and the claim checker's verdict."""
    verdicts = {r["reading"]: r["verdict"] for r in rows_sep if r["id"] == "p1-fig3-saturation"}
    ns, v = theorem2.sep_curve(sep_tab, name, radius, rows, agg)
    late = v[ns >= SATURATION_N]
    return float(late.min()), float(late.max()), verdicts[f"{agg} / {name} / {radius} / {rows}"]


def saturation_table(sep_tab: dict, rows_sep: Sequence[dict], L: int, model_name: str):
    """HTML table: N_s/N for N = 16..32 and its verdict per vectors reading (rows) and summary over heads."""
    def cell(agg, name):
        lo, hi, verdict = saturation(sep_tab, rows_sep, agg, name)
        return f"{lo:.3f}–{hi:.3f}<br><b>{verdict}</b>"

    return markup.table(["vectors x_i"] + [r.label for r in readings.SEP_AGGREGATES.values()],
                      [[f"<code>{n}</code>" + (" (default)" if n == "v_unit" else "")]
                       + [cell(a, n) for a in readings.SEP_AGGREGATES] for n in readings.VECTORS],
                      caption=f"N_s/N for N = 16..32, L = {L}, {model_name}; paper: "
                              f"{SEPARABILITY_BAND[0]}–{SEPARABILITY_BAND[1]}")


def bound_table(rows_sep: Sequence[dict], units: Sequence[str]):
    """HTML table: Theorem 2's bounds per reading of xi (rows) and unit vectors (columns): measured and verdict."""
    bound_rows = {(r["id"], r["reading"]): r for r in rows_sep if r["id"].startswith("p1-thm2")}
    what = {"p1-thm2-lower": "lower", "p1-thm2-upper-B": "upper [B]", "p1-thm2-upper-R": "upper [R]"}

    def cell(cid, xi, n):
        r = bound_rows[(cid, f"xi={xi} / {n} / nearest / positive_r")]
        return f"{r['measured'].split(';')[0]}<br><b>{r['verdict']}</b>"

    return markup.table(["bound", "xi"] + [f"<code>{n}</code>" for n in units],
                      [[what[cid] if j == 0 else "", readings.XI_READINGS[xi].label] + [cell(cid, xi, n) for n in units]
                       for cid in what for j, xi in enumerate(readings.XI_READINGS)])


# ------------------------------------------------------------- concentration against separability, head by head



def head_separability(model_name: Optional[str] = None) -> Result:
    """`concentration.separability_by_concentration` of one model (the build's when None) on the book's default
    window, cached (`running.cached_result`, keyed like the fig1 and fig3 Results it reads: model, text, window, their
    versions; a new version of either computes it again, in milliseconds). The figures come from
    `running.figure_results` with the set `book.models.claims_per_model` asks for, so that a model no chapter
    computed shares its forward passes."""
    from attnlab.figures import FIGURES, READING_FIGURES, figure_ids

    inp = running.inputs()
    if model_name and model_name != inp.model.name:
        inp = running.inputs(model_name)
    res = running.figure_results([i for i in figure_ids("normalization") if i not in READING_FIGURES], inp)
    key = {"fig1_version": FIGURES["fig1"].version, "fig3_version": FIGURES["fig3"].version,   # the Results' key
           **inp.window_key()}
    return running.cached_result("head_separability", key,
                                 lambda: separability_by_concentration(res["fig1"], res["fig3"]),
                                 model=inp.model, text_sha256=inp.corpus.sha256)


def relation_at(res: Result, N: Optional[int] = None) -> dict:
    """`concentration.concentration_relation` of a head_separability Result at N (its largest when None), with N."""
    N = max(res.unique("N")) if N is None else N
    return dict(concentration_relation(res.column("max_weight", N=N), res.column("ns_frac", N=N)), N=N)


def provenance_line(res: Result) -> str:
    """'smollm2, War and Peace, first 1024 tokens (L = 1024), N_s/N of values on the unit sphere, strict radius'."""
    from attnlab.core.models import weights_label
    from attnlab.core.text import text_title

    p = res.provenance
    text = text_title(p.get("text") or "a text")
    offsets = p.get("window_offsets")
    where = "first" if not offsets else f"from character {offsets} on, first"
    x = {"v": "value", "hidden": "layer-input"}.get(p.get("x"), str(p.get("x")))
    return (f"{p.get('model')}{weights_label(p.get('model_info'))}, {text} ({where} {p.get('window_tokens')} tokens, "
            f"L = {p.get('L')}); N_s/N: {x} vectors on the unit sphere, strict radius, token mean per head")


def relation_figure(results: dict, N: Optional[int] = None, figsize=None):
    """Figure: one panel per model ({name: head_separability Result}), each head's N_s/N at N (the largest when
    None) against its mean largest weight, coloured by layer, Spearman's rho in the panel's title, the paper's
    band shaded; the models, window, L and reading underneath. Two panels a row at most (three models: a page's
    column is 6.9 inches wide). `figsize`: 3.4 x 3.0 inches a panel when None."""
    cols = min(2, len(results))
    rows_of_panels = -(-len(results) // cols)
    figsize = figsize or (3.4 * cols, 3.0 * rows_of_panels)
    fig, grid = plt.subplots(rows_of_panels, cols, figsize=figsize, layout="constrained", squeeze=False)
    axes = [grid.ravel()]
    for ax in axes[0][len(results):]:
        ax.set_visible(False)
    for ax, (name, res) in zip(axes[0], results.items()):
        rel = relation_at(res, N)
        rows = res.select(N=rel["N"])
        layers = np.array([r["layer"] for r in rows])
        ax.axhspan(*SEPARABILITY_BAND, color="tab:green", alpha=0.12, lw=0, label="paper 0.70–0.85")
        sc = ax.scatter([r["max_weight"] for r in rows], [r["ns_frac"] for r in rows], c=layers, cmap="viridis",
                        s=10, alpha=0.85, lw=0)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean largest weight (row mean)",
               ylabel=f"$N_s/N$ at N = {rel['N']}")
        ax.set_title(f"{name}, L = {res.provenance.get('L')}, N = {rel['N']}\nSpearman ρ = {rel['rho']:+.2f} "
                     f"over {rel['n_heads']} heads", fontsize=9)
        fig.colorbar(sc, ax=ax, label="layer", shrink=0.85)
    axes[0][0].legend(loc="upper right", fontsize=8)
    fig.supxlabel("\n".join(textwrap.fill(provenance_line(r), 100) for r in results.values()), fontsize=7)
    return fig


def relation_sentence(name: str, res: Result, N: Optional[int] = None) -> str:
    """HTML: one model's relation at N (largest when None) in words, the direction read from the sign of rho, with
    rho over every N of the Result and the deciles."""
    rel = relation_at(res, N)
    rhos = [relation_at(res, n)["rho"] for n in sorted(res.unique("N"))]
    verb = concentration_direction(rel["rho"], "rises", "falls", "hardly changes")
    over = (f"; ρ from {min(rhos):+.2f} to {max(rhos):+.2f} over N = {min(res.unique('N'))}…{max(res.unique('N'))}"
            if len(rhos) > 1 else "")
    return (f"<b>{name}</b>: over its {rel['n_heads']} heads, N_s/N at N = {rel['N']} {verb} as the mean largest "
            f"weight grows (Spearman ρ = {rel['rho']:+.2f}{over}). The most concentrated tenth of its heads "
            f"({rel['k']}) has median N_s/N {rel['ns_concentrated']:.2f}, the least concentrated tenth "
            f"{rel['ns_diffuse']:.2f}. <small>({provenance_line(res)}.)</small>")


def relation_prose(results: dict, N: Optional[int] = None):
    """HTML: each model's relation (`relation_sentence`), how the models compare (median largest weight and median
    N_s/N), and what follows for the explanation "diffuse heads lose separability", every direction read from the
    rows."""
    rel = {m: relation_at(r, N) for m, r in results.items()}
    items = "".join(f"<li>{relation_sentence(m, r, N)}</li>" for m, r in results.items())
    parts = [f"<ul>{items}</ul>"]
    against = [m for m, r in rel.items() if r["rho"] <= -FLAT_RHO]
    along = [m for m, r in rel.items() if r["rho"] >= FLAT_RHO]
    if len(rel) >= 2:
        # The most diffuse model (a) against the most concentrated (b): a chapter shows the offline models and its
        # own model when it is another (GPT-2 in the publishing workflow), so three or four (two without Gemma 3).
        order = sorted(rel.items(), key=lambda kv: kv[1]["median_max_weight"])
        (a, ra), (b, rb) = order[0], order[-1]
        cmp_ns = ("higher" if ra["median_ns_frac"] > rb["median_ns_frac"] else
                  "lower" if ra["median_ns_frac"] < rb["median_ns_frac"] else "the same")
        weights = f"{ra['median_max_weight']:.2f} against {rb['median_max_weight']:.2f}"
        if len(order) == 2:
            who = f"{a}'s heads are more diffuse than {b}'s (median of the mean largest weight {weights}), and its"
            panels = "the two models' N and L are those of their panels"
        else:
            middle = ", ".join(f"{m} {r['median_max_weight']:.2f}" for m, r in order[1:-1])
            who = (f"{a}'s heads are the most diffuse and {b}'s the most concentrated (median of the mean largest "
                   f"weight {weights}; {middle} in between), and {a}'s")
            panels = "each model's N and L are those of its panel"
        parts.append(f"<p>Between the models: {who} median N_s/N at N = {ra['N']} is {cmp_ns} "
                     f"({ra['median_ns_frac']:.2f} against {rb['median_ns_frac']:.2f}; {panels}).</p>")
    verdict = []
    if against:
        verdict.append(f"On {', '.join(against)} the concentrated heads are the ones that lose separability: "
                       "within the model the diffuse heads separate more, so \"its rows are diffuse\" does not "
                       "explain where its level sits.")
    if along:
        verdict.append(f"On {', '.join(along)} the concentrated heads separate more; there a diffuse head does lose "
                       "separable tokens.")
    flat = [m for m in rel if m not in against and m not in along]
    if flat:
        verdict.append(f"On {', '.join(flat)} N_s/N hardly depends on the concentration (|ρ| < {FLAT_RHO}).")
    parts.append("<p>" + " ".join(verdict) + "</p>")
    return markup.prose("".join(parts))
