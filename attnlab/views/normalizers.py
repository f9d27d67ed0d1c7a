"""Views for chapter 7 (Beyond softmax): the table of every normalizer at the longest L from a
`tools.compare.compare_normalizers` Result. Views only."""
from __future__ import annotations

from attnlab.book import markup
from attnlab.tools import report

KEYS = ("max_weight", "entropy_norm", "weight_sum", "ns_frac", "critical_n_frac", "jac_norm_mean")


def cell(r: dict, key: str, cost: str) -> str:
    """One value: '> 0.95' for a censored critical N, '0 (the model itself)' for softmax's own cost, else 3 digits."""
    if key == "critical_n_frac" and r["critical_n_censored"]:
        return f"> {r['critical_n_max'] / r['L']:.2f}"
    v = r.get(key)
    if v is None:
        return ""
    if key == cost and abs(v) < 1e-6:
        return "0 (the model itself)" if r["normalizer"] == "softmax(T=1.0)" else "< 1e-6"
    return f"{v:.3g}"


def name(r: dict) -> str:
    """The normalizer, and where the comparison's rows come per layer kind, which kind: 'sparsemax, sliding 512'."""
    if r.get("layer_kind") in (None, ""):
        return r["normalizer"]
    w = r.get("sliding_window")
    return f"{r['normalizer']}, {r['layer_kind']}" + ("" if w in (None, "") else f" {w}")


def comparison_table(res):
    """HTML table: each normalizer at the longest L, its weights' statistics, Jacobian norm and cost (one row per
    layer kind where the comparison has them)."""
    cost = report.cost_key(res)
    keys = [*KEYS, cost]
    longest = res.select(L=max(res.unique("L")))
    return markup.table(["normalizer"] + [report.LABELS[k] for k in keys],
                      [[name(r)] + [cell(r, k, cost) for k in keys] for r in longest])
