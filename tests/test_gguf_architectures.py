"""Every architecture transformers' GGUF reader accepts: a tiny random model of the family is written as a GGUF file
(`gguf_writer.write_family_gguf`), loaded with `load_model("file.gguf")`, and its capture equals the loaded model's
own eager attention (and its output while attnlab is installed equals eager's); the architectures this cannot be
done for are listed with the reason, and the two lists cover the reader's list."""
import warnings

import pytest
import torch
from gguf_writer import TINY_VOCAB_SIZE, write_family_gguf

from attnlab.core import architectures
from attnlab.core.gguf import read_gguf
from attnlab.core.models import AttnModel, ModelUnavailable, load_model

WRITTEN = ("gemma2", "gemma3", "llama", "minimax_m2", "nemotron", "qwen2", "stablelm", "starcoder2")
NOT_WRITTEN = {   # architecture -> why no tiny file is loaded here (transformers 5.24, gguf 0.17)
    "bloom": "loads, but BLOOM does not call the AttentionInterface: refused (see the matrix)",
    "deci": "no Deci model class in transformers (the reader maps it to another family)",
    "falcon": "FalconConfig's head_dim cannot be set: no tiny config",
    "gemma4": "Gemma 4's per-layer head_dim: no tiny config",
    "gpt2": "the reader's fused-qkv layout does not round-trip the tiny file (size mismatch on load)",
    "gpt_oss": "the MoE expert tensors of the tiny file do not match on load (size mismatch)",
    "lfm2": "the reader fails on the tiny file's layer metadata (TypeError)",
    "mamba": "no attention: a state-space model",
    "mistral": "the gguf package has no 'mistral' tensor map (llama.cpp writes Mistral as 'llama')",
    "phi3": "the reader's padding id lies outside the tiny vocabulary",
    "qwen2_moe": "the MoE expert tensors of the tiny file do not match on load (size mismatch)",
    "qwen3": "the reader's head_dim for the tiny file does not match (size mismatch on load)",
    "qwen3_moe": "the MoE expert tensors of the tiny file do not match on load (size mismatch)",
    "t5": "an encoder-decoder: no causal-LM class, needs decoder inputs",
    "umt5": "an encoder-decoder: no causal-LM class, needs decoder inputs",
}
FAMILY = {"gemma3": "gemma3_text"}
# The writer's tiny byte-level BPE becomes, through the reader's Gemma converter, a tokenizer that cannot encode
# plain English (no unknown token): `load_model` refuses it (the tokenizer check), so the capture is checked on the
# model read from the same file without a tokenizer.
TOKENIZER_REFUSED = ("gemma2", "gemma3")
QK_SCALE = 60.0


def test_the_lists_cover_the_readers_architectures():
    assert set(WRITTEN) | set(NOT_WRITTEN) == architectures.gguf_architectures()
    assert not set(WRITTEN) & set(NOT_WRITTEN)


@pytest.mark.parametrize("arch", WRITTEN)
def test_a_tiny_gguf_of_the_family_is_captured_exactly(arch, tmp_path, monkeypatch):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    family = FAMILY.get(arch, arch)
    monkeypatch.setitem(architectures.TINY, "vocab_size", TINY_VOCAB_SIZE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = architectures.tiny_config(family)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            hf = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family])(config).float().eval()
        with torch.no_grad():      # scores of tens: past Gemma 2's softcap of 50 that its GGUF reader sets
            for name, p in hf.named_parameters():
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    p.mul_(QK_SCALE)
        path = write_family_gguf(tmp_path / f"tiny-{arch}.gguf", hf)
        if arch in TOKENIZER_REFUSED:
            with pytest.raises(ModelUnavailable, match="the tokenizer cannot encode a plain sentence"):
                load_model(str(path))
            model_hf, _, sha, _, checks = read_gguf(path)
            model = AttnModel(f"tiny-{arch}", model_hf, None, source=str(path), weights_sha256=sha, checks=checks)
        else:
            model = load_model(str(path))
    ids = torch.arange(3, 15)
    trace = model.capture(ids, keep=("probs",))
    with model.implementation("eager"):
        own = model.forward(ids, output_attentions=True)
    assert len(own.attentions) == model.n_layers == 2
    for i, a in enumerate(own.attentions):
        assert float((trace.probs[i] - a[0]).abs().max()) <= 1e-6
    assert float((model.forward(ids).logits - own.logits).abs().max()) <= 1e-6
