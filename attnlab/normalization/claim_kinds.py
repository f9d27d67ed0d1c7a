"""The paper-1 claim registry: one `Claim` per claim id of `claims.paper1_claims` -- what kind of statement it is,
the chapter that shows it and its label there (`book.CHAPTER_CLAIMS`), the paper's value or band its number is judged
against (`windows.claim_thresholds`), and what a failure of it means (chapter 6). Every comparison a claim makes
uses the one tolerance rule `core.verdicts.holds_le`. The claim rows themselves (the paper's words, the measured
number and its unit) come from `claims.paper1_claims`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from attnlab.normalization.claims import DROP_FACTOR, LINEAR_R2, PLATEAU_REL, SLOPE_TOL
from attnlab.normalization.paper import CRITICAL_FRAC, SEPARABILITY_BAND

THEOREM = "Theorems (must hold)"                                       # proved: must hold on every row of every model
PRINTED = "Bounds as printed (not proved in that form)"                # the paper's bounds as printed / read
EMPIRICAL = "Empirical statements about GPT-2 (may differ on another model)"   # what the authors saw on GPT-2
KINDS = (THEOREM, PRINTED, EMPIRICAL)


@dataclass(frozen=True)
class Claim:
    """One paper-1 claim. kind: one of KINDS; chapter: the number of the chapter that shows it; label: its line in
    the chapter map; failure: what a failure means, a `str.format` template over `failure_facts` (literal braces
    doubled), written in advance for either outcome; threshold: the paper's value, or the two ends of its band,
    that the claim's number is judged against (() for the claims about every row: share of rows = 1)."""

    kind: str
    chapter: str
    label: str
    failure: str
    threshold: tuple[float, ...] = ()


CLAIMS: dict[str, Claim] = {   # in the chapters' order (the chapter map's)
    "p1-cor1": Claim(THEOREM, "1", "every weight inside the Corollary 1 band (theorem)", (
        "A failure would be a bug: Corollary 1 follows from |qᵀk| ≤ ‖q‖‖k‖.")),
    "p1-thm1-R": Claim(THEOREM, "2", "Theorem 1 bound above the distance (reconstruction; theorem)", (
        "A failure would be a bug: the reconstruction is proved by the triangle inequality.")),
    "p1-thm1-B": Claim(PRINTED, "2", "Theorem 1 bound as printed in a summary", (
        "The published summary's printed form of Theorem 1 follows from the triangle inequality for N = 1; "
        "for N > 1 it leaves out the spread of the selected tokens around s, so rows whose selected tokens "
        "point in different directions can exceed it. The reconstruction (p1-thm1-R) keeps that term and "
        "holds.")),
    "p1-thm1-a": Claim(THEOREM, "2", "reading (a) bound (theorem)", (
        "A failure would be a bug.")),
    "p1-fig2a-linear": Claim(EMPIRICAL, "2", "the distance grows about linearly in L (Fig. 2a)", (
        "A straight line in L needs each extra unselected token to add about the same distance. The head "
        "population and the masking (bidirectional rows see all L keys; causal rows see fewer) change the "
        "curvature. For E, chapter 2 measures how far below its proved bound each reading starts, which "
        "decides whether it can grow linearly over these lengths, and how the readings fare against Corollary "
        "2(i) as this book reads it."),
        threshold=(LINEAR_R2,)),
    "p1-fig2b-plateau": Claim(EMPIRICAL, "2", "the distance plateaus for N ≥ 20 (Fig. 2b)", (
        "The plateau after N = 20 is a property of GPT-2's heads at L = 1024; with a shorter window N = 100 "
        "removes a much larger share of the keys, so the distance can keep falling."),
        threshold=(PLATEAU_REL,)),
    "p1-fig2c-critical": Claim(EMPIRICAL, "3", "critical N at most 6% of L (Fig. 2c)", (
        "The two per-head samples become indistinguishable only when the true distance d̃ has come down to "
        "its random-set expectation E. Compare the slopes of d̃ and E in the p1-fig2a-linear row: on this "
        "model d̃ is far above E, so only N close to L brings them together. The power of the KS test also "
        "depends on the number of heads (72 for MiniLM, 144 for GPT-2). Every other reading of E, d̃ and the "
        "vectors is counted in the next section."),
        threshold=(CRITICAL_FRAC,)),
    "p1-thm2-lower": Claim(THEOREM, "4", "Theorem 2 lower bound (theorem)", (
        "A failure would be a bug: 1{{X < r}} ≥ 1 − X/r.")),
    "p1-thm2-upper-R": Claim(PRINTED, "4", "Theorem 2 upper bound (reconstruction)", (
        "The reconstruction uses (ξ_i − r)₊: every selected token with ξ_i < r contributes exactly 1, so it "
        "is loose wherever tokens are inside the ball; it can fail where many ξ_i exceed r and yet N_s/N is "
        "high.")),
    "p1-thm2-upper-B": Claim(PRINTED, "4", "Theorem 2 upper bound as printed in a summary", (
        "It fails at N = 1 by construction, on any model: the single selected token is s itself, so ξ = 0 and "
        "N_s/N = 1, while the printed bound is exp(−r²/16) < 1. More generally it comes from a Hoeffding-type "
        "step applied to one bounded variable, with ξ_i standing in for an expectation over random "
        "configurations (Assumption 1): a heuristic for averages, not a bound for single rows. The paper "
        "itself only says that it 'tracks the empirical maxima closely'.")),
    "p1-fig3-saturation": Claim(EMPIRICAL, "4", "N_s/N saturates in 70–85% (Fig. 3)", (
        "The 70–85% band is what GPT-2's heads do; the level depends on how concentrated each head's "
        "attention is. On this model the rows are diffuse (mean largest weight {max_weight:.2f} at L = "
        "{L_top}, from the fig1 Result), so the extra selected tokens are light ones in the crowd near the "
        "origin (chapter 4's circle picture). The choice of vectors moves it most: see the next section."),
        threshold=tuple(SEPARABILITY_BAND)),
    "p1-cor3-exact": Claim(THEOREM, "5", "g ≤ 1/(2T), the exact bound (theorem)", (
        "A failure would be a bug: the Jacobian's norm is at most 1/(2T).")),
    "p1-cor3-paper": Claim(PRINTED, "5", "g ≤ min{1/(4T), √2} as printed", (
        "Two things. For T < 1/(4√2) ≈ 0.18 the curve is the flat √2. But √2 (the diameter of the simplex) "
        "caps the change of the weights, ‖Δα‖ ≤ √2, so it bounds g only by √2/ε: with ε = 10⁻³ rows near a "
        "tie give g far above √2. And for larger T, 1/(4T) bounds the Jacobian's entries, while its norm "
        "reaches 1/(2T) at a tie (chapter 5). The exact bound 1/(2T) (p1-cor3-exact) holds. {cor3_flat}")),
    "p1-fig4-slope": Claim(EMPIRICAL, "5", "g follows 1/T below T = 0.1 (Fig. 4)", (
        "The row mean of g at temperature T is carried by the rows whose two largest logits lie within about "
        "T of each other; each contributes up to 1/(2T), but their share shrinks as T falls. If that share "
        "shrinks like T, the mean stays flat; a 1/T law needs a share of near-tied rows that does not shrink. "
        "The maximum over the rows does follow 1/T: see the next section and chapter 5."),
        threshold=(-1 - SLOPE_TOL, -1 + SLOPE_TOL)),
    "p1-fig4-drop": Claim(EMPIRICAL, "5", "g drops 100× from T = 0.01 to T ≥ 1", (
        "The drop is measured from T = 0.01, where the curve has already flattened (see p1-fig4-slope); a "
        "flatter small-T end means a smaller drop."),
        threshold=(DROP_FACTOR,)),
    "p1-fig4-eps": Claim(EMPIRICAL, "5", "smaller ε, larger g below T = 0.1", (
        "In the flat regime a perturbation of size ε flips the rows whose top two logits are within about ε, "
        "each by up to √2, so each contributes about √2/ε while their share grows like ε: the mean hardly "
        "depends on ε, and the order of the ε = 10⁻³ and 10⁻¹ curves is decided by noise.")),
}
NO_EXPLANATION = "No explanation written yet for this claim."


def chapter_labels(chapter: str) -> dict[str, str]:
    """{claim id: its label} of the claims chapter `chapter` shows, in the table's order."""
    return {cid: c.label for cid, c in CLAIMS.items() if c.chapter == chapter}


def thresholds() -> dict[str, list[float]]:
    """{claim id: the paper's value or band} of the claims judged against one (`Claim.threshold`)."""
    return {cid: list(c.threshold) for cid, c in CLAIMS.items() if c.threshold}


def claim_kind(cid: str) -> str:
    """THEOREM, PRINTED or EMPIRICAL (a claim id not in the table is an empirical statement)."""
    return CLAIMS[cid].kind if cid in CLAIMS else EMPIRICAL


def is_theorem(cid: str) -> bool:
    return claim_kind(cid) == THEOREM


def by_kind(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """{kind: the claim rows of that kind}, every kind present (in KINDS order), rows in their own order."""
    out: dict[str, list[dict]] = {k: [] for k in KINDS}
    for r in rows:
        out[claim_kind(r["id"])].append(r)
    return out


def failure_facts(results: dict) -> dict:
    """The measured numbers the explanations quote: the fig1 row mean of the largest weight at the longest L, and
    (for Corollary 3 as printed) where its failing rows are."""
    r1, r4 = results["fig1"], results["fig4"]
    L_top = max(r1.unique("L"))
    T_bad = sorted({r["T"] for r in r4.rows if r["holds_paper"] < 1})
    flat = bool(T_bad) and max(T_bad) < 0.17
    return {"L_top": L_top, "max_weight": float(np.mean(r1.column("max_weight", L=L_top))),
            "cor3_flat": f"Here every failing row is at T ≤ {max(T_bad):.2g}, where the curve is √2." if flat else ""}


def why(cid: str, facts: dict) -> str:
    """What a failure of claim `cid` means, with this build's numbers (`failure_facts`)."""
    return CLAIMS[cid].failure.format(**facts) if cid in CLAIMS else NO_EXPLANATION
