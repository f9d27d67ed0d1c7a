"""Every normalizer: a distribution over visible keys (SA-Softmax excepted, by its definition),
masked keys 0, fully masked rows 0, gradients against finite differences; softmax Jacobian."""
import math

import pytest
import torch

from attnlab.tools import normalizers as nz

PROB = sorted(nz.SUMS_TO_ONE)


def rows(seed=0, shape=(4, 7, 9)):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*shape, generator=g) * 3
    vis = torch.rand(*shape, generator=g) > 0.3
    vis[..., 0] = True
    vis[0, 0] = False  # one fully masked row
    return z, vis


@pytest.mark.parametrize("name", PROB)
def test_distribution_over_visible_keys(name):
    z, vis = rows()
    p = nz.get_normalizer(name)(z, vis)
    assert p.dtype == torch.float32 and torch.isfinite(p).all()
    assert (p >= 0).all() and (p[~vis] == 0).all()
    sums = p.sum(-1)
    assert torch.allclose(sums[vis.any(-1)], torch.ones(()), atol=1e-5)
    assert (p[0, 0] == 0).all()


def test_sa_softmax_is_not_a_distribution_by_definition():
    z, vis = rows()
    plain = nz.sa_softmax(z, vis, variant="plain")
    normd = nz.sa_softmax(z, vis)
    soft = nz.softmax(z, vis)
    assert torch.allclose(plain, torch.where(vis, z, 0) * soft)
    assert (normd >= 0).all() and (normd <= soft + 1e-7).all() and (normd[~vis] == 0).all()
    with pytest.raises(ValueError, match="variant"):
        nz.sa_softmax(z, vis, variant="x")


@pytest.mark.parametrize("name", sorted(nz.NORMALIZERS))
def test_gradients_match_finite_differences(name):
    z, vis = rows(1, (2, 6))
    z = z.double().requires_grad_(True)
    fn = nz.get_normalizer(name)
    w = torch.randn(2, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: (fn(x, vis) * w).sum(), (z,), eps=1e-6, atol=1e-4)


def test_softmax_jacobian_analytic_equals_autograd():
    z = torch.randn(8)
    for T in (0.1, 1.0, 3.0):
        p = nz.softmax(z, T=T)
        auto = nz.jacobian(lambda s, v: nz.softmax(s, v, T=T), z)
        assert torch.allclose(nz.softmax_jacobian(p, T), auto, atol=1e-5)
        assert nz.spectral_norm(nz.softmax_jacobian(p, T)) <= 1 / (2 * T) + 1e-6


def test_softmax_low_temperature_is_finite():
    z = torch.randn(3, 50) * 20
    p = nz.softmax(z, T=1e-4)
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(3))
    assert torch.equal(p.argmax(-1), z.argmax(-1))


def test_ssmax_uses_each_rows_visible_length():
    z = torch.randn(6, 6)
    vis = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    p = nz.ssmax(z, vis, s=0.7)
    for t in range(1, 6):
        expect = torch.softmax(0.7 * math.log(t + 1) * z[t, : t + 1], -1)
        assert torch.allclose(p[t, : t + 1], expect, atol=1e-6)
    ref = nz.ssmax(z, None, ref_length=6)
    assert torch.allclose(ref, torch.softmax(z, -1), atol=1e-6)  # matches softmax at the reference length


def test_entmax_methods_agree():
    z, vis = rows(2)
    exact = nz.entmax(z, vis, alpha=1.5, method="sort")
    bis = nz.entmax(z, vis, alpha=1.5, method="bisect")
    assert torch.allclose(exact, bis, atol=1e-4)
    assert torch.allclose(nz.entmax(z, vis, alpha=2.0), nz.sparsemax_(z, vis), atol=1e-6)
    assert (nz.sparsemax_(z * 5, vis) == 0).any()  # exact zeros


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_bad_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        nz.softmax(torch.randn(3), T=bad)


def test_bad_scores_and_names():
    with pytest.raises(ValueError, match="NaN"):
        nz.softmax(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="unknown normalizer"):
        nz.get_normalizer("softermax")
    with pytest.raises(ValueError, match="alpha"):
        nz.entmax(torch.randn(3), alpha=0.5)


def causal_rows(seed=0, shape=(2, 3, 150, 150), scale=3.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*shape, generator=g) * scale
    z[:, 1] *= 0.02                                   # a near-uniform head: supports far beyond TOPK
    return z, torch.tril(torch.ones(shape[-2:], dtype=torch.bool))


def test_row_blocks_cover_each_rows_visible_keys():
    _, vis = causal_rows()
    blocks = nz.row_blocks(vis[None, None], 150, 150)
    assert len(blocks) > 1 and blocks[0][0].start == 0 and blocks[-1][0].stop == 150
    assert all(a[0].stop == b[0].start for a, b in zip(blocks, blocks[1:]))            # contiguous, in order
    for rows, width in blocks:
        assert width < 150 or rows.stop == 150
        assert not vis[rows, width:].any() and vis[rows.stop - 1, width - 1]        # tight: the last row's last key
    assert nz.row_blocks(torch.ones(150, 150, dtype=torch.bool), 150, 150) == [(slice(0, 150), 150)]
    assert nz.row_blocks(torch.ones(150, dtype=torch.bool), 150, 150) == [(slice(0, 150), 150)]


@pytest.mark.parametrize("name,alpha", [("sparsemax", 2.0), ("entmax15", 1.5)])
def test_row_blocks_and_partial_sort_are_exact(name, alpha):
    """Row blocks and the partial sort give bit for bit what the library's full sort gives on whole rows."""
    from entmax import entmax15, sparsemax

    z, vis = causal_rows()
    fill = z.masked_fill(~vis, float("-inf")).amax(-1, keepdim=True) - 1 / (alpha - 1) - 1
    reference = {2.0: sparsemax, 1.5: entmax15}[alpha](torch.where(vis, z, fill), dim=-1) * vis
    fast = nz.get_normalizer(name)(z, vis)
    assert torch.equal(fast, reference)
    assert torch.equal(nz.entmax(z, vis, alpha=alpha, method="sort"), reference)
    assert (fast[:, 1] > 0).sum(-1).max() > 2 * nz.TOPK                             # the doubling was needed


@pytest.mark.parametrize("name", sorted(nz.NORMALIZERS))
def test_jacobian_equals_autograd_row_by_row(name):
    z = torch.randn(12, generator=torch.Generator().manual_seed(3)) * 2
    fn = nz.get_normalizer(name)
    expect = torch.autograd.functional.jacobian(lambda s: fn(s), z)
    torch.testing.assert_close(nz.jacobian(fn, z), expect, rtol=0, atol=1e-7)
