"""Views of the tools' Results: the `attnlab diagnose` report (summary text, heat maps, curves, a
self-contained HTML page, written all at once) and the figures of normalizers swapped into a model.
They read Results and never recompute science."""
from __future__ import annotations

import base64
import html
import io
import math
import os
import shutil
import tempfile
import time
from glob import escape as glob_escape
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from attnlab.core.result import Result
from attnlab.core.style import literal, series_style
from attnlab.core.util import figure_grid
from attnlab.tools.diagnose import HEAT_METRICS, PAPER, REPORT_NAME

# ------------------------------------------------------------------------------------------- views

def _grid(result: Result, key: str, L: int) -> np.ndarray:
    """[layer, head] array of `key` over the head rows at L."""
    hr = result.select(kind="head", L=L)
    layers = sorted({r["layer"] for r in hr})
    heads = sorted({r["head"] for r in hr})
    out = np.full((len(layers), len(heads)), np.nan)
    for r in hr:
        v = r.get(key)
        out[layers.index(r["layer"]), heads.index(r["head"])] = np.nan if v is None else float(v)
    return out


def flag_length(result: Result) -> int:
    return int(result.provenance.get("flag_length") or max(r["L"] for r in result.rows))


def _truthy(v) -> bool:
    return v is True or v == 1 or v == "True"


def _names(rs: list[dict]) -> str:
    """"3 heads [0.1, 2.4, 5.11]" (the first 12 named)."""
    s = ", ".join(f"{r['layer']}.{r['head']}" for r in rs[:12])
    return f"{len(rs)} heads" + (f" [{s}{', ...' if len(rs) > 12 else ''}]" if rs else "")


def _longest(r: dict, L: int) -> int:
    """The keys of the longest row of a layer/model row: its `longest_row` (a model with sliding-window layers:
    min(L, w) in a sliding layer), else L."""
    v = r.get("longest_row")
    return L if v in (None, "", "None") or (isinstance(v, float) and math.isnan(v)) else int(float(v))


def all_label(r: dict) -> str:
    """The label of a pooled "model" row: "all", or "all sliding 512" / "all full" for one layer kind's."""
    if "layer_kind" not in r:
        return "all"
    w = r.get("sliding_window")
    return f"all {r['layer_kind']}" + ("" if w in (None, "", "None") else f" {int(float(w))}")


def critical_text(r: dict, L: int, key: str = "critical_n") -> str:
    """A layer/model row's critical N (or, key="critical_n_uniform", that of its uniform reference) in words: a
    share of L, or of the row's `longest_row` (a sliding layer's min(L, w) keys) where it has one below L."""
    n = _longest(r, L)
    of = "L" if n == L else f"the longest row's {n} keys"
    if r.get(f"{key}_testable") in (False, "False"):
        return "not testable (too few heads)"
    if _truthy(r.get(f"{key}_censored")):
        return f"> {r.get('critical_n_max')} (no N up to {100 * r['critical_n_max'] / n:.0f}% of {of} passed)"
    return f"{int(r[key])} ({100 * r[f'{key}_frac']:.1f}% of {of})"


def summary(result: Result) -> str:
    """A few lines for the terminal: model, text, how many heads are flagged and for what, and what the
    paper's numbers would say as fixed cuts (for comparison; they do not flag). A model with sliding-window layers:
    the layer kinds, then one block of verdicts per kind (its heads, its layers, its pooled "model" row)."""
    p = result.provenance
    L = flag_length(result)
    lines = [
        f"attnlab diagnose: {p.get('model')} ({p.get('n_layers')} layers x {p.get('n_heads')} heads, "
        f"{'causal' if p.get('causal') else 'bidirectional'}) on {p.get('text')} "
        f"(sha256 {str(p.get('text_sha256'))[:12]}...), L = {p.get('lengths')}",
    ]
    layer_rows = result.select(kind="layer", L=L)
    if not any("layer_kind" in r for r in layer_rows):
        return "\n".join(lines + _verdict_lines(result.select(kind="head", L=L), layer_rows,
                                                (result.select(kind="model", L=L) or [{}])[0], L, p))
    from attnlab.core.capture import layer_kinds_text

    kinds = [(r["layer_kind"], None if r["sliding_window"] in ("", "None") else r["sliding_window"])
             for r in sorted(layer_rows, key=lambda r: r["layer"])]
    lines.append(f"layer kinds: {layer_kinds_text(kinds)}; each kind's statistics over the keys its rows see, one "
                 "block each")
    for kind, window in dict.fromkeys(kinds):
        where = {"layer_kind": kind, "sliding_window": window}
        layers = [r for r in layer_rows if _same(r, where)]
        model_row = next((r for r in result.select(kind="model", L=L) if _same(r, where)), {})
        lines.append(f"{kind} layers{'' if window is None else f' (window {window})'}: "
                     f"{', '.join(str(r['layer']) for r in layers)}; longest row {model_row.get('longest_row')} keys")
        heads = [r for r in result.select(kind="head", L=L) if _same(r, where)]
        lines += ["  " + line for line in _verdict_lines(heads, layers, model_row, L, p)]
    return "\n".join(lines)


def _same(r: dict, where: dict) -> bool:
    """Whether row r has where's values (a CSV's None for a full layer's window: '' or None alike)."""
    return all(r.get(k) == v or (v is None and r.get(k) in ("", "None")) for k, v in where.items())


def _verdict_lines(heads: list[dict], layer_rows: list[dict], model_row: dict, L: int, p: dict) -> list[str]:
    """The flag lines of `summary` for these head, layer and (pooled) model rows at L."""
    low = [r for r in heads if _truthy(r.get("flag_low_separability"))]
    uni = [r for r in heads if _truthy(r.get("flag_near_uniform"))]
    any_ = [r for r in heads if _truthy(r.get("flagged"))]
    paper_low = [r for r in heads if _truthy(r.get("paper_ns_below_band"))]
    thr = p.get("thresholds", {})
    layers = [r for r in layer_rows if _truthy(r.get("flag_critical_n"))]
    undecided = [r for r in layer_rows if r.get("flag_critical_n") in (None, "", "None")]
    paper_layers = [r for r in layer_rows if _truthy(r.get("paper_critical_above"))]
    model_crit = "?"
    if model_row:
        ref = critical_text(model_row, L, "critical_n_uniform")
        verdict = model_row.get("flag_critical_n")
        verdict = "undecidable" if verdict in (None, "", "None") else "flagged" if _truthy(verdict) else "not flagged"
        model_crit = f"{critical_text(model_row, L)}, uniform attention {ref}: {verdict}"
    return [
        f"at L={L}: {len(any_)} of {len(heads)} heads flagged (a flag fires at score >= its cut; score 0 = the "
        "unsaturated end, 1 = uniform attention over the head's own rows)",
        f"  near uniform, entropy score >= {thr.get('entropy')}: {_names(uni)}",
        f"  low separability, N_s/N score >= {thr.get('separability')} (N={p.get('n_sep')}; heads with entropy score "
        f">= {thr.get('sharp_gate')}): {_names(low)}",
        f"  critical N, score >= {thr.get('critical')}: model {model_crit}; layers: {len(layers)} of {len(layer_rows)} "
        "flagged" + (f", {len(undecided)} undecidable (reference censored or untestable)" if undecided else ""),
        f"  the paper's GPT-2 numbers as fixed cuts (not flags): N_s/N < {PAPER['ns_band'][0]}: {len(paper_low)} "
        f"heads; critical N > {PAPER['critical_frac']} L: {len(paper_layers)} of {len(layer_rows)} layers",
    ]


def _png_data_uri(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def heatmap_figure(result: Result, L: Optional[int] = None):
    """matplotlib Figure: layer x head heat maps of the HEAT_METRICS at L (default: the flag length);
    flagged heads are marked x."""
    L = L or flag_length(result)
    low = _grid(result, "flag_low_separability", L)
    uni = _grid(result, "flag_near_uniform", L)
    n_layers, n_heads = low.shape
    fig, axes = figure_grid(len(HEAT_METRICS), 3.3, 1.1 + 0.28 * max(n_layers, 3))
    for ax, (key, title) in zip(axes, HEAT_METRICS):
        grid = _grid(result, key, L)
        im = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, fraction=0.05)
        ys, xs = np.nonzero(low == 1)
        ax.scatter(xs, ys, marker="x", color="red", s=18, linewidths=1)
        ys, xs = np.nonzero(uni == 1)
        ax.scatter(xs, ys, marker="o", facecolors="none", edgecolors="white", s=30, linewidths=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    fig.suptitle(f"{literal(result.provenance.get('model'))}, L = {L}\n"
                 "(red x: low separability; white o: near uniform)", fontsize=10)
    return fig


def _strip(ax, x, layers, heads, n_layers, flagged, hollow=None, ref=None):
    """Per-head dots at x, one row per layer (heads spread within the row); flagged red; hollow ones
    (not eligible for the flag) open; optional grey x at each head's reference `ref`."""
    y = layers + (heads - heads.max() / 2) / max(heads.max(), 1) * 0.6
    if ref is not None:
        ax.scatter(ref, y, marker="x", s=14, color="0.55", linewidths=0.8, label="uniform reference", zorder=2)
    hollow = np.zeros_like(flagged) if hollow is None else hollow
    for sel, kw in ((~flagged & ~hollow, dict(color="C0", label="head")),
                    (~flagged & hollow, dict(facecolors="none", edgecolors="C0", label="head (sharp side)")),
                    (flagged, dict(color="C3", label="flagged"))):
        if sel.any():
            ax.scatter(x[sel], y[sel], s=14, zorder=3, **kw)
    ax.set_yticks(range(n_layers))
    ax.set_ylim(n_layers - 0.5, -0.5)
    ax.set_ylabel("layer")


def _ends(ax, unsat: float, uniform: Optional[float], cut: float, unsat_label: str):
    """The references and the cut of a score axis: dotted lines at the ends, dashed red cut."""
    ax.axvline(unsat, color="0.3", ls=":", lw=1)
    ax.axvline(cut, color="C3", ls="--", lw=1, label=f"cut: score {cut:g}")
    ax.text(unsat, -0.55, unsat_label, ha="center", va="bottom", fontsize=9)
    if uniform is not None:
        ax.axvline(uniform, color="0.3", ls=":", lw=1)
        ax.text(uniform, -0.55, "uniform", ha="center", va="bottom", fontsize=9)


def flag_figure(result: Result, L: Optional[int] = None):
    """matplotlib Figure, four panels at L (default: the flag length), each the distribution across
    heads (one row per layer) a flag is cut from, with its references and its cut: the entropy score
    (near uniform); N_s/N with each head's uniform reference, the one-hot value 1/N and the paper's band;
    the separability score (low separability; open dots: heads on the sharp side of the gate); the
    critical N / L of each layer and of the model with the uniform reference and the paper's 0.06."""
    L = L or flag_length(result)
    p, thr = result.provenance, result.provenance.get("thresholds", {})
    heads = result.select(kind="head", L=L)
    col = {k: np.array([np.nan if r.get(k) is None else float(r[k]) for r in heads])
           for k in ("layer", "head", "score_entropy", "ns_frac", "ns_frac_uniform", "score_separability")}
    flag = {k: np.array([_truthy(r.get(k)) for r in heads]) for k in ("flag_near_uniform", "flag_low_separability")}
    lay, hd = col["layer"].astype(int), col["head"].astype(int)
    n_layers = int(lay.max()) + 1
    # 0.3 in per layer up to 16 layers, then the same 4.8 in shared (30 layers: 0.16 in each)
    fig, axes = figure_grid(4, 3.4, 1.2 + min(0.3 * max(n_layers, 4), 4.8))
    ax = axes[0]
    _strip(ax, col["score_entropy"], lay, hd, n_layers, flag["flag_near_uniform"])
    _ends(ax, 0.0, 1.0, thr.get("entropy", 0.9), "one-hot")
    ax.set_xlabel("entropy score H / log L")
    ax.set_title("near uniform", pad=14)
    ax = axes[1]
    n = float(p.get("n_sep") or 16)
    _strip(ax, col["ns_frac"], lay, hd, n_layers, flag["flag_low_separability"], ref=col["ns_frac_uniform"])
    lo, hi = PAPER["ns_band"]
    ax.axvspan(lo, hi, color="C1", alpha=0.25, lw=0, label=f"paper (GPT-2) {lo}-{hi}")
    ax.axvline(1 / n, color="0.3", ls=":", lw=1)
    ax.text(1 / n, -0.55, "one-hot", ha="center", va="bottom", fontsize=9)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel(f"N_s / N (N = {n:g})")
    ax.set_title("separability and its references", pad=14)
    ax = axes[2]
    gate = thr.get("sharp_gate", 0.5)
    sharp = np.nan_to_num(col["score_entropy"], nan=-1) < gate
    _strip(ax, col["score_separability"], lay, hd, n_layers, flag["flag_low_separability"], hollow=sharp)
    _ends(ax, 0.0, 1.0, thr.get("separability", 0.9), "N_s/N = 1")
    ax.set_xlabel("separability score")
    ax.set_title(f"low separability (open: entropy score < {gate:g})", pad=14)
    _critical_panel(axes[3], result, L, thr.get("critical", 0.9))
    legend = {}                             # one legend for the four panels, each label once
    for a in axes:
        for h, lab in zip(*a.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncol=3, frameon=False)
    fig.suptitle(f"{literal(p.get('model'))}, L = {L}: what each flag is cut from", fontsize=10)
    return fig


def _critical_panel(ax, result: Result, L: int, cut: float) -> None:
    """Critical N / L of each layer and of the model ("all"), its uniform reference, the cut, the paper's 0.06."""
    rows = result.select(kind="layer", L=L) + result.select(kind="model", L=L)
    seen: set = set()

    def once(label):
        return None if label in seen else seen.add(label) or label

    for i, r in enumerate(rows):
        if r.get("critical_n_testable") in (False, "False"):
            continue
        n_max, cens, n = float(r["critical_n_max"]), _truthy(r.get("critical_n_censored")), _longest(r, L)
        ax.scatter([n_max / n if cens else float(r["critical_n_frac"])], [i], marker=">" if cens else "o", s=22,
                   color="C3" if _truthy(r.get("flag_critical_n")) else "C0", zorder=3,
                   label=once("censored: > scan end" if cens else "critical N / L"))
        if r.get("critical_n_uniform") is not None and not _truthy(r.get("critical_n_uniform_censored")):
            nu = float(r["critical_n_uniform"])
            ax.scatter([nu / n], [i], marker="x", color="0.55", s=18, zorder=2, label=once("uniform reference"))
            ax.plot([(n_max - cut * (n_max - nu)) / n] * 2, [i - 0.3, i + 0.3], color="C3", lw=1.2,
                    label=once(f"cut: critical-N score {cut:g}"))
    ax.axvline(PAPER["critical_frac"], color="C1", ls="--", lw=1, label=f"paper (GPT-2) {PAPER['critical_frac']}")
    ax.set_yticks(range(len(rows)), [str(r["layer"]) if r["kind"] == "layer" else all_label(r) for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, None)
    ax.set_ylabel("layer")
    kinds = any("layer_kind" in r for r in rows)
    ax.set_xlabel("critical N / L" + (" (sliding: / min(L, w))" if kinds else ""))
    ax.set_title("critical N (KS test)", pad=14)


def curves_figure(result: Result):
    """matplotlib Figure: entropy / log L and max weight of every head against L (one line per head,
    coloured by layer), with the entropy threshold."""
    from matplotlib import colormaps

    lengths = sorted({r["L"] for r in result.select(kind="head")})
    fig, axes = figure_grid(2, 4.5, 3.2)
    grids = {L: {k: _grid(result, k, L) for k in ("entropy_norm", "max_weight")} for L in lengths}
    n_layers, n_heads = grids[lengths[0]]["max_weight"].shape
    cmap = colormaps["viridis"]
    for ax, key, title in ((axes[0], "entropy_norm", "entropy / log L"), (axes[1], "max_weight", "max weight")):
        for li in range(n_layers):
            color = cmap(li / max(n_layers - 1, 1))
            for hi in range(n_heads):
                ax.plot(
                    lengths,
                    [grids[L][key][li, hi] for L in lengths],
                    color=color,
                    lw=0.8,
                    alpha=0.6,
                    label=f"layer {li}" if hi == 0 else None,
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("L")
        ax.set_title(title, fontsize=10)
    thr = result.provenance.get("thresholds", {}).get("entropy_norm")
    if thr is not None:
        axes[0].axhline(thr, color="red", ls="--", lw=1, label="flag threshold")
    axes[1].set_yscale("log")
    axes[0].legend(ncol=2)
    return fig


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return html.escape(str(v))


def _table(rows: list[dict], cols: Sequence[str], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr"
        + (' class="flag"' if _truthy(r.get("flagged")) else "")
        + ">"
        + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols)
        + "</tr>"
        for r in rows
    )
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f3f3f3}tr.flag td{background:#fff0f0}.prov td,.rules td{text-align:left}
.scroll{overflow-x:auto}img{max-width:100%}code{background:#f3f3f3;padding:0 3px}pre{background:#f7f7f7;padding:0.8em;
white-space:pre-wrap}"""
PROV_KEYS = ("model", "model_source", "model_class", "model_weights_sha256", "causal", "n_layers", "n_heads",
             "d_head", "max_positions", "device", "text", "text_source", "text_sha256", "text_chars", "lengths",
             "window", "n_top", "n_sep", "max_rows", "alpha", "thresholds", "x", "keys", "entropy", "jacobian",
             "references", "critical_n", "flags", "paper_guidelines", "attnlab", "torch", "transformers",
             "created_utc", "runtime_seconds")
HEAD_COLS = ("layer", "head", "entropy_norm", "score_entropy", "max_weight", "ns_frac", "ns_frac_uniform",
             "score_separability", "dtilde_ratio", "dtilde_ratio_uniform", "dtilde_ratio_sharp", "jac_norm",
             "flag_near_uniform", "flag_low_separability", "flag_critical_n", "paper_ns_below_band")
CRIT_COLS = ("L", "layer", "critical_n", "critical_n_frac", "critical_n_censored", "critical_n_pvalue",
             "critical_n_uniform", "critical_n_uniform_frac", "critical_n_uniform_censored", "critical_n_max",
             "n_pooled_heads", "score_critical", "flag_critical_n", "paper_critical_above")
FLAG_TEXT = (
    "<p>Each flag cuts a <b>saturation score</b>: 0 at the statistic's unsaturated end, 1 at the value the same "
    "statistic takes under <b>uniform attention</b> over the head's own rows and value vectors (the weights of each "
    "row replaced by 1/L<sub>t</sub>, ranked as the row ranks its keys: the T &rarr; &infin; end of the head's "
    "temperature path). The figure shows the distribution across heads each flag is cut from, with its references "
    "and its cut. N<sub>s</sub>/N is not monotone in saturation (it falls towards 1/N at the one-hot end as well), so "
    "it flags only heads on the uniform side of the entropy gate. The paper's numbers (GPT-2: N<sub>s</sub>/N "
    "0.70&ndash;0.85, critical N &lt; 0.06 L) are shown for comparison (columns <code>paper_*</code>); they are not "
    "flags. Flags mark where a head has lost selectivity, not broken heads.</p>"
)


def report_html(result: Result) -> str:
    """A self-contained HTML page (no external files: PNGs as base64 data URIs) from a diagnose Result."""
    p = result.provenance
    L = flag_length(result)
    prov_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(p.get(k)))}</td></tr>" for k in PROV_KEYS if k in p
    )
    rules = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                    for k, v in (p.get("flag_rules") or {}).items())
    heads = result.select(kind="head", L=L)
    flagged = [r for r in heads if _truthy(r.get("flagged"))]
    crit_rows = sorted(
        ({"layer": all_label(r), **r} for r in result.select(kind="model") + result.select(kind="layer")),
        key=lambda r: (r["L"], -1 if r["kind"] == "model" else r["layer"]),
    )
    kinds = ("layer_kind", "sliding_window") if any("layer_kind" in r for r in heads) else ()
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>attnlab diagnose: {html.escape(str(p.get('model')))}</title><style>{_CSS}</style></head><body>",
        f"<h1>Attention diagnostics: {html.escape(str(p.get('model')))}</h1>",
        f"<div class='scroll'><table class='prov'>{prov_rows}</table></div>",
        f"<h2>Summary</h2><pre>{html.escape(summary(result))}</pre>",
        "<h2>Flags: rules, references, distributions</h2>",
        f"<table class='rules'>{rules}</table>",
        FLAG_TEXT,
        f"<img alt='per-head distributions with references and cuts' "
        f"src='{_png_data_uri(flag_figure(result, L))}'>",
        f"<h2>Heads at L = {L}</h2><img alt='heat maps' src='{_png_data_uri(heatmap_figure(result, L))}'>",
        f"<h2>Against L</h2><img alt='curves' src='{_png_data_uri(curves_figure(result))}'>",
        "<h2>Critical N (KS test pooling heads)</h2>",
        _table(crit_rows, CRIT_COLS + kinds),
        f"<h2>Flagged heads at L = {L} ({len(flagged)})</h2>",
        _table(flagged, HEAD_COLS + kinds) if flagged else "<p>none</p>",
        f"<h2>All heads at L = {L}</h2>",
        _table(heads, HEAD_COLS + kinds),
        "<p>Every length is in the CSV (<code>diagnose.csv</code>); provenance in <code>diagnose.json</code>.</p>",
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(result: Result, out_dir) -> dict[str, Path]:
    """Write diagnose.html, diagnose.csv, diagnose.json into out_dir, all or nothing: everything is
    written into a temporary sibling directory first, then moved in place (a new out_dir is renamed
    in one step). On any error the temporary directory is removed."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out_dir)!r} exists and is not a directory: choose another path")
    parent = out.parent if str(out.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{glob_escape(out.name)}.tmp-*"):   # left by a killed run (10 min or older)
        if stale.is_dir() and time.time() - stale.stat().st_mtime > 600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.tmp-"))
    try:
        result.save(tmp)
        (tmp / f"{REPORT_NAME}.html").write_text(report_html(result), encoding="utf-8")
        names = sorted(f.name for f in tmp.iterdir())
        umask = os.umask(0)
        os.umask(umask)
        if not out.exists():
            os.chmod(tmp, 0o777 & ~umask)
            os.rename(tmp, out)
        else:                       # csv, html, then json (it carries the csv's sha256): a kill between
            for name in names:      # two of them leaves a pair that Result.load refuses, never a mix taken as whole
                os.replace(tmp / name, out / name)
            tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {Path(n).suffix.lstrip("."): out / n for n in names}


# ------------------------------------------------------------------------------------------- views

COST_LABELS = {"drift": "hidden-state drift (1 - cos)", "loss_delta": "loss - native loss (nats)"}
LABELS = {
    "max_weight": "max weight",
    "entropy_norm": "entropy / log L",
    "ns_frac": "N_s / N",
    "jac_norm_mean": "Jacobian norm (mean)",
    "dtilde": "d~ (N = 5)",
    "critical_n_frac": "critical N / L",
    "weight_sum": "row sum of weights",
    **COST_LABELS,
}


def cost_key(result: Result) -> str:
    """ "loss_delta" when the model has an LM head (rows carry a loss), else "drift"."""
    return "loss_delta" if any(r.get("loss") is not None for r in result.rows) else "drift"


def _values(result: Result, key: str, **where) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in result.select(**where)])


def one_kind(result: Result, layer_kind: Optional[str]) -> Result:
    """The rows of one layer kind of a comparison whose rows come per layer kind (a model with sliding-window
    layers: `compare_normalizers`), else `result` itself; ValueError (one line) where it has kinds and `layer_kind`
    is not one of them: one bar or line per normalizer must not mix the kinds' rows."""
    kinds = sorted({r["layer_kind"] for r in result.rows if r.get("layer_kind") not in (None, "")})
    if not kinds:
        return result
    if layer_kind not in kinds:
        raise ValueError(f"this comparison has rows per layer kind ({', '.join(kinds)}): pass layer_kind= one of them")
    return Result(result.name, result.select(layer_kind=layer_kind), result.provenance)


def comparison_figure(result: Result, L: int, keys: Optional[Sequence[str]] = None, layer_kind: Optional[str] = None):
    """Bars per normalizer at length L for `keys` (default: max weight, entropy / log L, N_s/N, cost);
    axis limits are shared by every L, so frames of a slider over L compare. layer_kind: which kind's rows, for a
    comparison with rows per layer kind (`one_kind`)."""
    result = one_kind(result, layer_kind)
    keys = list(keys or ("max_weight", "entropy_norm", "ns_frac", cost_key(result)))
    names = result.unique("normalizer")
    fig, axes = figure_grid(len(keys), 3.4, 0.32 * len(names) + 1.0)
    colors = [series_style(i)["color"] for i in range(len(names))]     # the lines' colours of `length_figure`
    for ax, key in zip(np.atleast_1d(axes), keys):
        allv = _values(result, key)
        lo, hi = min(0.0, np.nanmin(allv)), np.nanmax(allv)
        vals = [
            (
                _values(result, key, normalizer=n, L=L, swap="all")
                if result.select(swap="all")
                else _values(result, key, normalizer=n, L=L)
            )
            for n in names
        ]
        ax.barh(range(len(names)), [v[0] if len(v) else np.nan for v in vals], color=colors)
        ax.set_xlim(lo, hi * 1.05 if hi > 0 else 1)
        ax.set_title(LABELS.get(key, key), fontsize=9)
    for i, ax in enumerate(axes):
        ax.set_yticks(range(len(names)), names if i % 2 == 0 else [""] * len(names))
        ax.invert_yaxis()
    fig.suptitle(f"{literal(result.provenance.get('model'))}, L = {L}", fontsize=9)
    return fig


def length_figure(
    result: Result, keys: Optional[Sequence[str]] = None, log_keys: Sequence[str] = ("max_weight", "jac_norm_mean"),
    layer_kind: Optional[str] = None,
):
    """Each key against L, one line per normalizer (swap = "all" rows; of one layer kind: `one_kind`)."""
    result = one_kind(result, layer_kind)
    keys = list(keys or ("max_weight", "entropy_norm", "jac_norm_mean", cost_key(result)))
    fig, axes = figure_grid(len(keys), 3.4, 3.0)
    for ax, key in zip(axes, keys):
        for i, n in enumerate(result.unique("normalizer")):
            rows = result.select(normalizer=n, swap="all")
            ax.plot(
                [r["L"] for r in rows],
                [np.nan if r.get(key) is None else r[key] for r in rows],
                ms=4,
                **series_style(i),        # colour-blind-safe colour, with its own dash and marker
                label=n,
            )
        ax.set_xscale("log", base=2)
        if key in log_keys:
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

            ax.set_yscale("log")                # 1-2-5 ticks, labelled: a range within one decade keeps numbers
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("L")
        ax.set_title(LABELS.get(key, key), fontsize=9)
    # one legend below the panels, covering none of them (a phone's version stacks it in one column)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=min(3, len(axes[0].lines)))
    return fig


def layer_figure(result: Result, key: Optional[str] = None):
    """Heat map swapped layer x normalizer of `key` (default: the cost) for a swap="each" Result."""

    key = key or cost_key(result)
    names = result.unique("normalizer")
    layers = sorted({r["swap"] for r in result.rows if r["swap"] != "all"})
    L = max(result.unique("L"))
    grid = np.array([[_values(result, key, normalizer=n, swap=l, L=L)[0] for n in names] for l in layers])
    fig, (ax,) = figure_grid(1, min(1.0 * len(names) + 2.4, 6.8), 0.35 * len(layers) + 1.6)
    im = ax.imshow(grid, aspect="auto", cmap="magma")
    fig.colorbar(im, ax=ax, label=LABELS.get(key, key))
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_yticks(range(len(layers)), layers)
    ax.set_ylabel("swapped layer")
    ax.set_title(f"{result.provenance.get('model')}, L = {L}: one layer swapped at a time", fontsize=9)
    return fig
