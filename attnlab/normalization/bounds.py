"""Every bound of "Limitations of Normalization in Attention Mechanism" (arXiv 2508.17821), as formulas.

Each docstring says where the formula comes from (labels: book appendix "How we read the papers"):

- **paper formula [P]**: stated in the paper;
- **[B] published-summary reading**: the formula as printed in a published summary of the paper (typesetting restored);
- **reconstruction [R]**: derived for this project from the paper's prose; *not* the paper's formula.

The functions here are the plain, direct formulas (readable, O(L·D) per row, batched over leading
dims). `attnlab.normalization.metrics.distance`, `separability` and `gradients` compute the same quantities
faster, over whole attention tensors, and the
tests check the two against each other and against the theorems' statements on random inputs.

Shapes: `alpha [..., L]` one attention row per leading index (weights of the L keys of that row),
`x [..., L, D]` the row's key vectors, `N` the top-N size. All functions accept torch tensors and
return float64 tensors (or Python floats for scalar-only formulas).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

SQRT2 = math.sqrt(2.0)


def _t(value) -> torch.Tensor:
    return value.double() if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float64)


def check_T(T) -> None:
    t = _t(T)
    if not bool(torch.all((t > 0) & torch.isfinite(t))):
        raise ValueError(f"temperature T must be a finite number > 0, got {T}")


def _check_N(N: int, L) -> None:
    if N < 1:
        raise ValueError(f"N must be >= 1, got {N}")
    if bool(torch.any(_t(L) <= N)):
        raise ValueError(f"need N < L (at least one non-selected token), got N={N}, L={L}")


# ----------------------------------------------------------------------------------- Lemma 1, Cor. 1

def lemma1_constants(F: Callable[[torch.Tensor], torch.Tensor], a: float, *, grid: int = 20001) -> tuple[float, float]:
    """Constants of Lemma 1 for a positive, L-independent normalizer F on logits in [-a, a].

    Paper formula [P]: `C1/L <= alpha_i <= C2/L` (Eq. 4). The constants are the reconstruction [R]
    implied by the paper's proof: `C1 = min F / max F`, `C2 = max F / min F` over `[-a, a]`.
    min/max are taken on a grid of `grid` points including both ends (exact for monotone F).
    """
    if a < 0:
        raise ValueError(f"a must be >= 0, got {a}")
    ls = torch.linspace(-a, a, grid, dtype=torch.float64)
    vals = _t(F(ls))
    if not bool(torch.all(torch.isfinite(vals))) or not bool(torch.all(vals > 0)):
        raise ValueError("F must be finite and positive on [-a, a]")
    lo, hi = float(vals.min()), float(vals.max())
    return lo / hi, hi / lo


def lemma1_band(L, C1: float, C2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Paper formula [P] (Lemma 1, Eq. 4): the band `(C1/L, C2/L)` for every weight of a row of length L."""
    L = _t(L)
    return C1 / L, C2 / L


def corollary1_delta(q: torch.Tensor, k: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """`Delta = ||q_t|| * max_i ||k_i||` over the keys each query sees. [R] practical reading of the
    paper's `Delta = ||q|| ||k||` (Corollary 1 proof: `|l_i| <= ||q|| ||k_i||`).

    q [..., Q, D], k [..., K, D], visible bool [Q, K] (default all) -> Delta [..., Q] float64.
    """
    from attnlab.normalization.metrics.engine import prefix_lengths

    qn = q.double().norm(dim=-1)                                   # [..., Q]
    kn = k.double().norm(dim=-1)                                   # [..., K]
    if visible is None or bool(visible.all()):
        return qn * kn.amax(-1, keepdim=True)                      # [..., 1] broadcast over the rows
    n = prefix_lengths(visible)
    if n is not None:                                              # row t sees keys 0..n_t-1 (causal): O(K) per head
        kmax = torch.cummax(kn, dim=-1).values[..., (n - 1).clamp_min(0)]
        return qn * torch.where(n > 0, kmax, float("-inf"))
    return qn * kn.unsqueeze(-2).masked_fill(~visible, float("-inf")).amax(-1)   # [..., Q]


def corollary1_log_band(L, delta, T) -> tuple[torch.Tensor, torch.Tensor]:
    """Natural-log band of Corollary 1: `log(1/L) -+ 2 Delta / T`.

    Paper formula [P text; formula from a secondary source]: `(1/L) exp(-2Delta/T) <= alpha_i <=
    (1/L) exp(2Delta/T)`. Logs avoid overflow (`2 Delta / T` is often > 100 in real heads).
    """
    check_T(T)
    L, delta, T = _t(L), _t(delta), _t(T)
    base = -torch.log(L)
    return base - 2 * delta / T, base + 2 * delta / T


def corollary1_band(L, delta, T) -> tuple[torch.Tensor, torch.Tensor]:
    """Corollary 1 band `((1/L) exp(-2Delta/T), (1/L) exp(2Delta/T))` (paper formula [P]); may overflow
    to inf for large `Delta/T`; prefer `corollary1_log_band`."""
    lo, hi = corollary1_log_band(L, delta, T)
    return torch.exp(lo), torch.exp(hi)


# ------------------------------------------------------------------------------------------ Theorem 1

def theorem1_fixed_bound(abar, d1, R, L, N: int, form: str = "B") -> torch.Tensor:
    """Upper bound `d_max` on the representation distance d~ (reading (b)) for a fixed top-N set.

    - form "B" (default), **[B] published-summary reading**:
      `(1 - abar) d1 + R (abar (L - N) - (1 - abar))`.
      A theorem for N = 1 (triangle inequality); for N > 1 the printed form drops a within-selected
      spread term, so it is not proof-level in general.
    - form "R", **reconstruction [R]** (proved by the triangle inequality for every N):
      `(1 - abar) d1 + ((1 - abar) + (L - N) abar) R`.

    abar = sum of the top-N weights; d1 = max distance from a non-selected to a selected vector;
    R = max norm of the selected vectors; L = number of keys in the row. Broadcasts elementwise.
    Note `B = R - 2 R (1 - abar) <= R` always.
    """
    abar, d1, R, L = _t(abar), _t(d1), _t(R), _t(L)
    rest = 1.0 - abar
    if form.upper() == "B":
        return rest * d1 + R * (abar * (L - N) - rest)
    if form.upper() == "R":
        return rest * d1 + (rest + (L - N) * abar) * R
    raise ValueError(f"form must be 'B' or 'R', got {form!r}")


def theorem1_fixed_bound_a(abar, d1, R) -> torch.Tensor:
    """Reconstruction [R] for reading (a) `d~_a = ||sum_{i not in I_N} a_i x_i - s||`:
    `d~_a <= (1 - abar) d1 + R` (from `sum_out a_i x_i = sum_out a_i (x_i - x_j*) + (1 - abar) x_j*`)."""
    abar, d1, R = _t(abar), _t(d1), _t(R)
    return (1.0 - abar) * d1 + R


def fixed_set_ingredients(alpha: torch.Tensor, x: torch.Tensor, N: int) -> dict[str, torch.Tensor]:
    """abar, d1, R, s for the top-N set of each row (direct computation, ties -> lower index).

    alpha [..., L], x [..., L, D] -> dict of [...] tensors (s: [..., D]).
    """
    alpha, x = _t(alpha), _t(x)
    L = alpha.shape[-1]
    _check_N(N, L)
    order = torch.sort(alpha, dim=-1, descending=True, stable=True).indices
    sel = torch.zeros_like(alpha, dtype=torch.bool).scatter_(-1, order[..., :N], True)
    s = (alpha * sel).unsqueeze(-1).mul(x).sum(-2)
    dist = torch.cdist(x, x)                                                  # [..., L, L]
    pair = sel.unsqueeze(-1) & ~sel.unsqueeze(-2)                             # [j sel, i out]
    d1 = dist.masked_fill(~pair, float("-inf")).flatten(-2).max(-1).values
    R = x.norm(dim=-1).masked_fill(~sel, float("-inf")).max(-1).values
    abar = (alpha * sel).sum(-1)
    return {"abar": abar, "d1": d1, "R": R, "s": s, "selected": sel}


def theorem1_random_main(alpha: torch.Tensor, x: torch.Tensor, N: int) -> torch.Tensor:
    """Main sum of the expected distance for a uniformly random top-N set.

    Reconstruction [R] (= the [B] published-summary reading `((L-N)/L) sum_i ||a_i (1 + N/(L-1)) x_i - xbar||`
    with `xbar = (N/(L-1)) sum_j a_j x_j`):
    `E_main = ((L - N)/L) * sum_{i=1}^{L} || a_i x_i - (N/(L-1)) sum_{j != i} a_j x_j ||`.

    alpha [..., L], x [..., L, D] -> [...]. By Jensen, `E_main <= E_{I_N}[d~] <= E_main + jensen`.
    """
    alpha, x = _t(alpha), _t(x)
    L = alpha.shape[-1]
    _check_N(N, L)
    y = alpha.unsqueeze(-1) * x                                   # [..., L, D]
    others = y.sum(-2, keepdim=True) - y                          # sum_{j != i} y_j
    return (L - N) / L * (y - N / (L - 1) * others).norm(dim=-1).sum(-1)


PRINTED_XBAR = {"E2": "mean", "E3": "scaled", "E5": "weighted"}


def theorem1_random_printed(alpha: torch.Tensor, x: torch.Tensor, N: int, xbar: str) -> torch.Tensor:
    """The published summary's random-set formula **read literally** ([B], its x-bar undefined there):

    `E = ((L - N)/L) * sum_{i=1}^{L} || (a_i + N/(L-1)) x_i - xbar ||` with xbar = the plain mean `(1/L) sum_j x_j`
    ("mean", reading E2), `(N/(L-1)) sum_j a_j x_j` ("scaled", E3) or `sum_j a_j x_j` ("weighted", E5).
    Not an expectation of d~ in general (`theorem1_random_main` is); `attnlab.normalization.readings` says why
    each is considered. alpha [..., L], x [..., L, D] -> [...].
    """
    alpha, x = _t(alpha), _t(x)
    L = alpha.shape[-1]
    _check_N(N, L)
    c = N / (L - 1)
    o = (alpha.unsqueeze(-1) * x).sum(-2, keepdim=True)
    centre = {"mean": x.mean(-2, keepdim=True), "scaled": c * o, "weighted": o}.get(xbar)
    if centre is None:
        raise ValueError(f"xbar must be one of {sorted(PRINTED_XBAR.values())}, got {xbar!r}")
    return (L - N) / L * ((alpha + c).unsqueeze(-1) * x - centre).norm(dim=-1).sum(-1)


def theorem1_jensen_bound(alpha: torch.Tensor, x: torch.Tensor, N: int) -> torch.Tensor:
    """Bound on the Jensen gap eps of the random-set expectation. Reconstruction [R]:

    `0 <= eps <= ((L-N)/L) sum_i sqrt(tr Cov[s | i not in I_N])`, with, for sampling N of the other
    L-1 tokens without replacement,
    `tr Cov = N (L-1-N) / ((L-1)(L-2)) * sum_{j != i} ||a_j x_j - mu_i||^2`,
    `mu_i = (1/(L-1)) sum_{j != i} a_j x_j` (0 when L = 2).
    """
    alpha, x = _t(alpha), _t(x)
    L = alpha.shape[-1]
    _check_N(N, L)
    if L <= 2:
        return torch.zeros(alpha.shape[:-1], dtype=torch.float64)
    y = alpha.unsqueeze(-1) * x
    y2 = (y * y).sum(-1)                                          # [..., L]
    others = y.sum(-2, keepdim=True) - y
    spread = (y2.sum(-1, keepdim=True) - y2) - (others * others).sum(-1) / (L - 1)
    coef = N * (L - 1 - N) / ((L - 1) * (L - 2))
    return (L - N) / L * (coef * spread.clamp_min(0)).sqrt().sum(-1)


# ------------------------------------------------------------------------------------------ Theorem 2

def theorem2_bounds(xi: torch.Tensor, r, M: float = 1.0, *, form: str = "B",
                    selected: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower and upper bounds on `E[N_s]/N` (Theorem 2), from the spreads `xi [..., N]` and radius r [...].

    - lower (paper's description [P] + [B]/[R], identical): `1 - (1/(r N)) sum_i xi_i`.
    - upper, form "B" (default) **[B] published-summary reading**: `(1/N) sum_i exp(-(r - xi_i)^2 / (16 M^2))`.
    - upper, form "R" **reconstruction [R]** (Hoeffding-type, range 2M):
      `(1/N) sum_i exp(-(xi_i - r)_+^2 / (2 M^2))`.
    With `selected` (bool, same shape as xi) only those entries count and N = their number.
    The lower bound with `xi_i = ||a_i x_i - s||` (the row's own distances) is a theorem for the row's
    N_s/N (since `1{X < r} >= 1 - X/r`); the upper bound is a heuristic ([G10]).
    """
    lower, (upper,) = theorem2_bound_set(xi, r, M, forms=(form,), selected=selected)
    return lower, upper


def theorem2_bound_set(xi: torch.Tensor, r, M: float = 1.0, *, forms=("B", "R"),
                       selected: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`theorem2_bounds` for several upper-bound forms at once: (lower, [upper for each form])."""
    xi, r = _t(xi), _t(r)
    if any(f.upper() not in ("B", "R") for f in forms):
        raise ValueError(f"form must be 'B' or 'R', got {forms!r}")
    gap = xi - r.unsqueeze(-1)
    keep = (lambda t: t) if selected is None else (lambda t: t.masked_fill(~selected, 0.0))
    n = xi.shape[-1] if selected is None else selected.sum(-1).double()
    uppers = []
    for f in forms:
        g = gap.square() if f.upper() == "B" else gap.clamp_min(0).square_()
        terms = g.div_(-16 * M * M if f.upper() == "B" else -2 * M * M).exp_()
        uppers.append(keep(terms).sum(-1) / n)
    return 1.0 - keep(xi).sum(-1) / (r * n), uppers


def theorem2_xi_delta(alpha_sel: torch.Tensor, delta, M: float = 1.0) -> torch.Tensor:
    """Spread xi_i of each selected token from the minimum separation delta. Reconstruction [R]:

    `xi_i^2 = M^2 sum_{j != i} a_j^2 + (M^2 - delta^2/2) sum_{j != k; j, k in I_N \\ {i}} a_j a_k`
    (an upper bound on `E ||s - a_i x_i||^2` on the sphere of radius M with pairwise distance >= delta).

    alpha_sel [..., N] (weights of the selected tokens), delta [...] -> xi [..., N].
    """
    a, delta = _t(alpha_sel), _t(delta)
    A = a.sum(-1, keepdim=True) - a                   # sum over the other selected
    A2 = (a * a).sum(-1, keepdim=True) - a * a
    cross = A * A - A2                                # sum_{j != k}, both != i
    xi2 = M * M * A2 + (M * M - delta.unsqueeze(-1) ** 2 / 2) * cross
    return xi2.clamp_min(0).sqrt()


# ------------------------------------------------------------------------------ Lemma 2, Corollary 3

def lemma2_bound(F_vals: torch.Tensor, dF_vals: torch.Tensor) -> torch.Tensor:
    """Upper bound on the spectral norm of the Jacobian of `alpha = F(l)/sum_j F(l_j)`. Reconstruction [R]
    (the paper's Lemma 2 formula is not available; this has the property the paper states: both terms
    scale inversely with min_j F(l_j)):

    `||d alpha / d l||_2 <= (1/L) (max_j |F'_j| / min_j F_j + ||alpha||_2 ||F'||_2 / min_j F_j)`,
    from `d alpha / d l = (diag(F') - alpha F'^T) / S`, `S = sum_j F_j >= L min_j F_j`.

    F_vals, dF_vals [..., L] (F and dF/dl at the row's logits) -> [...].
    """
    F, dF = _t(F_vals), _t(dF_vals)
    if not bool(torch.all(F > 0)):
        raise ValueError("F must be positive")
    L = F.shape[-1]
    alpha = F / F.sum(-1, keepdim=True)
    fmin = F.min(-1).values
    return (dF.abs().max(-1).values / fmin + alpha.norm(dim=-1) * dF.norm(dim=-1) / fmin) / L


def normalizer_jacobian(F_vals: torch.Tensor, dF_vals: torch.Tensor) -> torch.Tensor:
    """The exact Jacobian `(diag(F') - alpha F'^T) / S` of a general normalizer (paper Eq. 3), [..., L, L]."""
    F, dF = _t(F_vals), _t(dF_vals)
    S = F.sum(-1, keepdim=True)
    alpha = F / S
    return (torch.diag_embed(dF) - alpha.unsqueeze(-1) * dF.unsqueeze(-2)) / S.unsqueeze(-1)


def corollary3_bound(T):
    """Paper formula [P] (Fig. 4 caption, Corollary 3): `min{1/(4T), sqrt(2)}`.

    1/(4T) is the largest *entry* of the softmax Jacobian; its spectral norm can reach 1/(2T)
    (see `softmax_jacobian_bound`), so measured norms may exceed this curve by up to 2x ([G3]).
    """
    check_T(T)
    return torch.clamp(1.0 / (4 * _t(T)), max=SQRT2)


def softmax_jacobian_bound(T):
    """Exact spectral-norm bound of the softmax Jacobian `(diag(a) - a a^T)/T`: `1/(2T)`, attained for two
    equal top logits ([R]/[G3]; not the paper's curve). Also bounds the finite-difference g(T, eps)
    by the mean-value theorem."""
    check_T(T)
    return 1.0 / (2 * _t(T))


def finite_difference_cap(eps):
    """Trivial cap `g(T, eps) <= sqrt(2)/eps` ([R]: the probability simplex has l2 diameter sqrt 2)."""
    e = _t(eps)
    if not bool(torch.all(e > 0)):
        raise ValueError(f"eps must be > 0, got {eps}")
    return SQRT2 / e
