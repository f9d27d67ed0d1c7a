"""Figure experiments on tiny models (quick grids), plots, claims and the bench."""
import math

import matplotlib
import numpy as np
import pytest
import torch

from attnlab import benchmarks
from attnlab.core.capture import Trace
from attnlab.core.result import Result
from attnlab.core.verdicts import VERDICTS, claim_row
from attnlab.figures import FIGURES
from attnlab.normalization import claims, oracle
from attnlab.normalization import experiments as ex

matplotlib.use("Agg")


class FakeModel:
    """A tiny random attention model with the AttnModel API (causal or bidirectional)."""

    def __init__(self, causal=False, n_layers=2, n_heads=3, d_head=4, max_positions=64, vocab=50, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.name = f"fake-{'causal' if causal else 'bidir'}"
        self.causal, self.max_positions, self.device = causal, max_positions, torch.device("cpu")
        self.n_layers, self.n_heads, self.d_head = n_layers, n_heads, d_head
        d = n_heads * d_head
        self.emb = torch.randn(vocab, d, generator=g)
        self.pos = torch.randn(max_positions, d, generator=g) * 0.5
        self.W = torch.randn(n_layers, 3, d, d, generator=g) / d ** 0.5 * 2
        self.passes = 0

    def capture(self, ids, *, layers=None, heads=None, keep=("probs",), text_sha256=None):
        ids = torch.as_tensor(ids).long()
        if len(ids) > self.max_positions:
            raise ValueError("too long")
        self.passes += 1
        L, H, dh = len(ids), self.n_heads, self.d_head
        h = self.emb[ids] + self.pos[:L]
        vis = torch.ones(L, L, dtype=torch.bool)
        if self.causal:
            vis = torch.tril(vis)
        out = {k: [] for k in ("q", "k", "v", "scores", "probs", "hidden")}
        for layer in range(self.n_layers):
            q, k, v = (h @ self.W[layer, i] for i in range(3))
            q, k, v = (t.reshape(L, H, dh).transpose(0, 1) for t in (q, k, v))
            sc = (q @ k.transpose(-1, -2) * dh ** -0.5).masked_fill(~vis, float("-inf"))
            pr = torch.softmax(sc, -1)
            for name, t in (("q", q), ("k", k), ("v", v), ("scores", sc), ("probs", pr), ("hidden", h)):
                out[name].append(t)
            h = h + (pr @ v).transpose(0, 1).reshape(L, H * dh)
        tensors = {k: (torch.stack(v) if k in keep else None) for k, v in out.items()}
        return Trace(self.name, ids, list(range(self.n_layers)), list(range(H)), self.causal, dh ** -0.5,
                     text_sha256, **tensors)


TEXT = {"text": "synthetic", "text_sha256": "ab" * 32, "offset": 0}


@pytest.fixture(scope="module", params=[False, True], ids=["bidirectional", "causal"])
def figures(request):
    model = FakeModel(causal=request.param)
    ids = torch.randint(0, 50, (64,), generator=torch.Generator().manual_seed(1))
    res = ex.run_figures(model, ids, quick=True, progress=False, text=TEXT)
    return model, ids, res


def test_run_figures_results_and_provenance(figures):
    model, _, res = figures
    assert set(res) == set(ex.PAPER_FIGURES)
    # causal: one pass serves every L; bidirectional: one pass per L (32, 64)
    assert model.passes == (1 if model.causal else 2)
    for name, r in res.items():
        assert isinstance(r, Result) and r.name == name and r.rows
        p = r.provenance
        for key in ("model", "text_sha256", "window_offsets", "x", "keys", "grids", "device", "runtime_seconds",
                    "quick", "impl", "seed", "alpha"):
            assert key in p, (name, key)
        assert p["model"] == model.name and p["text_sha256"] == TEXT["text_sha256"] and p["quick"]
    assert res["fig2a"].unique("L") == [32, 64]
    assert sorted(res["fig2b"].unique("N")) == [1, 5, 10, 20]
    assert len(res["fig2a"].rows) == 2 * model.n_layers * model.n_heads
    assert res["fig4"].unique("eps") == list(ex.EPSILONS)


def test_figure_values_are_sane(figures):
    model, _, res = figures
    assert all(r["cor1_holds"] == 1.0 for r in res["fig1"].rows)
    assert all(r["holds_R"] == 1.0 for r in res["fig2a"].rows + res["fig2b"].rows)
    assert all(r["lower_holds"] == 1.0 for r in res["fig3"].rows)
    assert all(r["holds_exact"] == 1.0 for r in res["fig4"].rows)
    for r in res["fig2c"].rows:
        assert r["N"] <= r["critical_n"] or r["critical_n"] == -1
    crit = [r for r in res["fig2c"].rows if r["is_critical"]]
    assert all(r["pvalue"] > 0.01 for r in crit)
    for r in res["fig3"].rows:
        assert 0 <= r["ns_frac"] <= 1


def test_plots_return_titled_figures(figures, tmp_path):
    model, _, res = figures
    from matplotlib.figure import Figure

    for name, r in res.items():
        fig = FIGURES[name].plot(r)
        assert isinstance(fig, Figure)
        assert model.name in fig._suptitle.get_text() and "synthetic" in fig._suptitle.get_text()
        fig.savefig(tmp_path / f"{name}.png", dpi=40)


def test_plots_use_no_font_below_the_minimum(figures):
    """Every text of every library figure is at least MIN_FONT_PT (the book shows figures at their own
    size at 100 dpi, so this is the size on the page), with the style the book and the CLI set."""
    from matplotlib.text import Text

    from attnlab.core.style import MIN_FONT_PT, use_figure_style

    use_figure_style()
    _, _, res = figures
    for name, r in res.items():
        fig = FIGURES[name].plot(r)
        fig.canvas.draw()
        small = [(t.get_text(), t.get_fontsize()) for t in fig.findobj(Text)
                 if t.get_text().strip() and t.get_visible() and t.get_fontsize() < MIN_FONT_PT]
        assert not small, (name, small[:5])


def test_claims_table(figures):
    _, _, res = figures
    rows = claims.paper1_claims(res)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) >= 12
    for r in rows:
        assert set(r) == {"id", "reading", "claim", "paper", "measured", "verdict", "value", "unit"}
        assert r["verdict"] in VERDICTS
    from attnlab.figures import paper1_all_claims

    assert {r["model"] for r in paper1_all_claims(res)} == {r.provenance["model"] for r in res.values()}  # one
    by = {r["id"]: r["verdict"] for r in rows}
    assert by["p1-cor1"] == by["p1-thm1-R"] == by["p1-thm2-lower"] == by["p1-cor3-exact"] == "holds"
    assert by["p1-fig2b-plateau"] == "not applicable"          # quick grid stops at N = 20
    empty = claims.paper1_claims({})
    assert all(r["verdict"] == "not applicable" for r in empty)


def test_claim_row_checks_its_verdict():
    assert claim_row("x", "c", "p", "m", "holds")["verdict"] == "holds"
    with pytest.raises(ValueError):
        claim_row("x", "c", "p", "m", "maybe")


@pytest.mark.parametrize("causal", [False, True])
def test_vectorised_equals_oracle_through_experiments(causal):
    model = FakeModel(causal=causal, n_layers=1, max_positions=24)
    ids = torch.randint(0, 50, (24,), generator=torch.Generator().manual_seed(2))
    common = dict(quick=True, progress=False, lengths=[12, 24])
    for fig, kw in ((ex.fig1, {}), (ex.fig2a, {}), (ex.fig2c, {}), (ex.fig3, {"ns": [1, 3, 6]}),
                    (ex.fig4, {"temperatures": [0.01, 1.0], "epsilons": [1e-3, 10.0]})):
        a = fig(model, ids, **common, **kw)
        b = fig(model, ids, **common, impl=oracle, **kw)
        assert len(a.rows) == len(b.rows)
        for ra, rb in zip(a.rows, b.rows):
            for k, va in ra.items():
                if isinstance(va, float) and not math.isnan(va):
                    # logit_err is float32 rounding of the logits (recomputed in float32 by the
                    # vectorised code, float64 by the oracle): both are ~1e-7, far below the 1e-3 tested
                    tol = dict(rel=0, abs=1e-5) if k == "logit_err" else dict(rel=1e-5, abs=1e-7)
                    assert va == pytest.approx(rb[k], **tol), (fig.__name__, k)
                elif not isinstance(va, float):
                    assert va == rb[k], (fig.__name__, k)


def test_protocol_switches_and_windows():
    model = FakeModel(causal=True, max_positions=32)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (32,), generator=g)
    more = [torch.randint(0, 50, (32,), generator=g)]
    res = ex.run_figures(model, ids, more, quick=True, progress=False, figures=["fig2a", "fig3", "fig2c"],
                         x="hidden", keys="all")
    r = res["fig2a"]
    assert r.provenance["x"] == "hidden" and r.provenance["keys"] == "all" and r.provenance["n_windows"] == 2
    assert sorted(r.unique("window")) == [0, 1]
    assert all(row["n_rows"] == row["L"] for row in r.rows)      # masked keys included: every row counts
    for name in res:
        FIGURES[name].plot(res[name])
    before = torch.get_num_threads()
    ex.fig2a(model, ids, quick=True, progress=False, threads=1, lengths=[32])
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="unknown protocol"):
        ex.fig2a(model, ids, quick=True, progress=False, colour="red")
    with pytest.raises(ValueError, match="x must be"):
        ex.fig2a(model, ids, quick=True, progress=False, x="embeddings")
    with pytest.raises(ValueError, match="positions"):
        ex.fig2a(model, torch.zeros(40, dtype=torch.long), quick=True, progress=False)
    with pytest.raises(ValueError, match="lengths"):
        ex.fig2a(model, ids, quick=True, progress=False, lengths=[64])
    with pytest.raises(ValueError, match="unknown figures"):
        ex.run_figures(model, ids, figures=["fig9"], progress=False)


def test_length_grid():
    m = FakeModel(max_positions=512)
    assert ex.length_grid(m, 512) == [32, 64, 128, 256, 512]
    assert ex.length_grid(m, 512, quick=True) == [32, 64, 128]
    assert ex.length_grid(m, 300) == [32, 64, 128, 256, 300]
    assert ex.length_grid(m, 20) == [20]


def test_bench_figures_quick():
    model = FakeModel(causal=False, n_layers=2, max_positions=32)
    ids = torch.randint(0, 50, (32,), generator=torch.Generator().manual_seed(4))
    rows = benchmarks.bench_figures(model, ids, quick=True, figures=["fig2a", "fig2c"], lengths=[16, 32])
    assert [r["figure"] for r in rows] == ["fig2a", "fig2c"]
    for r in rows:
        assert r["vectorised_s"] > 0 and r["oracle_s"] > 0 and r["speedup"] > 0 and r["oracle_layers"] == 2


def test_tiny_gpt2_quick(tiny):
    ids = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(0))
    res = ex.run_figures(tiny, ids, quick=True, progress=False, figures=["fig1", "fig2a", "fig4"],
                         temperatures=[0.01, 1.0])
    assert res["fig2a"].provenance["causal"] is True
    assert all(r["cor1_holds"] == 1.0 for r in res["fig1"].rows)
    assert all(r["logit_err"] < 1e-3 for r in res["fig1"].rows)
    assert np.isfinite(res["fig4"].column("g_max")).all()


def test_long_windows_stream_the_layers_with_the_same_rows(tiny, monkeypatch):
    """A causal model whose captured tensors exceed the budget is captured one layer block at a time (the
    layers below a block replayed from the native pass): every figure's rows equal the one-pass rows."""
    ids = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(3))
    names = ["fig1", "fig2a", "fig2c", "fig3", "fig4"]
    kw = dict(quick=True, progress=False, figures=names, temperatures=[0.1, 1.0])
    whole = ex.run_figures(tiny, ids, **kw)
    keep = set().union(*(ex.trace_needs(n, ex.resolve_protocol(True, {})) for n in names))
    one_layer = 2 * tiny.n_heads * 64 ** 2 * 4
    monkeypatch.setattr(ex.streaming, "CAPTURE_BUDGET", one_layer)
    assert ex.streaming.layer_blocks(tiny, 64, keep) == [([0], None), ([1], None)]
    streamed = ex.run_figures(tiny, ids, **kw)
    monkeypatch.setattr(ex.streaming, "CAPTURE_BUDGET", one_layer // tiny.n_heads * 2)    # two heads at a time
    assert ex.streaming.layer_blocks(tiny, 64, keep)[:3] == [([0], [0, 1]), ([0], [2, 3]), ([1], [0, 1])]
    by_heads = ex.run_figures(tiny, ids, **kw)
    _same_rows(whole, streamed, names, 2)
    _same_rows(whole, by_heads, names, 4)
    # two windows: each keeps its own capture memory from block to block (`Captures.storage`)
    other = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(4))
    two = dict(kw, figures=["fig1", "fig2a"])
    streamed_two = ex.run_figures(tiny, ids, [other], **two)
    monkeypatch.setattr(ex.streaming, "CAPTURE_BUDGET", 1 << 40)
    _same_rows(ex.run_figures(tiny, ids, [other], **two), streamed_two, ["fig1", "fig2a"], 4)


def _same_rows(whole, streamed, names, blocks):
    for name in names:
        key = lambda r: tuple(str(r.get(k)) for k in ("window", "L", "N", "T", "eps", "layer", "head"))   # noqa: E731
        a, b = sorted(whole[name].rows, key=key), sorted(streamed[name].rows, key=key)
        assert len(a) == len(b) > 0
        for ra, rb in zip(a, b):
            assert ra.keys() == rb.keys()
            for k, v in ra.items():
                if isinstance(v, float) and not math.isnan(v):
                    assert rb[k] == pytest.approx(v, rel=1e-5, abs=1e-7), (name, k)
                else:
                    assert rb[k] == v or (isinstance(v, float) and math.isnan(rb[k])), (name, k)
        n = 1 if name in ex.streaming.POOLED else blocks           # fig2c and fig4 pool every head: one pass
        assert streamed[name].provenance.get("layer_blocks", 1) == n
        assert streamed[name].provenance["layers"] == [0, 1] and streamed[name].provenance["heads"] == [0, 1, 2, 3]


def test_check_reads_the_results_cache_and_refresh_recomputes(tmp_path, monkeypatch, capsys):
    """`attnlab check` takes each Result from the results cache when the book (or an earlier check) stored it
    under the same key, says how many, and prints the same table; --refresh computes them all again."""
    from attnlab import cli, figures

    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    computed = []
    real = figures.compute_figures

    def counting(ids, *a, **k):
        computed.append(list(ids))
        return real(ids, *a, **k)

    monkeypatch.setattr(figures, "compute_figures", counting)
    argv = ["check", "--model", "tiny-gpt2", "--quick", "--paper", "normalization", "--readings", "default"]
    tables, said = [], []
    for extra in ([], [], ["--refresh"]):
        assert cli.main(argv + extra) == 0
        out, err = capsys.readouterr()
        tables.append(out)
        said.append(next(line for line in err.splitlines() if line.startswith("[check]")))
    assert said[0].startswith("[check] 6 Results: 0 from the results cache")
    assert said[0].endswith("6 computed now; --refresh recomputes all")
    assert said[1].startswith("[check] 6 Results: 6 from the results cache") and "0 computed now" in said[1]
    assert said[2].endswith("6 computed now")
    assert [len(c) for c in computed] == [6, 6] and computed[0] == computed[1]     # first run and --refresh
    assert tables[0] == tables[1] == tables[2] and "holds" in tables[0]


def test_check_models_puts_each_models_verdict_side_by_side(tmp_path, monkeypatch, capsys):
    from attnlab.cli import main
    from attnlab.figures import compare_rows

    rows = compare_rows({"a": [{"id": "x", "claim": "c", "paper": "p", "measured": "1", "verdict": "holds"},
                               {"id": "y", "claim": "c", "paper": "p", "measured": "2", "verdict": "holds"}],
                         "b": [{"id": "x", "claim": "c", "paper": "p", "measured": "3", "verdict": "does not hold"}]})
    assert [(r["id"], r["same"]) for r in rows] == [("x", False), ("y", False)]
    assert rows[1]["verdict"] == {"a": "holds", "b": "not computed"} and rows[0]["measured"]["b"] == "3"
    assert main(["check", "--models", "tiny-gpt2,tiny-gpt2"]) == 2
    assert "two or more different" in capsys.readouterr().err
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    assert main(["check", "--models", "tiny-gpt2,minilm", "--quick", "--paper", "normalization",
                 "--readings", "default"]) == 0
    out = capsys.readouterr().out
    assert "tiny-gpt2 = causal decoder, random weights; minilm = bidirectional encoder" in out
    assert "p1-fig2c-critical" in out and "claims get a different verdict on tiny-gpt2 and minilm" in out


def test_causal_lengths_reuse_the_longest_lengths_rows(tiny):
    """fig1 and fig2a on a causal window compute their per-row tables once, at the longest L, and take each
    shorter L's first rows (`by_length`): the rows equal those computed on each prefix separately."""
    ids = torch.randint(0, 1000, (128,), generator=torch.Generator().manual_seed(5))
    p = ex.resolve_protocol(False, {"lengths": [16, 40, 128], "ns": [1, 5, 20]})
    cap = ex.Captures(tiny, ids, ex.trace_needs("fig1", p) | ex.trace_needs("fig2a", p))
    full1, full2 = ex.fig1_table(cap.get(128), p), ex.distance_table(cap.get(128), p, p["ns"])
    for L in (16, 40, 128):
        pairs = [(ex.fig1_rows(cap.get(L), p, L), ex.fig1_rows(cap.get(L), p, L, st=full1)),
                 (ex.distance_rows(cap.get(L), p, p["ns"], L), ex.distance_rows(cap.get(L), p, p["ns"], L, st=full2))]
        for alone, reused in pairs:
            assert len(alone) == len(reused) > 0
            for a, b in zip(alone, reused):
                assert a.keys() == b.keys()
                for k, v in a.items():
                    same = v == b[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(b[k]))
                    assert same or b[k] == pytest.approx(v, rel=1e-12, abs=1e-15), (L, k, v, b[k])
    assert {r["N"] for r in ex.distance_rows(cap.get(16), p, p["ns"], 16, st=full2)} == {1, 5}
