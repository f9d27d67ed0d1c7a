"""The causal path (issue #24, item 3): a tiny random Llama with grouped-query attention and RoPE.

What `AttnModel.capture` records for such a model (capture.attnlab_attention): transformers hands the
attention function q and k after RoPE, and k/v with one head per key/value head; the function repeats
each key/value head over its group of query heads (head h uses key/value head h // group, as eager's
repeat_kv) before anything is recorded. So Trace.k and Trace.v have one entry per query head, query heads
of one group hold identical keys and values, and q/k are the rotated vectors: `scores = scaling * q k^T`.

The same model written as a GGUF file (tests/gguf_writer.py, the `gguf` package's GGUFWriter) is read by
transformers and by attnlab's loader, so the GGUF path has a test that needs no download.
"""
import pytest
import torch
from gguf_writer import ENDOFTEXT, TINY_VOCAB_SIZE, reference_tokenizer, write_tiny_gguf

from attnlab.core.models import AttnModel, file_sha256

pytestmark = pytest.mark.usefixtures("one_thread")

N_LAYERS, N_HEADS, D_HEAD = 2, 4, 8
ROPE_THETA = 1000.0           # not transformers' default: the GGUF's rope.freq_base must be read
RMS_EPS = 2.0 ** -17          # exact in float32 (a GGUF stores it as float32), and not the default either
SENTENCE = "the attention of a head is the softmax of its scores: each query weighs every key before it."


def tiny_llama(n_kv: int = 2, seed: int = 0, vocab: int = TINY_VOCAB_SIZE):
    """A seeded random Llama: 2 layers, 4 query heads sharing `n_kv` key/value heads (head_dim 8), RoPE,
    eager attention. Weights drawn wider than transformers' 0.02 so that attention rows are far from uniform
    (a uniform row would pass any comparison of weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=N_HEADS * D_HEAD, intermediate_size=64,
                         num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=n_kv,
                         max_position_embeddings=256, rope_theta=ROPE_THETA, rms_norm_eps=RMS_EPS,
                         initializer_range=0.3, attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return reference_tokenizer(tmp_path_factory.mktemp("tiny-bpe"))


@pytest.fixture(scope="module")
def llama(tokenizer):
    return AttnModel("tiny-llama-gqa", tiny_llama(n_kv=2), tokenizer, source="random init (seed 0), tests only",
                     random_weights=True)


@pytest.fixture(scope="module")
def ids(tokenizer):
    ids = torch.tensor(tokenizer(SENTENCE)["input_ids"])
    assert 16 <= ids.numel() <= 64
    return ids


@pytest.fixture(scope="module")
def trace(llama, ids):
    return llama.capture(ids, keep=("q", "k", "v", "scores", "probs", "hidden"))


def eager_attentions(model: AttnModel, ids) -> torch.Tensor:
    """[layer, head, query, key]: the attention weights of transformers' eager implementation."""
    with model.implementation("eager"):
        out = model.forward(ids, output_attentions=True)
    assert out.attentions is not None and len(out.attentions) == model.n_layers
    return torch.stack([a[0] for a in out.attentions]).float()


def rope_qkv(model: AttnModel, hidden: torch.Tensor, layer: int):
    """(q before RoPE, q after, k after, v) [head, token, d_head] of `layer` from its input `hidden`
    [token, d_model], recomputed with the model's own projections and rotary embedding (key/value heads
    not repeated: [kv_head, token, d_head])."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    hf = model.hf
    attn = hf.model.layers[layer].self_attn
    x = hidden[None]
    n = hidden.shape[0]
    with torch.no_grad():
        q = attn.q_proj(x).view(1, n, -1, D_HEAD).transpose(1, 2)
        k = attn.k_proj(x).view(1, n, -1, D_HEAD).transpose(1, 2)
        v = attn.v_proj(x).view(1, n, -1, D_HEAD).transpose(1, 2)
        cos, sin = hf.model.rotary_emb(x, torch.arange(n)[None])
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    return q[0], q_rot[0], k_rot[0], v[0]


# --------------------------------------------------------------------------- the tiny GQA Llama

def test_the_tiny_llama_is_causal_with_grouped_query_attention(llama, trace, ids):
    cfg = llama.hf.config
    assert llama.causal is True and trace.causal is True
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    assert (llama.n_layers, llama.n_heads, llama.d_head) == (N_LAYERS, N_HEADS, D_HEAD)
    n = ids.numel()
    for name in ("q", "k", "v"):         # keys and values too: one entry per query head
        assert getattr(trace, name).shape == (N_LAYERS, N_HEADS, n, D_HEAD), name
    assert trace.scores.shape == trace.probs.shape == (N_LAYERS, N_HEADS, n, n)
    assert trace.scaling == pytest.approx(D_HEAD ** -0.5)


def test_captured_probabilities_equal_eager_attention(llama, trace, ids):
    eager = eager_attentions(llama, ids)
    assert eager.shape == trace.probs.shape
    assert (trace.probs - eager).abs().max() <= 1e-6
    # the rows are far from uniform, so the comparison above can fail
    assert trace.probs.max() > 0.5
    # and the attnlab implementation's forward pass is eager's
    with llama.implementation("eager"):
        want = llama.forward(ids).logits
    assert (llama.forward(ids).logits - want).abs().max() <= 1e-5


def test_captured_scores_are_the_scaled_dot_products_of_the_captured_q_and_k(trace):
    visible = trace.visible()
    qk = trace.scaling * trace.q @ trace.k.transpose(-1, -2)
    assert (trace.scores[..., visible] - qk[..., visible]).abs().max() <= 1e-5
    assert (torch.softmax(trace.scores, dim=-1) - trace.probs).abs().max() <= 1e-6


def test_the_causal_mask_is_exact(trace):
    n = trace.n_tokens
    future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    assert torch.equal(trace.visible(), ~future)
    assert bool((trace.probs[..., future] == 0).all())              # exactly 0, not merely small
    assert bool(torch.isneginf(trace.scores[..., future]).all())
    assert bool(torch.isfinite(trace.scores[..., ~future]).all())
    assert bool((trace.probs[..., ~future] > 0).all())
    assert (trace.probs.sum(-1) - 1).abs().max() <= 1e-6
    assert torch.equal(trace.probs[..., 0, 0], torch.ones(N_LAYERS, N_HEADS))   # the first token sees itself only


def test_no_weight_reaches_a_future_token(llama, trace, ids):
    """Changing the last tokens changes nothing in the rows before them (the mask, not the rows' size)."""
    cut = ids.numel() // 2
    other = ids.clone()
    other[cut:] = (ids[cut:] + 7) % TINY_VOCAB_SIZE
    changed = llama.capture(other, keep=("scores", "probs"))
    assert (changed.probs[..., :cut, :] - trace.probs[..., :cut, :]).abs().max() <= 1e-6
    assert (changed.probs[..., cut:, :] - trace.probs[..., cut:, :]).abs().max() > 1e-3
    head = trace.prefix(cut)
    assert (changed.prefix(cut).scores - head.scores)[..., head.visible()].abs().max() <= 1e-5


@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_query_heads_of_a_group_share_keys_and_values(tokenizer, ids, n_kv):
    model = AttnModel(f"tiny-llama-kv{n_kv}", tiny_llama(n_kv=n_kv), tokenizer, source="tests")
    t = model.capture(ids, keep=("q", "k", "v"))
    group = N_HEADS // n_kv
    for name in ("k", "v"):
        x = getattr(t, name)
        for h in range(N_HEADS):
            for g in range(N_HEADS):
                if h // group == g // group:
                    assert torch.equal(x[:, h], x[:, g]), (name, h, g)
                else:
                    assert (x[:, h] - x[:, g]).abs().max() > 1e-2, (name, h, g)
    for h in range(1, N_HEADS):            # queries are never shared
        assert (t.q[:, h] - t.q[:, 0]).abs().max() > 1e-2


def test_a_head_and_layer_subset_records_the_same_grouped_keys(llama, trace, ids):
    """heads=[1, 2] (two groups) and layers=[1]: the same keys, values and weights as the full capture."""
    part = llama.capture(ids, layers=[1], heads=[1, 2], keep=("k", "v", "scores", "probs"))
    assert (part.layers, part.heads) == ([1], [1, 2])
    for name in ("k", "v", "probs"):
        assert torch.equal(getattr(part, name), getattr(trace, name)[1:, [1, 2]]), name
    assert torch.equal(part.scores, trace.scores[1:, [1, 2]])


def test_recorded_q_and_k_are_rotated_and_each_head_reads_its_key_value_head(llama, trace):
    """q and k as the model's projections + RoPE give them; k/v of query head h are key/value head h // 2."""
    group = N_HEADS // llama.hf.config.num_key_value_heads
    kv_of = torch.arange(N_HEADS) // group
    for layer in range(N_LAYERS):
        q, q_rot, k_rot, v = rope_qkv(llama, trace.hidden[layer], layer)
        assert (trace.q[layer] - q_rot).abs().max() <= 1e-5
        assert (trace.k[layer] - k_rot[kv_of]).abs().max() <= 1e-5
        assert (trace.v[layer] - v[kv_of]).abs().max() <= 1e-5
        # after RoPE, not before: position 0 is not rotated, every later one is
        assert (trace.q[layer, :, 0] - q[:, 0]).abs().max() <= 1e-5
        assert (trace.q[layer, :, 1:] - q[:, 1:]).abs().max() > 1e-2


# --------------------------------------------------------------------------- the same model from a GGUF file

@pytest.fixture(scope="module")
def gguf_file(llama, tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", llama.hf)


def read_with_transformers(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=path.name, local_files_only=True, trust_remote_code=False)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), attn_implementation="eager", **kw).eval()
    return hf, AutoTokenizer.from_pretrained(str(path.parent), **kw)


def test_the_gguf_writer_gives_transformers_the_same_model(llama, gguf_file, ids, tokenizer):
    hf, tok = read_with_transformers(gguf_file)
    cfg = hf.config
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (2, 4, 2, 8)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (TINY_VOCAB_SIZE, 32, 64)
    assert cfg.rope_parameters["rope_theta"] == ROPE_THETA and cfg.rms_norm_eps == RMS_EPS
    assert cfg.tie_word_embeddings is False
    with torch.no_grad():
        got = hf(ids[None]).logits
    with llama.implementation("eager"):
        want = llama.forward(ids).logits
    assert (got - want).abs().max() <= 1e-5
    # the tokenizer: the same BPE, the same ids, the text back
    text = SENTENCE + ENDOFTEXT + " ünïcode, café"
    assert tok(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tok.decode(tok(text)["input_ids"]) == text
    assert len(tok) == TINY_VOCAB_SIZE
    assert tok(ENDOFTEXT)["input_ids"] == [TINY_VOCAB_SIZE - 1]
    assert len(tok(" the attention")["input_ids"]) == 2          # the merges are used


def test_without_the_q_k_permutation_the_gguf_model_differs(llama, tmp_path, ids):
    """The round trip above can fail: a file written without llama.cpp's RoPE permutation of attn_q/attn_k
    reads back as another model."""
    hf, _ = read_with_transformers(write_tiny_gguf(tmp_path / "unpermuted.gguf", llama.hf, permute=False))
    with torch.no_grad():
        got = hf(ids[None]).logits
    with llama.implementation("eager"):
        want = llama.forward(ids).logits
    assert (got - want).abs().max() > 1e-3


def test_an_f16_gguf_holds_the_weights_rounded_to_f16(llama, tmp_path, ids):
    from gguf import GGMLQuantizationType, GGUFReader

    path = write_tiny_gguf(tmp_path / "tiny-f16.gguf", llama.hf, dtype="f16")
    kinds = {t.name: t.tensor_type for t in GGUFReader(str(path)).tensors}
    assert kinds["blk.0.attn_q.weight"] == kinds["token_embd.weight"] == GGMLQuantizationType.F16
    assert kinds["blk.0.attn_norm.weight"] == kinds["output_norm.weight"] == GGMLQuantizationType.F32
    hf, _ = read_with_transformers(path)
    rounded = tiny_llama(n_kv=2)
    with torch.no_grad():
        for name, p in rounded.named_parameters():
            if p.ndim > 1:
                p.copy_(p.half().float())
        want, got = rounded(ids[None]).logits, hf(ids[None]).logits
    assert (got - want).abs().max() <= 1e-5


def test_load_model_reads_the_gguf_and_keeps_a_safetensors_copy(llama, gguf_file, ids, tokenizer, tmp_path,
                                                               monkeypatch):
    import transformers.integrations.gguf as gguf_integration
    import transformers.integrations.gguf.reader as gguf_reader
    import transformers.modeling_gguf_pytorch_utils as gguf_legacy

    from attnlab.core.models import load_model

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    reads = []

    def spy(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            reads.append(name)
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)

    gguf_integration.read_gguf_metadata         # resolve the lazy attribute before patching it
    spy(gguf_legacy, "load_gguf_checkpoint")
    spy(gguf_reader, "read_gguf_metadata")
    spy(gguf_integration, "read_gguf_metadata")

    first = load_model(str(gguf_file))
    assert reads, "the first load must read the GGUF file"
    assert isinstance(first, AttnModel) and first.causal is True
    assert (first.n_layers, first.n_heads, first.d_head) == (N_LAYERS, N_HEADS, D_HEAD)
    assert first.hf.config.num_key_value_heads == 2
    assert first.weights_sha256 == file_sha256(gguf_file)
    text = SENTENCE + ENDOFTEXT + " café"
    assert first.tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]

    t = first.capture(ids, keep=("k", "scores", "probs"))
    source = eager_attentions(llama, ids)
    assert (t.probs - source).abs().max() <= 1e-6
    assert (t.probs - eager_attentions(first, ids)).abs().max() <= 1e-6
    n = ids.numel()
    assert bool((t.probs[..., torch.triu(torch.ones(n, n, dtype=torch.bool), 1)] == 0).all())
    assert torch.equal(t.k[:, 0], t.k[:, 1]) and torch.equal(t.k[:, 2], t.k[:, 3])
    want = llama.capture(ids, keep=("scores",)).scores
    assert (t.scores - want)[..., t.visible()].abs().max() <= 1e-5

    copies = list((tmp_path / "cache").rglob("model.safetensors"))
    assert len(copies) == 1, copies
    stat = copies[0].stat()

    # the second load comes from the copy: no GGUF reading, the copy not rewritten
    reads.clear()
    again = load_model(str(gguf_file.parent))               # a directory holding one .gguf: the same model
    assert reads == []
    after = copies[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert again.weights_sha256 == first.weights_sha256
    assert torch.equal(again.capture(ids, keep=("probs",)).probs, t.probs)



def test_two_processes_with_an_empty_cache_de_quantize_a_gguf_once(gguf_file, tmp_path, monkeypatch, capfd):
    """`read_gguf` makes its de-quantized copy under a file lock: a second reader that comes while the first is
    making it (two test workers, two chapters) waits, says so in one line, and reads the first's copy. Two
    threads stand in for the processes (flock conflicts between two opens of the lock file all the same)."""
    import threading
    import time

    from attnlab.core import gguf

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    made, real = [], gguf._plain_model

    def slow_plain_model(path):
        made.append(path)
        time.sleep(0.5)                     # the second reader comes meanwhile
        return real(path)
    monkeypatch.setattr(gguf, "_plain_model", slow_plain_model)
    # transformers builds a model under process-wide patches (weights on the meta device until loaded): two threads
    # loading at once can leave them on for the rest of the process, so the loads take turns here (processes, which
    # the lock is for, do not share them)
    loading, load_copy = threading.Lock(), gguf._load_copy

    def one_load_at_a_time(folder):
        with loading:
            return load_copy(folder)
    monkeypatch.setattr(gguf, "_load_copy", one_load_at_a_time)
    got = []
    readers = [threading.Thread(target=lambda: got.append(gguf.read_gguf(gguf_file)[2])) for _ in range(2)]
    for r in readers:
        r.start()
        time.sleep(0.1)
    for r in readers:
        r.join()
    assert len(made) == 1 and got == [file_sha256(gguf_file)] * 2
    assert "waiting for another process de-quantizing tiny-llama.gguf" in capfd.readouterr().err
