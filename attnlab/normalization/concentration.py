"""Fig. 3's N_s/N against how concentrated each head is (the largest weight of its rows, Fig. 1), read from the fig1
and fig3 Results of one model and text (no model pass): the joined rows, the Result the book caches as
`head_separability`, and the words of the relation (Spearman's rho over heads). `attnlab.normalization.experiments`
re-exports these names."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from attnlab.core.result import Result, provenance
from attnlab.normalization.paper import SATURATION_N


def relation_ns(ns: Sequence[int]) -> list[int]:
    """The N of Fig. 3's grid `ns` where its saturation is judged (N >= SATURATION_N); the largest N when the grid
    stops below (quick grids)."""
    ns = sorted(int(n) for n in ns)
    if not ns:
        raise ValueError("Fig. 3's Result has no N")
    return [n for n in ns if n >= SATURATION_N] or ns[-1:]


def concentration_rows(fig1: Result, fig3: Result) -> list[dict]:
    """Per (window, N, layer, head) with N in `relation_ns`: the head's mean largest weight `max_weight` (fig1 at
    fig3's L: the row mean of max_i a_i over the head's rows) beside its N_s/N `ns_frac` (fig3: token mean, the
    default reading). Heads missing from either Result, or with a NaN, are left out. ValueError when fig1 has no
    row at fig3's L."""
    L = int(fig3.rows[0]["L"])
    mw = {(r.get("window", 0), r["layer"], r["head"]): r["max_weight"] for r in fig1.select(L=L)}
    if not mw:
        raise ValueError(f"fig1 has no row at Fig. 3's L = {L} (its lengths: {sorted(fig1.unique('L'))})")
    rows = []
    for N in relation_ns(fig3.unique("N")):
        for r in fig3.select(N=N):
            k = (r.get("window", 0), r["layer"], r["head"])
            if k in mw and math.isfinite(mw[k]) and math.isfinite(r["ns_frac"]):
                rows.append({"window": k[0], "L": L, "N": int(N), "layer": int(r["layer"]), "head": int(r["head"]),
                             "max_weight": float(mw[k]), "ns_frac": float(r["ns_frac"])})
    return rows


def separability_by_concentration(fig1: Result, fig3: Result) -> Result:
    """Theorem 2's N_s/N against how concentrated each head is (`concentration_rows`), read from the fig1 and fig3
    Results of one model and text (no model pass: milliseconds); provenance says from which."""
    p3 = fig3.provenance
    prov = provenance(figure="head_separability", model=p3.get("model"), causal=p3.get("causal"),
                      model_info=p3.get("model_info"), text=p3.get("text"), text_sha256=p3.get("text_sha256"),
                      window_offsets=p3.get("window_offsets"), window_tokens=p3.get("window_tokens"),
                      token_ids_sha256=p3.get("token_ids_sha256"), x=p3.get("x"), keys=p3.get("keys"),
                      reading="N_s/N: fig3's default (x = value vectors on the unit sphere, strict radius, rows with "
                              "r > 0 and L_t > N, token mean per head); max_weight: fig1's row mean of the largest "
                              "visible weight over every row of the head at the same L",
                      ns=relation_ns(fig3.unique("N")), L=int(fig3.rows[0]["L"]))
    return Result(name="head_separability", rows=concentration_rows(fig1, fig3), provenance=prov)


#: |Spearman rho| below this: sentences say N_s/N hardly depends on the concentration (no direction is read from it)
FLAT_RHO = 0.1


def concentration_direction(rho: float, up: str, down: str, flat: str) -> str:
    """The words of a relation of sign `rho`: `up` (rho >= FLAT_RHO), `down` (rho <= -FLAT_RHO), else `flat`."""
    return up if rho >= FLAT_RHO else down if rho <= -FLAT_RHO else flat


def concentration_relation(max_weight, ns_frac, tenth: float = 0.1) -> dict:
    """How N_s/N goes with concentration over heads (arrays [heads]): Spearman's rho (`scipy.stats.spearmanr`) and
    its p-value, the number of heads, the median N_s/N of the most and of the least concentrated `tenth` of the
    heads (by max_weight; at least one head each) and both medians over all heads. NaN pairs are left out."""
    from scipy.stats import spearmanr

    x, y = np.asarray(max_weight, dtype=float), np.asarray(ns_frac, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"max_weight and ns_frac must be 1-D of one length, got {x.shape} and {y.shape}")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        raise ValueError(f"need at least 3 heads with both numbers, got {len(x)}")
    res = spearmanr(x, y)
    order = np.argsort(x, kind="stable")
    k = max(1, int(round(tenth * len(x))))
    return {"rho": float(res.statistic), "p": float(res.pvalue), "n_heads": int(len(x)), "k": k,
            "ns_concentrated": float(np.median(y[order[-k:]])), "ns_diffuse": float(np.median(y[order[:k]])),
            "median_max_weight": float(np.median(x)), "median_ns_frac": float(np.median(y))}
