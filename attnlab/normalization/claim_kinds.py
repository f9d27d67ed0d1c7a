"""The paper-1 claim registry: one `Claim` per claim id, loaded from claims.toml (one table per claim: the paper's
words, kind, this book's test, the number it turns on with its unit, threshold, tolerance, what a failure means,
the chapter that shows it and its label there), and the thresholds (`THRESHOLDS`) its tests read.

Everything else reads it: the checker (`claims.paper1_claims`, the readings' `reading_claims`) takes its texts and
thresholds from here (`threshold`, `claim_text`), the chapter map its labels (`chapter_labels`), the text windows
the lines they draw (`thresholds`), chapter 6 the kinds and explanations (`by_kind`, `why`) and the threshold
sweeps (`trial`: a threshold tried at another value for the claims checked inside a `with` block)."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Sequence

import numpy as np

from attnlab.core import claim_registry
from attnlab.normalization import concentration as conc
from attnlab.normalization import paper

REGISTRY_FILE = Path(__file__).with_name("claims.toml")
# what a claim is (`core.claim_registry`, shared with paper 2's registry), under the names paper 1's readers use
Claim, Threshold, TOLERANCES = claim_registry.Claim, claim_registry.Threshold, claim_registry.TOLERANCES
THEOREM, PRINTED, EMPIRICAL = claim_registry.THEOREM, claim_registry.PRINTED, claim_registry.EMPIRICAL
KINDS, KIND_NAMES = claim_registry.KINDS, claim_registry.KIND_NAMES


def load(path: Path = REGISTRY_FILE) -> tuple[dict[str, Threshold], dict[str, str], dict[str, Claim],
                                                 dict[str, Claim]]:
    """(thresholds, texts, claims, reading-only claims) of paper 1's registry file (`core.claim_registry.load`, the
    paper's constants from `normalization.paper`)."""
    return claim_registry.load(path, paper)


THRESHOLDS, TEXTS, CLAIMS, READING_CLAIMS = load()
#: every claim id of the registry: `CLAIMS` (in the chapters' order: the chapter map's), then `READING_CLAIMS`
#: (checked only under chapter 2's readings)
ALL_CLAIMS: dict[str, Claim] = {**CLAIMS, **READING_CLAIMS}
NO_EXPLANATION = "No explanation written yet for this claim."

_TRIAL: ContextVar[dict] = ContextVar("attnlab_threshold_trial", default={})


def threshold(name: str):
    """The value of threshold `name` (`THRESHOLDS`), or the value a surrounding `trial` gives it."""
    trial_values = _TRIAL.get()
    return trial_values[name] if name in trial_values else THRESHOLDS[name].value


@contextmanager
def trial(**values):
    """Within the block, `threshold(name)` is values[name] (the claims checked there use it); restored after, also
    on an error. ValueError for a name the registry has no threshold of."""
    unknown = sorted(set(values) - set(THRESHOLDS))
    if unknown:
        raise ValueError(f"no such threshold in the claim registry: {', '.join(unknown)}")
    token = _TRIAL.set({**_TRIAL.get(), **values})
    try:
        yield
    finally:
        _TRIAL.reset(token)


def limits() -> dict:
    """{threshold name: value} (with a surrounding `trial`'s values) and the registry's texts formatted with them:
    the names the claim templates use."""
    values = {name: threshold(name) for name in THRESHOLDS}
    return {**values, **{k: t.format(**values) for k, t in TEXTS.items()}}


def text(name: str) -> str:
    """A sentence of the registry's [texts] (e.g. LINEAR_CLAIM), with the thresholds in."""
    return limits()[name]


def claim_text(cid: str, **facts) -> str:
    """This book's test of claim `cid` as its rows state it: the template with the thresholds and `facts` in."""
    return ALL_CLAIMS[cid].claim.format(**limits(), **facts)


def chapter_labels(chapter: str) -> dict[str, str]:
    """{claim id: its label} of the claims chapter `chapter` shows, in the table's order."""
    return {cid: c.label for cid, c in CLAIMS.items() if c.chapter == chapter}


def lines(cid: str) -> list[float]:
    """The paper's value or the two ends of its band, in the unit of claim `cid`'s number ([] for the claims about
    every row)."""
    c = ALL_CLAIMS[cid]
    if not c.threshold:
        return []
    t = threshold(c.threshold)
    return [-1 - t, -1 + t] if c.compare == "near -1" else list(t) if c.compare == "within" else [t]


def thresholds() -> dict[str, list[float]]:
    """{claim id: `lines`} of the claims judged against a threshold."""
    return {cid: lines(cid) for cid, c in CLAIMS.items() if c.threshold}


def claim_kind(cid: str) -> str:
    """THEOREM, PRINTED or EMPIRICAL (a claim id not in the registry is an empirical statement)."""
    return ALL_CLAIMS[cid].kind if cid in ALL_CLAIMS else EMPIRICAL


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
            "cor3_flat": f"Here every failing row is at T ≤ {max(T_bad):.2g}, where the curve is √2." if flat else "",
            "sep_relation": separability_relation(r1, results["fig3"]) if "fig3" in results else "",
            "heads_note": heads_note(len({(r["layer"], r["head"]) for r in r1.rows if "layer" in r}))}


def heads_note(n_heads: int) -> str:
    """One sentence: the KS test's sample size (one value per head) on this model against GPT-2's, and which way
    that moves the critical N (more heads: a stronger test, which keeps rejecting to a larger N)."""
    if n_heads <= 0:
        return ""
    if n_heads == paper.N_HEADS:
        return f"The KS test has GPT-2's sample size here ({paper.N_HEADS} heads)."
    more = n_heads > paper.N_HEADS
    return (f"The KS test's sample size is the number of heads: {n_heads} on this model against GPT-2's "
            f"{paper.N_HEADS}. "
            + ("More heads make a stronger test, which keeps rejecting to a larger N: this works against the claim "
               "here, by an amount not measured." if more else
               "Fewer heads make a weaker test, which accepts sooner: this works for the claim here, so it cannot "
               "explain a critical N above the paper's."))


def separability_relation(fig1, fig3) -> str:
    """One sentence: how N_s/N goes with a head's concentration on this model (`concentration.concentration_relation`
    at the largest N of `concentration.relation_ns`), its direction read from the sign of Spearman's rho."""
    rows = conc.concentration_rows(fig1, fig3)
    N = max(r["N"] for r in rows)
    rel = conc.concentration_relation([r["max_weight"] for r in rows if r["N"] == N],
                                      [r["ns_frac"] for r in rows if r["N"] == N])
    how = conc.concentration_direction(rel["rho"], "rises", "falls", "hardly changes")
    so = conc.concentration_direction(
        rel["rho"], "Here the more diffuse heads do lose separable tokens.",
        "So diffuse rows do not explain the level: on this model the concentrated heads lose the most.",
        "So how concentrated a head is does not explain the level.")
    return (f"On this model N_s/N at N = {N} {how} as a head's attention concentrates (Spearman ρ = {rel['rho']:+.2f} "
            f"against the mean largest weight at L = {rows[0]['L']}, over {rel['n_heads']} heads; median "
            f"{rel['ns_concentrated']:.2f} in the most concentrated tenth, {rel['ns_diffuse']:.2f} in the least; "
            f"chapter 4 plots it). {so}")


def why(cid: str, facts: dict) -> str:
    """What a failure of claim `cid` means, with this build's numbers (`failure_facts`)."""
    return ALL_CLAIMS[cid].failure.format(**facts) if cid in ALL_CLAIMS else NO_EXPLANATION
