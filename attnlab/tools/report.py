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
from attnlab.core.util import figure_grid
from attnlab.tools.diagnose import HEAT_METRICS, REPORT_NAME

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


def summary(result: Result) -> str:
    """A few lines for the terminal: model, text, how many heads are flagged and for what."""
    p = result.provenance
    L = flag_length(result)
    heads = result.select(kind="head", L=L)
    low = [r for r in heads if _truthy(r.get("flag_low_separability"))]
    uni = [r for r in heads if _truthy(r.get("flag_near_uniform"))]
    any_ = [r for r in heads if _truthy(r.get("flagged"))]
    thr = p.get("thresholds", {})
    model_row = (result.select(kind="model", L=L) or [{}])[0]
    layers = [r for r in result.select(kind="layer", L=L) if _truthy(r.get("flag_critical_n"))]
    testable = any(r.get("critical_n_testable") in (True, 1, "True") for r in result.select(kind="layer", L=L))

    def crit(r):
        if r.get("critical_n_testable") in (False, "False"):
            return "not testable (too few heads)"
        if _truthy(r.get("critical_n_censored")):
            return f"> {r.get('critical_n_max')} (no N up to {100 * r['critical_n_max'] / L:.0f}% of L passed)"
        return f"{int(r['critical_n'])} ({100 * r['critical_n_frac']:.1f}% of L)"

    def names(rs):
        s = ", ".join(f"{r['layer']}.{r['head']}" for r in rs[:12])
        return s + (", ..." if len(rs) > 12 else "")

    lines = [
        f"attnlab diagnose: {p.get('model')} ({p.get('n_layers')} layers x {p.get('n_heads')} heads, "
        f"{'causal' if p.get('causal') else 'bidirectional'}) on {p.get('text')} "
        f"(sha256 {str(p.get('text_sha256'))[:12]}...), L = {p.get('lengths')}",
        f"at L={L}: {len(any_)} of {len(heads)} heads flagged",
        f"  N_s/N < {thr.get('ns_frac')} (N={p.get('n_sep')}): {len(low)} heads" + (f" [{names(low)}]" if low else ""),
        f"  entropy >= {thr.get('entropy_norm')} log L: {len(uni)} heads" + (f" [{names(uni)}]" if uni else ""),
        f"  critical N / L > {thr.get('critical_frac')}: "
        f"model-level critical N {crit(model_row) if model_row else '?'}; "
        + (
            f"{len(layers)} of {len(result.select(kind='layer', L=L))} layers flagged"
            if testable
            else "per-layer test impossible (too few heads per layer for the KS test at this alpha)"
        ),
    ]
    return "\n".join(lines)


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
    fig.suptitle(f"{result.provenance.get('model')}, L = {L}\n(red x: N_s/N below threshold; white o: entropy near "
                 "log L)", fontsize=10)
    return fig


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
        return ""
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
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f3f3f3}tr.flag td{background:#fff0f0}.prov td{text-align:left}
img{max-width:100%}code{background:#f3f3f3;padding:0 3px}pre{background:#f7f7f7;padding:0.8em}"""


def report_html(result: Result) -> str:
    """A self-contained HTML page (no external files: PNGs as base64 data URIs) from a diagnose Result."""
    p = result.provenance
    L = flag_length(result)
    prov_keys = [
        "model",
        "model_source",
        "model_class",
        "model_weights_sha256",
        "causal",
        "n_layers",
        "n_heads",
        "d_head",
        "max_positions",
        "device",
        "text",
        "text_source",
        "text_sha256",
        "text_chars",
        "lengths",
        "window",
        "n_top",
        "n_sep",
        "max_rows",
        "alpha",
        "thresholds",
        "x",
        "keys",
        "entropy",
        "jacobian",
        "critical_n",
        "flags",
        "attnlab",
        "torch",
        "transformers",
        "created_utc",
        "runtime_seconds",
    ]
    prov_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(p.get(k)))}</td></tr>" for k in prov_keys if k in p
    )
    heads = result.select(kind="head", L=L)
    flagged = [r for r in heads if _truthy(r.get("flagged"))]
    crit_rows = sorted(
        ({"layer": "all", **r} for r in result.select(kind="model") + result.select(kind="layer")),
        key=lambda r: (r["L"], -1 if r["layer"] == "all" else r["layer"]),
    )
    head_cols = [
        "layer",
        "head",
        "entropy",
        "entropy_norm",
        "max_weight",
        "ns_frac",
        "dtilde",
        "jac_norm",
        "flag_low_separability",
        "flag_near_uniform",
        "flag_critical_n",
    ]
    crit_cols = [
        "L",
        "layer",
        "critical_n",
        "critical_n_frac",
        "critical_n_censored",
        "critical_n_pvalue",
        "critical_n_max",
        "n_pooled_heads",
        "flag_critical_n",
    ]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>attnlab diagnose: {html.escape(str(p.get('model')))}</title><style>{_CSS}</style></head><body>",
        f"<h1>Attention diagnostics: {html.escape(str(p.get('model')))}</h1>",
        f"<table class='prov'>{prov_rows}</table>",
        f"<h2>Summary</h2><pre>{html.escape(summary(result))}</pre>",
        "<p>Guidelines from Mudarisov et al., <i>Limitations of Normalization in Attention Mechanism</i> "
        "(arXiv 2508.17821): separability N<sub>s</sub>/N saturates at 0.70&ndash;0.85; fewer than ~6% of the "
        "tokens can be selected before the distances look as if the weights were uniform (critical N); "
        "monitor entropy. Flags are heuristics for where a head has lost selectivity, not proofs.</p>",
        f"<h2>Heads at L = {L}</h2><img alt='heat maps' src='{_png_data_uri(heatmap_figure(result, L))}'>",
        f"<h2>Against L</h2><img alt='curves' src='{_png_data_uri(curves_figure(result))}'>",
        "<h2>Critical N (KS test pooling heads)</h2>",
        _table(crit_rows, crit_cols),
        f"<h2>Flagged heads at L = {L} ({len(flagged)})</h2>",
        _table(flagged, head_cols) if flagged else "<p>none</p>",
        f"<h2>All heads at L = {L}</h2>",
        _table(heads, head_cols),
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


def comparison_figure(result: Result, L: int, keys: Optional[Sequence[str]] = None):
    """Bars per normalizer at length L for `keys` (default: max weight, entropy / log L, N_s/N, cost);
    axis limits are shared by every L, so frames of a slider over L compare."""
    keys = list(keys or ("max_weight", "entropy_norm", "ns_frac", cost_key(result)))
    names = result.unique("normalizer")
    fig, axes = figure_grid(len(keys), 3.4, 0.32 * len(names) + 1.0)
    colors = [f"C{i}" for i in range(len(names))]
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
    fig.suptitle(f"{result.provenance.get('model')}, L = {L}", fontsize=9)
    return fig


def length_figure(
    result: Result, keys: Optional[Sequence[str]] = None, log_keys: Sequence[str] = ("max_weight", "jac_norm_mean")
):
    """Each key against L, one line per normalizer (swap = "all" rows)."""
    keys = list(keys or ("max_weight", "entropy_norm", "jac_norm_mean", cost_key(result)))
    fig, axes = figure_grid(len(keys), 3.4, 3.0)
    for ax, key in zip(axes, keys):
        for i, n in enumerate(result.unique("normalizer")):
            rows = result.select(normalizer=n, swap="all")
            ax.plot(
                [r["L"] for r in rows],
                [np.nan if r.get(key) is None else r[key] for r in rows],
                marker="o",
                ms=3,
                color=f"C{i}",
                label=n,
            )
        ax.set_xscale("log", base=2)
        if key in log_keys:
            from matplotlib.ticker import NullFormatter

            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("L")
        ax.set_title(LABELS.get(key, key), fontsize=9)
    axes[-1].legend(loc="best")
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
