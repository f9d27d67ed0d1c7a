"""The claim registries' shape, shared by both papers (normalization/claims.toml, sample_complexity/claims.toml):
a `Claim` per table, the `Threshold`s its tests read, the kinds and the tolerance of each comparison, and `load`,
which reads a registry file and refuses a missing, empty or unknown field in one line naming the claim."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Optional

from attnlab.core.verdicts import RTOL

try:
    import tomllib
except ModuleNotFoundError:          # Python 3.10: the same parser, as a package (pyproject's dependencies)
    import tomli as tomllib

THEOREM = "Theorems (must hold)"                                       # proved: must hold on every row of every model
PRINTED = "Bounds as printed (not proved in that form)"                # the paper's bounds as printed / read
EMPIRICAL = "Empirical statements about GPT-2 (may differ on another model)"   # what the authors saw on GPT-2
KINDS = (THEOREM, PRINTED, EMPIRICAL)
KIND_NAMES = {"theorem": THEOREM, "printed": PRINTED, "empirical": EMPIRICAL}   # claims.toml's names

#: compare -> the tolerance of the comparison (the one rule `core.verdicts.holds_le`, RTOL relative, and absolute on
#: the scale of the terms where a side is near zero by cancellation)
TOLERANCES = {
    "every row": f"each row's inequality holds up to holds_le (RTOL = {RTOL:g} of the terms' magnitude); the claim "
                 "holds when the share of rows is exactly 1",
    "at most": f"holds_le(number, threshold): RTOL = {RTOL:g} relative",
    "at least": f"holds_le(threshold, number): RTOL = {RTOL:g} relative",
    "within": f"holds_le on both ends of the band: RTOL = {RTOL:g} relative",
    "near -1": f"holds_le(|number + 1|, threshold): RTOL = {RTOL:g} relative",
    # paper 2's (sample_complexity/claims.toml): each fit's number, every fit must pass
    "near": f"holds_le(|number - also|, threshold) for every fit: RTOL = {RTOL:g} relative",
    "within a factor": f"within(number, 1 / threshold, threshold) for every fit (holds_le on both ends: RTOL = "
                       f"{RTOL:g} relative), and the numbers increasing",
    "at or above": f"holds_le(reference - max(also * se, threshold), number) for every fit: RTOL = {RTOL:g} relative "
                   "(a se that is not finite counts as 0)",
    "below": "|number| < threshold for every fit, strictly (no rounding tolerance)",
}


@dataclass(frozen=True)
class Threshold:
    """A number verdicts turn on: `value` (a float, or a band's two ends), what it bounds (`means`), and whether the
    paper states it (`source` "paper": the value is `normalization.paper`'s) or it is this book's reading ("book")."""

    name: str
    value: float | tuple[float, ...]
    means: str
    source: str


@dataclass(frozen=True)
class Claim:
    """One claim (a table of a claims.toml). kind: one of KINDS; chapter: the number of the chapter that shows
    it; label: its line in the chapter map; paper: the paper's words; claim: this book's test (a template, see
    `claim_text`); unit: the number its verdict turns on; threshold: the name of the threshold that number is judged
    against ("" for the claims about every row); also: other thresholds the test reads; compare: how (a key of
    TOLERANCES); failure: what a failure means, a template over `failure_facts` (literal braces doubled)."""

    id: str
    kind: str
    chapter: str
    label: str
    paper: str
    claim: str
    unit: str
    threshold: str
    compare: str
    failure: str
    also: tuple[str, ...] = ()

    @property
    def tolerance(self) -> str:
        return TOLERANCES[self.compare]


def _threshold(name: str, spec: dict, constants: Optional[ModuleType]) -> Threshold:
    if ("paper" in spec) == ("value" in spec):
        raise ValueError(f"claims.toml: threshold {name} needs exactly one of paper = NAME or value")
    if "paper" in spec:
        if constants is None or not hasattr(constants, spec["paper"]):
            raise ValueError(f"claims.toml: threshold {name}: the paper's constant {spec['paper']} is not known here")
        return Threshold(name, getattr(constants, spec["paper"]), spec["means"], "paper")
    value = spec["value"]
    return Threshold(name, tuple(value) if isinstance(value, list) else float(value), spec["means"], "book")


def _claim(cid: str, spec: dict, known: dict) -> Claim:
    """One claims.toml table as a Claim; ValueError naming the claim and what is missing, empty or wrong."""
    required = {f.name for f in fields(Claim)} - {"id", "threshold", "also"}
    missing = sorted(required - set(spec)) + sorted(set(spec) - required - {"threshold", "also"})
    if missing:
        raise ValueError(f"claims.toml: claim {cid}: missing or unknown fields {missing}")
    spec = dict(spec, kind=KIND_NAMES.get(spec["kind"], spec["kind"]), threshold=spec.get("threshold", ""),
                also=tuple(spec.get("also", ())))
    # a claim judged against a threshold names a known one; a claim about every row names none
    threshold_ok = spec["threshold"] in known if spec["compare"] != "every row" else spec["threshold"] == ""
    bad = ([k for k in sorted(required) if not isinstance(spec[k], str) or not spec[k].strip()]
           + ["kind"] * (spec["kind"] not in KINDS) + ["compare"] * (spec["compare"] not in TOLERANCES)
           + ["threshold"] * (not threshold_ok) + ["also"] * (not all(a in known for a in spec["also"])))
    if bad:
        raise ValueError(f"claims.toml: claim {cid}: empty or wrong {', '.join(dict.fromkeys(bad))}")
    return Claim(id=cid, **spec)


def load(path: Path, constants: Optional[ModuleType] = None) -> tuple[dict[str, Threshold], dict[str, str],
                                                                     dict[str, Claim], dict[str, Claim]]:
    """(thresholds, texts, claims, reading-only claims) of a registry file ([texts] and [readings] may be absent),
    each field checked (`_claim`); `constants`: the module a threshold's `paper = "NAME"` reads (the paper's
    numbers, e.g. `attnlab.normalization.paper`)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    known = {name: _threshold(name, spec, constants) for name, spec in data["thresholds"].items()}
    return (known, dict(data.get("texts", {})), {cid: _claim(cid, s, known) for cid, s in data["claims"].items()},
            {cid: _claim(cid, s, known) for cid, s in data.get("readings", {}).items()})
