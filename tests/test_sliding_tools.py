"""`attnlab diagnose` and the normalizer comparison on a model with sliding-window layers (issue #48): on the tiny
random Gemma 3 of tests/test_sliding_figures.py (window 4; layers sliding / full / sliding), each kind's statistics
equal brute-force loops over the keys each row sees (`keys_of`, written in that test), computed from transformers' own
eager weights; the rows and the printed verdicts come per layer kind; a window too short for the asked N is one line."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_sliding_figures import W, keys_of, mixed_gemma

from attnlab.tools import diagnose as dg
from attnlab.tools import report

L = 16
N_TOP, N_SEP = 2, 2
SLIDING, FULL = (0, 2), (1,)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gemma():
    """The tiny mixed Gemma 3 with GPT-2's tokenizer (and vocabulary), to read War and Peace."""
    from attnlab.core.models import gpt2_tokenizer

    return mixed_gemma(vocab_size=50257, tokenizer=gpt2_tokenizer())


@pytest.fixture(scope="module")
def eager(gemma, war_and_peace):
    """transformers' eager weights [layer, head, query, key] and attnlab's values [layer, head, token, D] (float64) of
    the window diagnose reads (the first L tokens of the text)."""
    ids = gemma.window(war_and_peace.text, L)
    with gemma.implementation("eager"):
        out = gemma.forward(ids, output_attentions=True)
    v = gemma.capture(ids, keep=("v",)).v.double().numpy()
    return torch.stack([a[0] for a in out.attentions]).double().numpy(), v


@pytest.fixture(scope="module")
def result(gemma, war_and_peace):
    return dg.diagnose(gemma, war_and_peace, lengths=[8, L], n_top=N_TOP, n_sep=N_SEP, max_rows=None, progress=False)


def oracle_head(a: np.ndarray, v: np.ndarray, layer: int) -> dict:
    """One head's statistics by loops over each row's visible keys: a [Q, K] weights, v [K, D] values."""
    mx, ent, ent_n, ns, d, e, jac = [], [], [], [], [], [], []
    for t in range(a.shape[0]):
        k = keys_of(layer, t)
        w, x = a[t, k], v[k]
        mx.append(w.max())
        h = -sum(p * math.log(p) for p in w if p > 0)
        ent.append(h)
        if len(k) >= 2:
            ent_n.append(h / math.log(len(k)))
            jac.append(np.linalg.norm(np.diag(w) - np.outer(w, w), 2))
        y = w[:, None] * x
        if len(k) > N_SEP:                           # N_s / N: unit vectors, r = nearest non-selected, strict <
            yu = w[:, None] * (x / np.linalg.norm(x, axis=1, keepdims=True))
            top = np.argsort(-w, kind="stable")[:N_SEP]
            dist = np.linalg.norm(yu - yu[top].sum(0), axis=1)
            r = np.delete(dist, top).min()
            if r > 0:
                ns.append((dist[top] < r).sum() / N_SEP)
        if len(k) > N_TOP:                           # d~ (reading b) and E at N = n_top
            top = np.argsort(-w, kind="stable")[:N_TOP]
            rest = np.setdiff1d(np.arange(len(k)), top)
            d.append(np.linalg.norm(y[rest] - y[top].sum(0), axis=1).sum())
            n, c = len(k), N_TOP / (len(k) - 1)
            e.append((n - N_TOP) / n * np.linalg.norm(y - c * (y.sum(0) - y), axis=1).sum())
    return {"max_weight": np.mean(mx), "entropy": np.mean(ent), "entropy_norm": np.mean(ent_n),
            "ns_frac": np.mean(ns), "dtilde": np.mean(d), "dtilde_ratio": np.mean(d) / np.mean(e),
            "jac_norm": np.mean(jac)}


def test_diagnose_head_statistics_over_each_rows_visible_keys(result, eager):
    probs, v = eager
    heads = result.select(kind="head", L=L)
    assert [(r["layer"], r["head"]) for r in heads] == [(li, h) for li in range(3) for h in range(4)]
    for r in heads:
        li, h = r["layer"], r["head"]
        assert (r["layer_kind"], r["sliding_window"]) == (("full", None) if li in FULL else ("sliding", W))
        want = oracle_head(probs[li, h, :L, :L], v[li, h, :L], li)
        for key, value in want.items():
            assert r[key] == pytest.approx(value, rel=1e-5, abs=1e-9), (li, h, key)
        assert r["entropy_norm_uniform"] == pytest.approx(1, abs=1e-5)       # 1 / L_t over the row's own keys
        assert r["max_weight_uniform"] == pytest.approx(np.mean([1 / len(keys_of(li, t)) for t in range(L)]),
                                                        rel=1e-5)


def test_diagnose_critical_n_one_test_per_layer_kind(result, eager):
    """The sliding kind's KS test pools the 8 heads of layers 0 and 2 on the grid of its longest row (W keys); the
    full kind's 4 heads cannot reject at alpha = 0.01 (untestable), its grid that of L."""
    from attnlab.normalization.metrics.critical_n import ks_first_indistinguishable

    probs, v = eager
    model = {r["layer_kind"]: r for r in result.select(kind="model", L=L)}
    assert set(model) == {"sliding", "full"} and len(result.select(kind="model")) == 4
    sl, fu = model["sliding"], model["full"]
    assert (sl["longest_row"], sl["sliding_window"], sl["n_pooled_heads"]) == (W, W, 8)
    assert (fu["longest_row"], fu["sliding_window"], fu["n_pooled_heads"]) == (L, None, 4)
    assert fu["critical_n_testable"] is False and sl["critical_n_testable"] is True
    ns = dg.critical_grid(W, n_top=N_TOP)
    assert sl["critical_n_max"] == max(ns) < W and fu["critical_n_max"] == max(dg.critical_grid(L, n_top=N_TOP))
    d = np.zeros((2, 4, len(ns)))
    e = np.zeros_like(d)
    for i, li in enumerate(SLIDING):                 # per-head token means of d~ and E at each N of the grid
        for h in range(4):
            for j, n in enumerate(ns):
                dd, ee = [], []
                for t in range(L):
                    k = keys_of(li, t)
                    if len(k) <= n:
                        continue
                    w, x = probs[li, h, t, k], v[li, h, k]
                    y, top = w[:, None] * x, np.argsort(-w, kind="stable")[:n]
                    dd.append(np.linalg.norm(y[np.setdiff1d(np.arange(len(k)), top)] - y[top].sum(0), axis=1).sum())
                    ee.append((len(k) - n) / len(k) * np.linalg.norm(y - n / (len(k) - 1) * (y.sum(0) - y),
                                                                      axis=1).sum())
                d[i, h, j], e[i, h, j] = np.mean(dd), np.mean(ee)
    n, _, _ = ks_first_indistinguishable(d.reshape(-1, len(ns)), e.reshape(-1, len(ns)), ns, dg.ALPHA)
    assert (sl["critical_n"] if not sl["critical_n_censored"] else 0) == pytest.approx(float(n) if n > 0 else 0)
    if n > 0:
        assert sl["critical_n_frac"] == pytest.approx(n / W)


def test_diagnose_layer_rows_and_summary_per_kind(result, tmp_path):
    layers = result.select(kind="layer", L=L)
    assert [(r["layer"], r["layer_kind"], r["longest_row"]) for r in layers] == [(0, "sliding", W), (1, "full", L),
                                                                                 (2, "sliding", W)]
    assert {r["critical_n_max"] for r in layers if r["layer_kind"] == "sliding"} == {max(dg.critical_grid(W, n_top=2))}
    text = report.summary(result)
    assert "layer kinds: sliding 4 on 2 of 3, full on 1 of 3" in text
    assert "sliding layers (window 4): 0, 2; longest row 4 keys" in text
    assert "full layers: 1; longest row 16 keys" in text
    assert text.count(f"at L={L}: ") == 2 and "of 8 heads flagged" in text and "of 4 heads flagged" in text
    paths = report.write_report(result, tmp_path / "rep")
    page = paths["html"].read_text()
    assert "all sliding 4" in page and "all full" in page and "<th>layer_kind</th>" in page
    back = report.summary(type(result).load(tmp_path / "rep", "diagnose"))    # the CSV's rows read the same
    assert back == text
    from attnlab.views import diagnose as views

    table = views.critical_table(result, [L]).data
    assert "all sliding 4: " in table and "; all full: too few heads" in table


def test_full_only_diagnose_rows_have_no_kind_columns(tiny, war_and_peace):
    res = dg.diagnose(tiny, war_and_peace, lengths=[24], n_top=2, n_sep=4, max_rows=8, progress=False)
    assert all("layer_kind" not in r and "longest_row" not in r for r in res.rows)
    assert "layer kinds" not in report.summary(res) and len(res.select(kind="model")) == 1


def test_compare_rows_per_layer_kind(gemma, war_and_peace, eager):
    """softmax(T=1) swapped in every layer is the model itself: each kind's row holds the means over its heads of
    the brute-force statistics; sparsemax's rows come per kind as well, its cost the whole model's on both."""
    from attnlab.tools.compare import compare_normalizers, spec

    probs, v = eager
    res = compare_normalizers(gemma, war_and_peace, lengths=[8, L], specs=[spec("softmax", T=1.0), spec("sparsemax")],
                              n_top=N_TOP, n_sep=N_SEP, max_rows=None, n_windows=1, jac_rows=4, progress=False)
    assert [(r["normalizer"], r["L"], r["layer_kind"]) for r in res.rows] == [
        (n, Lr, k) for n in ("softmax(T=1.0)", "sparsemax") for Lr in (8, L) for k in ("sliding", "full")]
    for r in res.select(normalizer="softmax(T=1.0)", L=L):
        layers = SLIDING if r["layer_kind"] == "sliding" else FULL
        heads = [oracle_head(probs[li, h, :L, :L], v[li, h, :L], li) for li in layers for h in range(4)]
        for key in ("max_weight", "entropy", "entropy_norm", "ns_frac", "dtilde"):
            assert r[key] == pytest.approx(np.mean([s[key] for s in heads]), rel=1e-5), (r["layer_kind"], key)
        assert r["jac_rows"] == 4 and r["critical_n_max"] < (W if r["layer_kind"] == "sliding" else L)
        assert r["drift"] < 1e-6
    for n in ("softmax(T=1.0)", "sparsemax"):
        a, b = res.select(normalizer=n, L=L)
        assert a["drift"] == b["drift"] and a["loss"] == b["loss"]
    from attnlab.views import normalizers as views

    table = views.comparison_table(res).data
    assert "sparsemax, sliding 4" in table and "sparsemax, full<" in table
    with pytest.raises(ValueError, match=r"rows per layer kind \(full, sliding\): pass layer_kind="):
        report.length_figure(res)
    lines = report.length_figure(res, layer_kind="sliding").axes[0].lines
    assert [list(line.get_ydata()) for line in lines] == [[r["max_weight"] for r in res.select(normalizer=n,
                                                                                          layer_kind="sliding")]
                                                          for n in ("softmax(T=1.0)", "sparsemax")]
    bars = report.comparison_figure(res, L, layer_kind="full").axes[0].patches
    assert [b.get_width() for b in bars] == [r["max_weight"] for r in res.select(L=L, layer_kind="full")]


def test_a_window_at_most_the_largest_n_is_one_line(gemma, war_and_peace):
    from attnlab.tools.compare import compare_normalizers

    for call in (lambda: dg.diagnose(gemma, war_and_peace, lengths=[L], progress=False),
                 lambda: compare_normalizers(gemma, war_and_peace, quick=True, progress=False)):
        with pytest.raises(ValueError, match=r"^tiny-gemma3-mixed's sliding layers see at most 4 keys, not more than "
                                             r"the largest top-N \(16\): pass --n-top and --n-sep below 4$"):
            call()


def test_cli_diagnose_per_kind_and_one_line_errors(gemma, tmp_path, capsys, monkeypatch):
    from attnlab import cli
    from attnlab.core import models

    monkeypatch.setattr(models, "load_model", lambda name, device="cpu": gemma)
    text = tmp_path / "t.txt"
    text.write_text("It was a bright cold day in April, and the clocks were striking thirteen. " * 40)
    base = ["diagnose", "--model", "tiny", "--text", str(text), "--lengths", "8", str(L), "--quiet"]
    rc = cli.main(base + ["--n-top", "2", "--n-sep", "2", "--max-rows", "0", "--out", str(tmp_path / "ok")])
    printed = capsys.readouterr().out
    assert rc == 0 and "sliding layers (window 4): 0, 2" in printed and "full layers: 1" in printed
    for extra, words in ((["--out", str(tmp_path / "no")], "see at most 4 keys"),
                         (["--n-top", "2", "--n-sep", "2", "--lengths", "65"], "exceeds tiny-gemma3-mixed's 64")):
        rc = cli.main(base + extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("attnlab diagnose: error:") and words in err[0], err
    assert not (tmp_path / "no").exists()


def test_visible_masks_formed_once_and_shared_with_the_cuts(gemma, war_and_peace):
    """`Trace.visible` memoizes each (length, kind) mask; the traces cut from a trace (select_layers, prefix) read the
    same tensor, so every caller (fig4, diagnose, the comparison) forms each kind's mask once."""
    from attnlab.normalization.experiments import by_kind_groups

    trace = gemma.capture(gemma.window(war_and_peace.text, L), keep=("probs",))
    sliding, full = by_kind_groups(trace)
    assert sliding.layers == [0, 2] and sliding.visible() is trace.visible(layer=0) is trace.visible(layer=2)
    assert full.visible() is trace.select_layers([1]).visible() is trace.visible(layer=1)
    assert sliding.prefix(8).visible() is trace.prefix(8).visible(layer=2)
    assert torch.equal(sliding.visible(), torch.tensor([[0 <= t - s < W for s in range(L)] for t in range(L)]))
