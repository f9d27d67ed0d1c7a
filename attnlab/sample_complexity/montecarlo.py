"""Monte Carlo for the token sample complexity of attention (arXiv 2512.10656): seeded token
samplers, the finite empirical reference, log-log slope fits, and the moment errors of self-attention
on n tokens, vectorised over replicates. Conventions: `attnlab.sample_complexity.theory`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from attnlab.core.util import as_float64
from attnlab.sample_complexity.theory import (
    MAX_SCORES,
    check_positive_int,
    check_psd,
    check_scale,
    moment_errors,
    self_attention_moments,
    sqrtm_psd,
)

# --------------------------------------------------------------------------------------------------
# samplers
# --------------------------------------------------------------------------------------------------

def make_generator(seed: int, device="cpu") -> torch.Generator:
    """A torch.Generator on `device` seeded with `seed`."""
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int(seed))
    return g


def derive_seed(*parts: int) -> int:
    """Deterministic 63-bit seed from integers (numpy SeedSequence), for per-grid-point streams."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> 1)


def sample_gaussian(n: int, m, Sigma, *, batch: tuple = (), generator: Optional[torch.Generator] = None,
                    dtype=torch.float64, device="cpu") -> torch.Tensor:
    """``[*batch, n, d]`` i.i.d. tokens ~ N(m, Sigma) (Sigma PSD, singular allowed)."""
    n = check_positive_int(n, "n")
    S = check_psd(Sigma)
    m = as_float64(m)
    if m.ndim != 1 or m.shape[0] != S.shape[0]:
        raise ValueError(f"dimension mismatch: m has shape {tuple(m.shape)}, Sigma {tuple(S.shape)}")
    L = sqrtm_psd(S).to(dtype=dtype, device=device)
    z = torch.randn(*batch, n, S.shape[0], generator=generator, dtype=dtype, device=device)
    return z @ L.T + m.to(dtype=dtype, device=device)


def sample_sphere(n: int, d: int, *, radius: float = 1.0, batch: tuple = (),
                  generator: Optional[torch.Generator] = None, dtype=torch.float64,
                  device="cpu") -> torch.Tensor:
    """``[*batch, n, d]`` i.i.d. tokens uniform on the sphere of radius `radius` in R^d."""
    n, d = check_positive_int(n, "n"), check_positive_int(d, "d")
    radius = check_scale(radius, "radius")
    z = torch.randn(*batch, n, d, generator=generator, dtype=dtype, device=device)
    return radius * z / z.norm(dim=-1, keepdim=True)


def subsample_iid(n_total: int, n: int, k: int, *, generator: Optional[torch.Generator] = None,
                  device="cpu") -> torch.Tensor:
    """``[k, n]`` indices drawn i.i.d. uniformly *with replacement* from range(n_total)
    (the authors' BERT protocol)."""
    n_total, n, k = (check_positive_int(v, nm) for v, nm in ((n_total, "n_total"), (n, "n"), (k, "k")))
    return torch.randint(0, n_total, (k, n), generator=generator, device=device)



def empirical_reference(draw: Callable[[int, torch.Generator], torch.Tensor], A, V=None, *,
                        n_ref: int = 100_000, seed: int = 0, device="cpu",
                        max_scores: int = MAX_SCORES) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' large-sample reference: self-attention moments of ONE fresh draw of ``n_ref``
    tokens (float64, query-chunked so no n_ref x n_ref matrix is formed).  ``draw(n, generator)``
    returns ``[n, d]`` tokens.

    It is itself the n-token estimator at ``n = n_ref``, so its error has the same two parts as the
    estimates it is compared with, and they act differently (:func:`reference_decomposition`):

    - **mean**: for symmetric tokens (Gaussian N(0, Sigma), the sphere) the output mean is an odd
      function of the tokens, so ``E[m_n] = m`` exactly and the reference's error is independent
      fluctuation: ``E||m_n - m_ref||^2 = E||m_n - m||^2 + E||m_ref - m||^2``.  It **floors** the
      mean error curve (the fitted mean slope is shallower than against the exact limit).
    - **covariance**: ``C_n`` has a finite-n bias ``b(n) = E[C_n] - C`` and the reference carries the
      same bias ``b(n_ref)``, pointing the same way.  Subtracting it cancels part of the bias, most at
      the largest n, so where the bias dominates the error (large H) the reference does **not** floor
      the covariance error: it makes the fitted covariance slope *steeper* than against the exact limit
      (at small H the covariance error is fluctuation too, and is floored like the mean's).

    Compare with the exact limit where one exists."""
    n_ref = check_positive_int(n_ref, "n_ref")
    X = draw(n_ref, make_generator(seed, device)).to(torch.float64)
    return self_attention_moments(X, as_float64(A, device=X.device),
                                  None if V is None else as_float64(V, device=X.device), max_scores=max_scores)



# --------------------------------------------------------------------------------------------------
# log-log fits
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlopeFit:
    """``log err = intercept + slope * log n`` (natural logs): slope, its standard error and the
    intercept (``exp(intercept)`` is the constant C in ``err ~ C n^slope``)."""

    slope: float
    se: float
    intercept: float
    intercept_se: float
    n_points: int
    weighted: bool

    @property
    def beta(self) -> float:
        """|beta| = -slope."""
        return -self.slope


FIT_METHODS = ("wls", "ols")


def _loglog_design(n, err, err_std, k, degree: int, method: str = "wls"):
    n = np.asarray(n, dtype=np.float64).ravel()
    err = np.asarray(err, dtype=np.float64).ravel()
    if n.shape != err.shape:
        raise ValueError(f"n and err must have the same length, got {n.size} and {err.size}")
    if n.size < degree + 1:
        raise ValueError(f"need at least {degree + 1} points for a degree-{degree} log-log fit, got {n.size}")
    if np.any(n <= 0) or np.any(err <= 0) or not np.all(np.isfinite(err)):
        raise ValueError("log-log fit needs n > 0 and finite err > 0")
    if method not in FIT_METHODS:
        raise ValueError(f"fit method must be one of {FIT_METHODS}, got {method!r}")
    weighted = method == "wls" and err_std is not None and k is not None and int(k) >= 2
    if weighted:
        std = np.asarray(err_std, dtype=np.float64).ravel()
        var = np.maximum((std / math.sqrt(int(k)) / err) ** 2, 1e-18)
        w = 1.0 / var
    else:
        w = np.ones_like(n)
    return np.log(n), np.log(err), w, weighted


def _wls(X: np.ndarray, y: np.ndarray, w: np.ndarray):
    XtW = X.T * w
    G = XtW @ X
    coef = np.linalg.solve(G, XtW @ y)
    resid = y - X @ coef
    dof = X.shape[0] - X.shape[1]
    if dof <= 0:
        return coef, np.full((X.shape[1], X.shape[1]), np.nan)
    sigma2 = float((w * resid ** 2).sum() / dof)
    return coef, np.linalg.inv(G) * sigma2


def fit_loglog(n, err, err_std=None, k: Optional[int] = None, method: str = "wls") -> SlopeFit:
    """Least-squares fit of ``log err`` on ``log n``.  n, err, err_std: ``[points]``.

    ``method="wls"`` (default): weighted least squares as in the authors' ``src/tsc/fit.py`` [CODE],
    which they use for their Gaussian and BERT/BigBird runs: weights ``1 / var(log err)``,
    ``var(log err) ~ (err_std / sqrt(k) / err)^2`` (floored at 1e-18); the covariance of the
    coefficients is ``(X^T W X)^{-1}`` scaled by the weighted residual variance with
    ``dof = points - 2`` (se = nan with 2 points).  Without ``err_std`` and ``k >= 2`` it is OLS.

    ``method="ols"``: ordinary least squares whatever ``err_std`` says, as the authors' sphere run
    (``np.polyfit(log n, log err, 1, cov=True)`` in ``src/tsc/sphere.py`` [CODE]; same slope and se).
    """
    x, y, w, weighted = _loglog_design(n, err, err_std, k, 1, method)
    X = np.column_stack([np.ones_like(x), x])
    coef, cov = _wls(X, y, w)
    return SlopeFit(
        slope=float(coef[1]),
        se=float(np.sqrt(max(cov[1, 1], 0.0))) if np.isfinite(cov[1, 1]) else float("nan"),
        intercept=float(coef[0]),
        intercept_se=float(np.sqrt(max(cov[0, 0], 0.0))) if np.isfinite(cov[0, 0]) else float("nan"),
        n_points=int(x.size),
        weighted=weighted,
    )


def fit_loglog_curvature(n, err, err_std=None, k: Optional[int] = None, method: str = "wls") -> dict:
    """Quadratic fit ``log err = c0 + c1 u + c2 u^2`` with ``u = log n - mean(log n)`` (same weights
    as :func:`fit_loglog`; ``method``: "wls" or "ols" as there).  A power law has c2 = 0; a decay
    slower than any power law over the range (e.g. ``(log n)^-a``) bends upward: c2 > 0.  Returns
    slope_mid (= c1, the slope at the centre), curvature (= c2) and their standard errors (needs >= 4
    points for the se)."""
    x, y, w, weighted = _loglog_design(n, err, err_std, k, 2, method)
    u = x - x.mean()
    X = np.column_stack([np.ones_like(u), u, u**2])
    coef, cov = _wls(X, y, w)
    se = np.sqrt(np.clip(np.diag(cov), 0, None))
    return {
        "slope_mid": float(coef[1]),
        "slope_mid_se": float(se[1]),
        "curvature": float(coef[2]),
        "curvature_se": float(se[2]),
        "weighted": weighted,
    }


def local_slopes(n, err) -> np.ndarray:
    """Slopes between consecutive points, ``diff(log err) / diff(log n)`` ``[points - 1]``."""
    x, y = np.log(np.asarray(n, dtype=np.float64)), np.log(np.asarray(err, dtype=np.float64))
    return np.diff(y) / np.diff(x)


# --------------------------------------------------------------------------------------------------
# Monte Carlo engine (vectorised over replicates)
# --------------------------------------------------------------------------------------------------

#: replicate-batching budget on the CPU (score entries): batching many small problems saves python
#: and dispatch overhead, but batches of large n x n score matrices fall out of cache and run slower
#: than a loop (measured by attnlab.benchmarks.bench_monte_carlo on 2 cores).
CPU_BATCH_SCORES = 2**20


def replicate_batch(n: int, k: int, max_scores: int = MAX_SCORES, device="cpu", heads: int = 1) -> int:
    """Replicates processed together for n tokens: as many full ``heads x n x n`` score tensors as
    fit in the budget (``max_scores``, capped at ``CPU_BATCH_SCORES`` on the CPU); in [1, k]."""
    budget = max_scores if str(device).startswith("cuda") else min(max_scores, CPU_BATCH_SCORES)
    return max(1, min(int(k), budget // max(1, heads * n * n)))


def mc_moment_errors(
    draw: Callable[[int, int, torch.Generator], torch.Tensor],
    A,
    V,
    n_values: Sequence[int],
    k: int,
    references: dict,
    *,
    cov_norm: str = "fro",
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
    max_scores: int = MAX_SCORES,
    batch: Optional[int] = None,
) -> list[dict]:
    """Monte Carlo moment errors of self-attention on n tokens against one or more references.

    ``draw(n, b, generator)`` returns ``[b, n, d]`` tokens; for each n, ``k`` replicates are drawn in
    batches of ``batch`` (None: :func:`replicate_batch`) from a generator seeded with
    ``derive_seed(seed, n)``; attention runs in ``dtype``, moments in float64.
    ``references``: name -> (mean ``[d_out]``, cov ``[d_out, d_out]``).
    Returns one row per (n, reference, moment) with err_mean, err_std (ddof=1), err_se = std/sqrt(k).
    """
    k = check_positive_int(k, "k")
    A = as_float64(A, dtype=dtype, device=device)
    Vt = None if V is None else as_float64(V, dtype=dtype, device=device)
    rows = []
    for n in n_values:
        n = check_positive_int(n, "n")
        gen = make_generator(derive_seed(seed, n), device)
        b = replicate_batch(n, k, max_scores, device) if batch is None else check_positive_int(batch, "batch")
        errs = {(r, mom): [] for r in references for mom in ("mean", "cov")}
        done = 0
        while done < k:
            bb = min(b, k - done)
            X = draw(n, bb, gen).to(dtype=dtype, device=device)
            mean, cov = self_attention_moments(X, A, Vt, max_scores=max_scores)
            for r, (rm, rc) in references.items():
                em, ec = moment_errors(mean, cov, rm, rc, cov_norm=cov_norm)
                errs[(r, "mean")].append(em.cpu())
                errs[(r, "cov")].append(ec.cpu())
            done += bb
        for (r, mom), parts in errs.items():
            e = torch.cat(parts).numpy()
            std = float(e.std(ddof=1)) if k > 1 else 0.0
            rows.append(
                {
                    "n": n,
                    "reference": r,
                    "moment": mom,
                    "err_mean": float(e.mean()),
                    "err_std": std,
                    "err_se": std / math.sqrt(k),
                    "k": k,
                }
            )
    return rows


def mc_moment_samples(
    draw: Callable[[int, int, torch.Generator], torch.Tensor],
    A,
    V,
    n: int,
    k: int,
    *,
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
    max_scores: int = MAX_SCORES,
    batch: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k replicate moments behind :func:`mc_moment_errors` for one n (same generator
    ``derive_seed(seed, n)`` and batches, hence the same draws): means ``[k, f]`` and covariances
    ``[k, f, f]`` (float64, cpu)."""
    k, n = check_positive_int(k, "k"), check_positive_int(n, "n")
    A = as_float64(A, dtype=dtype, device=device)
    Vt = None if V is None else as_float64(V, dtype=dtype, device=device)
    gen = make_generator(derive_seed(seed, n), device)
    b = replicate_batch(n, k, max_scores, device) if batch is None else check_positive_int(batch, "batch")
    means, covs, done = [], [], 0
    while done < k:
        bb = min(b, k - done)
        X = draw(n, bb, gen).to(dtype=dtype, device=device)
        mean, cov = self_attention_moments(X, A, Vt, max_scores=max_scores)
        means.append(mean.cpu())
        covs.append(cov.cpu())
        done += bb
    return torch.cat(means), torch.cat(covs)


def reference_decomposition(means, covs, exact: tuple, ref: tuple) -> dict:
    """How a finite reference changes the mean squared error of the moments (L2 / Frobenius).

    means ``[k, f]``, covs ``[k, f, f]``: k replicate estimates at one n; ``exact`` and ``ref``:
    (mean, cov) of the true limit and of a finite reference.  For each moment X with limit X*,
    replicate average Xbar and reference X_ref, the algebraic identity (exact for the k replicates)

        mean_k ||X - X_ref||^2 = mean_k ||X - X*||^2 + ||X_ref - X*||^2 - 2 <Xbar - X*, X_ref - X*>

    splits the change into the reference's own squared error (``ref_dev2``, adds: a floor) and the
    ``cross`` term (removes where the estimator's bias ``Xbar - X*`` and the reference's error point
    the same way).  Returns ``{"mean": {...}, "cov": {...}}`` with mse_exact, mse_sample, ref_dev2,
    cross, bias2 = ||Xbar - X*||^2, var = mse_exact - bias2 (spread around Xbar), bias_noise2 =
    var / (k - 1) (what ||Xbar - X*||^2 would be with no bias), cos = the cosine of the angle between
    ``Xbar - X*`` and ``X_ref - X*``, and k."""
    out = {}
    k = int(means.shape[0])
    for mom, est, ex, rf in (("mean", means, exact[0], ref[0]), ("cov", covs, exact[1], ref[1])):
        est = est.to(torch.float64).reshape(k, -1)
        ex = as_float64(ex).reshape(-1)
        rf = as_float64(rf).reshape(-1)
        bias = est.mean(0) - ex
        dev = rf - ex
        mse_exact = float(((est - ex) ** 2).sum(-1).mean())
        bias2 = float(bias @ bias)
        var = mse_exact - bias2
        cross = float(bias @ dev)
        nb, nd = math.sqrt(bias2), float(dev.norm())
        out[mom] = {
            "mse_exact": mse_exact,
            "mse_sample": float(((est - rf) ** 2).sum(-1).mean()),
            "ref_dev2": nd ** 2,
            "cross": cross,
            "bias2": bias2,
            "var": var,
            "bias_noise2": var / (k - 1) if k > 1 else float("nan"),
            "cos": cross / (nb * nd) if nb > 0 and nd > 0 else float("nan"),
            "k": k,
        }
    return out
