"""Result 3 of "Token Sample Complexity of Attention" (arXiv 2512.10656): the softmax near a hardmax, tokens
uniform on a sphere at very large attention scale (rows as in `attnlab.sample_complexity.experiments`).

hardmax                   the error against n at each scale: slower than any power law at large scale.
authors_sphere_reference  attnlab's sphere limit covariance against the one the authors' code computes
                          (zero at their three largest scales: scipy's ive is NaN beyond 2**30).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.sample_complexity import montecarlo as mc
from attnlab.sample_complexity import theory
from attnlab.sample_complexity.protocol import (
    ERROR_BARS,
    PAPER,
    as_dtype,
    check_device,
    fit_label,
    fit_row,
    grid_values,
    preset_config,
    random_weights,
    ref_norm,
)

# ==================================================================================================
# 3. the hardmax regime: uniform sphere at very large scale
# ==================================================================================================

SPHERE_WEIGHTS = {
    "attnlab": "float64 torch.randn from a generator seeded with the seed",
    "authors": "float32 torch.randn after torch.manual_seed(seed), cast to float64, as the authors' src/tsc/sphere.py",
}
AUTHORS_REFERENCE_LABEL = (
    "'authors_code': the authors' reference as their code computes it (src/tsc/_sphere_covariance.py [CODE]): "
    "the same Bessel/Dirichlet formula, but their A_d returns 0 where scipy's ive is NaN (arguments >= 2**30), "
    "Dirichlet Monte Carlo with numpy seed 0; a bug reproduced for comparison, not a limit")


def sphere_weights(d: int, seed: int, weights: str = "attnlab") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """G_q, G_k, G_v ``[d, d]`` float64 with i.i.d. N(0, 1) entries: ``weights="attnlab"`` as
    :func:`random_weights`; ``"authors"``: float32 ``torch.randn`` from a generator seeded with
    ``seed`` (the stream of ``torch.manual_seed(seed)``), three draws in the order q, k, v, as the
    authors' ``run_sphere_experiment`` (seed 42 gives their matrices), cast to float64."""
    if weights == "attnlab":
        return random_weights(d, seed, 1.0)
    if weights == "authors":
        g = mc.make_generator(seed)
        return tuple(torch.randn(d, d, generator=g, dtype=torch.float32).to(torch.float64) for _ in range(3))
    raise ValueError(f"weights must be 'attnlab' or 'authors', got {weights!r}")


HARDMAX_PRESETS = {
    # the authors' sphere run (experiments/uniform_sphere_d50, README): heavy
    "paper": dict(d=50, radius=1.0, scales=tuple(np.geomspace(10, 1e5, 12)),
                  n_values=tuple(np.geomspace(1e4, 1e5, 12).astype(int)), k=200, n_dirichlet=1_000_000, seed=42),
    "default": dict(d=50, radius=1.0, scales=(1.0, 10.0, 1000.0), n_values=(256, 512, 1024, 2048, 4096),
                    k=8, n_dirichlet=200_000, seed=0),
    "quick": dict(d=16, radius=1.0, scales=(1.0, 100.0), n_values=(64, 128, 256, 512), k=3,
                  n_dirichlet=20_000, seed=0),
}


EXACT_SPHERE_REFERENCE_NOTE = ("mean 0; covariance W_v U diag(lambda) U^T W_v^T with the Bessel-ratio/Dirichlet "
                               "formula [CODE]")
CURVATURE_NOTE = "; curvature: quadratic fit in centred log n with the same weights"


@dataclass(frozen=True)
class _SphereRun:
    """The checked settings of one :func:`hardmax` run."""

    d: int
    radius: float
    scales: list
    n_values: list
    k: int
    seed: int
    n_dirichlet: int
    reference: str
    n_ref: int
    authors_reference: bool
    cov_norm: str
    device: str
    dtype: torch.dtype
    max_scores: int
    fit: str
    weights: str


def _scale_references(run: _SphereRun, A: torch.Tensor, Gv: torch.Tensor, i: int, s: float):
    """The references ({name: (mean [d], cov [d, d])}) of scale i (= s), with the numerics of the exact one
    and of the authors' one (dicts, None when not computed)."""
    refs, exact_info, authors_info = {}, None, None
    if run.reference in ("exact", "both"):
        mean, cov, info = theory.sphere_output_moments(A, Gv, radius=run.radius, n_mc=run.n_dirichlet,
                                                       seed=mc.derive_seed(run.seed, 11, i), return_info=True)
        refs["exact"] = (mean, cov)
        exact_info = {"scale": s, **{kk: v for kk, v in info.items() if kk != "lambda_se"},
                      "max_lambda_se": max(info.get("lambda_se", [0.0]))}
    if run.reference in ("sample", "both"):
        refs["sample"] = mc.empirical_reference(
            lambda n, gen: mc.sample_sphere(n, run.d, radius=run.radius, generator=gen, device=run.device),
            A, Gv, n_ref=run.n_ref, seed=mc.derive_seed(run.seed, 7, i), device=run.device, max_scores=run.max_scores)
    if run.authors_reference:
        mean_a, cov_a, info_a = theory.sphere_covariance_authors_guard(
            A, Gv, radius=run.radius, n_mc=run.n_dirichlet, seed=0, return_info=True)
        refs["authors_code"] = (mean_a, cov_a)
        authors_info = {"scale": s, "frac_beyond_ive": info_a["frac_beyond_ive"],
                        "cov_norm_authors": ref_norm((mean_a, cov_a), "cov", run.cov_norm)}
    return refs, exact_info, authors_info


def _curved_fit(pts: list[dict], reference: str, moment: str, fit: str, k: int) -> dict:
    """`fit_row` of one (reference, moment)'s point rows, plus the quadratic-in-log-n curvature (>= 4 points,
    errors > 0) and the first and last local slopes (>= 2 points)."""
    sel = sorted([p for p in pts if p["reference"] == reference and p["moment"] == moment], key=lambda p: p["n"])
    fr = fit_row(sel, fit)
    extra = {}
    ns, es = [p["n"] for p in sel], [p["err_mean"] for p in sel]
    if len(sel) >= 4 and min(es) > 0:
        cf = mc.fit_loglog_curvature(ns, es, [p["err_std"] for p in sel], k, method=fit)
        extra = {"curvature": cf["curvature"], "curvature_se": cf["curvature_se"]}
    if len(sel) >= 2:
        ls = mc.local_slopes(ns, es)
        extra.update(local_slope_first=float(ls[0]), local_slope_last=float(ls[-1]))
    return {**fr, **extra}


def _scale_rows(run: _SphereRun, base: torch.Tensor, Gv: torch.Tensor, Sigma: torch.Tensor, i: int, s: float):
    """Point and fit rows of scale i (= s), with its references' numerics (`_scale_references`)."""
    A = s ** 2 * base / math.sqrt(run.d)
    H = theory.horizon(A, Sigma)
    H_auth = theory.horizon(s ** 2 * base, Sigma)
    refs, exact_info, authors_info = _scale_references(run, A, Gv, i, s)

    def draw(n, b, gen):
        return mc.sample_sphere(n, run.d, radius=run.radius, batch=(b,), generator=gen, dtype=run.dtype,
                                device=run.device)

    pts = mc.mc_moment_errors(draw, A, Gv, run.n_values, run.k, refs, cov_norm=run.cov_norm,
                              seed=mc.derive_seed(run.seed, i), device=run.device, dtype=run.dtype,
                              max_scores=run.max_scores)
    common = {"scale": s, "horizon": H, "horizon_authors": H_auth}
    rows = [{"kind": "point", **common, **p} for p in pts]
    rows += [{"kind": "fit", **common, "reference": r, "moment": mom, **_curved_fit(pts, r, mom, run.fit, run.k),
              "ref_norm": ref_norm(refs[r], mom, run.cov_norm), "beta_ref": theory.beta_reference(H), "k": run.k}
             for r in refs for mom in ("mean", "cov")]
    return rows, exact_info, authors_info


def _hardmax_provenance(run: _SphereRun, ref_info: list, authors_info: list, *, quick: bool, preset: str,
                        t0: float) -> dict:
    """The provenance of :func:`hardmax`'s Result (t0: its start, for the runtime)."""
    seed = run.seed
    return provenance(
        experiment="hardmax", paper=PAPER, result="3 (hardmax regime, logarithmic rate)",
        preset="quick" if quick else preset, tokens=f"uniform on the sphere of radius {run.radius} in d={run.d}",
        weights=f"G_q, G_k, G_v i.i.d. N(0,1) from seed {seed} ({SPHERE_WEIGHTS[run.weights]}); "
                "W_q, W_k <- scale * G, W_v = G_v",
        A="scale^2 G_k^T G_q / sqrt(d)", scales=run.scales, n_values=run.n_values, k=run.k, seed=seed,
        seeds=f"scale i, size n: tokens from derive_seed(derive_seed({seed}, i), n); Dirichlet Monte Carlo "
              f"from derive_seed({seed}, 11, i)",
        reference=run.reference, exact_reference=EXACT_SPHERE_REFERENCE_NOTE, exact_reference_numerics=ref_info,
        n_dirichlet=run.n_dirichlet, n_ref=run.n_ref if run.reference != "exact" else None, cov_norm=run.cov_norm,
        authors_reference=(AUTHORS_REFERENCE_LABEL if run.authors_reference else None), authors_reference_numerics=(
            authors_info if run.authors_reference else None),
        error_bars=ERROR_BARS, fit=fit_label(run.fit, "hardmax") + CURVATURE_NOTE, fit_method=run.fit,
        temperature_convention=theory.TEMPERATURE_CONVENTION, dtype=str(run.dtype), moments_dtype="float64",
        device=run.device, max_scores=run.max_scores, torch_threads=torch.get_num_threads(),
        runtime_s=round(time.perf_counter() - t0, 3))


def hardmax(*, quick: bool = False, preset: str = "default", d: Optional[int] = None,
            radius: Optional[float] = None, scales: Optional[Sequence[float]] = None,
            n_values: Optional[Sequence[int]] = None, k: Optional[int] = None,
            n_dirichlet: Optional[int] = None, seed: Optional[int] = None, reference: str = "exact",
            n_ref: int = 20_000, cov_norm: str = "spectral", device: str = "cpu", dtype="float32",
            max_scores: int = theory.MAX_SCORES, fit: str = "wls", weights: str = "attnlab",
            authors_reference: bool = False) -> Result:
    """Result 3: the softmax near a hardmax (tokens uniform on the sphere, huge attention scale).

    The authors' sphere setting (the authors' code): tokens uniform on S^{d-1}(radius); G_q, G_k, G_v
    i.i.d. N(0, 1) drawn once; ``W_q, W_k <- s G``, ``W_v = G_v`` and temperature 1/sqrt(d), so
    ``A = s^2 G_k^T G_q / sqrt(d)``.  Reference ``"exact"``: mean 0 and the Bessel/Dirichlet covariance
    (:func:`theory.sphere_output_moments`, Monte Carlo over the Dirichlet with ``n_dirichlet`` samples
    when d > 6); ``"sample"``/``"both"`` add a large-sample reference (one draw of n_ref tokens, the
    authors' Gaussian protocol; their sphere run uses the closed form).
    Errors: mean (L2) and covariance (``cov_norm``, spectral as the authors).  Fit rows add a
    quadratic-in-log-n fit (curvature > 0: bends away from a power law) and the first/last local slopes.

    ``fit``: "wls" (default; weighted, as the authors' fit.py) or "ols" (ordinary least squares, which
    is what the authors' sphere run and its figure use: np.polyfit in src/tsc/sphere.py [CODE]).
    ``weights``: "attnlab" (float64 draws from ``seed``) or "authors" (float32 ``torch.randn`` after
    ``torch.manual_seed(seed)``, as src/tsc/sphere.py: with seed 42 the authors' own G_q, G_k, G_v).
    ``authors_reference=True`` adds the reference "authors_code": mean 0 and the covariance as the
    authors' code computes it (:func:`theory.sphere_covariance_authors_guard`: zero once the Bessel
    arguments pass 2**30), a labelled comparison, not a limit.
    """
    t0 = time.perf_counter()
    fit_label(fit, "hardmax")                             # validates fit
    cfg = preset_config(HARDMAX_PRESETS, quick, preset, d=d, radius=radius, scales=scales, n_values=n_values, k=k,
                  n_dirichlet=n_dirichlet, seed=seed)
    d = theory.check_positive_int(cfg["d"], "d")
    R = theory.check_scale(cfg["radius"], "radius")
    scales = grid_values(cfg["scales"], "scale")
    n_values = grid_values(cfg["n_values"], "n", integer=True)
    k = theory.check_positive_int(cfg["k"], "k")
    seed = int(cfg["seed"])
    if reference not in ("exact", "sample", "both"):
        raise ValueError(f"reference must be 'exact', 'sample' or 'both', got {reference!r}")
    device, dt = check_device(device), as_dtype(dtype)
    run = _SphereRun(d, R, scales, n_values, k, seed, int(cfg["n_dirichlet"]), reference, n_ref, authors_reference,
                     cov_norm, device, dt, max_scores, fit, weights)

    Gq, Gk, Gv = sphere_weights(d, seed, weights)
    base = Gk.T @ Gq
    Sigma = (R ** 2 / d) * torch.eye(d, dtype=torch.float64)
    rows, ref_info, authors_info = [], [], []
    for i, s in enumerate(scales):
        scale_rows, exact_info, authors = _scale_rows(run, base, Gv, Sigma, i, s)
        rows += scale_rows
        ref_info += [exact_info] if exact_info is not None else []
        authors_info += [authors] if authors is not None else []
    return Result("tsc_hardmax", rows, _hardmax_provenance(run, ref_info, authors_info, quick=quick, preset=preset,
                                                           t0=t0))


AUTHORS_REFERENCE_PRESETS = {
    # the authors' sphere run: their weights (seed 42), their 12 scales, their 10^6 Dirichlet samples (minutes)
    "paper": dict(d=50, radius=1.0, scales=tuple(np.geomspace(10, 1e5, 12)), n_dirichlet=1_000_000,
                  n_hardmax=1_000_000, seed=42, weights="authors"),
    # ~40 s on 2 CPU cores: the same with 10^5 Dirichlet samples
    "default": dict(d=50, radius=1.0, scales=tuple(np.geomspace(10, 1e5, 12)), n_dirichlet=100_000,
                    n_hardmax=200_000, seed=42, weights="authors"),
    "quick": dict(d=8, radius=1.0, scales=(10.0, 1e3, 1e5), n_dirichlet=20_000, n_hardmax=100_000, seed=42,
                  weights="authors"),
}


def authors_sphere_reference(*, quick: bool = False, preset: str = "default", d: Optional[int] = None,
                             radius: Optional[float] = None, scales: Optional[Sequence[float]] = None,
                             n_dirichlet: Optional[int] = None, n_hardmax: Optional[int] = None,
                             seed: Optional[int] = None, weights: Optional[str] = None,
                             cov_norm: str = "spectral") -> Result:
    """attnlab's sphere limit covariance against the authors' reference **as their code computes it**.

    Sphere setting of :func:`hardmax` (``A = s^2 G_k^T G_q / sqrt(d)``, ``W_v = G_v``; by default the
    authors' own weights, seed 42, and their twelve scales).  Per scale, a ``kind="reference"`` row:
    ``bessel_arg_max/min`` = ``R^2 sigma_max/min(A)`` (the range of the Bessel argument
    ``R^2 sqrt(sum sigma_k^2 T_k)``), ``frac_beyond_ive`` (share of Dirichlet samples with argument
    >= 2**30, where ``scipy.special.ive`` is NaN), the norms of attnlab's covariance
    (:func:`theory.sphere_output_moments`) and of the authors' (:func:`theory.sphere_covariance_authors_guard`,
    A_d = 0 there), ``rel_diff = ||C - C_authors|| / ||C||`` (1 when theirs is the zero matrix),
    ``rel_to_hardmax = ||C - C_hardmax|| / ||C_hardmax||`` against the hardmax limit by direct Monte
    Carlo (:func:`theory.sphere_hardmax_moments`, ``n_hardmax`` samples), the smallest eigenvalue of
    ours (positive definite) and ``rel_change_prev`` (relative change from the previous scale).
    Both covariances use the same Dirichlet samples (numpy seed 0, as the authors), so they differ
    only by the guard.  Where their reference is 0, their plotted covariance error
    ``||C_n - C_ref||_2`` is ``||C_n||_2``, about ``||C||_2`` at every n (:func:`hardmax` with
    ``authors_reference=True`` measures it).  Norms: ``cov_norm`` ("spectral" as their sphere run).
    """
    t0 = time.perf_counter()
    cfg = preset_config(AUTHORS_REFERENCE_PRESETS, quick, preset, d=d, radius=radius, scales=scales,
                  n_dirichlet=n_dirichlet, n_hardmax=n_hardmax, seed=seed, weights=weights)
    d = theory.check_positive_int(cfg["d"], "d")
    R = theory.check_scale(cfg["radius"], "radius")
    scales = grid_values(cfg["scales"], "scale")
    n_mc = theory.check_positive_int(cfg["n_dirichlet"], "n_dirichlet")
    n_hard = theory.check_positive_int(cfg["n_hardmax"], "n_hardmax")
    seed = int(cfg["seed"])
    if cov_norm not in ("fro", "spectral"):
        raise ValueError(f"cov_norm must be 'fro' or 'spectral', got {cov_norm!r}")
    Gq, Gk, Gv = sphere_weights(d, seed, cfg["weights"])
    base = Gk.T @ Gq
    Sigma = (R ** 2 / d) * torch.eye(d, dtype=torch.float64)
    sig = torch.linalg.svdvals(base / math.sqrt(d))
    nrm = (lambda M: float(torch.linalg.matrix_norm(M, ord="fro" if cov_norm == "fro" else 2)))
    _, C_hard = theory.sphere_hardmax_moments(base, Gv, radius=R, n_samples=n_hard, seed=1)
    rows, prev = [], None
    for s in scales:
        A = s ** 2 * base / math.sqrt(d)
        _, C, info = theory.sphere_output_moments(A, Gv, radius=R, n_mc=n_mc, seed=0, return_info=True)
        _, C_a = theory.sphere_covariance_authors_guard(A, Gv, radius=R, n_mc=n_mc, seed=0)
        rows.append({
            "kind": "reference", "scale": s, "horizon": theory.horizon(A, Sigma),
            "horizon_authors": theory.horizon(s ** 2 * base, Sigma),
            "bessel_arg_max": R ** 2 * s ** 2 * float(sig[0]), "bessel_arg_min": R ** 2 * s ** 2 * float(sig[-1]),
            "frac_beyond_ive": info["frac_beyond_ive"], "cov_norm": nrm(C), "cov_norm_authors": nrm(C_a),
            "rel_diff": nrm(C - C_a) / nrm(C), "authors_zero": bool(torch.all(C_a == 0)),
            "rel_to_hardmax": nrm(C - C_hard) / nrm(C_hard),
            "rel_change_prev": nrm(C - prev) / nrm(C) if prev is not None else float("nan"),
            "min_eig": float(torch.linalg.eigvalsh(C)[0]), "finite": bool(torch.isfinite(C).all()),
            "n_dirichlet": n_mc})
        prev = C
    rows.append({"kind": "hardmax", "cov_norm": nrm(C_hard), "n_hardmax": n_hard})
    prov = provenance(
        experiment="authors_sphere_reference", paper=PAPER,
        result="3: the sphere limit covariance, attnlab's and the authors' code's",
        preset="quick" if quick else preset, tokens=f"uniform on the sphere of radius {R} in d={d}",
        weights=f"G_q, G_k, G_v i.i.d. N(0,1) from seed {seed} ({SPHERE_WEIGHTS[cfg['weights']]})",
        A="scale^2 G_k^T G_q / sqrt(d)", scales=scales, seed=seed, n_dirichlet=n_mc, n_hardmax=n_hard,
        dirichlet_seed="numpy seed 0 (the authors' default), shared by both covariances",
        hardmax_seed="numpy seed 1", cov_norm=cov_norm, authors_reference=AUTHORS_REFERENCE_LABEL,
        ive_nan_threshold=theory.IVE_MAX_ARG,
        finding=("scipy.special.ive is NaN for arguments >= 2**30 and the authors' A_d guard returns 0 there: "
                 "where every Bessel argument is beyond, their reference covariance is the zero matrix and their "
                 "plotted covariance error is ||C_n||_2; attnlab's covariance is finite, positive definite and "
                 "continuous with the smaller scales (the hardmax limit)"),
        runtime_s=round(time.perf_counter() - t0, 3))
    return Result("tsc_authors_sphere_reference", rows, prov)
