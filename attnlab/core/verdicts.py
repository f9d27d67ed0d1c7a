"""The shape of a claim row, shared by both papers' claim checkers: id, claim, paper, measured, verdict."""
from __future__ import annotations

VERDICTS = ("holds", "does not hold", "not applicable")


def claim_row(cid: str, claim: str, paper: str, measured: str, verdict: str) -> dict:
    """One row of the claim table; `verdict` must be one of VERDICTS."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    return {"id": cid, "claim": claim, "paper": paper, "measured": measured, "verdict": verdict}


def verdict(ok: bool) -> str:
    return "holds" if ok else "does not hold"
