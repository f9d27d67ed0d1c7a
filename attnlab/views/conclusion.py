"""The closing chapter's advice on designing attention, each number and direction read from the claim rows and the
cached Results (chapters 3 and 5 show them in full). Views only."""
from __future__ import annotations

from typing import Sequence

from attnlab.book import markup, running
from attnlab.normalization.paper import CRITICAL_FRAC, ONE_OVER_T_BELOW


def temperature_item(model_name: str, slope_row: dict, T0: float, attained: float, gap_min: float) -> str:
    """HTML <li>: what lowering T costs, from the default p1-fig4-slope claim row (its `value`: the log-log slope of
    Fig. 4's statistic below T = 0.1) and the worst row's exact Jacobian norm at the smallest T (`attained`, a
    share of 1/(2T)) with the smallest top-2 gap of any row (`claims._fig4_numbers`)."""
    slope = slope_row.get("value", float("nan"))
    trend = (f"grows as T falls, like T^{slope:.2f}" if slope < 0 else f"does not grow as T falls (slope {slope:+.2f})")
    follows = "as the paper's 1/T" if slope_row.get("verdict") == "holds" else "where 1/T would be T^-1"
    return ("<li><b>Sharpening by temperature has a price, at near-ties.</b> Lowering T concentrates attention and "
            "raises the bound on the norm of the softmax Jacobian, 1/(2T) (a theorem, chapter 5); a row reaches that "
            "bound only when its two largest logits are nearly tied. On "
            f"{model_name}, at T = {T0:g} the worst row's norm is {attained:.3f} × 1/(2T) (the smallest top-2 gap of "
            f"any row is {gap_min:.2g}), while the paper's statistic, the largest token mean over heads, {trend} below "
            f"T = {ONE_OVER_T_BELOW:g} ({follows}; chapter 5). Sparse normalizers reach exact zeros, but they do not "
            "escape the bound: sparsemax's "
            "Jacobian has norm exactly 1/T on its support (chapter 5), and chapter 7 measures the norm of each "
            "normalizer on this page's model side by side.</li>")


def retrieval_item(crit: dict) -> str:
    """HTML <li>: the paper's 'modest number of selected tokens' against the critical N measured on each model
    ({model: (lowest, highest critical N / L, longest L, causal, heads)}, `claims.critical_per_model`); the advice
    that rests on the 6% figure is given as the paper's unless some model reproduces it."""
    per = "; ".join(f"{lo:.2f}–{hi:.2f} L on {m} (L ≤ {L})" for m, (lo, hi, L, *_rest) in crit.items())
    met = [m for m, (lo, hi, *_rest) in crit.items() if hi <= CRITICAL_FRAC]
    head = ("<li><b>Selecting many tokens at once is limited, by the paper's argument.</b> The paper reads the "
            "distance and the separability results as one statement from two sides: beyond a modest number of "
            f"selected tokens ({CRITICAL_FRAC:.0%} of the context, on GPT-2), a head's selection stops being "
            "distinguishable from a random one. ")
    if not crit:
        return head + "No critical N was measured on this build.</li>"
    if met:
        return (head + f"Here the critical N is {per}: {', '.join(met)} reproduce{'s' if len(met) == 1 else ''} the "
                f"{CRITICAL_FRAC:.0%} figure (chapter 3). The advice that follows from the argument is to spread "
                "retrieval over heads and layers rather than expect one head to pick out many tokens.</li>")
    return (head + f"Here the critical N is {per} (chapter 3, window by window), so no model of this book reproduces "
            f"the {CRITICAL_FRAC:.0%} figure: it is the paper's number, not a measurement here. The paper's advice "
            "that rests on it, to spread retrieval over heads and layers rather than expect one head to pick out many "
            "tokens, is therefore the paper's too; these measurements neither support nor refute it (chapter 3 "
            "shows why the critical N comes out so large here).</li>")


def design_prose(inp, rows: Sequence[dict]):
    """HTML list: `temperature_item` and `retrieval_item` on the build's model, from its claim rows, the cached
    gradient_readings Result and every offline model's critical N."""
    import numpy as np

    from attnlab.normalization.readings import lemma2
    from attnlab.views import claims as claim_views

    grad = running.figure_results(["gradient_readings"], inp)["gradient_readings"]
    worst = lemma2.g_table(grad)[("worst", 0.0)]               # the worst row (chapter 5), the first direction
    i0 = int(np.argmin(worst["T"]))
    T0, attained = worst["T"][i0], 2 * worst["T"][i0] * np.nanmax(worst["g_max_row"][i0])   # share of 1/(2T)
    gap_min = np.nanmin([r["gap_min"] for r in grad.rows if r.get("gap_min") is not None])
    slope = next((r for r in rows if r["id"] == "p1-fig4-slope" and not r.get("reading")), {})
    return markup.prose("<ul>" + temperature_item(inp.model.name, slope, T0, attained, gap_min)
                      + retrieval_item(claim_views.critical_per_model(inp)) + "</ul>")
