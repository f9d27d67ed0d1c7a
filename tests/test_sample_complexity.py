"""Token sample complexity (arXiv 2512.10656): closed forms against Monte Carlo, horizon and beta,
slope fits, chunking, the experiments in quick mode, and input validation."""
import math

import numpy as np
import pytest
import torch

from attnlab import benchmarks
from attnlab.core.capture import Trace
from attnlab.core.result import Result
from attnlab.sample_complexity import claims as scc
from attnlab.sample_complexity import experiments as te
from attnlab.sample_complexity import montecarlo as mc
from attnlab.sample_complexity import plots as scp
from attnlab.sample_complexity import theory

f64 = torch.float64


def _gen(seed):
    return mc.make_generator(seed)


def _spd(d, seed):
    g = _gen(seed)
    M = torch.randn(d, d, dtype=f64, generator=g)
    return M @ M.T / d + 0.3 * torch.eye(d, dtype=f64)


# ---------------------------------------------------------------------------------- closed forms

def test_gaussian_map_matches_monte_carlo():
    d, g = 3, _gen(1)
    Sigma = _spd(d, 2)
    m = 0.3 * torch.randn(d, dtype=f64, generator=g)
    A = 0.4 * torch.randn(d, d, dtype=f64, generator=g)
    V = torch.randn(2, d, dtype=f64, generator=g)
    n = 200_000
    keys = mc.sample_gaussian(n, m, Sigma, generator=g)
    x = torch.randn(6, d, dtype=f64, generator=g)
    emp = theory.attention_map(x, keys, A, V, chunk=2)
    exact = theory.gaussian_map(x, m, Sigma, A, V)
    # pointwise error within 4x the [DERIVED] delta-method RMS error C(x)/sqrt(n)
    bound = 4 * theory.map_error_constant(x, m, Sigma, A, V) / math.sqrt(n)
    assert ((emp - exact).norm(dim=-1) < bound).all()


def test_gaussian_output_moments_match_monte_carlo():
    d, g = 3, _gen(3)
    Sigma = _spd(d, 4)
    m = 0.2 * torch.randn(d, dtype=f64, generator=g)
    A = 0.3 * torch.randn(d, d, dtype=f64, generator=g)
    V = torch.randn(d, d, dtype=f64, generator=g)
    keys = mc.sample_gaussian(30_000, m, Sigma, generator=g)
    queries = mc.sample_gaussian(2_000, m, Sigma, generator=g)
    mean, cov = theory.output_moments(theory.attention_map(queries, keys, A, V))
    m_ex, c_ex = theory.gaussian_output_moments(m, Sigma, A, V)
    assert torch.allclose(c_ex, c_ex.T)
    assert (mean - m_ex).norm() < 0.1 * (c_ex.trace().sqrt() + m_ex.norm())
    assert (cov - c_ex).norm() < 0.1 * c_ex.norm()
    # zero-mean tokens: the exact mean vanishes; identity V matches V=None
    m0, _ = theory.gaussian_output_moments(torch.zeros(d), Sigma, A)
    assert torch.all(m0 == 0)


def test_bessel_ratio_known_values():
    r = np.array([1e-12, 0.01, 0.5, 2.0, 30.0, 1e6])
    # d = 3: A_3(r) = coth(r) - 1/r
    a3 = theory.bessel_ratio(r, 3)
    ref = np.where(r < 1e-3, r / 3, 1 / np.tanh(r) - 1 / r)
    assert np.allclose(a3, ref, rtol=1e-6, atol=1e-14)
    # small r: r/d; large r: 1 - (d-1)/(2r); monotone in r and below 1 for d = 50
    a50 = theory.bessel_ratio(r, 50)
    assert a50[0] == pytest.approx(1e-12 / 50, rel=1e-6)
    assert a50[-1] == pytest.approx(1 - 49 / 2e6, rel=1e-6)
    assert np.all(np.diff(a50) > 0) and np.all(a50 < 1)


def test_sphere_map_matches_monte_carlo():
    d, R, g = 5, 1.3, _gen(5)
    A = torch.randn(d, d, dtype=f64, generator=g)
    keys = mc.sample_sphere(300_000, d, radius=R, generator=g)
    assert torch.allclose(keys.norm(dim=-1), torch.full((300_000,), R, dtype=f64))
    x = torch.randn(4, d, dtype=f64, generator=g)
    emp = theory.attention_map(x, keys, A)
    exact = theory.sphere_map(x, A, radius=R)
    assert (emp - exact).norm(dim=-1).max() < 1e-2
    assert torch.all(theory.sphere_map(torch.zeros(1, d), A, radius=R) == 0)


def test_sphere_covariance_quadrature_mc_and_sampling_agree():
    d, R, g = 4, 1.0, _gen(6)
    A = 0.8 * torch.randn(d, d, dtype=f64, generator=g)
    V = torch.randn(d, d, dtype=f64, generator=g)
    m_q, c_q, info = theory.sphere_output_moments(A, V, radius=R, return_info=True)
    assert info["method"] == "quadrature" and torch.all(m_q == 0)
    _, c_mc = theory.sphere_output_moments(A, V, radius=R, method="mc", n_mc=200_000, seed=1)
    assert (c_q - c_mc).norm() < 0.01 * c_q.norm()
    keys = mc.sample_sphere(30_000, d, radius=R, generator=g)
    queries = mc.sample_sphere(2_000, d, radius=R, generator=g)
    _, c_emp = theory.output_moments(theory.attention_map(queries, keys, A, V))
    assert (c_emp - c_q).norm() < 0.1 * c_q.norm()


def test_sphere_covariance_small_and_huge_scale_limits():
    d = 3
    A = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=f64))
    # tiny A: Gamma(x) ~ R^2 A x / d, Cov = R^4/d^2 A Cov(X) A^T = A A^T / d^3 (R = 1)
    _, c_small = theory.sphere_output_moments(1e-4 * A)
    assert torch.allclose(c_small, (1e-8 * A @ A.T) / d ** 3, rtol=1e-4)
    # huge A: Gamma(x) -> R A x / ||A x|| on the sphere, trace(Cov) -> R^2 = 1
    _, c_big = theory.sphere_output_moments(1e6 * A)
    assert float(c_big.trace()) == pytest.approx(1.0, rel=1e-3)


# ----------------------------------------------------------------------------- horizon and beta

def test_horizon_and_beta_on_known_matrices():
    Sigma = torch.diag(torch.tensor([4.0, 1.0], dtype=f64))
    A = torch.diag(torch.tensor([1.0, 3.0], dtype=f64))
    assert theory.horizon(A, Sigma) == pytest.approx(4.0)            # diag(4, 3)
    assert theory.horizon(A, Sigma, sided="one") == pytest.approx(3.0)  # diag(2, 3)
    assert theory.horizon(torch.eye(3), 0.1 * torch.eye(3)) == pytest.approx(0.1)
    # Cholesky form used by the authors, ||L^T A L||_2, gives the same value
    S, B = _spd(4, 7), torch.randn(4, 4, dtype=f64, generator=_gen(8))
    L = torch.linalg.cholesky(S)
    assert theory.horizon(B, S) == pytest.approx(float(torch.linalg.matrix_norm(L.T @ B @ L, ord=2)), rel=1e-10)
    assert theory.beta_reference(0.0) == 0.5
    assert theory.beta_reference(1.0) == 0.25
    assert theory.beta_reference(3.0) == pytest.approx(0.05)
    assert np.allclose(theory.beta_reference(np.array([0.0, 1.0])), [0.5, 0.25])
    # temperature convention: bilinear_form includes 1/sqrt(d_head)
    Wq, Wk = torch.randn(8, 5, dtype=f64), torch.randn(8, 5, dtype=f64)
    assert torch.allclose(theory.bilinear_form(Wq, Wk), Wk.T @ Wq / math.sqrt(8))


# ------------------------------------------------------------------------------------ slope fits

def test_wls_recovers_power_law_exponent():
    n = np.geomspace(100, 10_000, 8)
    exact = 2.5 * n ** -0.37
    f = mc.fit_loglog(n, exact, 0.01 * exact, k=50)
    assert f.slope == pytest.approx(-0.37, abs=1e-10) and f.beta == pytest.approx(0.37)
    assert math.exp(f.intercept) == pytest.approx(2.5, rel=1e-8) and f.se < 1e-8 and f.weighted
    rng = np.random.default_rng(0)
    slopes, ses = [], []
    for _ in range(40):
        rel_sd = rng.uniform(0.02, 0.1, n.size)                       # heteroscedastic, known
        noisy = exact * np.exp(rng.normal(0, rel_sd))
        fit = mc.fit_loglog(n, noisy, rel_sd * noisy * math.sqrt(20), k=20)
        slopes.append(fit.slope)
        ses.append(fit.se)
    assert abs(np.mean(slopes) + 0.37) < 0.01
    assert 0.5 < np.std(slopes) / np.mean(ses) < 2.0                  # standard errors are calibrated
    ols = mc.fit_loglog(n, exact)
    assert not ols.weighted and ols.slope == pytest.approx(-0.37)


def test_curvature_separates_power_law_from_log_decay():
    n = np.geomspace(100, 1e6, 10)
    flat = mc.fit_loglog_curvature(n, 3 * n ** -0.5)
    assert abs(flat["curvature"]) < 1e-10 and flat["slope_mid"] == pytest.approx(-0.5)
    logd = mc.fit_loglog_curvature(n, 1 / np.log(n))
    assert logd["curvature"] > 0 and abs(logd["slope_mid"]) < 0.2
    assert np.allclose(mc.local_slopes(n, n ** -0.25), -0.25)


# ------------------------------------------------------------------------------ attention engine

def test_chunked_equals_dense_attention():
    g = _gen(9)
    q = torch.randn(3, 37, 6, dtype=f64, generator=g)
    k = torch.randn(3, 53, 6, dtype=f64, generator=g)
    v = torch.randn(3, 53, 4, dtype=f64, generator=g)
    dense = torch.softmax(0.7 * q @ k.transpose(-1, -2), dim=-1) @ v
    for chunk in (1, 5, 37, 100):
        assert torch.allclose(theory.attend(q, k, v, scale=0.7, chunk=chunk), dense, atol=1e-12)
    assert torch.allclose(theory.attend(q, k, v, scale=0.7, max_scores=200), dense, atol=1e-12)
    # huge scores (hardmax): finite, equal to the argmax key's value
    hard = theory.attend(q, k, v, scale=1e6)
    idx = (q @ k.transpose(-1, -2)).argmax(-1)
    assert torch.isfinite(hard).all()
    assert torch.allclose(hard, torch.gather(v, 1, idx[..., None].expand(-1, -1, 4)), atol=1e-8)


def test_batched_self_attention_equals_per_replicate_loop():
    g = _gen(10)
    X = torch.randn(5, 40, 4, dtype=f64, generator=g)
    A = torch.randn(4, 4, dtype=f64, generator=g)
    V = torch.randn(3, 4, dtype=f64, generator=g)
    mb, cb = theory.self_attention_moments(X, A, V, chunk=7)
    for i in range(5):
        mi, ci = theory.self_attention_moments(X[i], A, V)
        assert torch.allclose(mb[i], mi, atol=1e-12) and torch.allclose(cb[i], ci, atol=1e-12)
    Y = theory.self_attention(X[0], A, V)
    assert torch.allclose(ci.new_tensor(np.cov(Y.numpy().T, bias=True)), theory.output_moments(Y)[1], atol=1e-12)


# ------------------------------------------------------------------------------- experiments

PROVENANCE_KEYS = {"seed", "k", "device", "runtime_s", "temperature_convention", "n_values", "reference"}


@pytest.fixture(scope="module")
def quick_results():
    return {"uniform_map": te.uniform_map(quick=True), "moment_convergence": te.moment_convergence(quick=True),
            "hardmax": te.hardmax(quick=True)}


def test_quick_experiments_return_results(quick_results, tmp_path):
    for name, res in quick_results.items():
        assert isinstance(res, Result) and res.select(kind="point") and res.select(kind="fit")
        assert PROVENANCE_KEYS <= set(res.provenance), name
        for p in res.select(kind="point"):
            assert p["err_mean"] > 0 and p["err_se"] == pytest.approx(p["err_std"] / math.sqrt(p["k"]))
        fig = getattr(scp, f"plot_{name}")(res)
        assert fig.axes and fig.get_suptitle()
        res.save(tmp_path)
        assert len(Result.load(tmp_path, res.name).rows) == len(res.rows)
    mc = quick_results["moment_convergence"]
    assert set(mc.unique("reference")) == {"exact", "sample"}
    fit = mc.select(kind="fit")[0]
    assert fit["horizon_authors"] == pytest.approx(math.sqrt(8) * fit["horizon"])     # d = 8
    assert fit["beta_ref"] == pytest.approx(theory.beta_reference(fit["horizon"]))
    um = quick_results["uniform_map"].select(kind="fit")
    assert all(f["C"] > 0 and f["C_pred"] > 0 for f in um)


def test_claims_rows(quick_results):
    rows = scc.tsc_claims(quick_results)
    assert [r["id"] for r in rows] == ["tsc-uniform-rate", "tsc-uniform-constant", "tsc-moments-beta",
                                       "tsc-hardmax", "tsc-real-beta"]
    for r in rows:
        assert set(r) == {"id", "claim", "paper", "measured", "verdict"}
        assert r["verdict"] in ("holds", "does not hold", "not applicable")
    assert rows[-1]["verdict"] == "not applicable"
    assert all(r["verdict"] == "not applicable" for r in scc.tsc_claims({}))


def test_bench_monte_carlo_rows():
    res = benchmarks.bench_monte_carlo(n_values=(16, 32), k=4, d=6, repeats=1)
    assert {r["method"] for r in res.rows} == {"vectorised", "loop"}
    assert all(r["seconds"] > 0 and r["max_abs_diff"] < 1e-5 for r in res.rows)


# ------------------------------------------------------------- real encoder on a tiny random BERT

class TinyBert:
    """A randomly initialised 2-layer BertModel behind the slice of attnlab.core.models.AttnModel's API
    that real_encoder uses (hf, name, max_positions, capture). Also records the model's own
    attention.self outputs, to check the recomputation."""

    def __init__(self, seed=0):
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.hf = BertModel(cfg, add_pooling_layer=False).eval()
        self.name, self.max_positions, self.tokenizer = "tiny-bert (random init)", 64, None
        self.context = {}

    def capture(self, ids, keep=("q", "k", "v", "hidden"), **_):
        layers = self.hf.encoder.layer
        inputs, hooks = {}, []
        for i, layer in enumerate(layers):
            def pre(mod, args, kwargs, i=i):
                inputs[i] = (args[0] if args else kwargs["hidden_states"])[0].detach()

            def post(mod, args, out, i=i):
                self.context[i] = out[0][0].detach()
            hooks += [layer.attention.self.register_forward_pre_hook(pre, with_kwargs=True),
                      layer.attention.self.register_forward_hook(post)]
        try:
            with torch.no_grad():
                self.hf(input_ids=ids[None])
                sa = layers[0].attention.self
                nh, dh = sa.num_attention_heads, sa.attention_head_size
                proj = {nm: torch.stack([getattr(l.attention.self, lin)(inputs[i]).view(-1, nh, dh).transpose(0, 1)
                                         for i, l in enumerate(layers)])
                        for nm, lin in (("q", "query"), ("k", "key"), ("v", "value"))}
        finally:
            for h in hooks:
                h.remove()
        return Trace(model_name=self.name, token_ids=ids, layers=list(range(len(layers))), heads=list(range(nh)),
                     causal=False, scaling=sa.scaling, hidden=torch.stack([inputs[i] for i in range(len(layers))]),
                     **proj)


def test_real_encoder_on_tiny_bert():
    model = TinyBert()
    ids = torch.randint(0, 60, (48,), generator=_gen(11))
    trace = model.capture(ids)
    for i in range(2):
        mine = te.multihead_self_attention(trace.q[i], trace.k[i], trace.v[i], trace.scaling)
        assert torch.allclose(mine, model.context[i], atol=1e-5)           # the model's own attention
    res = te.real_encoder(model, ids=ids, quick=True, seed=3)
    fits = res.select(kind="fit")
    assert {f["layer"] for f in fits} == {0, 1} and {f["moment"] for f in fits} == {"mean", "cov"}
    assert all(f["horizon_authors"] == pytest.approx(math.sqrt(8) * f["horizon"]) for f in fits)  # d_head = 8
    sa = model.hf.encoder.layer[1].attention.self
    hid = trace.hidden[1].double()
    Sigma = torch.cov(hid.T, correction=0)
    A = sa.scaling * sa.key.weight.double().T @ sa.query.weight.double()
    assert fits[-1]["horizon"] == pytest.approx(theory.horizon(A, Sigma), rel=1e-6)
    assert "with replacement" in res.provenance["subsampling"].lower()
    scp.plot_real_encoder(res)
    assert scc.tsc_claims({"real_encoder": res})[-1]["verdict"] in ("holds", "does not hold")
    with pytest.raises(ValueError, match="layers"):
        te.real_encoder(model, ids=ids, quick=True, layers=[5])


# ------------------------------------------------------------------------------------ bad input

def test_bad_input_raises_clear_errors():
    S, A = torch.eye(3, dtype=f64), torch.eye(3, dtype=f64)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        mc.sample_gaussian(0, torch.zeros(3), S)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        te.moment_convergence(quick=True, n_values=(0, 10))
    with pytest.raises(ValueError, match="scale must be a finite number >= 0"):
        te.moment_convergence(quick=True, scales=(-1.0,))
    with pytest.raises(ValueError, match="positive semi-definite"):
        theory.horizon(A, torch.diag(torch.tensor([1.0, -1.0, 1.0])))
    with pytest.raises(ValueError, match="symmetric"):
        theory.gaussian_output_moments(torch.zeros(2), torch.tensor([[1.0, 0.5], [0.0, 1.0]]), torch.eye(2))
    with pytest.raises(ValueError, match="dimension mismatch"):
        theory.attention_map(torch.zeros(2, 3), torch.zeros(5, 4), torch.eye(4))
    with pytest.raises(ValueError, match="dimension mismatch"):
        theory.gaussian_output_moments(torch.zeros(4), torch.eye(4), A)
    with pytest.raises(ValueError, match="dimension mismatch"):
        theory.self_attention(torch.zeros(5, 3), A, V=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="at least 2 points"):
        mc.fit_loglog([10], [0.1])
    with pytest.raises(ValueError, match="unknown preset"):
        te.hardmax(preset="huge")
    with pytest.raises(ValueError, match="reference must be"):
        te.moment_convergence(quick=True, reference="population")
    with pytest.raises(ValueError, match="cov_norm"):
        theory.moment_errors(torch.zeros(2), torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, 2), cov_norm="nuc")
    with pytest.raises(ValueError, match="CUDA"):
        if not torch.cuda.is_available():
            te.uniform_map(quick=True, device="cuda")
        else:
            raise ValueError("CUDA available: skip")


def test_real_encoder_minilm_quick():
    from attnlab.core.models import ModelUnavailable, load_model

    try:
        model = load_model("minilm")
        res = te.real_encoder(model, quick=True, layers=[0, 5])
    except (ModelUnavailable, FileNotFoundError, RuntimeError) as exc:
        pytest.skip(f"MiniLM or WikiText-2 unavailable: {exc}")
    assert res.provenance["model"] == "minilm" and res.provenance["window_tokens"] == 64
    assert res.provenance["text"] == "wikitext2" and res.provenance["text_sha256"]
    fits = res.select(kind="fit")
    assert {f["layer"] for f in fits} == {0, 5}
    assert all(f["d_head"] == 32 and f["n_heads"] == 12 for f in fits)
    assert all(f["horizon_authors"] == pytest.approx(math.sqrt(32) * f["horizon"]) for f in fits)
