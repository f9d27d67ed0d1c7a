"""Claim rows for "Token Sample Complexity of Attention" (arXiv 2512.10656), from computed Results."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from attnlab.core import claim_registry
from attnlab.core.result import Result
from attnlab.core.verdicts import claim_row, holds_le, with_model, within

_row = claim_row

#: paper 2's claim registry (claims.toml beside this module; the loader and fields are paper 1's,
#: `core.claim_registry`): CLAIMS {id: Claim} in the chapters' order, THRESHOLDS {name: Threshold}, TEXTS
REGISTRY_FILE = Path(__file__).with_name("claims.toml")
THRESHOLDS, TEXTS, CLAIMS, _ = claim_registry.load(REGISTRY_FILE)
HEADS_READING = TEXTS["HEADS_READING"]


def threshold(name: str) -> float:
    """The value of paper-2 threshold `name` (`THRESHOLDS`)."""
    return THRESHOLDS[name].value


def claim_text(cid: str) -> str:
    """This book's test of claim `cid`: the registry's template with the thresholds in."""
    return CLAIMS[cid].claim.format(**{name: threshold(name) for name in THRESHOLDS})


def _texts(cid: str) -> tuple[str, str]:
    """(this book's test, the paper's words) of claim `cid`."""
    return claim_text(cid), CLAIMS[cid].paper


def chapter_labels(chapter: str) -> dict[str, str]:
    """{claim id: its label} of the paper-2 claims chapter `chapter` shows, in the registry's order."""
    return {cid: c.label for cid, c in CLAIMS.items() if c.chapter == chapter}


def why(cid: str) -> str:
    """What a failure of claim `cid` means (the registry's `failure`)."""
    return CLAIMS[cid].failure


def _claim_uniform(res: Optional[Result]) -> list[dict]:
    (c1, p1), (c2, p2) = _texts("tsc-uniform-rate"), _texts("tsc-uniform-constant")
    if res is None:
        return [_row("tsc-uniform-rate", c1, p1, "not run", "not applicable"),
                _row("tsc-uniform-constant", c2, p2, "not run", "not applicable")]
    fits = sorted(res.select(kind="fit"), key=lambda f: f["R"])
    ok = all(holds_le(abs(f["slope"] - threshold("RATE_SLOPE")), threshold("RATE_TOL")) for f in fits)
    meas = "; ".join(f"R={f['R']:g}: {f['slope']:.3f}±{f['slope_se']:.3f}" for f in fits)
    rows = [_row("tsc-uniform-rate", c1, p1, meas, "holds" if ok else "does not hold")]
    C = [f["C"] for f in fits]
    ratio = [f["C"] / f["C_pred"] for f in fits]
    grows = all(b > a for a, b in zip(C, C[1:]))
    factor = threshold("C_FACTOR")
    tracks = all(within(r, 1 / factor, factor) for r in ratio)
    meas2 = (", ".join(f"C({f['R']:g})={f['C']:.3g}" for f in fits)
             + "; delta-method constant exp(||Sigma^1/2 A x||^2/2)-type [DERIVED]: "
             + ", ".join(f"{f['C_pred']:.3g}" for f in fits)
             + f"; measured/derived in [{min(ratio):.2f}, {max(ratio):.2f}]")
    rows.append(_row("tsc-uniform-constant", c2, p2, meas2, "holds" if (grows and tracks) else "does not hold"))
    return rows


def beta_at_or_above(beta: float, ref: float, se: float) -> bool:
    """The test of one fitted rate: beta >= ref - max(BETA_SE_FACTOR se, BETA_TOL_FLOOR) (the registry's; a se that
    is not finite counts as 0), up to rounding."""
    se = float(se) if np.isfinite(se) else 0.0
    return holds_le(ref - max(threshold("BETA_SE_FACTOR") * se, threshold("BETA_TOL_FLOOR")), beta)


def margin_text() -> str:
    """The margin of `beta_at_or_above` as the rows state it: "max(2 se, 0.03)"."""
    return f"max({threshold('BETA_SE_FACTOR'):g} se, {threshold('BETA_TOL_FLOOR')})"


def _beta_claim(fits: list[dict], cid: str, claim: str, paper: str) -> dict:
    fits = [f for f in fits if np.isfinite(f["beta"])]
    if not fits:
        return _row(cid, claim, paper, "no finite fits", "not applicable")
    n_ok = sum(beta_at_or_above(f["beta"], f["beta_ref"], f["slope_se"]) for f in fits)
    n_ok_auth = (sum(beta_at_or_above(f["beta"], f["beta_ref_authors"], f["slope_se"]) for f in fits)
                 if "beta_ref_authors" in fits[0] else None)
    below = [f for f in fits if not beta_at_or_above(f["beta"], f["beta_ref"], f["slope_se"])]
    lab = "layer" if "layer" in fits[0] else "scale"
    detail = "; ".join(f"{lab} {f[lab]:g} {f['moment']}: |beta|={f['beta']:.3f}±{f['slope_se']:.3f} vs "
                       f"beta(H={f['horizon']:.3g})={f['beta_ref']:.3f}" for f in below[:6])
    meas = (f"{n_ok}/{len(fits)} fits at or above beta(H) within {margin_text()} "
            "(our H, temperature in A)")
    if n_ok_auth is not None:
        meas += f"; {n_ok_auth}/{len(fits)} with the authors' H (no temperature)"
    if below:
        meas += f"; below: {detail}"
    smax = max(f["beta"] for f in fits)
    meas += f"; |beta| range {min(f['beta'] for f in fits):.3f}..{smax:.3f}, H range " \
            f"{min(f['horizon'] for f in fits):.3g}..{max(f['horizon'] for f in fits):.3g}"
    return _row(cid, claim, paper, meas, "holds" if n_ok == len(fits) else "does not hold")


def _claim_moments(res: Optional[Result]) -> list[dict]:
    c, p = _texts("tsc-moments-beta")
    if res is None:
        return [_row("tsc-moments-beta", c, p, "not run", "not applicable")]
    fits = res.select(kind="fit")
    ref = "exact" if any(f["reference"] == "exact" for f in fits) else fits[0]["reference"]
    return [_beta_claim([f for f in fits if f["reference"] == ref], "tsc-moments-beta", c + f" ({ref} reference)", p)]


def _claim_hardmax(res: Optional[Result]) -> list[dict]:
    """Verdict on the covariance error at the largest scale.  The mean is not used: m_n is an odd
    function of the tokens and the sphere is symmetric, so E[m_n] = 0 = m_inf exactly and the mean
    error is pure fluctuation (near n^-1/2 at every scale); the hardmax bias shows in the covariance."""
    c, p = _texts("tsc-hardmax")
    if res is None:
        return [_row("tsc-hardmax", c, p, "not run", "not applicable")]
    fits = res.select(kind="fit")
    ref = "exact" if any(f["reference"] == "exact" for f in fits) else fits[0]["reference"]
    fits = [f for f in fits if f["reference"] == ref]
    smax = max(f["scale"] for f in fits)
    top = [f for f in fits if f["scale"] == smax and f["moment"] == "cov"]
    ok = bool(top) and all(np.isfinite(f["slope"]) and abs(f["slope"]) < threshold("HARDMAX_SLOPE") for f in top)
    meas = "; ".join(
        f"scale {f['scale']:g} (H={f['horizon']:.3g}) {f['moment']}: slope {f['slope']:.3f}±{f['slope_se']:.3f}"
        + (f", curvature {f['curvature']:.3f}±{f['curvature_se']:.3f}" if "curvature" in f else "")
        for f in sorted(fits, key=lambda f: (f["scale"], f["moment"])))
    meas += " (verdict on the covariance; the mean's limit is 0 by symmetry, its error is fluctuation only)"
    return [_row("tsc-hardmax", c + f" (covariance error, largest scale, {ref} reference)", p, meas,
                 "holds" if ok else "does not hold")]


def _claim_real(res: Optional[Result]) -> list[dict]:
    c, p = _texts("tsc-real-beta")
    if res is None:
        return [_row("tsc-real-beta", c, p, "not run", "not applicable")]
    return [_beta_claim(res.select(kind="fit"), "tsc-real-beta",
                        c + f" ({res.provenance.get('model')})", p)]


def _claim_real_heads(res: Optional[Result]) -> list[dict]:
    """Per head: the share of heads whose mean and covariance exponents are at or above beta(H_j) (the
    tolerance of the per-layer claim), and the rank correlation of |beta_cov| with H_j across heads (the
    prediction "larger horizon, slower decay" read across heads; reported, not part of the verdict)."""
    c, p = _texts("tsc-real-beta-heads")
    heads = [h for h in res.select(kind="head") if "beta_cov" in h] if res is not None else []
    if not heads:
        why = "not run" if res is None else "no per-head fits in this Result"
        return [_row("tsc-real-beta-heads", c, p, why, "not applicable", reading=HEADS_READING)]
    parts, ok = [], True
    for mom in ("mean", "cov"):
        fin = [h for h in heads if np.isfinite(h[f"beta_{mom}"])]
        n_ok = sum(beta_at_or_above(h[f"beta_{mom}"], h["beta_ref"], h[f"beta_{mom}_se"]) for h in fin)
        ok = ok and bool(fin) and n_ok == len(fin)
        b = [h[f"beta_{mom}"] for h in fin]
        parts.append(f"{mom}: {n_ok}/{len(fin)} heads at or above beta(H_j) within {margin_text()}"
                     + (f", |beta| {min(b):.3f}..{max(b):.3f}" if b else ""))
    from scipy.stats import spearmanr

    fin = [h for h in heads if np.isfinite(h["beta_cov"])]
    rho = spearmanr([h["horizon"] for h in fin], [h["beta_cov"] for h in fin])[0] if len(fin) > 2 else float("nan")
    Hs = [h["horizon"] for h in heads]
    meas = "; ".join(parts) + (f"; H_j {min(Hs):.3g}..{max(Hs):.3g} over {len(heads)} heads; Spearman rank "
                               f"correlation of |beta_cov| with H_j: {rho:+.2f} (the prediction reads it < 0)")
    return [_row("tsc-real-beta-heads", c + f" ({res.provenance.get('model')})", p, meas,
                 "holds" if ok else "does not hold", reading=HEADS_READING)]


def tsc_claims(results: dict) -> list[dict]:
    """Claim rows (id, claim, paper, measured, verdict) from Results keyed by figure id (`attnlab.figures`):
    "tsc_uniform", "tsc_moments", "tsc_hardmax", "tsc_real" (missing -> "not applicable").
    Verdicts (thresholds: the registry's, `THRESHOLDS`): uniform-map slopes within RATE_TOL of RATE_SLOPE (and
    C(R) increasing, within a factor C_FACTOR of the [DERIVED] delta-method constant, which grows like
    exp(||Sigma^1/2 A x||^2 / 2)); every fitted moment |beta| at or above beta(H) within
    max(BETA_SE_FACTOR se, BETA_TOL_FLOOR) (the upper-bound reading; our H with the temperature inside A, the
    authors' H reported beside it); hardmax: |slope| < HARDMAX_SLOPE for the covariance error at the largest scale
    (the mean error is fluctuation only, see _claim_hardmax); per head (reading HEADS_READING, a last row): every
    head's exponents at or above beta(H_j).
    Every row carries `model`, its Result's (`with_model`: None for synthetic tokens)."""
    get = results.get
    return [row for fig, claim in (("tsc_uniform", _claim_uniform), ("tsc_moments", _claim_moments),
                                   ("tsc_hardmax", _claim_hardmax), ("tsc_real", _claim_real),
                                   ("tsc_real", _claim_real_heads))
            for row in with_model(claim(get(fig)), get(fig))]
