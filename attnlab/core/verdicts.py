"""The shape of a claim row, shared by both papers' claim checkers: id, reading, claim, paper, measured, verdict.
`reading` names the reading of an open formula the row was measured under (e.g. "E2 / b / v_unit": the
registries of `attnlab.normalization.readings`); "" for the book's default readings."""
from __future__ import annotations

from typing import Optional

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
