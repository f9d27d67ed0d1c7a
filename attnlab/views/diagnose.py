"""Views for chapter 8 (Diagnose your own model): the before/after-calibration table, the critical-N table and
the temperature-path figure, from a `tools.diagnose` Result (or arrays computed from a Trace). Views only."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from attnlab.book import markup
from attnlab.core.util import figure_grid
from attnlab.tools import diagnose, report


def _count(rows: Sequence[dict], key: str) -> int:
    return sum(bool(r.get(key)) for r in rows)


def calibration_table(res, Ls: Sequence[int]):
    """HTML table per L: heads and layers flagged by the paper's fixed cuts (N_s/N < 0.7 or H >= 0.9 log L;
    critical N > 0.06 L) against the calibrated flags of the report."""
    rows = []
    for L in Ls:
        heads, layers = res.select(kind="head", L=L), res.select(kind="layer", L=L)
        before = sum(bool(r["paper_ns_below_band"] or r["flag_near_uniform"]) for r in heads)
        rows.append([L, f"{before} of {len(heads)}", f"{_count(layers, 'paper_critical_above')} of {len(layers)}",
                     _count(heads, "flag_near_uniform"), _count(heads, "flag_low_separability"),
                     f"{_count(heads, 'flagged')} of {len(heads)}",
                     f"{_count(layers, 'flag_critical_n')} of {len(layers)}"])
    return markup.table(["L", "fixed cuts: heads", "fixed cuts: layers", "near uniform", "low separability",
                       "calibrated: heads", "calibrated: layers"], rows)


def critical_text(r: dict, key: str = "critical_n") -> str:
    """'412 (40.2%)', '> 1023 (> 100%)' (no N rejected) or 'too few heads' for one row of the Result."""
    if r.get(f"{key}_testable") is False:
        return "too few heads"
    if r[f"{key}_censored"]:               # a share of the longest row: L, or min(L, w) in a sliding layer
        return f"> {r['critical_n_max']} (> {r['critical_n_max'] / (r.get('longest_row') or r['L']):.0%})"
    return f"{int(r[key])} ({r[f'{key}_frac']:.1%})"


def _per_layer(res, L: int) -> str:
    """The layers' critical N at one length: one entry when every layer has the same value."""
    vals = {r["layer"]: critical_text(r) for r in res.select(kind="layer", L=L)}
    refs = ", ".join(critical_text(r, "critical_n_uniform").split(" ")[0] for r in res.select(kind="layer", L=L))
    if len(set(vals.values())) == 1:
        return f"every layer ({len(vals)}): {next(iter(vals.values()))}; uniform: {refs}"
    return "; ".join(f"layer {layer}: {v}" for layer, v in vals.items()) + f"; uniform: {refs}"


def critical_table(res, Ls: Sequence[int]):
    """HTML table per L: the critical N of the whole model (of each layer kind, where the rows come per kind) and of
    each layer, with the uniform reference."""
    def whole(r):
        flag = " (flagged)" if r["flag_critical_n"] else ""
        return f"{critical_text(r)}; uniform: {critical_text(r, 'critical_n_uniform')}" + flag
    def pooled(L):                        # one KS test per layer kind where the rows come per kind
        rows = res.select(kind="model", L=L)
        return whole(rows[0]) if len(rows) == 1 else "; ".join(f"{report.all_label(r)}: {whole(r)}" for r in rows)
    return markup.table(["L", "whole model", "per layer"], [[L, pooled(L), _per_layer(res, L)] for L in Ls])


def temperature_path_figure(path: dict, Ts: Sequence[float], uniform_ref: np.ndarray, model_name: str, L: int):
    """Figure: per statistic of `path` ({name: one array [layer, head] per T}), the heads' median and 25-75% band
    against T, with the uniform reference and the one-hot value 1/N of N_s/N."""
    fig, axes = figure_grid(2, 3.4, 3.0)
    for ax, (name, vals) in zip(axes, path.items()):
        v = np.array([x.ravel() for x in vals])              # [T, heads]
        q25, med, q75 = np.nanpercentile(v, [25, 50, 75], axis=1)
        ax.fill_between(Ts, q25, q75, color="C0", alpha=0.25, lw=0, label="heads: 25-75%")
        ax.plot(Ts, med, "o-", color="C0", ms=3, label="heads: median")
        ax.axvline(1, color="0.5", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("temperature T (the model's: 1)")
        ax.set_title(name)
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].axhline(np.median(uniform_ref), color="C3", ls="--", lw=1, label="uniform reference (median)")
    axes[1].axhline(1 / diagnose.N_SEP, color="0.3", ls="-.", lw=1, label=f"one-hot: 1/N = 1/{diagnose.N_SEP}")
    axes[1].set_ylim(0, 1)
    fig.legend(*axes[1].get_legend_handles_labels(), loc="outside lower center", ncol=2, frameon=False)
    fig.suptitle(f"{model_name}, L = {L}: each head's rows at temperature T", fontsize=10)
    return fig
