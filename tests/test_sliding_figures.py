"""Paper 1's figures on a model with sliding-window layers (issue #48): on a tiny random Gemma 3 (window 4, layers
sliding / full / sliding), each figure's per-row statistic equals a brute-force loop over the keys each row sees
(row t of a sliding layer: keys t - w < s <= t; of a full layer: s <= t), computed from transformers' own eager
attention weights, and a layer's rows are the same whether it is captured alone or with layers of the other kind."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.core.models import AttnModel
from attnlab.normalization import experiments as ex

W = 4
L = 16


def mixed_gemma(vocab_size: int = 128, tokenizer=None, *, kinds=("sliding", "full", "sliding"), window: int = W,
                heads: int = 4, kv_heads: int = 1, hidden: int = 32, positions: int = 64, seed: int = 0,
                name: str = "tiny-gemma3-mixed") -> AttnModel:
    """A seeded random Gemma 3 text model: one layer per entry of `kinds` ("sliding": a window of `window` keys, or
    "full"), `heads` query heads of dim 8 sharing `kv_heads` key/value heads (tests/test_sliding_tools.py: GPT-2's
    tokenizer and vocabulary, to read a text)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=64,
                              num_hidden_layers=len(kinds), num_attention_heads=heads, num_key_value_heads=kv_heads,
                              head_dim=8, sliding_window=window, layer_types=[f"{k}_attention" for k in kinds],
                              max_position_embeddings=positions, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        hf = Gemma3ForCausalLM(config).eval()
    return AttnModel(name, hf, tokenizer, source="random init (tests)", random_weights=True)


@pytest.fixture(scope="module")
def gemma():
    return mixed_gemma()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 128, (L,), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def eager(gemma, ids):
    """transformers' eager weights [layer, head, query, key] (float64), attnlab's values [layer, head, token, D]."""
    with gemma.implementation("eager"):
        out = gemma.forward(ids, output_attentions=True)
    v = gemma.capture(ids, keep=("v",)).v.double()
    return torch.stack([a[0] for a in out.attentions]).double(), v


def keys_of(layer: int, t: int) -> list[int]:
    """The keys row t of `layer` sees (written out here, not read from attnlab): layer 1 is full."""
    return list(range(0 if layer == 1 else max(0, t - W + 1), t + 1))


def rows_at(result, **where) -> list[dict]:
    return [r for r in result.rows if all(r.get(k) == v for k, v in where.items())]


def test_fig1_counts_each_rows_own_keys(gemma, ids, eager):
    probs, _ = eager
    res = ex.fig1(gemma, ids, lengths=[8, L], progress=False)
    assert len(res.rows) == 2 * 3 * 4
    for r in res.rows:
        li, h, n = r["layer"], r["head"], r["L"]
        assert (r["layer_kind"], r["sliding_window"]) == (("full", None) if li == 1 else ("sliding", W))
        ks = [keys_of(li, t) for t in range(n)]
        mx = np.mean([max(probs[li, h, t, k].item() for k in ks[t]) for t in range(n)])
        ent = np.mean([-sum(float(a) * math.log(float(a)) for a in probs[li, h, t, ks[t]] if a > 0)
                       for t in range(n)])
        assert r["max_weight"] == pytest.approx(mx, rel=1e-5)
        assert r["entropy"] == pytest.approx(ent, rel=1e-4, abs=1e-6)
        assert r["mean_row_len"] == pytest.approx(np.mean([len(k) for k in ks]))
        assert r["uniform"] == pytest.approx(1 / len(ks[-1]))             # 1 / min(L, w) in a sliding layer
        assert 0 <= r["cor1_holds"] <= 1 and r["lemma1_holds"] == 1.0    # Lemma 1 is a theorem: every row


def test_fig2a_distances_over_the_visible_keys(gemma, ids, eager):
    probs, v = eager
    N = 2
    res = ex.fig2a(gemma, ids, lengths=[L], ns=[N], progress=False)
    for r in res.rows:
        li, h = r["layer"], r["head"]
        d, e = [], []
        for t in range(L):
            k = keys_of(li, t)
            if len(k) <= N:
                continue
            a, x = probs[li, h, t, k].numpy(), v[li, h, k].numpy()
            top = np.argsort(-a, kind="stable")[:N]
            rest = np.setdiff1d(np.arange(len(k)), top)
            y = a[:, None] * x
            s = y[top].sum(0)
            d.append(np.linalg.norm(y[rest] - s, axis=1).sum())
            others, c, n = y.sum(0) - y, N / (len(k) - 1), len(k)
            e.append((n - N) / n * np.linalg.norm(y - c * others, axis=1).sum())
        assert r["n_rows"] == len(d)
        assert r["dtilde_b"] == pytest.approx(np.mean(d), rel=1e-4)
        assert r["E"] == pytest.approx(np.mean(e), rel=1e-4)


def test_fig3_separation_over_the_visible_keys(gemma, ids, eager):
    probs, v = eager
    res = ex.fig3(gemma, ids, lengths=[L], ns=[1], progress=False)
    for r in res.rows:
        li, h = r["layer"], r["head"]
        radii = []
        for t in range(L):
            k = keys_of(li, t)
            if len(k) <= 1:
                continue
            a, x = probs[li, h, t, k].numpy(), v[li, h, k].numpy()
            xn = x / np.linalg.norm(x, axis=1, keepdims=True)
            top = int(np.argmax(a))
            dist = np.linalg.norm(a[:, None] * xn - a[top] * xn[top], axis=1)
            radii.append(np.delete(dist, top).min())
        assert r["r"] == pytest.approx(np.mean(radii), rel=1e-4)


def test_fig2c_and_ratio_per_layer_kind(gemma, ids, eager):
    probs, v = eager
    N = 2
    ratio = ex.fig2c_ratio(gemma, ids, lengths=[L], points=3, fracs=[N / L], progress=False)
    top = {kind: max(r["N"] for r in rows_at(ratio, layer_kind=kind)) for kind in ("sliding", "full")}
    assert top["sliding"] < W <= top["full"]
    for kind, layers in (("sliding", (0, 2)), ("full", (1,))):
        r = rows_at(ratio, layer_kind=kind, N=N)[0]
        heads = []
        for li in layers:
            for h in range(4):
                d = []
                for t in range(L):
                    k = keys_of(li, t)
                    if len(k) > N:
                        a, x = probs[li, h, t, k].numpy(), v[li, h, k].numpy()
                        top = np.argsort(-a, kind="stable")[:N]
                        y = a[:, None] * x
                        d.append(np.linalg.norm(y[np.setdiff1d(np.arange(len(k)), top)] - y[top].sum(0), axis=1).sum())
                heads.append(np.mean(d))
        assert r["n_heads"] == 4 * len(layers)
        assert r["d_mean"] == pytest.approx(np.mean(heads), rel=1e-4)
    crit = ex.fig2c(gemma, ids, lengths=[L], progress=False)
    for kind, longest in (("sliding", W), ("full", L)):
        rs = rows_at(crit, layer_kind=kind)
        assert rs and {r["longest_row"] for r in rs} == {longest} and {r["n_heads"] for r in rs} == {
            8 if kind == "sliding" else 4}
        assert max(r["N"] for r in rs) < longest


def test_a_layers_rows_do_not_depend_on_the_other_kinds_captured_with_it(gemma, ids):
    """fig1 / fig2b / fig3 / fig4 of the full layer alone equal its rows when captured with the sliding layers."""
    keep = set().union(*(ex.trace_needs(f, ex.resolve_protocol(True, {})) for f in ex.PAPER_FIGURES))
    both, alone = ex.Captures(gemma, ids, keep), ex.Captures(gemma, ids, keep, layers=[1])
    for name in ("fig1", "fig2b", "fig3"):
        mixed = [r for r in ex.FIGURE_FUNCS[name](gemma, None, quick=True, progress=False, captures=[both]).rows
                 if r["layer"] == 1]
        single = ex.FIGURE_FUNCS[name](gemma, None, quick=True, progress=False, captures=[alone]).rows
        assert len(mixed) == len(single) > 0
        for m, s in zip(mixed, single):
            for k, val in s.items():
                assert m[k] == pytest.approx(val, nan_ok=True), (name, k)
    g = ex.fig4(gemma, None, quick=True, progress=False, captures=[both], jac_rows=2)
    assert all(np.isfinite(r["g_max"]) and r["holds_exact"] == 1.0 for r in g.rows)


def test_run_figures_on_a_model_with_sliding_layers(gemma, ids):
    out = ex.run_figures(gemma, ids, quick=True, progress=False)
    assert set(out) == set(ex.PAPER_FIGURES)
    assert {r["layer_kind"] for r in out["fig1"].rows} == {"sliding", "full"}
    assert out["fig1"].provenance["layers"] == [0, 1, 2]


def _window(gemma, ids):
    from types import SimpleNamespace

    return SimpleNamespace(model=gemma, ids=lambda L=None: ids[:L], corpus=SimpleNamespace(name="random"), start=0)


def test_pooled_ks_one_test_per_layer_kind(gemma, ids, monkeypatch):
    """windows.pooled_critical_n: a KS test per layer kind, each over its own layers' heads and keys; the full kind's
    equals the test on the full layer alone (causal mask), the sliding kind's scan stops below the window."""
    from attnlab import windows as aw
    from attnlab.normalization.metrics.critical_n import critical_n

    other = torch.randint(3, 128, (L,), generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(aw, "window_inputs", lambda *a: [_window(gemma, ids), _window(gemma, other)])
    rows = aw.pooled_critical_n("tiny", [None, None], [L], progress=False)
    by = {r["layer_kind"]: r for r in rows}
    assert set(by) == {"sliding", "full"}
    assert (by["sliding"]["sliding_window"], by["full"]["sliding_window"]) == (W, None)
    assert (by["sliding"]["n_samples"], by["full"]["n_samples"]) == (2 * 2 * 4, 2 * 1 * 4)
    assert (by["sliding"]["longest_row"], by["full"]["longest_row"]) == (W, L)
    assert by["sliding"]["critical_n"] < W
    one = [gemma.capture(w, keep=("probs", "v"), layers=[1]) for w in (ids, other)]
    res = critical_n(torch.cat([t.probs for t in one]), torch.cat([t.v for t in one]),
                     torch.tril(torch.ones(L, L, dtype=torch.bool)))
    assert by["full"]["critical_n"] == int(res["n"])


def test_fig4_without_repeats_on_sliding_layers(gemma):
    """A window opening with a run of one token: rows whose two largest visible logits fall on the run are left out;
    in a sliding layer a row past the window sees none of the run, so it is never left out."""
    from attnlab import windows as aw

    ids = torch.cat([torch.full((5,), 7), torch.randint(3, 128, (L - 5,), generator=torch.Generator().manual_seed(5))])
    res = aw.fig4_without_repeats(_window(gemma, ids))
    trace = gemma.capture(ids, keep=("scores",))
    bad, rows = 0, 0
    for li in range(3):
        for h in range(4):
            for t in range(L):
                k = keys_of(li, t)
                if len(k) < 2:
                    continue
                rows += 1
                top = sorted(k, key=lambda s: -float(trace.scores[li, h, t, s]))[:2]
                bad += all(s < 5 for s in top)
    assert res.rows[0]["run"] == 5 and res.rows[0]["degenerate_share"] == pytest.approx(bad / rows)


def test_readings_on_sliding_layers(gemma, ids, eager):
    """Paper 1's readings run per layer kind: Theorem 1's curves (d~ b at N = 1, the mean over rows of the largest
    ||x_i|| over each row's keys) equal brute-force loops; the critical rows of each kind stop below its longest
    row; Theorem 2's and Lemma 2's rows name each layer's kind, sliding layers with N below the window."""
    from attnlab.normalization.readings.lemma2 import gradient_readings
    from attnlab.normalization.readings.theorem1 import thm1_readings
    from attnlab.normalization.readings.theorem2 import separability_readings

    probs, v = eager
    res = thm1_readings(gemma, ids, quick=True, progress=False, vectors=["v"], pairs=[("E1", "b")], lengths=[L],
                        curve_lengths=[L], samples=2)
    for r in (r for r in res.rows if r["kind"] == "curve" and r["N"] == 1):
        li, h = r["layer"], r["head"]
        d, xmax = [], []
        for t in range(L):
            k = keys_of(li, t)
            xmax.append(max(float(v[li, h, s].norm()) for s in k))
            if len(k) > 1:
                a, x = probs[li, h, t, k].numpy(), v[li, h, k].numpy()
                top = int(np.argmax(a))
                y = a[:, None] * x
                d.append(np.delete(np.linalg.norm(y - y[top], axis=1), top).sum())
        assert r["layer_kind"] == ("full" if li == 1 else "sliding")
        assert r["d_b"] == pytest.approx(np.mean(d), rel=1e-5) and r["x_max"] == pytest.approx(np.mean(xmax), rel=1e-5)
    crit = {r["layer_kind"]: r for r in res.rows if r["kind"] == "critical"}
    assert crit["sliding"]["longest_row"] == W and crit["sliding"]["n_scanned"] < W
    assert crit["full"]["longest_row"] == L
    sep = separability_readings(gemma, ids, quick=True, progress=False, vectors=["v"])
    grad = gradient_readings(gemma, ids, quick=True, progress=False, directions=["gaussian"])
    for out in (sep, grad):
        assert {(r["layer"], r["layer_kind"]) for r in out.rows} == {(0, "sliding"), (1, "full"), (2, "sliding")}
    assert max(r["N"] for r in sep.rows if r["layer_kind"] == "sliding") == W - 1


def test_sinks_per_layer_kind(gemma, ids, eager):
    """The first token's share in a sliding layer: over the rows that see it (t < w), a brute-force mean; its
    uniform baseline the same rows' 1 / L_t; the sink claims per layer kind, the sliding scan below the window."""
    from attnlab.tools.sinks import sink_claims, sink_shares

    probs, _ = eager
    res = sink_shares(gemma, ids, lengths=[L])
    for r in res.rows:
        li, h = r["layer"], r["head"]
        seen = [t for t in range(L) if len(keys_of(li, t)) >= 2 and 0 in keys_of(li, t)]
        assert r["layer_kind"] == ("full" if li == 1 else "sliding")
        assert r["first"] == pytest.approx(np.mean([float(probs[li, h, t, 0]) for t in seen]), rel=1e-6)
        assert r["first_uniform"] == pytest.approx(np.mean([1 / len(keys_of(li, t)) for t in seen]))
    claims = sink_claims(gemma, ids, lengths=[8, L])
    crit = [r for r in claims.rows if r["quantity"] == "critical_frac" and r["subset"] == "all heads" and r["L"] == L]
    assert {(r["layer_kind"], r["longest_row"], r["n_heads"]) for r in crit} == {("sliding", W, 8), ("full", L, 4)}
    assert {r["layer_kind"] for r in claims.rows if r["quantity"] == "fig4_slope"} == {"sliding", "full"}


def test_full_only_models_rows_keep_their_columns(tiny):
    """A model whose layers are all full: one group, the same call as before, no layer-kind columns."""
    ids = torch.arange(3, 3 + 32)
    out = ex.run_figures(tiny, ids, quick=True, progress=False, figures=["fig1", "fig2c"])
    assert all("layer_kind" not in r and "sliding_window" not in r for res in out.values() for r in res.rows)
    assert {r["uniform"] for r in out["fig1"].rows} == {1 / L for L in {r["L"] for r in out["fig1"].rows}}


def test_readings_skip_head_slices_a_model_does_not_have():
    """Gemma 3 270M's hidden width (640) is not heads x d_head (4 x 256): no slice of it belongs to a head, so the
    readings leave out "hidden_head" (and its unit reading), say why in their provenance and claim rows, and refuse
    it by name in one line; every other reading is computed."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from attnlab.normalization import readings
    from attnlab.normalization.readings.theorem1 import thm1_readings
    from attnlab.normalization.readings.theorem2 import reading_claims, separability_readings

    config = Gemma3TextConfig(vocab_size=128, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=8, sliding_window=W,
                              layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
                              pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AttnModel("tiny-gemma3-narrow", Gemma3ForCausalLM(config).eval(), None, source="random init (tests)",
                          random_weights=True)
    ids = torch.randint(3, 128, (L,), generator=torch.Generator().manual_seed(3))
    skipped = {"hidden_head", "hidden_head_unit"}
    assert set(readings.undefined_vectors(model)) == skipped
    assert readings.undefined_vectors(mixed_gemma()) == {}                     # 32 = 4 x 8: every reading
    res = thm1_readings(model, ids, quick=True, progress=False, pairs=[("E1", "b")], lengths=[L], curve_lengths=[L],
                        samples=2)
    assert {r["vectors"] for r in res.rows} == set(readings.VECTORS) - skipped
    assert set(res.provenance["vectors_not_defined"]) == skipped
    sep = separability_readings(model, ids, quick=True, progress=False)
    assert {r["vectors"] for r in sep.rows} == set(readings.VECTORS) - skipped
    why = [r["measured"] for r in reading_claims({"separability_readings": sep})
           if "/ hidden_head_unit /" in r["reading"]]
    assert why and all("hidden_head_unit not defined on this model: hidden width 24 is not heads x d_head = 4 x 8"
                       in m for m in why)
    with pytest.raises(ValueError, match=r"^vectors hidden_head are not defined on tiny-gemma3-narrow: hidden width "
                                         r"24 is not heads x d_head = 4 x 8"):
        thm1_readings(model, ids, quick=True, progress=False, vectors=["hidden_head"])
