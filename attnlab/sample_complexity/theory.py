"""Token sample complexity of attention: attention as a map on measures, its exact infinite-token
limits, and the horizon (Monte Carlo and slope fits: `montecarlo`).

Paper: Bohbot, Letrouit, Peyre, Vialard, "Token Sample Complexity of Attention" (arXiv 2512.10656).
Only the abstract of the paper was available; formulas below say where they come from:
[CODE] = the authors' released code, [DERIVED] = a reconstruction made for attnlab (checked
numerically in tests/test_sample_complexity.py, not vouched for by the paper).

Conventions (used by every function here)
-----------------------------------------
tokens ``X``        ``[..., n, d]``; leading axes are Monte Carlo replicates (batch).
bilinear form ``A`` ``[d, d]``; the score of query ``x`` against key ``y`` is ``<A x, y> = y^T A x``.
                    **A includes the softmax temperature** (appendix "How we read the papers", paper 2
                    G3): for projection weights
                    ``W_q, W_k`` (``[d_head, d]``) and temperature ``1/sqrt(d_head)``,
                    ``A = W_k^T W_q / sqrt(d_head)`` (see :func:`bilinear_form`).  The authors' code
                    computes the horizon on ``W_k^T W_q`` *without* the temperature, i.e. a value
                    ``sqrt(d_head)`` times ours; experiments record both.
value map ``V``     ``[d_out, d]``; a key ``y`` contributes the value ``V y`` (``V=None``: identity).
empirical map       ``Gamma_{mu_n}(x) = sum_i softmax_i(<A x, y_i>) V y_i`` (softmax attention).
self-attention      the n tokens attend to themselves: the pushforward ``(Gamma_{mu_n})_# mu_n``.
moments             mean ``m = E[z]`` and population covariance ``C = E[z z^T] - m m^T`` (divide by n).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from attnlab.core.util import as_float64

TEMPERATURE_CONVENTION = (
    "A = W_k^T W_q * temperature, temperature = 1/sqrt(d_head) included in A (scores <A x, y>); "
    "H = ||Sigma^1/2 A Sigma^1/2||_2 on that A. The authors' code omits the temperature in H "
    "(H_authors = sqrt(d_head) * H)."
)

#: default budget of score entries held at once (batch x query-chunk x keys); 2**22 = 32 MiB in float64.
MAX_SCORES = 2 ** 22

Tensorish = "torch.Tensor | np.ndarray | Sequence[float] | float"


# --------------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------------

def check_positive_int(value, name: str) -> int:
    """Return int(value) or raise ValueError when it is not an integer >= 1."""
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_scale(value, name: str = "scale") -> float:
    """Return float(value) or raise ValueError when it is negative or not finite."""
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def check_psd(Sigma, name: str = "Sigma", *, tol: float = 1e-8) -> torch.Tensor:
    """Sigma as a float64 tensor ``[d, d]``; ValueError unless square, symmetric and positive
    semi-definite (smallest eigenvalue >= -tol * largest |eigenvalue|)."""
    S = as_float64(Sigma, device="cpu")
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"{name} must be a square [d, d] matrix, got shape {tuple(S.shape)}")
    if not torch.isfinite(S).all():
        raise ValueError(f"{name} has non-finite entries")
    scale = float(S.abs().max()) if S.numel() else 0.0
    if float((S - S.T).abs().max()) > 1e-6 * max(scale, 1e-300):
        raise ValueError(f"{name} must be symmetric (a covariance matrix)")
    lam = torch.linalg.eigvalsh(0.5 * (S + S.T))
    lam_min, lam_abs = float(lam.min()), float(lam.abs().max())
    if lam_min < -tol * max(lam_abs, 1e-300):
        raise ValueError(f"{name} must be positive semi-definite; its smallest eigenvalue is "
                         f"{lam_min:.3g} < 0 (pass a covariance matrix, e.g. X.T @ X / n)")
    return 0.5 * (S + S.T)


def _check_square(A, d: int, name: str = "A") -> None:
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"{name} must be a square [d, d] matrix, got shape {tuple(A.shape)}")
    if A.shape[0] != d:
        raise ValueError(f"dimension mismatch: {name} is {tuple(A.shape)} but tokens have d={d}")


def _check_value_map(V, d: int) -> None:
    if V is not None and (V.ndim != 2 or V.shape[1] != d):
        raise ValueError(f"dimension mismatch: V must be [d_out, d={d}], got shape {tuple(V.shape)}")


def sqrtm_psd(Sigma) -> torch.Tensor:
    """Symmetric square root ``Sigma^{1/2}`` ``[d, d]`` (float64) of a PSD matrix (checked)."""
    S = check_psd(Sigma)
    lam, Q = torch.linalg.eigh(S)
    return (Q * lam.clamp_min(0).sqrt()) @ Q.T


# --------------------------------------------------------------------------------------------------
# attention on samples (empirical measures)
# --------------------------------------------------------------------------------------------------

def bilinear_form(W_q, W_k, temperature: Optional[float] = None) -> torch.Tensor:
    """``A = temperature * W_k^T W_q`` ``[d, d]`` (float64) from projections ``W_q, W_k``
    ``[d_head, d]`` (nn.Linear weight layout).  ``temperature=None`` uses ``1/sqrt(d_head)`` with
    ``d_head = W_q.shape[0]`` (single head).  For the row-stacked weights of all heads,
    ``W_k^T W_q = sum_h W_{k,h}^T W_{q,h}``; pass ``temperature=1/sqrt(d_head)`` explicitly."""
    Wq, Wk = as_float64(W_q), as_float64(W_k)
    if Wq.shape != Wk.shape or Wq.ndim != 2:
        raise ValueError(f"W_q and W_k must have the same [d_head, d] shape, got {tuple(Wq.shape)} "
                         f"and {tuple(Wk.shape)}")
    t = 1.0 / math.sqrt(Wq.shape[0]) if temperature is None else check_scale(temperature, "temperature")
    return t * (Wk.T @ Wq)


def auto_chunk(n_queries: int, n_keys: int, batch: int = 1, max_scores: int = MAX_SCORES) -> int:
    """Queries per block so that ``batch * chunk * n_keys <= max_scores`` (at least 1)."""
    return max(1, min(n_queries, max_scores // max(1, batch * n_keys)))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float = 1.0,
           chunk: Optional[int] = None, max_scores: int = MAX_SCORES) -> torch.Tensor:
    """Softmax attention ``softmax(scale * q k^T) v``, chunked over queries.

    q ``[..., m, e]``, k ``[..., n, e]``, v ``[..., n, f]`` (leading axes broadcast) -> ``[..., m, f]``.
    Each block holds at most ``batch * chunk * n`` scores (``chunk=None``: chosen from
    ``max_scores``); the softmax subtracts each row's max (log-sum-exp safe), so huge scores
    (hardmax regime) do not overflow.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"dimension mismatch: queries have e={q.shape[-1]}, keys e={k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"keys ({k.shape[-2]}) and values ({v.shape[-2]}) must have the same count")
    m, n = q.shape[-2], k.shape[-2]
    if n < 1:
        raise ValueError("attention needs at least one key (n >= 1)")
    batch = int(np.prod(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) or (1,)))
    c = auto_chunk(m, n, batch, max_scores) if chunk is None else check_positive_int(chunk, "chunk")
    kt = k.transpose(-1, -2)
    outs = []
    for s in range(0, m, c):
        scores = (q[..., s:s + c, :] @ kt) * scale          # [..., c, n]
        outs.append(torch.softmax(scores, dim=-1) @ v)      # [..., c, f]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def attention_map(x, tokens, A, V=None, *, chunk: Optional[int] = None,
                  max_scores: int = MAX_SCORES) -> torch.Tensor:
    """Empirical attention map ``Gamma_{mu_n}(x) = sum_i softmax_i(<A x, y_i>) V y_i``.

    x ``[..., m, d]`` queries, tokens ``[..., n, d]`` keys/values y_i, A ``[d, d]``,
    V ``[d_out, d]`` or None -> ``[..., m, d_out]`` (dtype and device of ``tokens``).
    """
    y = tokens
    if not isinstance(y, torch.Tensor):
        y = as_float64(y)
    x = as_float64(x, dtype=y.dtype, device=y.device)
    d = y.shape[-1]
    if y.shape[-2] < 1:
        raise ValueError("need n >= 1 tokens")
    if x.shape[-1] != d:
        raise ValueError(f"dimension mismatch: queries have d={x.shape[-1]}, tokens d={d}")
    A = as_float64(A, dtype=y.dtype, device=y.device)
    _check_square(A, d)
    vals = y
    if V is not None:
        V = as_float64(V, dtype=y.dtype, device=y.device)
        _check_value_map(V, d)
        vals = y @ V.T
    return attend(x @ A.T, y, vals, chunk=chunk, max_scores=max_scores)


def self_attention(tokens, A, V=None, *, chunk: Optional[int] = None,
                   max_scores: int = MAX_SCORES) -> torch.Tensor:
    """Self-attention output (the pushforward ``(Gamma_{mu_n})_# mu_n``): every token attends to
    the n tokens.  tokens ``[..., n, d]`` -> ``[..., n, d_out]``.  No residual, no output projection."""
    return attention_map(tokens, tokens, A, V, chunk=chunk, max_scores=max_scores)


def output_moments(Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean ``[..., f]`` and population covariance ``[..., f, f]`` (float64, symmetrised) of the
    rows of ``Y`` ``[..., n, f]``: ``C = Y^T Y / n - m m^T`` as in the authors' code."""
    Y = Y.to(torch.float64)
    n = Y.shape[-2]
    mean = Y.mean(dim=-2)
    cov = Y.transpose(-1, -2) @ Y / n - mean.unsqueeze(-1) * mean.unsqueeze(-2)
    return mean, 0.5 * (cov + cov.transpose(-1, -2))


def self_attention_moments(tokens, A, V=None, *, chunk: Optional[int] = None,
                           max_scores: int = MAX_SCORES) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean ``[..., d_out]`` and covariance ``[..., d_out, d_out]`` of the self-attention output of
    ``tokens`` ``[..., n, d]`` (the moments of nu_n = (Gamma_{mu_n})_# mu_n)."""
    return output_moments(self_attention(tokens, A, V, chunk=chunk, max_scores=max_scores))


def moment_errors(mean, cov, ref_mean, ref_cov, *, cov_norm: str = "fro"):
    """``||m - m_ref||_2`` ``[...]`` and ``||C - C_ref||`` ``[...]`` (``cov_norm``: "fro" as the
    authors' Gaussian/BERT runs, or "spectral" as their sphere run), float64."""
    dm = mean.to(torch.float64) - as_float64(ref_mean, device=mean.device)
    dc = cov.to(torch.float64) - as_float64(ref_cov, device=cov.device)
    err_m = torch.linalg.vector_norm(dm, ord=2, dim=-1)
    if cov_norm == "fro":
        err_c = torch.linalg.matrix_norm(dc, ord="fro")
    elif cov_norm == "spectral":
        err_c = torch.linalg.matrix_norm(dc, ord=2)
    else:
        raise ValueError(f"cov_norm must be 'fro' or 'spectral', got {cov_norm!r}")
    return err_m, err_c


# --------------------------------------------------------------------------------------------------
# exact infinite-token limits
# --------------------------------------------------------------------------------------------------

def gaussian_map(x, m, Sigma, A, V=None) -> torch.Tensor:
    """Exact limit for Gaussian tokens mu = N(m, Sigma): ``Gamma_mu(x) = V (m + Sigma A x)``.

    [DERIVED] (exponential tilting of N(m, Sigma) by exp(<A x, y>) is N(m + Sigma A x, Sigma); also
    stated by a citing paper).  x ``[..., d]`` -> ``[..., d_out]`` float64.
    """
    S = check_psd(Sigma)
    d = S.shape[0]
    A, m, x = as_float64(A, device="cpu"), as_float64(m, device="cpu"), as_float64(x, device="cpu")
    _check_square(A, d)
    if x.shape[-1] != d or m.shape != (d,):
        raise ValueError(f"dimension mismatch: x {tuple(x.shape)}, m {tuple(m.shape)}, Sigma {tuple(S.shape)}")
    out = m + x @ (S @ A).T
    if V is not None:
        V = as_float64(V, device="cpu")
        _check_value_map(V, d)
        out = out @ V.T
    return out


def gaussian_output_moments(m, Sigma, A, V=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact moments of nu = (Gamma_mu)_# mu for mu = N(m, Sigma) [DERIVED]:
    mean ``V (m + Sigma A m)`` ``[d_out]``, covariance ``V Sigma A Sigma A^T Sigma V^T`` ``[d_out, d_out]``."""
    S = check_psd(Sigma)
    d = S.shape[0]
    A, m = as_float64(A, device="cpu"), as_float64(m, device="cpu")
    _check_square(A, d)
    if m.shape != (d,):
        raise ValueError(f"dimension mismatch: m {tuple(m.shape)}, Sigma {tuple(S.shape)}")
    Vm = torch.eye(d, dtype=torch.float64) if V is None else as_float64(V, device="cpu")
    _check_value_map(Vm, d)
    B = Vm @ S @ A                               # [d_out, d]: the linear part of the map
    cov = B @ S @ B.T
    return Vm @ (m + S @ A @ m), 0.5 * (cov + cov.T)


#: scipy.special.ive (AMOS zbesi) returns NaN for arguments >= 2**30 (checked in
#: tests/test_sample_complexity.py on the installed scipy); :func:`bessel_ratio` switches to the
#: large-r expansion there.
IVE_MAX_ARG = 2.0 ** 30

BESSEL_GUARDS = ("attnlab", "authors")


def bessel_ratio(r, d: int, *, guard: str = "attnlab") -> np.ndarray:
    """``A_d(r) = I_{d/2}(r) / I_{d/2-1}(r)`` (mean resultant length of the von Mises-Fisher law on
    S^{d-1} with concentration r), via exponentially scaled Bessel functions ``scipy.special.ive``.
    Returns float64 ndarray.

    ``guard="attnlab"`` (default): the series ``r/d`` where the Bessel values underflow (r -> 0), and
    the large-r expansion ``1 - (d-1)/(2r) + (d-1)(d-3)/(8 r^2)`` where ``ive`` is NaN
    (``r >= IVE_MAX_ARG = 2**30``; the expansion agrees with ``ive`` to 1e-16 from r = 1e7 for d <= 50).

    ``guard="authors"``: the authors' ``A_d`` as their code computes it (src/tsc/_sphere_covariance.py
    [CODE]): 0 at r = 0 and **0 wherever |ive(d/2-1, r)| > 1e-300 fails**, which includes the NaN that
    ``ive`` returns for ``r >= 2**30``.  So their A_d drops from ~1 to 0 at r = 2**30: a bug, kept here
    only to reproduce their reference covariance (:func:`sphere_covariance_authors_guard`).
    """
    from scipy.special import ive

    d = check_positive_int(d, "d")
    if guard not in BESSEL_GUARDS:
        raise ValueError(f"guard must be one of {BESSEL_GUARDS}, got {guard!r}")
    r = np.asarray(r, dtype=np.float64)
    if np.any(r < 0):
        raise ValueError("bessel_ratio needs r >= 0")
    with np.errstate(all="ignore"):
        num, den = ive(d / 2.0, r), ive(d / 2.0 - 1.0, r)
        ratio = num / den
    if guard == "authors":
        safe = (r > 0) & (np.abs(den) > 1e-300)          # False for NaN: the authors' A_d is then 0
        return np.where(safe, ratio, 0.0)
    ok = (den > 1e-300) & (num > 0) & np.isfinite(ratio)
    with np.errstate(all="ignore"):
        big = 1.0 - (d - 1) / (2.0 * r) + (d - 1) * (d - 3) / (8.0 * r ** 2)
    fallback = np.where(r >= 1e3 * d, big, r / d)       # non-finite ive at large r, underflow at small r
    out = np.where(ok, ratio, fallback)
    return np.minimum(out, 1.0)


def sphere_map(x, A, V=None, *, radius: float = 1.0) -> torch.Tensor:
    """Exact limit for tokens uniform on the sphere S^{d-1}(radius) [CODE, checked in tests]:
    ``Gamma(x) = radius * A_d(radius ||A x||) * A x / ||A x||`` (von Mises-Fisher mean), then V.
    x ``[..., d]`` -> ``[..., d_out]`` float64; Gamma(x) = 0 where A x = 0."""
    radius = check_scale(radius, "radius")
    x = as_float64(x)
    A = as_float64(A, device=x.device)
    d = A.shape[-1]
    _check_square(A, d)
    if x.shape[-1] != d:
        raise ValueError(f"dimension mismatch: x has d={x.shape[-1]}, A is {tuple(A.shape)}")
    a = x @ A.T
    norm = a.norm(dim=-1, keepdim=True)
    kappa = (radius * norm).cpu().numpy()
    ratio = torch.as_tensor(bessel_ratio(kappa, d), dtype=torch.float64, device=a.device)
    out = radius * ratio * a / torch.where(norm > 0, norm, torch.ones_like(norm))
    if V is not None:
        V = as_float64(V, device=a.device)
        _check_value_map(V, d)
        out = out @ V.T
    return out


def _sphere_integrand(s2: np.ndarray, radius: float, d: int, guard: str = "attnlab") -> np.ndarray:
    """``A_d(R^2 sqrt(s2))^2 / s2`` with its s2 -> 0 limit ``R^4 / d^2`` (below 1e-300; the authors'
    code switches below 1e-30, reproduced with ``guard="authors"``)."""
    s2 = np.asarray(s2, dtype=np.float64)
    small = s2 <= (1e-30 if guard == "authors" else 1e-300)
    safe = np.where(small, 1.0, s2)
    val = bessel_ratio(radius ** 2 * np.sqrt(safe), d, guard=guard) ** 2 / safe
    return np.where(small, radius ** 4 / d ** 2, val)


def _dirichlet_quadrature(d: int, n_quad: int) -> tuple[np.ndarray, np.ndarray]:
    """Tensor-product Gauss-Jacobi rule for T ~ Dirichlet(1/2, ..., 1/2) on the d-simplex via stick
    breaking v_j ~ Beta(1/2, (d-j-1)/2): nodes ``[N, d]``, weights ``[N]`` (sum to 1)."""
    from scipy.special import beta as beta_fn
    from scipy.special import roots_jacobi

    T_parts, rem, w = [], np.ones([1] * (d - 1)), np.ones([1] * (d - 1))
    for j in range(d - 1):
        a, b = 0.5, (d - j - 1) / 2.0
        xj, wj = roots_jacobi(n_quad, b - 1.0, a - 1.0)      # weight (1-x)^(b-1) (1+x)^(a-1)
        shape = [1] * (d - 1)
        shape[j] = n_quad
        v = ((1.0 + xj) / 2.0).reshape(shape)
        T_parts.append(v * rem)
        rem = rem * (1.0 - v)
        w = w * (wj * 2.0 ** (-(a + b - 1.0)) / beta_fn(a, b)).reshape(shape)
    T_parts.append(rem)
    full = np.broadcast_shapes(*[t.shape for t in T_parts], w.shape)
    T = np.stack([np.broadcast_to(t, full).ravel() for t in T_parts], axis=-1)
    return T, np.broadcast_to(w, full).ravel().copy()


def sphere_output_moments(A, V=None, *, radius: float = 1.0, method: str = "auto",
                          n_quad: Optional[int] = None, n_mc: int = 200_000, seed: int = 0,
                          quad_max_d: int = 6, return_info: bool = False, bessel_guard: str = "attnlab"):
    """Exact moments of nu = (Gamma)_# mu for mu uniform on S^{d-1}(radius) [CODE formula].

    With ``A = U diag(sigma) W^T``: mean 0 and ``Cov(Gamma(X)) = U diag(lambda) U^T``,
    ``lambda_i = R^2 sigma_i^2 E_T[ A_d(R^2 sqrt(s)) ^2 / s * T_i ]``, ``s = sum_k sigma_k^2 T_k``,
    ``T ~ Dirichlet(1/2, ..., 1/2)`` (T_k = squared coordinates of a uniform unit vector).
    The Dirichlet expectation is evaluated by tensor-product Gauss-Jacobi quadrature when
    ``d <= quad_max_d`` (``method="auto"``) or ``method="quadrature"``, else by Monte Carlo with
    ``n_mc`` samples from ``seed`` (``method="mc"``).  Output covariance ``V Cov V^T``.

    ``bessel_guard``: how A_d is evaluated (:func:`bessel_ratio`): ``"attnlab"`` (correct at every r)
    or ``"authors"`` (the authors' guard, A_d = 0 for arguments >= 2**30: their reference as their code
    computes it, see :func:`sphere_covariance_authors_guard`).

    Returns ``(mean [d_out], cov [d_out, d_out])`` float64; with ``return_info`` also a dict with the
    method, node/sample count, the bessel guard, ``frac_beyond_ive`` (weighted fraction of the
    Dirichlet nodes/samples whose Bessel argument ``R^2 sqrt(s)`` is >= 2**30, where ``ive`` is NaN)
    and (Monte Carlo) the standard error of each lambda_i.
    """
    if bessel_guard not in BESSEL_GUARDS:
        raise ValueError(f"bessel_guard must be one of {BESSEL_GUARDS}, got {bessel_guard!r}")
    radius = check_scale(radius, "radius")
    A = as_float64(A, device="cpu")
    d = A.shape[-1]
    _check_square(A, d)
    if method == "auto":
        method = "quadrature" if d <= quad_max_d else "mc"
    U, sig, _ = torch.linalg.svd(A)
    sig2 = (sig ** 2).numpy()
    info: dict = {"method": method, "bessel_guard": bessel_guard}
    if d == 1:
        r1 = radius ** 2 * math.sqrt(sig2[0])
        lam = np.array([radius ** 2 * bessel_ratio(r1, 1, guard=bessel_guard) ** 2])
        info.update(n_nodes=0, frac_beyond_ive=float(r1 >= IVE_MAX_ARG))
    elif method == "quadrature":
        if n_quad is None:
            n_quad = int(min(256, max(3, round(200_000 ** (1.0 / (d - 1))))))
        if n_quad ** (d - 1) > 2e7:
            raise ValueError(f"quadrature with n_quad={n_quad} in d={d} needs {n_quad ** (d - 1):.1e} "
                             "nodes; use method='mc'")
        T, w = _dirichlet_quadrature(d, n_quad)
        s2 = T @ sig2
        lam = radius ** 2 * sig2 * ((T * (_sphere_integrand(s2, radius, d, bessel_guard) * w)[:, None]).sum(0))
        info.update(n_quad=n_quad, n_nodes=len(w),
                    frac_beyond_ive=float(w[radius ** 2 * np.sqrt(s2) >= IVE_MAX_ARG].sum()))
    elif method == "mc":
        n_mc = check_positive_int(n_mc, "n_mc")
        rng = np.random.default_rng(seed)
        s1, s2_ = np.zeros(d), np.zeros(d)
        done, block, beyond = 0, max(1, 2_000_000 // d), 0
        while done < n_mc:
            b = min(block, n_mc - done)
            G = rng.gamma(0.5, size=(b, d))
            T = G / G.sum(axis=1, keepdims=True)
            s2 = T @ sig2
            f = T * _sphere_integrand(s2, radius, d, bessel_guard)[:, None]
            s1 += f.sum(0)
            s2_ += (f ** 2).sum(0)
            beyond += int((radius ** 2 * np.sqrt(s2) >= IVE_MAX_ARG).sum())
            done += b
        e = s1 / n_mc
        se = np.sqrt(np.maximum(s2_ / n_mc - e ** 2, 0) / max(n_mc - 1, 1))
        lam = radius ** 2 * sig2 * e
        info.update(n_mc=n_mc, seed=seed, lambda_se=(radius ** 2 * sig2 * se).tolist(),
                    frac_beyond_ive=beyond / n_mc)
    else:
        raise ValueError(f"method must be 'auto', 'quadrature' or 'mc', got {method!r}")
    lam = np.where(sig2 == 0, 0.0, lam)
    cov = (U * torch.as_tensor(lam, dtype=torch.float64)) @ U.T
    if V is not None:
        V = as_float64(V, device="cpu")
        _check_value_map(V, d)
        cov = V @ cov @ V.T
    cov = 0.5 * (cov + cov.T)
    mean = torch.zeros(cov.shape[0], dtype=torch.float64)
    return (mean, cov, info) if return_info else (mean, cov)


def sphere_covariance_authors_guard(A, V=None, *, radius: float = 1.0, n_mc: int = 1_000_000, seed: int = 0,
                                    return_info: bool = False):
    """The authors' reference covariance **as their code computes it** (labelled comparison, not a
    correct limit): the Bessel/Dirichlet formula of :func:`sphere_output_moments` with their guard on
    A_d (src/tsc/_sphere_covariance.py [CODE]; :func:`bessel_ratio` with ``guard="authors"``), Dirichlet
    Monte Carlo with their defaults (``n_mc = 10^6`` samples, numpy seed 0; quadrature when d <= 6).

    ``scipy.special.ive`` is NaN for arguments >= 2**30 and their guard turns that into A_d = 0, so
    every Dirichlet sample with ``R^2 sqrt(sum_k sigma_k^2 T_k) >= 2**30`` contributes 0 instead of
    ~``R^2 T_i / s``: once all of them are beyond (the three largest scales of their d = 50 sphere run)
    the reference is the zero matrix and their plotted covariance error is ``||C_n||_2``.
    Same arguments and return values as :func:`sphere_output_moments`.
    """
    return sphere_output_moments(A, V, radius=radius, method="auto", n_mc=n_mc, seed=seed,
                                 return_info=return_info, bessel_guard="authors")


def sphere_hardmax_moments(A, V=None, *, radius: float = 1.0, n_samples: int = 400_000,
                           seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Moments of the hardmax limit on the sphere, ``Gamma_inf(x) = R V A x / ||A x||`` for x uniform
    on S^{d-1}(R), by direct Monte Carlo over x (``n_samples`` from numpy ``seed``): an independent
    check of :func:`sphere_output_moments` at large scale (A_d -> 1), which it must approach.
    Returns ``(mean [d_out], cov [d_out, d_out])`` float64 (population covariance)."""
    radius = check_scale(radius, "radius")
    n_samples = check_positive_int(n_samples, "n_samples")
    A = as_float64(A, device="cpu")
    d = A.shape[-1]
    _check_square(A, d)
    Vm = torch.eye(d, dtype=torch.float64) if V is None else as_float64(V, device="cpu")
    _check_value_map(Vm, d)
    rng = np.random.default_rng(seed)
    s1 = torch.zeros(Vm.shape[0], dtype=torch.float64)
    s2 = torch.zeros(Vm.shape[0], Vm.shape[0], dtype=torch.float64)
    done, block = 0, max(1, 2_000_000 // d)
    while done < n_samples:
        b = min(block, n_samples - done)
        a = torch.as_tensor(rng.standard_normal((b, d))) @ A.T      # direction of A x (x uniform)
        y = radius * (a / a.norm(dim=-1, keepdim=True)) @ Vm.T
        s1 += y.sum(0)
        s2 += y.T @ y
        done += b
    mean = s1 / n_samples
    cov = s2 / n_samples - torch.outer(mean, mean)
    return mean, 0.5 * (cov + cov.T)


def map_error_constant(x, m, Sigma, A, V=None) -> torch.Tensor:
    """Delta-method constant of the pointwise map error for Gaussian tokens [DERIVED]:
    ``n E||Gamma_{mu_n}(x) - Gamma_mu(x)||^2 -> exp(a^T Sigma a) tr(V (Sigma + Sigma a a^T Sigma) V^T)``
    with ``a = A x`` (self-normalized importance sampling; E[w^2]/E[w]^2 = exp(a^T Sigma a)).
    Returns the RMS constant ``sqrt(...)`` ``[...]`` for x ``[..., d]``.  It grows like
    ``exp(||Sigma^1/2 A x||^2 / 2)``: the exponential C(R) of the paper's first result."""
    S = check_psd(Sigma)
    d = S.shape[0]
    A, x = as_float64(A, device="cpu"), as_float64(x, device="cpu")
    _check_square(A, d)
    Vm = torch.eye(d, dtype=torch.float64) if V is None else as_float64(V, device="cpu")
    _check_value_map(Vm, d)
    a = x @ A.T                                       # [..., d]
    quad = (a @ S * a).sum(-1)                        # a^T Sigma a
    VS = Vm @ S                                       # [d_out, d]
    tr = torch.trace(VS @ Vm.T) + ((a @ VS.T) ** 2).sum(-1)
    return torch.sqrt(torch.exp(quad) * tr)



# --------------------------------------------------------------------------------------------------
# horizon and the reference exponent
# --------------------------------------------------------------------------------------------------

def horizon(A, Sigma, *, sided: str = "two", eps: float = 0.0) -> float:
    """Horizon ``H = ||Sigma^{1/2} A Sigma^{1/2}||_2`` (spectral norm) [CODE, "Horizon_new"].

    ``sided="one"`` gives the older ``||Sigma^{1/2} A||_2`` ("Horizon_old", paper 2 G4).  ``eps`` adds
    ``eps * I`` to Sigma first (the authors use 1e-6 for BERT's empirical Sigma).  Whether the
    temperature is inside A is the caller's convention; ours includes it (TEMPERATURE_CONVENTION).
    """
    S = check_psd(Sigma)
    A = as_float64(A, device="cpu")
    _check_square(A, S.shape[0])
    eps = check_scale(eps, "eps")
    R = sqrtm_psd(S + eps * torch.eye(S.shape[0], dtype=torch.float64))
    if sided == "two":
        M = R @ A @ R
    elif sided == "one":
        M = R @ A
    else:
        raise ValueError(f"sided must be 'two' or 'one', got {sided!r}")
    return float(torch.linalg.matrix_norm(M, ord=2))


def head_horizons(W_q, W_k, Sigma, n_heads: int, *, scaling: float = 1.0, eps: float = 0.0) -> np.ndarray:
    """Per-head horizons ``H_h = ||Sigma^{1/2} A_h Sigma^{1/2}||_2`` with ``A_h = scaling * W_{k,h}^T W_{q,h}``,
    ``W_{q,h}`` = rows ``h*e:(h+1)*e`` of ``W_q`` ``[n_heads * e, d]`` (nn.Linear layout, heads stacked
    as in BERT), ``e = d_head``.  As the authors' per-head horizons (downstream compute_horizons.py
    [CODE], which omit the temperature: ``scaling=1``); ``sum_h A_h`` is the layer's A of
    :func:`horizon`.  ``eps`` adds ``eps * I`` to Sigma.  Exact via thin QR factors (the d x d
    matrix ``(W_{k,h} R)^T (W_{q,h} R)`` has rank <= e).  Returns float64 ``[n_heads]``."""
    n_heads = check_positive_int(n_heads, "n_heads")
    Wq, Wk = as_float64(W_q, device="cpu"), as_float64(W_k, device="cpu")
    if Wq.shape != Wk.shape or Wq.ndim != 2 or Wq.shape[0] % n_heads:
        raise ValueError(f"W_q, W_k must be the same [n_heads * d_head, d] shape with n_heads={n_heads} dividing "
                         f"the rows, got {tuple(Wq.shape)} and {tuple(Wk.shape)}")
    S = check_psd(Sigma)
    d = S.shape[0]
    if Wq.shape[1] != d:
        raise ValueError(f"dimension mismatch: W_q is {tuple(Wq.shape)} but Sigma is {tuple(S.shape)}")
    R = sqrtm_psd(S + check_scale(eps, "eps") * torch.eye(d, dtype=torch.float64))
    e = Wq.shape[0] // n_heads
    P = (Wk @ R).reshape(n_heads, e, d)                   # W_{k,h} R
    Q = (Wq @ R).reshape(n_heads, e, d)                   # W_{q,h} R
    Tp = torch.linalg.qr(P.transpose(-1, -2)).R           # (W_{k,h} R)^T = U_p Tp
    Tq = torch.linalg.qr(Q.transpose(-1, -2)).R
    H = torch.linalg.matrix_norm(Tp @ Tq.transpose(-1, -2), ord=2)
    return (check_scale(scaling, "scaling") * H).numpy()


def beta_reference(H):
    """``beta(H) = 1 / (2 (1 + H^2))``: the authors' reference curve, as encoded in their plotting
    code ("theoretical reference" in every slope-versus-horizon plot).  Not a theorem we have: the
    paper's statement of beta was unavailable.  A [DERIVED] reading (balance of the exp(H^2 r^2/2)
    uniform bound against the Gaussian tail exp(-r^2/2)) suggests it is an upper-bound exponent:
    measured |slopes| are expected at or above it.  Accepts a float or an array."""
    Ha = np.asarray(H, dtype=np.float64)
    if np.any(Ha < 0):
        raise ValueError("horizon H must be >= 0")
    out = 1.0 / (2.0 * (1.0 + Ha ** 2))
    return float(out) if out.ndim == 0 else out
