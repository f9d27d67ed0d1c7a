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


def test_auto_falls_back_quickly_with_one_warning(monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = models.load_model("auto")
    assert time.perf_counter() - t0 < 30
    assert m.name in ("gpt2", "minilm")
    if m.name == "minilm":
        msgs = [str(w.message) for w in caught if "falling back" in str(w.message).lower()]
        assert len(msgs) == 1 and "GPT-2" in msgs[0]


def test_unknown_and_missing_models(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="unknown model"):
        models.load_model("no such model")
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
