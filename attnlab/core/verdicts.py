"""The shape of a claim row, shared by both papers' claim checkers: id, reading, claim, paper, measured, verdict.
`reading` names the reading of an open formula the row was measured under (e.g. "E2 / b / v_unit": the
registries of `attnlab.normalization.readings`); "" for the book's default readings."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

VERDICTS = ("holds", "does not hold", "not applicable")


def claim_row(cid: str, claim: str, paper: str, measured: str, verdict: str, reading: str = "",
              value: Optional[float] = None, unit: str = "") -> dict:
    """One row of the claim table; `verdict` must be one of VERDICTS; `reading` "" = the default readings.
    `value`: the one number the verdict turns on (what `unit` names, e.g. "largest N*/L"), so that rows from
    several text windows can be summarised (median, range); None where a row has no such number."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    return {"id": cid, "reading": reading, "claim": claim, "paper": paper, "measured": measured, "verdict": verdict,
            "value": None if value is None else float(value), "unit": unit}



def with_model(rows: list[dict], *results) -> list[dict]:
    """`rows` (claim rows) with `model`: the model the Results they were read from were computed with, from each
    Result's provenance (its `model`); None for Results of synthetic tokens (no model) or no Result at all (None
    entries). Results of different models in one call are a bug: a ValueError."""
    models = {r.provenance.get("model") for r in results if r is not None}
    if len(models) > 1:
        raise ValueError(f"claim rows read from Results of several models: {sorted(map(str, models))}")
    model = models.pop() if models else None
    return [dict(r, model=model) for r in rows]

#: the tolerance of every inequality a claim tests (`holds_le`). The captured tensors (attention weights, scores, q, k,
#: x) are float32: each carries a relative rounding of a few units of 2^-23 ~ 1.2e-7, and the weights of a row sum to 1
#: only within about that (3e-8 measured on a SmolLM2 row), which abar and 1 - abar inherit. A quantity formed from
#: terms of total magnitude S therefore carries an error of a few 1e-7 * S; the float64 arithmetic after it adds
#: ~1e-16 * S, except distances formed from squared norms (||u||^2 - 2 u.w + ||w||^2), which near zero keep only
#: sqrt(2^-52) ~ 1.5e-8 * S. 1e-6 (8 float32 units) covers both with headroom (the worst Theorem 1 row of SmolLM2's
#: WikiText-2 window #4 is 5e-8 * S past its bound) and is far below any real violation a claim reports.
RTOL = 1e-6


def holds_le(lhs, rhs, scale=0.0):
    """Whether lhs <= rhs up to float32 rounding: lhs <= rhs + RTOL * max(|lhs|, |rhs|, |scale|), elementwise.

    The relative part (RTOL * max(|lhs|, |rhs|)) makes a bound met with equality hold; the absolute part
    (RTOL * |scale|, in the quantities' unit) covers sides that are near zero by cancellation: `scale` is the
    magnitude of the terms both sides are computed from (e.g. Theorem 1 [B]'s bound R (2 abar - 1) at N = 1 is ~1e-4
    from terms of size R ~ 1). Tensors (-> bool tensor, broadcast), numpy arrays (-> bool array) or numbers
    (-> bool). NaN on either side: False; an infinite side gets no tolerance (inf <= finite is False)."""
    if any(isinstance(v, torch.Tensor) for v in (lhs, rhs, scale)):
        lhs, rhs, scale = (torch.as_tensor(v).double() for v in (lhs, rhs, scale))
        mag = torch.maximum(torch.maximum(lhs.abs(), rhs.abs()), scale.abs())
        return lhs <= rhs + torch.where(torch.isfinite(mag), RTOL * mag, torch.zeros_like(mag))
    lhs, rhs, scale = (np.asarray(v, dtype=float) for v in (lhs, rhs, scale))
    mag = np.maximum(np.maximum(np.abs(lhs), np.abs(rhs)), np.abs(scale))
    with np.errstate(invalid="ignore"):
        out = lhs <= rhs + np.where(np.isfinite(mag), RTOL * mag, 0.0)
    return bool(out) if out.ndim == 0 else out


def within(x, lo, hi, scale=0.0):
    """Whether lo <= x <= hi up to float32 rounding (`holds_le` on both sides)."""
    return holds_le(lo, x, scale) & holds_le(x, hi, scale)


def verdict(ok: bool) -> str:
    return "holds" if ok else "does not hold"


def percent(frac: float) -> str:
    """A share as a percentage with no false precision: "100%" only when exact, "> 99.99%" when it
    would round to 100, else two decimals ("99.87%")."""
    if frac != frac:
        return "n/a"
    if frac == 1.0:
        return "100%"
    if frac == 0.0:
        return "0%"
    if frac > 0.9999:
        return "> 99.99%"
    if frac < 1e-4:
        return "< 0.01%"
    return f"{frac:.2%}"
