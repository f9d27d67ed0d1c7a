"""The bounds that are theorems hold on random inputs; formulas match their definitions."""
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.normalization import bounds
from attnlab.normalization.metrics import gradients, separability

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


def _row(seed: int, L: int, D: int, sharp: float):
    g = torch.Generator().manual_seed(seed)
    alpha = torch.softmax(torch.randn(L, generator=g, dtype=torch.float64) * sharp, -1)
    x = torch.randn(L, D, generator=g, dtype=torch.float64) * (
        1 + 2 * torch.rand(L, 1, generator=g, dtype=torch.float64)
    )
    return alpha, x


def _dtilde(alpha, x, N):
    order = torch.sort(alpha, descending=True, stable=True).indices
    sel, out = order[:N], order[N:]
    s = (alpha[sel, None] * x[sel]).sum(0)
    y = alpha[:, None] * x
    return (y[out] - s).norm(dim=-1).sum(), (y[out].sum(0) - s).norm(), s


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(2, 12),
    D=st.integers(1, 6),
    scale=st.floats(0.1, 5.0),
    T=st.floats(0.05, 10.0),
)
def test_corollary1_band_holds(seed, L, D, scale, T):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(D, generator=g, dtype=torch.float64) * scale
    k = torch.randn(L, D, generator=g, dtype=torch.float64) * scale
    logw = torch.log_softmax(k @ q / T, -1)
    delta = bounds.corollary1_delta(q[None], k)[0]
    lo, hi = bounds.corollary1_log_band(L, delta, T)
    assert bool((logw >= lo - 1e-9).all()) and bool((logw <= hi + 1e-9).all())


@pytest.mark.parametrize(
    "F", [lambda l: torch.exp(l / 0.7), lambda l: torch.nn.functional.softplus(l) + 0.1, lambda l: 1 + l * l]
)
@SETTINGS
@given(seed=st.integers(0, 10_000), L=st.integers(1, 30), a=st.floats(0.0, 3.0))
def test_lemma1_band_holds(F, seed, L, a):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.rand(L, generator=g, dtype=torch.float64) * 2 - 1) * a
    alpha = F(logits) / F(logits).sum()
    C1, C2 = bounds.lemma1_constants(F, a)
    lo, hi = bounds.lemma1_band(L, C1, C2)
    assert bool((alpha >= lo * (1 - 1e-9)).all()) and bool((alpha <= hi * (1 + 1e-9)).all())


def test_lemma1_constants_of_softmax_match_corollary1():
    C1, C2 = bounds.lemma1_constants(lambda l: torch.exp(l / 2.0), 3.0)
    assert C1 == pytest.approx(math.exp(-3.0)) and C2 == pytest.approx(math.exp(3.0))
    with pytest.raises(ValueError):
        bounds.lemma1_constants(lambda l: l, 1.0)  # not positive


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(2, 14),
    D=st.integers(1, 5),
    sharp=st.floats(0.0, 6.0),
    nfrac=st.floats(0.0, 0.99),
)
def test_theorem1_fixed_bounds(seed, L, D, sharp, nfrac):
    alpha, x = _row(seed, L, D, sharp)
    N = 1 + int(nfrac * (L - 1))
    N = min(N, L - 1)
    d_b, d_a, _ = _dtilde(alpha, x, N)
    ing = bounds.fixed_set_ingredients(alpha, x, N)
    b_R = bounds.theorem1_fixed_bound(ing["abar"], ing["d1"], ing["R"], L, N, "R")
    b_B = bounds.theorem1_fixed_bound(ing["abar"], ing["d1"], ing["R"], L, N, "B")
    tol = 1e-9 * (1 + float(b_R))
    assert float(d_b) <= float(b_R) + tol  # [R]: a theorem
    assert float(b_B) <= float(b_R) + tol  # [B] is the tighter of the two
    if N == 1:
        assert float(d_b) <= float(b_B) + tol  # [B] is a theorem for N = 1
    assert float(d_a) <= float(bounds.theorem1_fixed_bound_a(ing["abar"], ing["d1"], ing["R"])) + tol


def test_theorem1_B_is_tight_for_one_hot_rows():
    L, N = 7, 1
    alpha = torch.zeros(L, dtype=torch.float64)
    alpha[3] = 1
    x = torch.randn(L, 4, dtype=torch.float64)
    d_b, _, _ = _dtilde(alpha, x, N)
    ing = bounds.fixed_set_ingredients(alpha, x, N)
    b_B = bounds.theorem1_fixed_bound(ing["abar"], ing["d1"], ing["R"], L, N, "B")
    assert float(d_b) == pytest.approx(float(b_B)) == pytest.approx((L - 1) * float(x[3].norm()))


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(3, 7),
    D=st.integers(1, 4),
    sharp=st.floats(0.0, 4.0),
    nfrac=st.floats(0.0, 0.99),
)
def test_random_set_expectation_within_jensen_band(seed, L, D, sharp, nfrac):
    """main sum <= E_{I_N}[d~] (exact, by enumerating all subsets) <= main sum + Jensen bound."""
    alpha, x = _row(seed, L, D, sharp)
    N = min(L - 1, 1 + int(nfrac * (L - 1)))
    y = alpha[:, None] * x
    total = 0.0
    subsets = list(itertools.combinations(range(L), N))
    for sel in subsets:
        s = y[list(sel)].sum(0)
        total += float(sum((y[i] - s).norm() for i in range(L) if i not in sel))
    exact = total / len(subsets)
    main = float(bounds.theorem1_random_main(alpha, x, N))
    gap = float(bounds.theorem1_jensen_bound(alpha, x, N))
    assert main <= exact + 1e-9
    assert exact <= main + gap + 1e-9


def test_random_main_equals_brief_form():
    """[B] printed form with x_bar = (N/(L-1)) sum_j a_j x_j equals the [R] main sum."""
    alpha, x = _row(3, 9, 4, 2.0)
    L, N = 9, 3
    c = N / (L - 1)
    xbar = c * (alpha[:, None] * x).sum(0)
    brief = (L - N) / L * (alpha[:, None] * (1 + c) * x - xbar).norm(dim=-1).sum()
    assert float(bounds.theorem1_random_main(alpha, x, N)) == pytest.approx(float(brief))


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(2, 12),
    D=st.integers(2, 5),
    sharp=st.floats(0.0, 6.0),
    nfrac=st.floats(0.0, 0.99),
)
def test_theorem2_lower_bound_with_row_spread_holds(seed, L, D, sharp, nfrac):
    alpha, x = _row(seed, L, D, sharp)
    N = min(L - 1, 1 + int(nfrac * (L - 1)))
    st_ = separability.separability_stats(alpha[None].float(), x.float(), [N], stats=("ns_frac", "lower_row", "r"))
    frac, lower = float(st_["ns_frac"][0, 0]), float(st_["lower_row"][0, 0])
    if not math.isnan(frac):
        assert lower <= frac + 1e-9


def test_theorem2_bounds_formulas():
    xi = torch.tensor([[0.1, 0.3]], dtype=torch.float64)
    r = torch.tensor([0.5], dtype=torch.float64)
    lo, up = bounds.theorem2_bounds(xi, r, 1.0, form="B")
    assert float(lo) == pytest.approx(1 - 0.4 / (0.5 * 2))
    assert float(up) == pytest.approx((math.exp(-0.16 / 16) + math.exp(-0.04 / 16)) / 2)
    _, up_r = bounds.theorem2_bounds(xi, r, 1.0, form="R")
    assert float(up_r) == pytest.approx(1.0)  # xi < r: (xi - r)_+ = 0
    # delta-spread: two selected tokens, the other one carries all the spread
    xd = bounds.theorem2_xi_delta(torch.tensor([[0.6, 0.4]], dtype=torch.float64), torch.tensor([1.0]), 1.0)
    assert torch.allclose(xd, torch.tensor([[0.4, 0.6]], dtype=torch.float64))


def _F_family():
    return [
        (lambda l: torch.exp(l / 0.5), lambda l: torch.exp(l / 0.5) / 0.5),
        (lambda l: torch.nn.functional.softplus(l) + 0.05, lambda l: torch.sigmoid(l)),
        (lambda l: 1 + l * l, lambda l: 2 * l),
    ]


@SETTINGS
@given(seed=st.integers(0, 10_000), L=st.integers(2, 10), which=st.integers(0, 2), scale=st.floats(0.1, 3.0))
def test_lemma2_bound_above_exact_jacobian_norm(seed, L, which, scale):
    F, dF = _F_family()[which]
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(L, generator=g, dtype=torch.float64) * scale
    J = bounds.normalizer_jacobian(F(logits), dF(logits))
    # the formula is the Jacobian: check against autograd
    lv = logits.clone().requires_grad_(True)
    auto = torch.autograd.functional.jacobian(lambda l: F(l) / F(l).sum(), lv)
    assert torch.allclose(J, auto, atol=1e-10)
    exact = torch.linalg.matrix_norm(J, ord=2)
    assert float(exact) <= float(bounds.lemma2_bound(F(logits), dF(logits))) * (1 + 1e-9)


@SETTINGS
@given(seed=st.integers(0, 10_000), L=st.integers(2, 16), T=st.floats(0.01, 50.0), scale=st.floats(0.0, 5.0))
def test_softmax_jacobian_norm_at_most_half_over_T(seed, L, T, scale):
    g = torch.Generator().manual_seed(seed)
    a = torch.softmax(torch.randn(1, L, generator=g, dtype=torch.float64) * scale / T, -1)
    n = gradients.softmax_jacobian_norm(a, T)
    assert float(n) <= float(bounds.softmax_jacobian_bound(T)) * (1 + 1e-9)


def test_softmax_jacobian_bound_attained_and_corollary3():
    a = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    assert float(gradients.softmax_jacobian_norm(a, 0.25)) == pytest.approx(2.0)  # 1/(2T)
    assert float(bounds.corollary3_bound(0.25)) == pytest.approx(1.0)  # 1/(4T)
    assert float(bounds.corollary3_bound(1e-4)) == pytest.approx(math.sqrt(2))  # capped
    assert float(bounds.finite_difference_cap(0.1)) == pytest.approx(10 * math.sqrt(2))


@pytest.mark.parametrize(
    "call",
    [
        lambda: bounds.corollary1_log_band(5, 1.0, 0.0),
        lambda: bounds.corollary3_bound(-1.0),
        lambda: bounds.theorem1_random_main(torch.ones(4) / 4, torch.ones(4, 2), 4),
        lambda: bounds.theorem1_fixed_bound(0.5, 1.0, 1.0, 5, 2, form="X"),
        lambda: bounds.fixed_set_ingredients(torch.ones(3) / 3, torch.ones(3, 2), 0),
        lambda: bounds.finite_difference_cap(0.0),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
