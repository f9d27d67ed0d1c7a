"""Views for chapter 7 (Beyond softmax): its Results by name on the chapter's model and text (`comparison`,
`each_layer`, `peers`, `bench`: the one place of each key, which `attnlab.results.book_plan` fills too) and the table
of every normalizer at the longest L from a `tools.compare.compare_normalizers` Result. Views only."""
from __future__ import annotations

from attnlab.book import markup, running
from attnlab.core.result import Result
from attnlab.tools import compare, report

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


# ------------------------------------------------------------------ the chapter's Results (book.result, by name)

def _key(inp, **key) -> dict:
    """`key` on the model's device; `running.result` adds the model, its weights and the text."""
    return {"device": str(inp.model.device), **key}


def comparison(inp) -> Result:
    """Every normalizer swapped into every layer at the default lengths (`compare.compare_normalizers`)."""
    return running.result("compare_normalizers", _key(inp, params="default"), model=inp.model, corpus=inp.corpus)


def layer_length(res: Result) -> int:
    """The L of the one-layer-at-a-time swap: the middle of `comparison`'s lengths."""
    Ls = res.unique("L")
    return sorted(Ls)[len(Ls) // 2]


def each_specs(res: Result) -> list:
    """The normalizers swapped one layer at a time: the default ones but softmax itself (SSMax's reference length
    the shortest of `comparison`'s lengths)."""
    return [s for s in compare.default_specs(min(res.unique("L"))) if s.label != "softmax(T=1.0)"]


def each_layer(inp, res: Result) -> Result:
    """`each_specs` swapped into one layer at a time at `layer_length` ("compare_normalizers_each")."""
    key = _key(inp, L=layer_length(res), specs=[s.label for s in each_specs(res)],
               ssmax_ref_length=min(res.unique("L")))
    return running.result("compare_normalizers_each", key, model=inp.model, corpus=inp.corpus)


def peers(inp, res: Result) -> Result:
    """Softpick and sigmoid swapped into every layer at `comparison`'s lengths."""
    key = _key(inp, params="peers", lengths=res.unique("L"))
    return running.result("compare_normalizers", key, model=inp.model, corpus=inp.corpus)


def bench(inp) -> Result:
    """The exact sparse normalizers against sorting ("bench_normalizers", 3 repeats) at L = 128 and 512 (the
    model's positions where fewer)."""
    key = _key(inp, lengths=[128, min(inp.model.max_positions, 512)])
    return running.result("bench_normalizers", key, model=inp.model, corpus=inp.corpus)
