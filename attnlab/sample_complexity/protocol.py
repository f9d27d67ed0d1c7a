"""The protocol shared by the experiments of "Token Sample Complexity of Attention": the paper's citation,
the slope fits (weighted or ordinary least squares, and which one the authors' code uses where), presets,
grids, dtypes and devices, and the random weights drawn once per run."""
from __future__ import annotations

import numpy as np
import torch

from attnlab.sample_complexity import montecarlo as mc
from attnlab.sample_complexity import theory

PAPER = ("Bohbot, Letrouit, Peyre, Vialard. Token Sample Complexity of Attention. "
         "arXiv:2512.10656 (ICML 2026)")
ERROR_BARS = "std over the k replicates (ddof=1) / sqrt(k)"
FIT_LABELS = {
    "wls": ("weighted least squares of log err on log n, weights 1/var(log err) with "
            "var(log err) = (err_se/err)^2, slope se scaled by the weighted residual variance (dof = points-2), "
            "as the authors' src/tsc/fit.py (which they use for their Gaussian and BERT/BigBird runs)"),
    "ols": ("ordinary least squares of log err on log n (error bars not used), slope se from the residual "
            "variance (dof = points-2), as the authors' sphere run: np.polyfit(log n, log err, 1, cov=True) "
            "in src/tsc/sphere.py"),
}
FIT = FIT_LABELS["wls"]
#: what the authors' released code uses per experiment (src/tsc/gaussian.py, experiments/bert/run.py: fit.py
#: WLS; src/tsc/sphere.py: np.polyfit OLS, with error bars std(ddof=0)/sqrt(k) drawn but not used in the fit)
AUTHORS_FIT = {"uniform_map": None, "moment_convergence": "wls", "hardmax": "ols", "real_encoder": "wls"}


def fit_label(fit: str, experiment: str) -> str:
    """Provenance text for the slope fit ``fit`` ("wls"/"ols") of ``experiment``, saying which fit the
    authors' code uses for that experiment when it differs."""
    if fit not in FIT_LABELS:
        raise ValueError(f"fit must be one of {tuple(FIT_LABELS)}, got {fit!r}")
    label = FIT_LABELS[fit]
    theirs = AUTHORS_FIT.get(experiment)
    if theirs == "ols" and fit == "wls":
        label += ("; NOT the authors' fit for this experiment: their sphere run fits by ordinary least squares "
                  "(np.polyfit in src/tsc/sphere.py), available as fit='ols'")
    elif theirs == "wls" and fit == "ols":
        label = label.replace("as the authors' sphere run", "as the authors' sphere run, not their fit for this "
                              "experiment (src/tsc/fit.py WLS, fit='wls')")
    return label

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return DTYPES[dtype]


def check_device(device) -> str:
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use device='cpu'")
    return device


def preset_config(table: dict, quick: bool, preset: str, **overrides) -> dict:
    """A copy of the preset's settings (``quick=True`` selects "quick" whatever `preset` says),
    with every override that is not None applied."""
    name = "quick" if quick else preset
    if name not in table:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(table)}")
    return {**table[name], **{k: v for k, v in overrides.items() if v is not None}}


def grid_values(values, name: str, *, integer: bool = False) -> list:
    vals = list(np.atleast_1d(np.asarray(values, dtype=np.float64)))
    if not vals:
        raise ValueError(f"{name} must not be empty")
    if integer:
        return [theory.check_positive_int(round(v) if abs(v - round(v)) < 1e-9 else v, name) for v in vals]
    return [theory.check_scale(v, name) for v in vals]


def fit_row(points: list[dict], fit: str = "wls") -> dict:
    """Slope fit over point rows (same k) -> fields of a fit row (``fit``: "wls" or "ols",
    :func:`mc.fit_loglog`)."""
    pts = sorted(points, key=lambda r: r["n"])
    n = [p["n"] for p in pts]
    err = [p["err_mean"] for p in pts]
    std = [p["err_std"] for p in pts]
    k = pts[0]["k"]
    if len(pts) < 2 or min(err) <= 0:
        return {"slope": float("nan"), "slope_se": float("nan"), "intercept": float("nan"),
                "beta": float("nan"), "n_points": len(pts)}
    f = mc.fit_loglog(n, err, std, k, method=fit)
    return {"slope": f.slope, "slope_se": f.se, "intercept": f.intercept, "beta": -f.slope,
            "n_points": f.n_points}


def ref_norm(ref: tuple, moment: str, cov_norm: str) -> float:
    """Norm of the reference moment (scale for the errors): ||m_ref||_2 or ||C_ref|| (cov_norm)."""
    if moment == "mean":
        return float(torch.linalg.vector_norm(ref[0].double()))
    return float(torch.linalg.matrix_norm(ref[1].double(), ord="fro" if cov_norm == "fro" else 2))


def random_weights(d: int, seed: int, std: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W_q, W_k, W_v [d, d] float64 with i.i.d. N(0, std^2) entries from `seed` (drawn once)."""
    g = mc.make_generator(seed)
    return tuple(std * torch.randn(d, d, dtype=torch.float64, generator=g) for _ in range(3))
