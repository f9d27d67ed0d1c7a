"""attnlab.tools.compare: normalizers swapped into pretrained models (quick grids), Jacobians, speed bench.

Causality of every swapped normalizer is tested in test_capture.py (test_swapped_normalizer_preserves_causality).
"""
import argparse
import json
import math

import pytest
import torch

from attnlab import benchmarks
from attnlab.cli import bench as cli_bench
from attnlab.tools import compare as cmp
from attnlab.tools import normalizers

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def quick_minilm(minilm, war_and_peace):
    return cmp.compare_normalizers(minilm, war_and_peace, quick=True, progress=False)


def test_quick_comparison_encoder(quick_minilm):
    res = quick_minilm
    labels = [s.label for s in cmp.default_specs(32)]
    assert res.unique("normalizer") == labels and res.unique("L") == [32, 64]
    assert len(res.rows) == len(labels) * 2
    assert "tolerance" in res.provenance["note"] and "1/log(32)" in res.provenance["ssmax"]
    for L in (32, 64):
        soft = res.select(normalizer="softmax(T=1.0)", L=L)[0]
        assert abs(soft["drift"]) < 1e-6 and soft["loss"] is None      # native model; no LM head
        sparse = res.select(normalizer="sparsemax", L=L)[0]
        assert sparse["max_weight"] >= soft["max_weight"] and sparse["entropy"] < soft["entropy"]
        assert sparse["drift"] > 1e-3
        cold, hot = res.select(normalizer="softmax(T=0.5)", L=L)[0], res.select(normalizer="softmax(T=2.0)", L=L)[0]
        assert cold["max_weight"] > soft["max_weight"] > hot["max_weight"]
        assert cold["jac_norm_mean"] > hot["jac_norm_mean"]
        sa = res.select(family="sa_softmax", L=L)[0]
        assert sa["weight_sum"] < 1 - 1e-3                               # SA-Softmax: weights do not sum to 1
        for r in res.select(L=L):
            assert r["jac_rows"] == 4 and r["jac_norm_max"] >= r["jac_norm_mean"] >= 0
    # SSMax with s = 1/log(32) is the native softmax on rows of 32 keys (a bidirectional model at L = 32)
    ss = res.select(family="ssmax", L=32)[0]
    assert abs(ss["drift"]) < 1e-6
    assert abs(res.select(family="ssmax", L=64)[0]["drift"]) > 1e-6


def test_quick_comparison_causal_lm(tiny, war_and_peace):
    specs = [cmp.spec("softmax", T=1.0), cmp.spec("sparsemax"), cmp.spec("softmax", T=0.5)]
    res = cmp.compare_normalizers(tiny, war_and_peace, specs=specs, quick=True, progress=False)
    for L in (32, 64):
        soft = res.select(normalizer="softmax(T=1.0)", L=L)[0]
        assert soft["loss_delta"] == pytest.approx(0, abs=1e-5) and abs(soft["drift"]) < 1e-6
        assert math.isfinite(soft["loss"]) and soft["loss_native"] == pytest.approx(soft["loss"], abs=1e-5)
        assert res.select(normalizer="sparsemax", L=L)[0]["max_weight"] >= soft["max_weight"]
    assert "next-token loss" in res.provenance["cost"]


def test_one_layer_at_a_time(tiny, war_and_peace):
    res = cmp.compare_normalizers(tiny, war_and_peace, specs=[cmp.spec("sparsemax")], swap="each", lengths=[32],
                                  n_top=2, n_sep=4, max_rows=8, jac_rows=2, n_windows=1, progress=False)
    assert res.name == "compare_normalizers_each"
    assert [r["swap"] for r in res.rows] == list(range(tiny.n_layers))
    assert all(r["drift"] > 0 for r in res.rows)


def test_one_layer_at_a_time_reuses_native_layers_exactly(tiny, war_and_peace):
    """swap="each" does not recompute the layers below the swapped one: same numbers as recomputing them."""
    kw = dict(specs=[cmp.spec("entmax15"), cmp.spec("softmax", T=0.5)], swap="each", lengths=[40], n_top=2, n_sep=4,
              max_rows=8, jac_rows=2, progress=False)
    fast = cmp.compare_normalizers(tiny, war_and_peace, **kw)
    blocks, tiny.blocks = tiny.blocks, None               # as for a model without a list of layer blocks
    try:
        slow = cmp.compare_normalizers(tiny, war_and_peace, **kw)
    finally:
        tiny.blocks = blocks
    def same(rows):  # every value but the timing, NaN included
        return json.dumps([{k: v for k, v in r.items() if k != "seconds"} for r in rows], sort_keys=True)
    assert same(fast.rows) == same(slow.rows)


def test_autograd_jacobian_matches_exact_softmax(tiny, war_and_peace):
    ids = tiny.window(war_and_peace.text, 24)
    with tiny.normalizer(normalizers.get_normalizer("softmax", T=0.5)):
        trace = tiny.capture(ids, keep=("probs", "scores", "v"))
    picks = cmp.jacobian_sample(trace, 6, seed=1)
    assert len(set(picks)) == 6 and all(t >= 1 for _, _, t in picks)   # rows with >= 2 visible keys
    exact, how = cmp.jacobian_norms(cmp.spec("softmax", T=0.5), trace, picks)
    auto, how2 = cmp.jacobian_norms(cmp.spec("entmax", alpha=1, T=0.5), trace, picks)   # entmax(1) = softmax
    assert how.startswith("exact") and how2.startswith("autograd")
    torch.testing.assert_close(exact, auto, rtol=1e-4, atol=1e-6)


def test_compact_spectral_norm_equals_full():
    z = torch.tensor([3.0, 2.9, 0.1, -1.0, 2.5, -4.0])
    fn = normalizers.get_normalizer("sparsemax")
    jac = normalizers.jacobian(fn, z)
    assert cmp._compact_spectral_norm(jac) == pytest.approx(float(normalizers.spectral_norm(jac)), abs=1e-6)
    assert cmp._compact_spectral_norm(torch.zeros(3, 3)) == 0.0


def test_too_short_text_fails_before_work(tiny):
    with pytest.raises(ValueError, match="too short"):
        cmp.compare_normalizers(tiny, "only a few words here", lengths=[64], progress=False)
    with pytest.raises(ValueError, match="swap"):
        cmp.compare_normalizers(tiny, "text", swap="some")


def test_bench_quick_cli(capsys):
    rows = cli_bench.bench_normalizers(argparse.Namespace(model="tiny-gpt2", quick=True))
    out = capsys.readouterr().out
    assert "fastest exact method" in out
    assert {"softmax", "sort", "topk16", "topk64", "bisect", "attnlab auto"} <= {r["method"] for r in rows}
    assert {r["case"] for r in rows} == {"model", "dense"}
    for r in rows:
        assert r["seconds"] > 0
        if r["method"] in ("sort", "topk16", "topk64", "attnlab auto"):
            assert r["max_abs_diff"] < 1e-5                  # exact algorithms agree
    from attnlab.core.result import Result

    best = benchmarks.recommend(Result("bench_normalizers", rows))
    assert {(b["case"], b["alpha"]) for b in best} == {("model", 2.0), ("model", 1.5), ("dense", 2.0), ("dense", 1.5)}


@pytest.mark.parametrize("scale", [0.0, 1.0])
def test_grid_critical_n_equals_the_whole_grid(scale):
    """The certified shortcut beyond N = n_top gives the critical N of the whole grid, computed exactly:
    uniform rows (scale 0: found at N = 48, the fallback to the whole grid) and random ones (censored, certified)."""
    from attnlab.tools.diagnose import critical_grid, distance_heads, pooled_critical_n

    g = torch.Generator().manual_seed(5)
    L, n_top = 96, 5
    z = torch.randn(2, 6, L, L, generator=g) * scale
    vis = torch.tril(torch.ones(L, L, dtype=torch.bool))
    probs = torch.softmax(z.masked_fill(~vis, float("-inf")), dim=-1)
    x = torch.randn(2, 6, L, 8, generator=g)
    ns = critical_grid(L, n_top=n_top, max_frac=0.5, step_frac=0.02)
    crit, d = cmp.grid_critical_n(probs, x, vis, ns, n_top, L, 0.05)
    d_all, e_all = distance_heads(probs, x, vis, ns)
    whole = pooled_critical_n(d_all, e_all, ns, L, 0.05)
    assert {k: crit[k] for k in whole} == pytest.approx(whole, nan_ok=True)
    assert (crit["critical_n"] == 48) == (scale == 0.0)
    k = list(ns).index(n_top) + 1
    assert d == pytest.approx(d_all[..., :k])


def test_length_figure_labels_every_axis_and_its_legend_covers_no_panel(quick_minilm):
    """Fig. 7.2: each panel's y axis carries numbers (a log axis within one decade once had none), and the one
    legend sits below the panels, overlapping none of them, on the desktop figure and its phone version."""
    from matplotlib.text import Text

    from attnlab import widgets as aw
    from attnlab.tools import report

    for phone in (False, True):
        fig = report.length_figure(quick_minilm)
        if phone:
            assert aw.phone_layout(fig)
        fig.draw_without_rendering()
        for ax in fig.axes:
            numbers = [t for t in ax.yaxis.get_ticklabels() if isinstance(t, Text) and t.get_text().strip()
                       and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]]
            assert len(numbers) >= 2, (ax.get_title(), phone, [t.get_text() for t in numbers])
            assert ax.get_legend() is None
        (legend,) = fig.legends
        box = legend.get_window_extent()
        assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes), phone
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width + 1, (phone, box, fig.bbox)
