"""What each of the first paper's figures shows, in one or two sentences with its measured numbers: the
alt text and caption of the chapters' static figures (a screen reader hears what a sighted reader sees).
Numbers are aggregated as the plots aggregate them (`normalization.plots.aggregate_curve`: mean over heads per window,
then over windows)."""
from __future__ import annotations

import math

import numpy as np

from attnlab.core.models import weights_label
from attnlab.core.result import Result
from attnlab.core.text import text_title
from attnlab.normalization.claim_kinds import threshold
from attnlab.normalization.paper import SEPARABILITY_BAND
from attnlab.normalization.plots import aggregate_curve


def _who(result: Result) -> str:
    p = result.provenance
    return f"{p.get('model', '?')}{weights_label(p.get('model_info'))} on {text_title(p.get('text') or 'a text')}"


def _ends(result: Result, key: str, by: str, **where) -> tuple[float, float, float, float]:
    """(first x, last x, value at the first, value at the last) of the plotted curve of `key` against `by`."""
    x, c, _, _ = aggregate_curve(result, key, by, **where)
    return float(x[0]), float(x[-1]), float(c[0]), float(c[-1])


def fig1(result: Result) -> str:
    L0, L1, m0, m1 = _ends(result, "max_weight", "L")
    _, _, e0, e1 = _ends(result, "entropy", "L")
    inside = 100 * float(np.mean(result.column("cor1_holds")))
    return (f"Fig. 1 ({_who(result)}): from L = {L0:.0f} to {L1:.0f} tokens the largest weight of a row, mean over "
            f"heads, goes from {m0:.2f} to {m1:.2f} while the uniform weight 1/L falls from {1 / L0:.3f} to "
            f"{1 / L1:.4f}; the entropy goes from {e0:.1f} to {e1:.1f} nats, below log L ({math.log(L0):.1f} to "
            f"{math.log(L1):.1f}); {inside:.0f}% of the rows lie inside Corollary 1's band.")


def fig2a(result: Result) -> str:
    L0, L1, d0, d1 = _ends(result, "dtilde_b", "L")
    _, _, E0, E1 = _ends(result, "E", "L")
    _, _, b0, b1 = _ends(result, "dmax_B", "L")
    N = result.rows[0]["N"]
    return (f"Fig. 2a ({_who(result)}), N = {N}, L from {L0:.0f} to {L1:.0f} on log axes: the true distance d~ "
            f"(reading b, mean over heads) grows from {d0:.3g} to {d1:.3g} (x{d1 / d0:.1f}), the expectation E for a "
            f"random top-N set from {E0:.3g} to {E1:.3g}, and the upper bound d_max [B] from {b0:.3g} to {b1:.3g}.")


def fig2b(result: Result) -> str:
    N0, N1, d0, d1 = _ends(result, "dtilde_b", "N")
    _, _, E0, E1 = _ends(result, "E", "N")
    L = result.rows[0]["L"]
    return (f"Fig. 2b ({_who(result)}), L = {L}, top-N from {N0:.0f} to {N1:.0f}: the true distance d~ (reading b, "
            f"mean over heads) goes from {d0:.3g} to {d1:.3g} and the expectation E from {E0:.3g} to {E1:.3g}.")


def fig2c(result: Result) -> str:
    per: dict = {}
    for r in result.rows:
        per.setdefault(r["L"], {})[r.get("window", 0)] = r["critical_n"]
    parts = []
    for L in sorted(per):
        found = [c for c in per[L].values() if c > 0]
        parts.append(f"{np.mean(found):.0f} at L = {L} ({np.mean(found) / L:.0%})" if found else f"none at L = {L}")
    return (f"Fig. 2c ({_who(result)}): the critical N, the smallest N where the KS test no longer tells the "
            f"heads' top-N distances from those of random sets, is " + ", ".join(parts) + "; the dashed line is the "
            f"paper's {threshold('CRITICAL_FRAC'):.0%} of L.")


def fig3(result: Result) -> str:
    N0, N1, s0, s1 = _ends(result, "ns_frac", "N")
    L = result.rows[0]["L"]
    share = 100 * float(np.nanmean([r["lower_holds"] for r in result.rows]))
    return (f"Fig. 3 ({_who(result)}), L = {L}: box plots over heads of the separable share N_s/N against N; its "
            f"mean over heads goes from {s0:.2f} at N = {N0:.0f} to {s1:.2f} at N = {N1:.0f}, against the paper's "
            f"band of {SEPARABILITY_BAND[0]:.2f}-{SEPARABILITY_BAND[1]:.2f} (shaded); Theorem 2's lower bound holds in "
            f"{share:.0f}% of the rows.")


def fig4(result: Result) -> str:
    e = sorted(result.unique("eps"))[0]
    T0, T1, g0, g1 = _ends(result, "g_max", "T", eps=e)
    slope = math.log(g0 / g1) / math.log(T0 / T1) if g0 > 0 and g1 > 0 else float("nan")
    return (f"Fig. 4 ({_who(result)}), log-log: the largest gradient sensitivity g over heads (eps = {e:g}) goes "
            f"from {g0:.3g} at T = {T0:g} to {g1:.3g} at T = {T1:g} (slope {slope:.2f} end to end), under the exact "
            f"bound 1/(2T) ({1 / (2 * T0):.3g} to {1 / (2 * T1):.3g}) and beside the paper's min(1/(4T), sqrt 2).")


DESCRIBE = {"fig1": fig1, "fig2a": fig2a, "fig2b": fig2b, "fig2c": fig2c, "fig3": fig3, "fig4": fig4}


def describe(fig_id: str, result: Result) -> str:
    """What the plot of figure `fig_id` shows, with its numbers (the alt text of the chapters' static figures)."""
    if fig_id not in DESCRIBE:
        raise ValueError(f"no description for figure {fig_id!r}; known: {', '.join(DESCRIBE)}")
    return DESCRIBE[fig_id](result)
