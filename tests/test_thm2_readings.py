"""Readings of Theorem 2 / Fig. 3 and Fig. 4 (issue #14): the radius, rows and direction switches and the exact
T -> 0 limit of g against the per-row oracle, the limit against g at a tiny T, the two experiments and their
claims (the default readings give the claim checker's verdicts)."""
import math

import matplotlib
import numpy as np
import pytest
import torch

from attnlab.core.capture import Trace
from attnlab.core.verdicts import VERDICTS
from attnlab.normalization import claims, oracle, readings
from attnlab.normalization import experiments as ex
from attnlab.normalization.metrics import gradients, separability
from attnlab.normalization.readings import lemma2, theorem2

matplotlib.use("Agg")


def _inputs(seed=0, layers=2, heads=2, L=12, D=4, sharp=2.0, causal=True):
    g = torch.Generator().manual_seed(seed)
    vis = torch.tril(torch.ones(L, L, dtype=torch.bool)) if causal else torch.ones(L, L, dtype=torch.bool)
    scores = (torch.randn(layers, heads, L, L, generator=g) * sharp).masked_fill(~vis, float("-inf"))
    return scores, torch.softmax(scores, -1), torch.randn(layers, heads, L, D, generator=g), vis


def _close(a, b, rtol=1e-5, atol=1e-9):
    assert a.shape == b.shape
    assert torch.equal(torch.isnan(a), torch.isnan(b)), "different rows skipped"
    m = ~torch.isnan(a)
    assert torch.allclose(a[m], b[m], rtol=rtol, atol=atol), float(((a[m] - b[m]).abs() / (b[m].abs() + atol)).max())


STATS = separability.SEPARABILITY_STATS + separability.RADIUS_STATS


@pytest.mark.parametrize("causal,keys", [(True, "visible"), (True, "all"), (False, "visible")])
@pytest.mark.parametrize("radius", ["nearest", "closed"])
@pytest.mark.parametrize("rows", ["positive_r", "all"])
def test_separability_switches_equal_oracle(causal, keys, radius, rows):
    _, probs, x, vis = _inputs(seed=1, causal=causal)
    x[..., 2, :] = 0.0                                    # zero vectors: rows where r = 0 (s = 0 = a_j x_j)
    x[..., 5, :] = 0.0
    probs = probs.clone()
    probs[..., 5] += 2.0 * vis[:, 5]                      # key 5 (x = 0) is the heaviest where visible
    probs = (probs * (vis if keys == "visible" else torch.ones_like(vis))).double()
    probs = (probs / probs.sum(-1, keepdim=True)).float()
    visible = vis if keys == "visible" else None
    ns = [1, 2, 4, 8]
    a = separability.separability_stats(probs, x, ns, visible, stats=STATS, radius=radius, rows=rows, chunk=30)
    b = oracle.separability_stats(probs, x, ns, visible, stats=STATS, radius=radius, rows=rows)
    for k in STATS:
        _close(a[k], b[k], atol=1e-7)
    assert torch.equal(a["ns_frac"].nan_to_num(-1), a[f"ns_frac_{radius}"].nan_to_num(-1))
    r0 = a["r"] == 0
    assert bool(r0.any()) == (rows == "all")              # r = 0 rows exist, kept only under "all" ...
    if rows == "all":
        assert bool((a["ns_frac"][r0] == 0).all()) and bool(torch.isnan(a["lower_row"][r0]).all())  # ... N_s = 0


def test_closed_ball_counts_a_tie_at_r():
    """Keys 1 and 2 carry the same weight and vector: at N = 2 key 1 is selected and sits exactly at r."""
    probs = torch.tensor([[0.4, 0.3, 0.3]])
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    for impl in (separability, oracle):
        st = impl.separability_stats(probs, x, [2], stats=separability.RADIUS_STATS)
        assert float(st["ns_frac_closed"][0, 0]) == 1.0 and float(st["ns_frac_nearest"][0, 0]) == 0.5


def test_bad_switches_are_refused():
    _, probs, x, vis = _inputs()
    with pytest.raises(ValueError, match="radius"):
        separability.separability_stats(probs, x, [1], vis, radius="open")
    with pytest.raises(ValueError, match="rows"):
        separability.separability_stats(probs, x, [1], vis, rows="some")
    with pytest.raises(ValueError, match="direction"):
        gradients.fd_grad_norms(probs.log(), [1.0], [0.1], vis, direction="worst")


@pytest.mark.parametrize("direction", gradients.DIRECTIONS)
def test_fd_directions_and_limit_equal_oracle(direction):
    scores, _, _, vis = _inputs(seed=2, L=10)
    scores[0, 0, 6, :3] = scores[0, 0, 6, 3]              # an exact four-way tie at the top of a row
    scores[0, 0, 6, 4:7] = scores[0, 0, 6, 3] - 5
    Ts, Es = [0.003, 0.1, 1.0, 30.0], [1e-3, 0.1, 10.0]
    _close(gradients.fd_grad_norms(scores, Ts, Es, vis, seed=5, direction=direction, chunk=25),
           oracle.fd_grad_norms(scores, Ts, Es, vis, seed=5, direction=direction), atol=1e-9)
    lim = gradients.fd_grad_limit(scores, Es, vis, seed=5, direction=direction, chunk=25)
    _close(lim, oracle.fd_grad_limit(scores, Es, vis, seed=5, direction=direction), atol=1e-12)
    eps = torch.tensor(Es, dtype=torch.float64)
    ok = ~torch.isnan(lim)
    assert bool((lim[ok] <= (math.sqrt(2) / eps).expand_as(lim)[ok] * (1 + 1e-12)).all())   # the cap sqrt(2)/eps
    tie = lim[0, 0, 6] * eps                              # ||u_B - u_A|| with |A| = 4: in {0, ..., sqrt(1/4 + 1)}
    assert bool((tie > 0).all()) and bool((tie <= math.sqrt(1.25) + 1e-12).all())
    v = gradients.random_directions(scores.shape[:-2], vis, 5, direction)
    assert torch.allclose(v.norm(dim=-1), torch.ones(v.shape[:-1], dtype=torch.float64))
    if direction == "rademacher":
        n = vis.sum(-1).double()
        assert torch.allclose(v.abs(), vis / n.sqrt().unsqueeze(-1))
    keys = scores.topk(2, -1).indices
    assert torch.equal(gradients.random_direction_entries(scores.shape[:-2], vis, keys, 5, direction),
                       v.gather(-1, keys))


def test_gaussian_directions_are_the_default_and_unchanged():
    """The default draw is the seeded stream Fig. 4 always used (one generator per (seed, head))."""
    scores, _, _, vis = _inputs(seed=3)
    v = gradients.random_directions(scores.shape[:-2], vis, 7)
    for b in range(4):
        z = torch.randn(*vis.shape, generator=torch.Generator().manual_seed(7 * 1_000_003 + b)).double() * vis
        assert torch.equal(v.reshape(4, *vis.shape)[b], z / z.norm(dim=-1, keepdim=True))
    a = gradients.fd_grad_norms(scores, [0.5], [0.1], vis, seed=1)
    assert torch.equal(a.nan_to_num(-1), gradients.fd_grad_norms(scores, [0.5], [0.1], vis, seed=1,
                                                                 direction="gaussian").nan_to_num(-1))


@pytest.mark.parametrize("direction", gradients.DIRECTIONS)
def test_g_at_tiny_T_is_its_T_to_0_limit_away_from_ties(direction):
    """g(T = 1e-4, eps) equals the limit on rows whose top-2 gaps (of l and of l + eps v) exceed 50 T; the token
    mean of the limit is (sqrt 2 / eps) x the share of rows whose argmax the step flips."""
    scores, _, _, vis = _inputs(seed=4, layers=3, heads=4, L=24, sharp=3.0)
    T, Es = 1e-4, [1e-3, 0.1, 10.0]
    g = gradients.fd_grad_norms(scores, [T], Es, vis, seed=0, direction=direction)[..., 0, :]
    lim = gradients.fd_grad_limit(scores, Es, vis, seed=0, direction=direction)
    v = gradients.random_directions(scores.shape[:-2], vis, 0, direction)
    l = scores.double()
    flips = 0
    for ei, eps in enumerate(Es):
        far = (lemma2.top2_gaps(l, vis)[0] > 50 * T) & (lemma2.top2_gaps(l + eps * v, vis)[0] > 50 * T)
        assert int(far.sum()) > 100
        _close(g[..., ei][far], lim[..., ei][far], rtol=1e-6, atol=1e-12)
        moved = l.argmax(-1) != (l + eps * v).masked_fill(~vis, -math.inf).argmax(-1)
        ok = vis.sum(-1) >= 2
        assert torch.allclose(lim[..., ei][..., ok], math.sqrt(2) / eps * moved[..., ok].double())
        flips += int(moved[..., ok].sum())
    assert flips > 0


# ------------------------------------------------------------------------------------------ experiments

class FakeModel:
    """A tiny random attention model with the AttnModel API (causal or bidirectional)."""

    def __init__(self, causal=True, n_layers=2, n_heads=3, d_head=4, max_positions=64, vocab=50, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.name, self.causal, self.max_positions = f"fake-{causal}", causal, max_positions
        self.n_layers, self.n_heads, self.d_head, self.device = n_layers, n_heads, d_head, torch.device("cpu")
        d = n_heads * d_head
        self.emb, self.pos = torch.randn(vocab, d, generator=g), torch.randn(max_positions, d, generator=g) * 0.5
        self.W = torch.randn(n_layers, 3, d, d, generator=g) / d ** 0.5 * 3

    def capture(self, ids, *, keep=("probs",), **_):
        L, H, dh = len(ids), self.n_heads, self.d_head
        h = self.emb[ids] + self.pos[:L]
        vis = torch.tril(torch.ones(L, L, dtype=torch.bool)) if self.causal else torch.ones(L, L, dtype=torch.bool)
        out = {k: [] for k in ("k", "v", "scores", "probs", "hidden")}
        for layer in range(self.n_layers):
            q, k, v = ((h @ self.W[layer, i]).reshape(L, H, dh).transpose(0, 1) for i in range(3))
            sc = (q @ k.transpose(-1, -2) * dh ** -0.5).masked_fill(~vis, float("-inf"))
            pr = torch.softmax(sc, -1)
            for name, t in (("k", k), ("v", v), ("scores", sc), ("probs", pr), ("hidden", h)):
                out[name].append(t)
            h = h + (pr @ v).transpose(0, 1).reshape(L, H * dh)
        return Trace(self.name, torch.as_tensor(ids), list(range(self.n_layers)), list(range(H)), self.causal,
                     dh ** -0.5, None, **{k: (torch.stack(v) if k in keep else None) for k, v in out.items()})


TEXT = {"text": "synthetic", "text_sha256": "ab" * 32, "offset": 0}


@pytest.mark.parametrize("causal", [True, False])
def test_experiments_claims_and_plots(causal):
    model = FakeModel(causal=causal)
    ids = torch.arange(40) % 50
    ns, Ts = list(range(1, 21)), [1e-3, 1e-2, 0.05, 1.0, 10.0]
    sep = theorem2.separability_readings(model, ids, progress=False, ns=ns, text=TEXT)
    grad = lemma2.gradient_readings(model, ids, progress=False, temperatures=Ts, jac_rows=8, text=TEXT)
    heads = model.n_layers * model.n_heads
    assert len(sep.rows) == len(readings.VECTORS) * 2 * 2 * len(ns) * heads
    assert len(grad.rows) == heads * (2 * (len(Ts) + 1) * 3 + len(Ts))
    for res in (sep, grad):
        assert res.provenance["text_sha256"] == "ab" * 32 and res.provenance["window_tokens"] == 40
    assert set(sep.provenance["readings"]["VECTORS"]) == set(readings.VECTORS)
    both = {"separability_readings": sep, "gradient_readings": grad}
    rows = theorem2.reading_claims(both) + lemma2.reading_claims(both)
    assert all(r["verdict"] in VERDICTS and r["reading"] for r in rows)
    keys = {(r["id"], r["reading"]) for r in rows}
    assert len(keys) == len(rows)                                            # every reading once
    n_sep = len(readings.SEP_AGGREGATES) * len(readings.VECTORS) * len(readings.RADII) * len(readings.ROW_SETS)
    assert sum(r["id"] == "p1-fig3-saturation" for r in rows) == n_sep
    assert sum(r["id"] == "p1-fig4-slope" for r in rows) == len(readings.G_AGGREGATES) * 7
    # the default readings measure what the claim checker measures on fig3 / fig4
    f3 = ex.fig3(model, ids, progress=False, ns=ns, text=TEXT)
    f4 = ex.fig4(model, ids, progress=False, temperatures=Ts, text=TEXT)
    ref = {r["id"]: r for r in claims.paper1_claims({"fig3": f3, "fig4": f4})}
    default = {"p1-fig3-saturation": " / ".join(theorem2.SEP_DEFAULT), "p1-thm2-lower": "xi=row / v_unit / nearest / "
               "positive_r", "p1-thm2-upper-B": "xi=row / v_unit / nearest / positive_r",
               "p1-thm2-upper-R": "xi=row / v_unit / nearest / positive_r",
               "p1-fig4-slope": "max_head_mean / gaussian / eps=0.001"}
    mine = {r["id"]: r for r in rows if default.get(r["id"]) == r["reading"]}
    assert set(mine) == set(default)
    for cid, r in mine.items():
        assert r["verdict"] == ref[cid]["verdict"], cid
    assert mine["p1-fig3-saturation"]["measured"].split(" (")[0] == ref["p1-fig3-saturation"]["measured"].split(" (")[0]
    assert mine["p1-fig4-slope"]["measured"].split(";")[0] == ref["p1-fig4-slope"]["measured"].split(";")[0]
    # the limit rows: the plateau is (sqrt 2 / eps) x the flip share, head by head
    for r in grad.rows:
        if r["T"] == 0.0:
            assert math.isclose(r["g_mean"], math.sqrt(2) / r["eps"] * r["flip_frac"], rel_tol=1e-9, abs_tol=1e-12)
    table = lemma2.g_table(grad)
    for agg in readings.G_AGGREGATES:
        T, g = lemma2.g_curve(table, "gaussian", 0.1, agg)
        assert list(T) == Ts and np.isfinite(g).all()
    for fig in (theorem2.plot_separability_readings(sep, aggregate="q75", radius="closed", rows="all"),
                lemma2.plot_gradient_readings(grad), lemma2.plot_gradient_readings(grad, aggregate="max_row",
                                                                             direction="worst")):
        assert fig.get_size_inches()[0] <= 6.8
        assert "fake" in fig._suptitle.get_text()


def test_missing_results_quick_grids_and_bad_protocol():
    rows = theorem2.reading_claims({}) + lemma2.reading_claims({})
    assert rows and all(r["verdict"] == "not applicable" for r in rows)
    sep = theorem2.separability_readings(FakeModel(), torch.arange(40), quick=True, progress=False,
                                    vectors=["v_unit", "k"])
    assert sep.provenance["grids"]["ns"] == list(range(1, 9)) and sep.provenance["quick"]
    only_sep = {"separability_readings": sep}
    rows = theorem2.reading_claims(only_sep) + lemma2.reading_claims(only_sep)
    assert all(r["verdict"] == "not applicable" for r in rows if r["id"] == "p1-fig3-saturation")   # no N >= 16
    lower = [r["verdict"] for r in rows if r["id"] == "p1-thm2-lower" and r["reading"].startswith("xi=row / v_unit")]
    assert lower == ["holds"]                                                # a theorem
    with pytest.raises(ValueError, match="unknown protocol"):
        theorem2.separability_readings(FakeModel(), torch.arange(10), progress=False, x="v")
    with pytest.raises(ValueError, match="unknown vectors"):
        theorem2.separability_readings(FakeModel(), torch.arange(10), progress=False, vectors=["q"])
    with pytest.raises(ValueError, match="unknown directions"):
        lemma2.gradient_readings(FakeModel(), torch.arange(10), progress=False, directions=["up"])
