"""Token sample complexity (arXiv 2512.10656): closed forms against Monte Carlo, horizon and beta,
slope fits, chunking, the experiments in quick mode, and input validation."""
import math

import numpy as np
import pytest
import torch

from attnlab import benchmarks
from attnlab.core.capture import Trace
from attnlab.core.result import Result
from attnlab.figures import FIGURES
from attnlab.sample_complexity import claims as scc
from attnlab.sample_complexity import experiments as te
from attnlab.sample_complexity import montecarlo as mc
from attnlab.sample_complexity import plots as scp
from attnlab.sample_complexity import real_tokens, sphere, theory

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
    return {r.name: r for r in (te.uniform_map(quick=True), te.moment_convergence(quick=True),
                                sphere.hardmax(quick=True))}


def test_quick_experiments_return_results(quick_results, tmp_path):
    for name, res in quick_results.items():
        assert isinstance(res, Result) and res.select(kind="point") and res.select(kind="fit")
        assert PROVENANCE_KEYS <= set(res.provenance), name
        for p in res.select(kind="point"):
            assert p["err_mean"] > 0 and p["err_se"] == pytest.approx(p["err_std"] / math.sqrt(p["k"]))
        fig = FIGURES[name].plot(res)
        assert fig.axes and fig.get_suptitle()
        res.save(tmp_path)
        assert len(Result.load(tmp_path, res.name).rows) == len(res.rows)
    mc = quick_results["tsc_moments"]
    assert set(mc.unique("reference")) == {"exact", "sample"}
    fit = mc.select(kind="fit")[0]
    assert fit["horizon_authors"] == pytest.approx(math.sqrt(8) * fit["horizon"])     # d = 8
    assert fit["beta_ref"] == pytest.approx(theory.beta_reference(fit["horizon"]))
    um = quick_results["tsc_uniform"].select(kind="fit")
    assert all(f["C"] > 0 and f["C_pred"] > 0 for f in um)


def test_claims_rows(quick_results):
    rows = scc.tsc_claims(quick_results)
    assert [r["id"] for r in rows] == ["tsc-uniform-rate", "tsc-uniform-constant", "tsc-moments-beta",
                                       "tsc-hardmax", "tsc-real-beta", "tsc-real-beta-heads"]
    assert rows[-1]["reading"] == scc.HEADS_READING and all(not r["reading"] for r in rows[:-1])
    for r in rows:
        assert set(r) == {"id", "reading", "claim", "paper", "measured", "verdict", "value", "unit", "model"}
        assert r["verdict"] in ("holds", "does not hold", "not applicable")
    assert rows[-1]["verdict"] == "not applicable"
    assert [r["model"] for r in rows] == [None] * 6        # synthetic tokens, and no tsc_real here: no model
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

    def __init__(self, seed=0, heads=4):
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=heads,
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
        mine = real_tokens.multihead_self_attention(trace.q[i], trace.k[i], trace.v[i], trace.scaling)
        assert torch.allclose(mine, model.context[i], atol=1e-5)           # the model's own attention
    res = real_tokens.real_encoder(model, ids=ids, quick=True, seed=3)
    fits = res.select(kind="fit")
    assert {f["layer"] for f in fits} == {0, 1} and {f["moment"] for f in fits} == {"mean", "cov"}
    assert all(f["horizon_authors"] == pytest.approx(math.sqrt(8) * f["horizon"]) for f in fits)  # d_head = 8
    sa = model.hf.encoder.layer[1].attention.self
    hid = trace.hidden[1].double()
    Sigma = torch.cov(hid.T, correction=0)
    A = sa.scaling * sa.key.weight.double().T @ sa.query.weight.double()
    assert fits[-1]["horizon"] == pytest.approx(theory.horizon(A, Sigma), rel=1e-6)
    heads = res.select(kind="head", layer=1)                  # per-head horizons, A_h = scaling W_kh^T W_qh
    assert [r["head"] for r in heads] == [0, 1, 2, 3] and all(r["d_head"] == 8 for r in heads)
    Wq, Wk = sa.query.weight.double(), sa.key.weight.double()
    for r in heads:
        h = r["head"]
        A_h = sa.scaling * Wk[8 * h:8 * h + 8].T @ Wq[8 * h:8 * h + 8]
        assert r["horizon"] == pytest.approx(theory.horizon(A_h, Sigma), rel=1e-6)
        assert r["horizon_authors"] == pytest.approx(math.sqrt(8) * r["horizon"])
    assert all(np.isfinite(r[f"beta_{m}"]) and np.isfinite(r[f"beta_{m}_se"]) for r in heads for m in ("mean", "cov"))
    assert "with replacement" in res.provenance["subsampling"].lower()
    scp.plot_real_encoder(res)
    scp.plot_real_heads(res, 1)
    assert scc.tsc_claims({"tsc_real": res})[-1]["verdict"] in ("holds", "does not hold")
    with pytest.raises(ValueError, match="layers"):
        real_tokens.real_encoder(model, ids=ids, quick=True, layers=[5])


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
        sphere.hardmax(preset="huge")
    with pytest.raises(ValueError, match="reference must be"):
        te.moment_convergence(quick=True, reference="population")
    with pytest.raises(ValueError, match="cov_norm"):
        theory.moment_errors(torch.zeros(2), torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, 2), cov_norm="nuc")
    if not torch.cuda.is_available():                   # with a GPU, "cuda" is a valid device
        with pytest.raises(ValueError, match="CUDA"):
            te.uniform_map(quick=True, device="cuda")


def test_real_encoder_minilm_quick():
    from attnlab.core.models import ModelUnavailable, load_model

    try:
        model = load_model("minilm")
        res = real_tokens.real_encoder(model, quick=True, layers=[0, 5])
    except (ModelUnavailable, FileNotFoundError) as exc:       # a RuntimeError is a failure, not a skip
        pytest.skip(f"MiniLM or WikiText-2 unavailable: {exc}")
    assert res.provenance["model"] == "minilm" and res.provenance["window_tokens"] == 64
    assert res.provenance["text"] == "wikitext2" and res.provenance["text_sha256"]
    fits = res.select(kind="fit")
    assert {f["layer"] for f in fits} == {0, 5}
    assert all(f["d_head"] == 32 and f["n_heads"] == 12 for f in fits)
    assert all(f["horizon_authors"] == pytest.approx(math.sqrt(32) * f["horizon"]) for f in fits)


# ------------------------------------------------- issue #14: the authors' finite reference, fits, A_d guard

def test_sample_reference_floors_mean_but_not_covariance():
    """Gaussian tokens at a large scale (H ~ 2): against one finite n_ref-token sample the mean error
    flattens (its slope is shallower than against the exact limit) while the covariance slope gets
    steeper, because the sample shares the covariance estimator's finite-n bias."""
    res = te.sample_reference_effect(quick=True)                          # d=32, s=50, n=64..512, n_ref=4096
    eff = {e["moment"]: e for e in res.select(kind="effect")}
    assert eff["mean"]["slope_sample"] > eff["mean"]["slope_exact"]      # shallower: a floor
    assert eff["mean"]["delta_beta"] < 0
    assert eff["cov"]["slope_sample"] < eff["cov"]["slope_exact"]        # steeper: no floor
    assert eff["cov"]["delta_beta"] > 0.05
    dec = {(r["moment"], r["n"]): r for r in res.select(kind="decomposition")}
    ns = sorted({n for _, n in dec})
    for n in ns:
        m, c = dec["mean", n], dec["cov", n]
        for r in (m, c):                                                  # the identity behind the rows
            assert r["mse_sample"] == pytest.approx(r["mse_exact"] + r["ref_dev2"] - 2 * r["cross"], rel=1e-9)
        # the mean is unbiased (E[m_n] = m by symmetry): its replicate average is at its noise level
        assert m["bias2"] < 3 * m["bias_noise2"]
        # the covariance is biased, and the reference's error points the same way
        assert c["bias2"] > 5 * c["bias_noise2"] and c["cos"] > 0.8
        assert c["mse_sample"] < c["mse_exact"]                           # the sample reference removes error
    assert np.mean([dec["mean", n]["mse_sample"] - dec["mean", n]["mse_exact"] for n in ns]) > 0   # and adds here
    assert abs(np.mean([dec["mean", n]["cos"] for n in ns])) < 0.5
    assert "floors the mean error" in res.provenance["finding"]
    fig = scp.plot_sample_reference_effect(res)
    assert len(fig.axes) == 3


def test_sample_reference_rows_match_moment_convergence():
    kw = dict(d=6, rho=0.1, scales=(5.0,), n_values=(32, 64), k=3, n_ref=256, seed=2, dtype="float64")
    a = te.sample_reference_effect(**kw)
    b = te.moment_convergence(reference="both", **kw)
    key = lambda r: (r["n"], r["reference"], r["moment"])                 # noqa: E731
    pa = sorted(a.select(kind="point"), key=key)
    pb = sorted(b.select(kind="point"), key=key)
    assert [key(r) for r in pa] == [key(r) for r in pb]
    for x, y in zip(pa, pb):
        assert x["err_mean"] == pytest.approx(y["err_mean"], rel=1e-9)
        assert x["err_std"] == pytest.approx(y["err_std"], rel=1e-7)
    with pytest.raises(ValueError, match="k >= 2"):
        te.sample_reference_effect(**{**kw, "k": 1})


def test_ols_and_wls_fits():
    n = np.geomspace(1000, 30000, 8)
    x = np.log(n)
    exact = 1.7 * n ** -0.2
    std = 0.05 * exact * np.linspace(1, 8, n.size)                        # heteroscedastic error bars
    w = mc.fit_loglog(n, exact, std, k=10)
    o = mc.fit_loglog(n, exact, std, k=10, method="ols")
    assert w.weighted and not o.weighted
    assert w.slope == pytest.approx(-0.2, abs=1e-12) and o.slope == pytest.approx(-0.2, abs=1e-12)
    # OLS is np.polyfit(..., cov=True), slope and standard error (the authors' sphere fit)
    rng = np.random.default_rng(3)
    noisy = exact * np.exp(rng.normal(0, 0.05, n.size))
    o = mc.fit_loglog(n, noisy, std, k=10, method="ols")
    (p1, _), cov = np.polyfit(x, np.log(noisy), 1, cov=True)
    assert o.slope == pytest.approx(p1, rel=1e-10) and o.se == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-8)
    # one point off the power law, with a large error bar: WLS ignores it, OLS moves by its leverage
    delta = 0.3
    bent = exact * np.exp(delta * (np.arange(n.size) == n.size - 1))
    bars = 0.01 * exact
    bars[-1] = 10 * bent[-1]
    w = mc.fit_loglog(n, bent, bars, k=10)
    o = mc.fit_loglog(n, bent, bars, k=10, method="ols")
    lever = (x[-1] - x.mean()) / ((x - x.mean()) ** 2).sum()
    assert w.slope == pytest.approx(-0.2, abs=1e-4)
    assert o.slope == pytest.approx(-0.2 + delta * lever, rel=1e-10)
    cw = mc.fit_loglog_curvature(n, bent, bars, k=10)
    co = mc.fit_loglog_curvature(n, bent, bars, k=10, method="ols")
    assert cw["weighted"] and not co["weighted"] and co["curvature"] > cw["curvature"]
    with pytest.raises(ValueError, match="fit method"):
        mc.fit_loglog(n, exact, method="lad")


def test_hardmax_fit_option_and_label(quick_results):
    wls = quick_results["tsc_hardmax"]
    ols = sphere.hardmax(quick=True, fit="ols")
    # same draws, only the fit differs
    assert [p["err_mean"] for p in ols.select(kind="point")] == [p["err_mean"] for p in wls.select(kind="point")]
    for f in ols.select(kind="fit"):
        pts = sorted(ols.select(kind="point", scale=f["scale"], reference=f["reference"], moment=f["moment"]),
                     key=lambda p: p["n"])
        (p1, _) = np.polyfit(np.log([p["n"] for p in pts]), np.log([p["err_mean"] for p in pts]), 1)
        assert f["slope"] == pytest.approx(p1, rel=1e-9)
    assert ols.provenance["fit_method"] == "ols" and "np.polyfit" in ols.provenance["fit"]
    assert wls.provenance["fit_method"] == "wls"
    assert "NOT the authors' fit" in wls.provenance["fit"] and "fit='ols'" in wls.provenance["fit"]
    mcv = quick_results["tsc_moments"].provenance["fit"]
    assert "fit.py" in mcv and "NOT" not in mcv
    with pytest.raises(ValueError, match="fit must be"):
        sphere.hardmax(quick=True, fit="median")


def test_scipy_ive_nan_beyond_2_pow_30_and_bessel_guards():
    from scipy.special import ive

    big = theory.IVE_MAX_ARG
    assert big == 2.0 ** 30
    for nu in (0.5, 24.0, 25.0):
        assert np.isfinite(ive(nu, big * (1 - 1e-9))) and np.isnan(ive(nu, big)) and np.isnan(ive(nu, 1e11))
    r = np.array([1e-3, 3.0, 1e4, big * (1 - 1e-9), big, 4 * big, 1e11])
    for d in (3, 8, 50):
        ours = theory.bessel_ratio(r, d)
        theirs = theory.bessel_ratio(r, d, guard="authors")
        assert np.all(np.isfinite(ours)) and np.all(np.diff(ours) >= 0) and np.all(ours <= 1)
        assert ours[3:] == pytest.approx(1 - (d - 1) / (2 * r[3:]), rel=1e-15)     # continuous across 2**30
        assert np.allclose(theirs[:4], ours[:4], rtol=1e-12)                     # same below 2**30 ...
        assert np.all(theirs[4:] == 0)                                           # ... and 0 from 2**30 on
    assert theory.bessel_ratio(0.0, 5, guard="authors") == 0
    with pytest.raises(ValueError, match="guard"):
        theory.bessel_ratio(1.0, 3, guard="scipy")


def test_sphere_covariance_at_the_authors_largest_scales():
    res = sphere.authors_sphere_reference(quick=True)                        # d=8, scales 10, 1e3, 1e5
    ref = {r["scale"]: r for r in res.select(kind="reference")}
    lo, top = ref[10.0], ref[1e5]
    assert lo["frac_beyond_ive"] == 0 and lo["rel_diff"] == 0 and not lo["authors_zero"]
    assert top["bessel_arg_max"] > theory.IVE_MAX_ARG > lo["bessel_arg_max"] and top["frac_beyond_ive"] == 1
    assert top["authors_zero"] and top["cov_norm_authors"] == 0 and top["rel_diff"] == 1
    # ours: finite, positive definite, continuous with the smaller scale, at the hardmax limit
    assert top["finite"] and top["min_eig"] > 0
    assert top["rel_change_prev"] < 1e-4 and top["rel_to_hardmax"] < 0.02
    assert top["cov_norm"] == pytest.approx(res.select(kind="hardmax")[0]["cov_norm"], rel=0.02)
    # directly: the authors' reference is the zero matrix, ours is the hardmax covariance
    d = 6
    A = 1e12 * torch.diag(torch.tensor([1.0, 2.0, 3.0, 0.5, 0.7, 4.0], dtype=f64))
    _, c_auth, info = theory.sphere_covariance_authors_guard(A, n_mc=20_000, return_info=True)
    assert info["frac_beyond_ive"] == pytest.approx(1) and torch.all(c_auth == 0)
    _, c_ours = theory.sphere_output_moments(A)
    _, c_hard = theory.sphere_hardmax_moments(A, n_samples=400_000, seed=3)
    assert torch.isfinite(c_ours).all() and float(c_ours.trace()) == pytest.approx(1.0, rel=1e-6)
    assert (c_ours - c_hard).norm() < 0.02 * c_ours.norm()
    assert torch.linalg.eigvalsh(c_ours).min() > 0 and d == A.shape[0]


def test_hardmax_authors_reference_error_is_norm_of_finite_covariance():
    """Where the authors' reference is zero, their plotted covariance error is ||C_n||_2."""
    d, seed, s = 8, 42, 1e5
    res = sphere.hardmax(d=d, scales=(s,), n_values=(64, 128), k=3, n_dirichlet=20_000, seed=seed, weights="authors",
                     authors_reference=True)
    assert res.provenance["authors_reference_numerics"][0]["frac_beyond_ive"] == 1
    Gq, Gk, Gv = sphere.sphere_weights(d, seed, "authors")
    torch.manual_seed(seed)
    assert torch.equal(Gq, torch.randn(d, d).double())                  # the authors' torch.manual_seed stream
    A = s ** 2 * Gk.T @ Gq / math.sqrt(d)
    draw = lambda n, b, g: mc.sample_sphere(n, d, batch=(b,), generator=g, dtype=torch.float32)   # noqa: E731
    for n in (64, 128):
        _, covs = mc.mc_moment_samples(draw, A, Gv, n, 3, seed=mc.derive_seed(seed, 0))
        pt = res.select(kind="point", n=n, moment="cov", reference="authors_code")[0]
        assert pt["err_mean"] == pytest.approx(float(torch.linalg.matrix_norm(covs, ord=2).mean()), rel=1e-6)
        ex = res.select(kind="point", n=n, moment="cov", reference="exact")[0]
        assert ex["err_mean"] != pytest.approx(pt["err_mean"], rel=1e-3)
    fits = {f["reference"]: f for f in res.select(kind="fit", moment="cov")}
    assert fits["authors_code"]["ref_norm"] == 0 and fits["exact"]["ref_norm"] > 0
    assert "2**30" in res.provenance["authors_reference"]
    with pytest.raises(ValueError, match="weights"):
        sphere.sphere_weights(d, seed, "numpy")


def test_head_horizons():
    g = _gen(12)
    nh, e, d = 3, 4, 6
    Wq, Wk = torch.randn(nh * e, d, dtype=f64, generator=g), torch.randn(nh * e, d, dtype=f64, generator=g)
    S = _spd(d, 13)
    H = theory.head_horizons(Wq, Wk, S, nh, scaling=0.5, eps=1e-3)
    S_eps = S + 1e-3 * torch.eye(d, dtype=f64)
    for h in range(nh):
        A_h = 0.5 * Wk[h * e:(h + 1) * e].T @ Wq[h * e:(h + 1) * e]
        assert H[h] == pytest.approx(theory.horizon(A_h, S_eps), rel=1e-10)
    assert theory.head_horizons(Wq, Wk, S, 1)[0] == pytest.approx(theory.horizon(Wk.T @ Wq, S), rel=1e-10)
    with pytest.raises(ValueError, match="n_heads"):
        theory.head_horizons(Wq, Wk, S, 5)


def test_head_blocks_are_each_heads_own_moments():
    g = _gen(21)
    nh, e, n = 3, 4, 10
    Y = torch.randn(2, n, nh * e, dtype=f64, generator=g)                  # [b, n, h*e]
    mean_h, cov_h = real_tokens.head_blocks(*theory.output_moments(Y), nh)
    for h in range(nh):
        m, c = theory.output_moments(Y[..., h * e:(h + 1) * e])
        assert torch.allclose(mean_h[:, h], m) and torch.allclose(cov_h[:, h], c)


def test_real_encoder_one_head_per_head_errors_equal_the_layers():
    model = TinyBert(heads=1)
    ids = torch.randint(0, 60, (40,), generator=_gen(22))
    res = real_tokens.real_encoder(model, ids=ids, quick=True, seed=5)
    for p in res.select(kind="point"):
        (hp,) = res.select(kind="head_point", layer=p["layer"], n=p["n"], moment=p["moment"])
        assert hp["head"] == 0 and hp["err_mean"] == pytest.approx(p["err_mean"], rel=1e-12)
    for l in (0, 1):
        (head,) = res.select(kind="head", layer=l)
        for mom in ("mean", "cov"):
            (f,) = res.select(kind="fit", layer=l, moment=mom)
            assert head[f"beta_{mom}"] == pytest.approx(f["beta"], rel=1e-9) and np.isfinite(head[f"beta_{mom}"])
            assert head["horizon"] == pytest.approx(f["horizon"], rel=1e-9)       # one head: A_h = A
    row = scc.tsc_claims({"tsc_real": res})[-1]
    assert row["id"] == "tsc-real-beta-heads" and row["verdict"] in ("holds", "does not hold")
    assert "/2 heads" in row["measured"] and "Spearman" in row["measured"]
