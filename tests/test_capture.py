"""Capture equals the model's own eager attention; outputs unchanged; transformers traps stay caught."""
import pytest
import torch

from attnlab.core import capture as cap
from attnlab.tools.normalizers import NORMALIZERS, get_normalizer


def eager_attentions(model, ids):
    with model.implementation("eager"), torch.no_grad():
        out = model.hf(input_ids=ids[None], output_attentions=True)
    return out, torch.stack([a[0] for a in out.attentions])


@pytest.mark.parametrize("name", ["tiny", "minilm"])
def test_capture_equals_eager_and_leaves_outputs_unchanged(name, request, war_and_peace):
    model = request.getfixturevalue(name)
    ids = model.window(war_and_peace.text, 96)
    trace = model.capture(ids, keep=("q", "k", "v", "scores", "probs", "hidden"), text_sha256=war_and_peace.sha256)
    out_eager, probs_eager = eager_attentions(model, ids)
    assert (trace.probs - probs_eager).abs().max() <= 1e-6
    assert trace.probs.dtype == torch.float32
    L, H = model.n_layers, model.n_heads
    assert trace.q.shape == (L, H, 96, model.d_head) and trace.scores.shape == (L, H, 96, 96)
    # scores are the pre-normalization logits: softmax of them is the captured weights
    assert torch.allclose(torch.softmax(trace.scores, -1), trace.probs, atol=1e-6)
    # scores == scaling * q.k on visible keys
    qk = trace.q @ trace.k.transpose(-1, -2) * trace.scaling
    vis = trace.visible()
    assert torch.allclose(qk[..., vis], trace.scores[..., vis], atol=1e-4)
    assert torch.isinf(trace.scores[..., ~vis]).all()
    assert trace.causal == (name == "tiny")
    first = out_eager.logits if hasattr(out_eager, "logits") else out_eager.last_hidden_state
    now = model.forward(ids)
    again = now.logits if hasattr(now, "logits") else now.last_hidden_state
    assert torch.equal(first, again)
    assert trace.text_sha256 == war_and_peace.sha256


def test_capture_subset_of_layers_and_heads(tiny):
    ids = torch.arange(1000, 1040)
    full = tiny.capture(ids, keep=("probs", "scores"))
    part = tiny.capture(ids, layers=[1], heads=[3, 0], keep=("probs", "scores"))
    assert part.probs.shape == (1, 2, 40, 40) and part.layers == [1] and part.heads == [3, 0]
    assert torch.equal(part.probs, full.probs[1:2, [3, 0]])
    assert torch.equal(part.scores, full.scores[1:2, [3, 0]])


def test_causal_prefix_is_exact(tiny):
    ids = torch.arange(2000, 2064)
    long = tiny.capture(ids, keep=("probs", "v"))
    short = tiny.capture(ids[:20], keep=("probs", "v"))
    cut = long.prefix(20)
    assert torch.allclose(cut.probs, short.probs, atol=1e-6) and torch.allclose(cut.v, short.v, atol=1e-6)


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_swapped_normalizer_preserves_causality(tiny, name):
    fn = get_normalizer(name)
    ids = torch.arange(3000, 3032)
    changed = ids.clone()
    changed[20] = 5
    with tiny.normalizer(fn):
        a = tiny.forward(ids).logits[0]
        b = tiny.forward(changed).logits[0]
        swapped = tiny.capture(ids, keep=("probs",)).probs
    assert torch.allclose(a[:20], b[:20], atol=1e-5), "an earlier position saw a later token"
    assert not torch.allclose(a[20:], b[20:])
    assert torch.all(swapped[..., torch.triu(torch.ones(32, 32, dtype=torch.bool), 1)] == 0)
    if name != "softmax":
        assert not torch.allclose(swapped, tiny.capture(ids, keep=("probs",)).probs)


def test_swap_in_chosen_layers_only(tiny):
    ids = torch.arange(100, 130)
    base = tiny.capture(ids, keep=("probs",)).probs
    with tiny.normalizer(get_normalizer("sparsemax"), layers=[1]):
        sw = tiny.capture(ids, keep=("probs", "scores"))
    assert torch.equal(sw.probs[0], base[0]) and not torch.allclose(sw.probs[1], base[1])
    # the swapped layer's own weights are recorded (beside a native layer's, in the same buffer)
    assert torch.equal(sw.probs[1], get_normalizer("sparsemax")(sw.scores[1].nan_to_num(neginf=0.0), sw.visible()))


def test_capture_reusing_native_layers_is_exact(tiny):
    ids = torch.arange(200, 240)
    record = tiny.layer_outputs(ids)
    assert len(record.outputs) == tiny.n_layers == len(tiny.blocks)
    with tiny.normalizer(get_normalizer("entmax15"), layers=[1]):
        full = tiny.capture(ids, layers=[1], keep=("probs", "scores", "v"))
        reused = tiny.capture(ids, layers=[1], keep=("probs", "scores", "v"), reuse=(record, 1))
        logits = tiny.forward(ids).logits
        logits_reused = tiny.forward(ids, reuse=(record, 1)).logits
        with pytest.raises(ValueError, match="native normalizer"):
            tiny.forward(ids, reuse=(record, 2))            # layer 1 is swapped: it may not be reused
    assert all(torch.equal(getattr(full, k), getattr(reused, k)) for k in ("probs", "scores", "v"))
    assert torch.equal(logits, logits_reused)
    with pytest.raises(ValueError, match="other token ids"):
        tiny.forward(ids + 1, reuse=(record, 1))
    assert not any("forward" in vars(b) for b in tiny.blocks)      # the blocks compute again afterwards


def test_custom_function_without_mask_function_is_not_causal(tiny):
    """The trap: a function registered with AttentionInterface alone receives no mask."""
    from transformers import AttentionInterface

    seen = {}

    def probe(module, query, key, value, attention_mask, **kwargs):
        seen["mask"] = attention_mask
        return cap.attnlab_attention(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("attnlab_probe_nomask", probe)
    tiny.hf.set_attn_implementation("attnlab_probe_nomask")
    try:
        with torch.no_grad():
            tiny.hf(input_ids=torch.arange(5)[None])
    finally:
        tiny.hf.set_attn_implementation(cap.IMPLEMENTATION)
    assert seen["mask"] is None  # hence attnlab registers its mask function too
    assert tiny.causal  # and learned causality from the mask it receives


def test_sdpa_output_attentions_trap(tiny):
    """With sdpa, output_attentions returns nothing useful; attnlab never relies on it."""
    with tiny.implementation("sdpa"), torch.no_grad():
        out = tiny.hf(input_ids=torch.arange(6)[None], output_attentions=True)
    assert not out.attentions or all(a is None for a in out.attentions)
    assert tiny.capture(torch.arange(6)).probs.shape[-1] == 6


def test_bad_inputs(tiny):
    with pytest.raises(ValueError, match="exceeds"):
        tiny.capture(torch.zeros(1025, dtype=torch.long))
    with pytest.raises(ValueError, match="keep"):
        tiny.capture(torch.arange(4), keep=("nonsense",))
    with pytest.raises(ValueError, match="layers"):
        tiny.capture(torch.arange(4), layers=[7])
    with pytest.raises(ValueError, match="1-D"):
        tiny.capture(torch.zeros(2, 3, dtype=torch.long))


def test_grouped_query_attention_llama(tiny):
    """Llama-style model with fewer key/value heads than query heads (GQA) and an explicit head_dim."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnlab.core.models import AttnModel

    cfg = LlamaConfig(vocab_size=50257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    torch.manual_seed(0)
    model = AttnModel("tiny-llama-gqa", LlamaForCausalLM(cfg), tiny.tokenizer, source="random init")
    ids = torch.arange(500, 540)
    trace = model.capture(ids, keep=("probs", "k"))
    _, ref = eager_attentions(model, ids)
    assert model.causal and model.d_head == 16 and trace.k.shape == (2, 4, 40, 16)
    assert (trace.probs - ref).abs().max() <= 1e-6


def test_query_row_blocks_give_the_same_capture(tiny, monkeypatch):
    """Where one head's [query, key] matrix exceeds CHUNK_ELEMENTS (L > 2048 on the CPU) it is formed a block of
    query rows at a time; a head subset of one layer computes only those heads: the same numbers either way."""
    ids = torch.arange(500, 560)
    whole = tiny.capture(ids, keep=("probs", "scores"))
    record = tiny.layer_outputs(ids)
    monkeypatch.setattr(cap, "CHUNK_ELEMENTS", 7 * 60)          # 7 query rows per block
    assert [b[3] for b in cap.attention_blocks((1, 4, 60, 60), [0, 1], torch.device("cpu"))][:2] == \
        [slice(0, 7), slice(7, 14)]
    blocks = tiny.capture(ids, keep=("probs", "scores"))
    part = tiny.capture(ids, layers=[1], heads=[3, 0], keep=("probs", "scores"))
    assert torch.allclose(blocks.probs, whole.probs, atol=1e-6)
    assert torch.equal(blocks.scores.isinf(), whole.scores.isinf())
    assert torch.equal(part.probs, blocks.probs[1:2, [3, 0]]) and torch.equal(part.scores, blocks.scores[1:2, [3, 0]])
    again = tiny.layer_outputs(ids)
    assert all(torch.allclose(a[0], b[0], atol=1e-5) for a, b in zip(record.outputs, again.outputs))


def test_captures_into_a_storage_reuse_its_memory_and_give_the_same_trace(tiny):
    """`capture(storage=...)`: block after block in the same memory (grown when a block needs more), same numbers."""
    ids = torch.arange(500, 540)
    storage = {}
    first = tiny.capture(ids, layers=[1], heads=[0, 1], keep=("probs", "scores"), storage=storage)
    ptr = storage["probs"].data_ptr()
    assert first.probs.data_ptr() == ptr
    del first
    second = tiny.capture(ids, layers=[0], heads=[2], keep=("probs", "scores"), storage=storage)
    assert second.probs.data_ptr() == ptr                            # the smaller block: the same memory
    alone = tiny.capture(ids, layers=[0], heads=[2], keep=("probs", "scores"))
    assert torch.equal(second.probs, alone.probs) and torch.equal(second.scores, alone.scores)
    bigger = tiny.capture(ids, layers=[0, 1], keep=("probs",), storage=storage)
    assert storage["probs"].numel() == bigger.probs.numel() and torch.equal(bigger.probs[0, 2], alone.probs[0, 0])


def test_a_block_of_causal_rows_leaves_out_only_the_keys_its_mask_hides():
    """`seen_keys`: the last key any row of the block may see, + 1, from an additive or a bool mask; every key when
    a row sees none (such rows then come out as they would without the cut)."""
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    additive = torch.zeros(10, 10).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert cap.seen_keys(additive[None, 3:6]) == 6 and cap.seen_keys(causal[None, 3:6]) == 6
    assert cap.seen_keys(causal[None, 9:]) == 10
    padded = causal.clone()
    padded[:, 0] = False                                          # a padded first key changes nothing past it
    assert cap.seen_keys(padded[None, :4]) == 4
    assert cap.seen_keys(torch.zeros(1, 2, 10, dtype=torch.bool)) == 10


def test_a_block_of_sliding_window_rows_leaves_out_the_keys_before_its_band():
    """`first_seen_key`: the first key any row of the block may see (a sliding window of 4: rows 6..8 see keys 3..8);
    0 when a row sees none (such rows keep every key)."""
    q, k = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    band = (k <= q) & (k > q - 4)
    additive = torch.zeros(10, 10).masked_fill(~band, torch.finfo(torch.float32).min)
    assert cap.first_seen_key(band[None, 6:9]) == 3 and cap.first_seen_key(additive[None, 6:9]) == 3
    assert (cap.first_seen_key(band[None, :2]), cap.seen_keys(band[None, :2])) == (0, 2)
    assert cap.first_seen_key(torch.zeros(1, 2, 10, dtype=torch.bool)) == 0


def test_a_sliding_window_computed_in_bands_equals_softmax_of_all_keys(monkeypatch):
    """Blocks of 3 rows under a window of 4 keys: each block's keys cut to its band (`first_seen_key`) and above
    (`seen_keys`); weights, scores (-inf outside the band) and output equal softmax(q k^T s + mask) over every key."""
    monkeypatch.setattr(cap, "CHUNK_ELEMENTS", 3 * 12)                   # 3 rows per block
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g) for _ in range(3))
    i, j = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    band = (j <= i) & (j > i - 4)
    mask = torch.zeros(1, 1, 12, 12).masked_fill(~band, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    out, probs = cap.attnlab_attention(module, q, k, v, mask, scaling=0.5)
    want = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + mask, dim=-1)
    assert torch.allclose(probs, want, atol=1e-6) and float(probs[0][:, ~band].abs().max()) == 0.0
    assert torch.allclose(out, (want @ v).transpose(1, 2), atol=1e-6)


def test_a_native_pass_for_layer_outputs_forms_no_attention_weights(tiny):
    seen = []
    hooks = [m.register_forward_hook(lambda mod, a, out: seen.append(out[1])) for m in tiny._modules]
    try:
        tiny.layer_outputs(torch.arange(10, 30))
        weights = tiny.forward(torch.arange(10, 30), output_attentions=True).attentions
    finally:
        for h in hooks:
            h.remove()
    assert seen[:tiny.n_layers] == [None] * tiny.n_layers           # layer_outputs: weights not formed
    assert all(w is not None and w.shape[-1] == 20 for w in seen[tiny.n_layers:]) and len(weights) == tiny.n_layers


def test_per_head_masks_give_each_head_block_its_own_key_cut(monkeypatch):
    """A mask with one part per head: each head block's `seen_keys` comes from its own part (the cut is remembered
    per head, not shared): head 0 sees the first 3 keys, head 1 every earlier key, head 2 all; the attention equals
    softmax(q k^T s + mask) v head by head (a cut remembered from head 0 would hide keys from head 1)."""
    monkeypatch.setattr(cap, "CHUNK_ELEMENTS", 12 * 12)                 # one head per block
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, 12, 4, generator=g) for _ in range(3))
    vis = torch.stack([torch.zeros(12, 12, dtype=torch.bool).index_fill_(1, torch.arange(3), True),
                       torch.ones(12, 12, dtype=torch.bool).tril(), torch.ones(12, 12, dtype=torch.bool)])[None]
    mask = torch.zeros(vis.shape).masked_fill(~vis, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    out, probs = cap.attnlab_attention(module, q, k, v, mask, scaling=0.5)
    want = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + mask, dim=-1)
    assert torch.allclose(probs, want, atol=1e-6)
    assert torch.allclose(out, (want @ v).transpose(1, 2), atol=1e-6)
    assert float(probs[0, 0, :, 3:].abs().max()) == 0.0 and float(probs[0, 1, -1, 3:].min()) > 0
