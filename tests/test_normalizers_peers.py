"""Softpick and sigmoid attention (the normalizers of the papers that followed): the formulas, their stable
forms against the naive float64 ones, what they do not normalize, and the swap into a pretrained model."""
import math

import pytest
import torch

from attnlab.tools import normalizers as nz


def naive_softpick(z: torch.Tensor, vis: torch.Tensor, eps: float = nz.SOFTPICK_EPS) -> torch.Tensor:
    e = torch.where(vis, torch.exp(z.double()) - 1, torch.zeros((), dtype=torch.float64))
    return torch.relu(e) / (e.abs().sum(-1, keepdim=True) + eps)


def test_softpick_equals_the_formula_and_sums_to_p_over_p_plus_n():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 9, generator=g) * 3
    vis = torch.rand(5, 9, generator=g) > 0.3
    vis[:, 0] = True
    got = nz.softpick(z, vis)
    torch.testing.assert_close(got.double(), naive_softpick(z, vis), rtol=1e-5, atol=1e-7)
    e = torch.where(vis, torch.exp(z.double()) - 1, torch.zeros((), dtype=torch.float64))
    P, N = e.clamp(min=0).sum(-1), (-e).clamp(min=0).sum(-1)
    torch.testing.assert_close(got.sum(-1).double(), P / (P + N), rtol=1e-5, atol=1e-7)
    assert (got[~vis] == 0).all() and (got >= 0).all() and (got.sum(-1) <= 1 + 1e-6).all()


def test_softpick_is_stable_where_the_naive_form_overflows_and_zero_on_negative_rows():
    z = torch.tensor([[500.0, 499.0, -3.0, 0.0], [-200.0, -1.0, -0.5, -300.0], [0.0, 0.0, 0.0, 0.0]])
    p = nz.softpick(z)
    assert torch.isfinite(p).all()
    assert torch.isinf(torch.exp(z[0]).float()).any()                  # the naive float32 form overflows here
    torch.testing.assert_close(p[0].double(), naive_softpick(z[:1], torch.ones(1, 4, dtype=torch.bool))[0])
    assert (p[1] == 0).all() and (p[2] == 0).all()                     # no positive score: attends to nothing


def test_sigmoid_attention_is_sigmoid_of_score_minus_log_n_per_row():
    z = torch.randn(6, 6)
    vis = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    p = nz.sigmoid_attention(z, vis)
    for t in range(6):
        torch.testing.assert_close(p[t, : t + 1], torch.sigmoid(z[t, : t + 1] - math.log(t + 1)))
    assert (p[~vis] == 0).all()
    zeros = nz.sigmoid_attention(torch.zeros(3, 10))                   # n equal scores 0 sum to n / (n + 1)
    torch.testing.assert_close(zeros.sum(-1), torch.full((3,), 10 / 11))
    torch.testing.assert_close(nz.sigmoid_attention(z, bias=0.0), torch.sigmoid(z))
    torch.testing.assert_close(nz.sigmoid_attention(z, vis, T=2.0), nz.sigmoid_attention(z / 2, vis))


@pytest.mark.parametrize("bad", [dict(bias=float("nan")), dict(bias="x")])
def test_sigmoid_attention_rejects_a_bad_bias(bad):
    with pytest.raises(ValueError, match="bias"):
        nz.get_normalizer("sigmoid", **bad)


def test_softpick_rejects_a_bad_eps():
    with pytest.raises(ValueError, match="eps"):
        nz.get_normalizer("softpick", eps=0)


@pytest.mark.parametrize("name", ["softpick", "sigmoid"])
def test_swapped_into_a_model_its_weights_are_the_normalizer_of_its_scores(tiny, name):
    fn = nz.get_normalizer(name)
    ids = torch.arange(300, 340)
    native = tiny.capture(ids, keep=("probs",)).probs
    with tiny.normalizer(fn):
        sw = tiny.capture(ids, keep=("probs", "scores"))
    vis = sw.visible()
    torch.testing.assert_close(sw.probs[0], fn(sw.scores[0].nan_to_num(neginf=0.0), vis))   # layer 0: same input
    assert not torch.allclose(sw.probs, native)
    assert (sw.probs[..., ~vis] == 0).all()
    assert name not in nz.SUMS_TO_ONE
