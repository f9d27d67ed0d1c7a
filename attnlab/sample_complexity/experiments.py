"""Experiments, plots and claim rows for "Token Sample Complexity of Attention"
(Bohbot, Letrouit, Peyre, Vialard; arXiv 2512.10656, ICML 2026).

Each experiment returns a :class:`attnlab.core.result.Result` whose rows are tidy: ``kind="point"`` rows
hold one Monte Carlo estimate (error mean, std over the k replicates (ddof=1), error bar
``err_se = std / sqrt(k)``) and ``kind="fit"`` rows hold the log-log slope fits the plots and the
claim checker read.  The provenance records seeds, grids, k, the reference used, the temperature
convention (book appendix "How we read the papers", paper 2, G3), device and runtime.

Experiments
-----------
uniform_map          result 1: sup over a ball of radius R of the map error, against n (slope -1/2, C(R)).
moment_convergence   result 2: mean/covariance errors of the output tokens; fitted |beta| against H.
hardmax              result 3: the sphere at very large attention scale; slower than any power law.
real_encoder         a pretrained encoder (MiniLM by default) on WikiText-2; per-layer |beta| and H.
"""
from __future__ import annotations

import hashlib
import math
import time
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.core.util import as_float64
from attnlab.sample_complexity import montecarlo as mc
from attnlab.sample_complexity import theory

PAPER = ("Bohbot, Letrouit, Peyre, Vialard. Token Sample Complexity of Attention. "
         "arXiv:2512.10656 (ICML 2026)")
ERROR_BARS = "std over the k replicates (ddof=1) / sqrt(k)"
FIT = ("weighted least squares of log err on log n, weights 1/var(log err) with "
       "var(log err) = (err_se/err)^2, slope se scaled by the weighted residual variance (dof = points-2), "
       "as in the authors' src/tsc/fit.py")

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


def _preset(table: dict, quick: bool, preset: str, **overrides) -> dict:
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


def _fit_row(points: list[dict]) -> dict:
    """Slope fit over point rows (same k) -> fields of a fit row."""
    pts = sorted(points, key=lambda r: r["n"])
    n = [p["n"] for p in pts]
    err = [p["err_mean"] for p in pts]
    std = [p["err_std"] for p in pts]
    k = pts[0]["k"]
    if len(pts) < 2 or min(err) <= 0:
        return {"slope": float("nan"), "slope_se": float("nan"), "intercept": float("nan"),
                "beta": float("nan"), "n_points": len(pts)}
    f = mc.fit_loglog(n, err, std, k)
    return {"slope": f.slope, "slope_se": f.se, "intercept": f.intercept, "beta": -f.slope,
            "n_points": f.n_points}


def _ref_norm(ref: tuple, moment: str, cov_norm: str) -> float:
    """Norm of the reference moment (scale for the errors): ||m_ref||_2 or ||C_ref|| (cov_norm)."""
    if moment == "mean":
        return float(torch.linalg.vector_norm(ref[0].double()))
    return float(torch.linalg.matrix_norm(ref[1].double(), ord="fro" if cov_norm == "fro" else 2))


def random_weights(d: int, seed: int, std: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W_q, W_k, W_v [d, d] float64 with i.i.d. N(0, std^2) entries from `seed` (drawn once)."""
    g = mc.make_generator(seed)
    return tuple(std * torch.randn(d, d, dtype=torch.float64, generator=g) for _ in range(3))


# ==================================================================================================
# 1. uniform convergence of the attention map
# ==================================================================================================

UNIFORM_MAP_PRESETS = {
    "default": dict(d=4, rho=1.0, H=0.4, radii=(0.5, 1.0, 2.0, 3.0, 4.0),
                    n_values=(2000, 4000, 8000, 16000, 32000, 64000, 128000), k=24, n_random_probes=8),
    "quick": dict(d=3, rho=1.0, H=0.5, radii=(0.5, 2.0), n_values=(200, 400, 800, 1600), k=6,
                  n_random_probes=4),
}


def probe_points(d: int, R: float, A, Sigma, *, n_random: int = 16, seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """The finite set on which ``sup_{||x|| <= R}`` is estimated: ``[P, d]`` float64 and labels.

    The centre, the 2d points ``+-R e_i`` (axes), ``+-R v`` with v the top right-singular vector of
    ``Sigma^{1/2} A`` (the direction that maximises the tilt ||Sigma^{1/2} A x|| on the ball, where
    the effective sample size of the softmax weights is smallest), and ``n_random`` fixed points
    uniform on the sphere of radius R (from `seed`).  P = 1 + 2d + 2 + n_random.
    """
    d = theory.check_positive_int(d, "d")
    R = theory.check_scale(R, "R")
    eye = torch.eye(d, dtype=torch.float64)
    _, _, Vh = torch.linalg.svd(theory.sqrtm_psd(Sigma) @ as_float64(A))
    top = Vh[0]
    g = mc.make_generator(seed)
    rnd = torch.randn(n_random, d, dtype=torch.float64, generator=g)
    rnd = rnd / rnd.norm(dim=-1, keepdim=True)
    pts = torch.cat([torch.zeros(1, d, dtype=torch.float64), R * eye, -R * eye,
                     R * top[None], -R * top[None], R * rnd])
    labels = (["centre"] + [f"+e{i}" for i in range(d)] + [f"-e{i}" for i in range(d)]
              + ["+top", "-top"] + [f"random{i}" for i in range(n_random)])
    return pts, labels


def uniform_map(*, quick: bool = False, preset: str = "default", d: Optional[int] = None,
                rho: Optional[float] = None, H: Optional[float] = None,
                radii: Optional[Sequence[float]] = None, n_values: Optional[Sequence[int]] = None,
                k: Optional[int] = None, n_random_probes: Optional[int] = None, seed: int = 0,
                device: str = "cpu", dtype="float64", max_scores: int = theory.MAX_SCORES) -> Result:
    """Result 1: ``sup_{||x|| <= R} ||Gamma_{mu_n}(x) - Gamma_mu(x)||_2`` against n, for several R.

    Tokens ``mu = N(0, rho I_d)``; A a fixed random matrix (seed) rescaled to horizon ``H``;
    V = I.  Reference: the exact limit ``Gamma_mu(x) = Sigma A x`` (:func:`theory.gaussian_map`).
    The sup is estimated as the max over :func:`probe_points` (centre, axes, the top tilt
    direction, fixed random points on the sphere of radius R); each replicate draws n fresh keys and
    all radii share them (common random numbers).  Error bars: std/sqrt(k) of that max.
    Fit rows carry the slope (expected -1/2), ``C = exp(intercept)`` (the constant C(R) of
    ``err ~ C(R)/sqrt(n)``) and ``C_pred``, the [DERIVED] delta-method constant
    (:func:`theory.map_error_constant`) maximised over the probes.
    """
    t0 = time.perf_counter()
    cfg = _preset(UNIFORM_MAP_PRESETS, quick, preset, d=d, rho=rho, H=H, radii=radii, n_values=n_values, k=k,
                  n_random_probes=n_random_probes)
    d = theory.check_positive_int(cfg["d"], "d")
    rho = theory.check_scale(cfg["rho"], "rho")
    Hval = theory.check_scale(cfg["H"], "H")
    radii = grid_values(cfg["radii"], "radius")
    n_values = grid_values(cfg["n_values"], "n", integer=True)
    k = theory.check_positive_int(cfg["k"], "k")
    device, dt = check_device(device), as_dtype(dtype)

    Sigma = rho * torch.eye(d, dtype=torch.float64)
    m = torch.zeros(d, dtype=torch.float64)
    g = mc.make_generator(seed)
    A0 = torch.randn(d, d, dtype=torch.float64, generator=g)
    h0 = theory.horizon(A0, Sigma)
    A = A0 * (Hval / h0) if h0 > 0 else A0 * 0
    probes, labels = [], []
    for R in radii:
        p, lab = probe_points(d, R, A, Sigma, n_random=int(cfg["n_random_probes"]), seed=seed + 1)
        probes.append(p)
        labels.append(lab)
    P = probes[0].shape[0]
    X_all = torch.cat(probes)                                   # [len(radii) * P, d]
    exact = theory.gaussian_map(X_all, m, Sigma, A)                 # [len(radii) * P, d]
    C_pred = theory.map_error_constant(X_all, m, Sigma, A).reshape(len(radii), P).max(dim=1).values
    tilt = (X_all @ A.T @ theory.sqrtm_psd(Sigma)).norm(dim=-1).reshape(len(radii), P).max(dim=1).values

    Xq, Ad, ex = X_all.to(device, dt), A.to(device, dt), exact.to(device, dt)
    rows = []
    for n in n_values:
        gen = mc.make_generator(mc.derive_seed(seed, n), device)
        b = max(1, min(k, max_scores // max(1, n * X_all.shape[0])))
        sups, done = [], 0
        while done < k:
            bb = min(b, k - done)
            keys = math.sqrt(rho) * torch.randn(bb, n, d, generator=gen, dtype=dt, device=device)
            out = theory.attention_map(Xq, keys, Ad, max_scores=max_scores)       # [bb, R*P, d]
            err = (out - ex).norm(dim=-1).reshape(bb, len(radii), P)
            sups.append(err.max(dim=-1).values.to(torch.float64).cpu())       # [bb, radii]
            done += bb
        sup = torch.cat(sups).numpy()                                         # [k, radii]
        for j, R in enumerate(radii):
            e = sup[:, j]
            std = float(e.std(ddof=1)) if k > 1 else 0.0
            rows.append({"kind": "point", "R": R, "n": n, "err_mean": float(e.mean()), "err_std": std,
                         "err_se": std / math.sqrt(k), "k": k})
    for j, R in enumerate(radii):
        fit = _fit_row([r for r in rows if r["kind"] == "point" and r["R"] == R])
        rows.append({"kind": "fit", "R": R, **fit, "C": math.exp(fit["intercept"]),
                     "C_pred": float(C_pred[j]), "max_tilt": float(tilt[j]), "k": k})
    prov = provenance(
        experiment="uniform_map", paper=PAPER, result="1 (uniform convergence on a ball)",
        tokens=f"N(0, rho I_d), d={d}, rho={rho}", A=f"random N(0,1) matrix (seed {seed}) rescaled to H={Hval}",
        V="identity", horizon=Hval, reference="exact limit Gamma(x) = Sigma A x (Gaussian closed form)",
        sup_estimate=("max over probe points per R: centre, +-R e_i, +-R top right-singular vector of "
                      f"Sigma^1/2 A, {cfg['n_random_probes']} fixed random points on the sphere of radius R "
                      f"(seed {seed + 1}); E[max] over k replicates"),
        common_random_numbers="all radii share each replicate's keys", radii=radii, n_values=n_values, k=k,
        seed=seed, seeds=f"keys for each n from derive_seed({seed}, n)", error_bars=ERROR_BARS, fit=FIT,
        temperature_convention=theory.TEMPERATURE_CONVENTION, dtype=str(dt), device=device,
        max_scores=max_scores, preset="quick" if quick else preset, torch_threads=torch.get_num_threads(),
        runtime_s=round(time.perf_counter() - t0, 3))
    return Result("tsc_uniform_map", rows, prov)


# ==================================================================================================
# 2. convergence of the moments of the output distribution (Gaussian tokens)
# ==================================================================================================

MOMENT_PRESETS = {
    # the authors' README "paper parameters" (experiments/gaussian): heavy (hours on a CPU)
    "paper": dict(d=50, rho=0.1, scales=tuple(np.geomspace(0.05, 50, 12)),
                  n_values=tuple(np.geomspace(1000, 30000, 12).astype(int)), k=200,
                  reference="both", n_ref=100_000, seed=42),
    # ~12 s on 2 CPU cores: the paper's setting and scales (every other one), smaller n and k
    "default": dict(d=50, rho=0.1, scales=tuple(np.geomspace(0.05, 50, 12)[1::2]),
                    n_values=(128, 256, 512, 1024, 2048), k=24, reference="exact", n_ref=20_000, seed=0),
    "quick": dict(d=8, rho=0.1, scales=(1.0, 30.0), n_values=(64, 128, 256), k=4, reference="both",
                  n_ref=1024, seed=0),
}


def moment_convergence(*, quick: bool = False, preset: str = "default", d: Optional[int] = None,
                       rho: Optional[float] = None, scales: Optional[Sequence[float]] = None,
                       n_values: Optional[Sequence[int]] = None, k: Optional[int] = None,
                       reference: Optional[str] = None, n_ref: Optional[int] = None,
                       seed: Optional[int] = None, cov_norm: str = "fro", device: str = "cpu",
                       dtype="float32", max_scores: int = theory.MAX_SCORES) -> Result:
    """Result 2: mean and covariance errors of the self-attention output of n Gaussian tokens.

    The authors' setting (``preset="paper"``, the authors' code): ``mu = N(0, rho I_d)``; W_q, W_k, W_v
    i.i.d. N(0, 1/d) drawn once; for each scale s, ``W_q, W_k <- sqrt(s) W`` and softmax temperature
    1/sqrt(d), so in our convention ``A = s W_k^T W_q / sqrt(d)``.  For each scale and n, k replicates
    of n fresh tokens; errors ``||m_n - m_ref||_2`` and ``||C_n - C_ref||_F`` (``cov_norm``).

    reference: ``"exact"`` (closed form m = 0, C = W_v Sigma A Sigma A^T Sigma W_v^T),
    ``"sample"`` (the authors' one fresh draw of ``n_ref`` tokens per scale) or ``"both"`` (both, from
    the same Monte Carlo draws).  Fit rows carry |beta| = -slope and beta(H) for our H (temperature
    in A) and for the authors' H (without it, sqrt(d) times larger).
    """
    t0 = time.perf_counter()
    cfg = _preset(MOMENT_PRESETS, quick, preset, d=d, rho=rho, scales=scales, n_values=n_values, k=k,
                  reference=reference, n_ref=n_ref, seed=seed)
    d = theory.check_positive_int(cfg["d"], "d")
    rho = theory.check_scale(cfg["rho"], "rho")
    scales = grid_values(cfg["scales"], "scale")
    n_values = grid_values(cfg["n_values"], "n", integer=True)
    k = theory.check_positive_int(cfg["k"], "k")
    seed = int(cfg["seed"])
    ref_kind = cfg["reference"]
    if ref_kind not in ("exact", "sample", "both"):
        raise ValueError(f"reference must be 'exact', 'sample' or 'both', got {ref_kind!r}")
    n_ref = theory.check_positive_int(cfg["n_ref"], "n_ref")
    device, dt = check_device(device), as_dtype(dtype)

    Sigma = rho * torch.eye(d, dtype=torch.float64)
    m = torch.zeros(d, dtype=torch.float64)
    Wq, Wk, Wv = random_weights(d, seed, 1.0 / math.sqrt(d))
    base = Wk.T @ Wq
    sd = math.sqrt(rho)

    def draw(n, b, gen):
        return sd * torch.randn(b, n, d, generator=gen, dtype=dt, device=device)

    rows = []
    for i, s in enumerate(scales):
        A = s * base / math.sqrt(d)
        H = theory.horizon(A, Sigma)
        H_auth = theory.horizon(s * base, Sigma)
        refs = {}
        if ref_kind in ("exact", "both"):
            refs["exact"] = theory.gaussian_output_moments(m, Sigma, A, Wv)
        if ref_kind in ("sample", "both"):
            refs["sample"] = mc.empirical_reference(
                lambda n, gen: sd * torch.randn(n, d, generator=gen, dtype=torch.float64, device=device),
                A, Wv, n_ref=n_ref, seed=mc.derive_seed(seed, 7, i), device=device, max_scores=max_scores)
        pts = mc.mc_moment_errors(draw, A, Wv, n_values, k, refs, cov_norm=cov_norm,
                                  seed=mc.derive_seed(seed, i), device=device, dtype=dt, max_scores=max_scores)
        common = {"scale": s, "horizon": H, "horizon_authors": H_auth}
        rows += [{"kind": "point", **common, **p} for p in pts]
        for r in refs:
            for mom in ("mean", "cov"):
                fit = _fit_row([p for p in pts if p["reference"] == r and p["moment"] == mom])
                rows.append({"kind": "fit", **common, "reference": r, "moment": mom, **fit,
                             "ref_norm": _ref_norm(refs[r], mom, cov_norm),
                             "beta_ref": theory.beta_reference(H), "beta_ref_authors": theory.beta_reference(H_auth),
                             "k": k})
    prov = provenance(
        experiment="moment_convergence", paper=PAPER, result="2 (moments of the output distribution)",
        preset="quick" if quick else preset, tokens=f"N(0, rho I_d), d={d}, rho={rho}",
        weights=f"W_q, W_k, W_v i.i.d. N(0, 1/d) from seed {seed}; W_q, W_k <- sqrt(scale) W",
        A="scale * W_k^T W_q / sqrt(d)", scales=scales, n_values=n_values, k=k, seed=seed,
        seeds=f"scale i, size n: tokens from derive_seed(derive_seed({seed}, i), n); sample reference "
              f"from derive_seed({seed}, 7, i)",
        reference=ref_kind, n_ref=n_ref if ref_kind != "exact" else None,
        exact_reference="m = V(m + Sigma A m) = 0, C = V Sigma A Sigma A^T Sigma V^T [DERIVED closed form]",
        sample_reference="authors' protocol: one fresh draw of n_ref tokens per scale, self-attention moments",
        cov_norm=cov_norm, error_bars=ERROR_BARS, fit=FIT, beta_reference="1/(2(1+H^2)), the authors' "
        "reference curve as encoded in their plotting code", temperature_convention=theory.TEMPERATURE_CONVENTION,
        horizon="horizon = ours (A with temperature); horizon_authors = ||Sigma^1/2 (s W_k^T W_q) Sigma^1/2||_2",
        dtype=str(dt), moments_dtype="float64", device=device, max_scores=max_scores,
        torch_threads=torch.get_num_threads(), runtime_s=round(time.perf_counter() - t0, 3))
    return Result("tsc_moment_convergence", rows, prov)


# ==================================================================================================
# 3. the hardmax regime: uniform sphere at very large scale
# ==================================================================================================

HARDMAX_PRESETS = {
    # the authors' sphere run (experiments/uniform_sphere_d50, README): heavy
    "paper": dict(d=50, radius=1.0, scales=tuple(np.geomspace(10, 1e5, 12)),
                  n_values=tuple(np.geomspace(1e4, 1e5, 12).astype(int)), k=200, n_dirichlet=1_000_000, seed=42),
    "default": dict(d=50, radius=1.0, scales=(1.0, 10.0, 1000.0), n_values=(256, 512, 1024, 2048, 4096),
                    k=8, n_dirichlet=200_000, seed=0),
    "quick": dict(d=16, radius=1.0, scales=(1.0, 100.0), n_values=(64, 128, 256, 512), k=3,
                  n_dirichlet=20_000, seed=0),
}


def hardmax(*, quick: bool = False, preset: str = "default", d: Optional[int] = None,
            radius: Optional[float] = None, scales: Optional[Sequence[float]] = None,
            n_values: Optional[Sequence[int]] = None, k: Optional[int] = None,
            n_dirichlet: Optional[int] = None, seed: Optional[int] = None, reference: str = "exact",
            n_ref: int = 20_000, cov_norm: str = "spectral", device: str = "cpu", dtype="float32",
            max_scores: int = theory.MAX_SCORES) -> Result:
    """Result 3: the softmax near a hardmax (tokens uniform on the sphere, huge attention scale).

    The authors' sphere setting (the authors' code): tokens uniform on S^{d-1}(radius); G_q, G_k, G_v
    i.i.d. N(0, 1) drawn once; ``W_q, W_k <- s G``, ``W_v = G_v`` and temperature 1/sqrt(d), so
    ``A = s^2 G_k^T G_q / sqrt(d)``.  Reference ``"exact"``: mean 0 and the Bessel/Dirichlet covariance
    (:func:`theory.sphere_output_moments`, Monte Carlo over the Dirichlet with ``n_dirichlet`` samples
    when d > 6); ``"sample"``/``"both"`` add the authors' large-sample reference (n_ref tokens).
    Errors: mean (L2) and covariance (``cov_norm``, spectral as the authors).  Fit rows add a
    quadratic-in-log-n fit (curvature > 0: bends away from a power law) and the first/last local slopes.
    """
    t0 = time.perf_counter()
    cfg = _preset(HARDMAX_PRESETS, quick, preset, d=d, radius=radius, scales=scales, n_values=n_values, k=k,
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

    Gq, Gk, Gv = random_weights(d, seed, 1.0)
    base = Gk.T @ Gq
    Sigma = (R ** 2 / d) * torch.eye(d, dtype=torch.float64)

    def draw(n, b, gen):
        return mc.sample_sphere(n, d, radius=R, batch=(b,), generator=gen, dtype=dt, device=device)

    rows, ref_info = [], []
    for i, s in enumerate(scales):
        A = s ** 2 * base / math.sqrt(d)
        H = theory.horizon(A, Sigma)
        H_auth = theory.horizon(s ** 2 * base, Sigma)
        refs = {}
        if reference in ("exact", "both"):
            mean, cov, info = theory.sphere_output_moments(A, Gv, radius=R, n_mc=int(cfg["n_dirichlet"]),
                                                       seed=mc.derive_seed(seed, 11, i), return_info=True)
            refs["exact"] = (mean, cov)
            ref_info.append({"scale": s, **{kk: v for kk, v in info.items() if kk != "lambda_se"},
                             "max_lambda_se": max(info.get("lambda_se", [0.0]))})
        if reference in ("sample", "both"):
            refs["sample"] = mc.empirical_reference(
                lambda n, gen: mc.sample_sphere(n, d, radius=R, generator=gen, device=device),
                A, Gv, n_ref=n_ref, seed=mc.derive_seed(seed, 7, i), device=device, max_scores=max_scores)
        pts = mc.mc_moment_errors(draw, A, Gv, n_values, k, refs, cov_norm=cov_norm,
                                  seed=mc.derive_seed(seed, i), device=device, dtype=dt, max_scores=max_scores)
        common = {"scale": s, "horizon": H, "horizon_authors": H_auth}
        rows += [{"kind": "point", **common, **p} for p in pts]
        for r in refs:
            for mom in ("mean", "cov"):
                sel = sorted([p for p in pts if p["reference"] == r and p["moment"] == mom], key=lambda p: p["n"])
                fit = _fit_row(sel)
                extra = {}
                ns, es = [p["n"] for p in sel], [p["err_mean"] for p in sel]
                if len(sel) >= 4:
                    cf = mc.fit_loglog_curvature(ns, es, [p["err_std"] for p in sel], k)
                    extra = {"curvature": cf["curvature"], "curvature_se": cf["curvature_se"]}
                if len(sel) >= 2:
                    ls = mc.local_slopes(ns, es)
                    extra.update(local_slope_first=float(ls[0]), local_slope_last=float(ls[-1]))
                rows.append({"kind": "fit", **common, "reference": r, "moment": mom, **fit, **extra,
                             "ref_norm": _ref_norm(refs[r], mom, cov_norm),
                             "beta_ref": theory.beta_reference(H), "k": k})
    prov = provenance(
        experiment="hardmax", paper=PAPER, result="3 (hardmax regime, logarithmic rate)",
        preset="quick" if quick else preset, tokens=f"uniform on the sphere of radius {R} in d={d}",
        weights=f"G_q, G_k, G_v i.i.d. N(0,1) from seed {seed}; W_q, W_k <- scale * G, W_v = G_v",
        A="scale^2 G_k^T G_q / sqrt(d)", scales=scales, n_values=n_values, k=k, seed=seed,
        seeds=f"scale i, size n: tokens from derive_seed(derive_seed({seed}, i), n); Dirichlet Monte Carlo "
              f"from derive_seed({seed}, 11, i)",
        reference=reference, exact_reference="mean 0; covariance W_v U diag(lambda) U^T W_v^T with the "
        "Bessel-ratio/Dirichlet formula [CODE]", exact_reference_numerics=ref_info,
        n_dirichlet=int(cfg["n_dirichlet"]), n_ref=n_ref if reference != "exact" else None, cov_norm=cov_norm,
        error_bars=ERROR_BARS, fit=FIT + "; curvature: quadratic fit in centred log n with the same weights",
        temperature_convention=theory.TEMPERATURE_CONVENTION, dtype=str(dt), moments_dtype="float64",
        device=device, max_scores=max_scores, torch_threads=torch.get_num_threads(),
        runtime_s=round(time.perf_counter() - t0, 3))
    return Result("tsc_hardmax", rows, prov)


# ==================================================================================================
# 4. a real pretrained encoder
# ==================================================================================================

REAL_PRESETS = {
    # the authors' BERT run used n = geomspace(64, 384, 10), k = 500 on bert-base-uncased
    "paper": dict(n_values=tuple(np.geomspace(64, 384, 10).astype(int)), k=500),
    "default": dict(n_values=(64, 96, 144, 216, 324), k=32),
    "quick": dict(n_values=(8, 16, 32), k=4),
}


def _self_attention_module(hf, layer: int):
    """``encoder.layer[layer].attention.self`` of a BERT-family model (bare or with a head)."""
    for root in (hf, getattr(hf, "base_model", None), getattr(hf, "bert", None)):
        enc = getattr(root, "encoder", None) if root is not None else None
        if enc is not None and hasattr(enc, "layer"):
            return enc.layer[layer].attention.self
    raise ValueError(f"{type(hf).__name__} has no encoder.layer[i].attention.self: real_encoder supports "
                     "BERT-family encoders (query/key/value Linear layers)")


def multihead_self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, *,
                             max_scores: int = theory.MAX_SCORES) -> torch.Tensor:
    """Bidirectional multi-head attention on captured projections: q, k, v ``[..., head, n, e]``
    -> head outputs concatenated ``[..., n, head * e]`` (the "context layer", before the output
    projection, no mask)."""
    out = theory.attend(q, k, v, scale=scaling, max_scores=max_scores)       # [..., head, n, e]
    out = out.transpose(-3, -2)                                           # [..., n, head, e]
    return out.reshape(*out.shape[:-2], -1)


def real_encoder(model="minilm", *, quick: bool = False, preset: str = "default",
                 ids: Optional[torch.Tensor] = None, text: Optional[str] = None, corpus: str = "wikitext2",
                 L: Optional[int] = None, offset: int = 0, layers: Optional[Sequence[int]] = None,
                 n_values: Optional[Sequence[int]] = None, k: Optional[int] = None, seed: int = 0,
                 eps: float = 0.0, cov_norm: str = "fro", device: str = "cpu", dtype="float32",
                 max_scores: int = theory.MAX_SCORES) -> Result:
    """Token sample complexity of a pretrained encoder's self-attention, per layer.

    Protocol (the authors' BERT experiment, the authors' code, on attnlab's model and text):
    one window of L tokens (default the model's max positions; WikiText-2 test text unless `text`
    or `ids` are given) is captured once (q, k, v per head after projection, biases included; the
    layer inputs).  For each layer, the reference is the multi-head self-attention output of the
    full L-token sequence (heads concatenated, before the output projection): its mean and
    covariance over the L output tokens (a bootstrap-like target, paper 2 G6 of the appendix).  For each n, k subsamples
    of n token positions drawn i.i.d. *with replacement* from the L positions; attention is
    recomputed on the subsample from those tokens' captured q, k, v (same temperature
    ``trace.scaling``); errors of the output mean (L2) and covariance (``cov_norm``).

    Horizon per layer: ``Sigma`` = population covariance of the layer-input tokens (all L), plus
    ``eps I``; ``A = scaling * W_k^T W_q = scaling * sum_h W_{k,h}^T W_{q,h}`` from
    ``encoder.layer[l].attention.self.query/key`` weights (biases ignored, as the authors);
    ``horizon_authors`` omits ``scaling`` (the authors' code).

    ``model``: a name for :func:`attnlab.core.models.load_model` or an object with ``hf``, ``name``,
    ``max_positions``, ``capture(ids, keep=...)`` and ``window(text, L, offset)``.  When ``ids``
    (token ids ``[L]``) are given, ``text``/``corpus``/``L``/``offset`` are not used.
    ``quick=True`` caps the window at 64 tokens and uses n = 8, 16, 32 with k = 4.
    """
    t0 = time.perf_counter()
    cfg = _preset(REAL_PRESETS, quick, preset, n_values=n_values, k=k)
    n_values = grid_values(cfg["n_values"], "n", integer=True)
    k = theory.check_positive_int(cfg["k"], "k")
    device, dt = check_device(device), as_dtype(dtype)
    if isinstance(model, str):
        from attnlab.core.models import load_model

        model = load_model(model, device=device)
    text_prov: dict = {}
    if ids is None:
        if text is None:
            from attnlab.core.text import load_corpus

            c = load_corpus(corpus)
            text, text_prov = c.text, c.provenance()
        else:
            text_prov = {"text": "user text", "text_sha256": hashlib.sha256(text.encode()).hexdigest()}
        L = int(L or model.max_positions)
        if quick:
            L = min(L, 64)
        ids = model.window(text, L, offset)
    ids = torch.as_tensor(ids).long()
    Lw = int(ids.numel())
    trace = model.capture(ids, keep=("q", "k", "v", "hidden"))
    scaling = float(trace.scaling)
    wanted = list(trace.layers) if layers is None else [int(l) for l in layers]
    missing = [l for l in wanted if l not in trace.layers]
    if missing:
        raise ValueError(f"layers {missing} not in the trace (layers {trace.layers})")

    rows = []
    for l in wanted:
        i = trace.layers.index(l)
        q, kk, v = (getattr(trace, nm)[i].to(device=device, dtype=dt) for nm in ("q", "k", "v"))   # [h, L, e]
        full = multihead_self_attention(q, kk, v, scaling, max_scores=max_scores)        # [L, h*e]
        ref = theory.output_moments(full)
        hid = trace.hidden[i].to(torch.float64)                                           # [L, d_model]
        cen = hid - hid.mean(0)
        Sigma = cen.T @ cen / hid.shape[0]
        attn = _self_attention_module(model.hf, l)
        Wq = attn.query.weight.detach().to("cpu", torch.float64)
        Wk = attn.key.weight.detach().to("cpu", torch.float64)
        A_raw = Wk.T @ Wq
        H = theory.horizon(scaling * A_raw, Sigma, eps=eps)
        H_auth = theory.horizon(A_raw, Sigma, eps=eps)
        nh, e = q.shape[0], q.shape[-1]
        for n in n_values:
            gen = mc.make_generator(mc.derive_seed(seed, l, n), device)
            idx = mc.subsample_iid(Lw, n, k, generator=gen, device=device)                 # [k, n]
            b = mc.replicate_batch(n, k, max_scores, device, heads=nh)
            em, ec = [], []
            for s in range(0, k, b):
                sub = idx[s:s + b]                                                          # [b, n]
                qs, ks, vs = (t[:, sub].transpose(0, 1) for t in (q, kk, v))                # [b, h, n, e]
                mean, cov = theory.output_moments(multihead_self_attention(qs, ks, vs, scaling, max_scores=max_scores))
                a, c = theory.moment_errors(mean, cov, *ref, cov_norm=cov_norm)
                em.append(a.cpu())
                ec.append(c.cpu())
            for mom, parts in (("mean", em), ("cov", ec)):
                err = torch.cat(parts).numpy()
                std = float(err.std(ddof=1)) if k > 1 else 0.0
                rows.append({"kind": "point", "layer": l, "horizon": H, "horizon_authors": H_auth,
                             "n": n, "moment": mom, "err_mean": float(err.mean()), "err_std": std,
                             "err_se": std / math.sqrt(k), "k": k})
        for mom in ("mean", "cov"):
            fit = _fit_row([r for r in rows if r["kind"] == "point" and r["layer"] == l and r["moment"] == mom])
            rows.append({"kind": "fit", "layer": l, "horizon": H, "horizon_authors": H_auth, "moment": mom,
                         **fit, "beta_ref": theory.beta_reference(H), "beta_ref_authors": theory.beta_reference(H_auth),
                         "k": k, "n_heads": nh, "d_head": e})
    prov = provenance(
        experiment="real_encoder", paper=PAPER, result="2 on a real encoder (the authors' BERT protocol)",
        preset="quick" if quick else preset, model=getattr(model, "name", type(model).__name__),
        **({"model_info": model.provenance()} if hasattr(model, "provenance") else {}),
        **text_prov, trace_text_sha256=trace.text_sha256, window_tokens=Lw, offset=offset,
        token_ids_sha256=hashlib.sha256(ids.numpy().astype(np.int64).tobytes()).hexdigest(),
        layers=wanted, n_values=n_values, k=k, seed=seed,
        seeds=f"layer l, size n: subsample indices from derive_seed({seed}, l, n)",
        subsampling="n positions i.i.d. uniform WITH replacement from the L window tokens (as the authors)",
        reference="multi-head self-attention output of the full L-token window (mean, population covariance "
                  "over its L output tokens), heads concatenated before the output projection",
        recompute="attention recomputed on the subsample from the captured q, k, v (biases included) "
                  "with temperature trace.scaling",
        horizon_def="H = ||Sigma^1/2 A Sigma^1/2||_2, Sigma = population covariance of the layer inputs "
                    f"(+ eps I, eps={eps}), A = scaling * sum_h W_kh^T W_qh (biases ignored); "
                    "horizon_authors without scaling",
        scaling=scaling, cov_norm=cov_norm, error_bars=ERROR_BARS, fit=FIT,
        temperature_convention=theory.TEMPERATURE_CONVENTION, dtype=str(dt), moments_dtype="float64",
        device=device, max_scores=max_scores, torch_threads=torch.get_num_threads(),
        runtime_s=round(time.perf_counter() - t0, 3))
    return Result("tsc_real_encoder", rows, prov)
