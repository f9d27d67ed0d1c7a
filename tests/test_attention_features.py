"""Exact or refused: every keyword a model passes to the attention function is computed as its eager attention
computes it (softcap, sinks), accepted because eager ignores it (NO_EFFECT), or refused at load in one line."""
import functools

import pytest
import torch

from attnlab.core.models import AttnModel

N = 10


def tiny(family: str, **fields):
    """A seeded random 2-layer model of `family` (float32, eval, eager attention) with `fields` set."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.for_model(family, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, **fields)
    config._attn_implementation = "eager"
    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return cls(config).eval()


def gemma2(softcap: float = 0.05):
    """A tiny Gemma 2 whose q/k projections are scaled up, so that its scores reach well past `softcap`."""
    hf = tiny("gemma2", attn_logit_softcapping=softcap)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(20)
            layer.self_attn.k_proj.weight.mul_(20)
    return hf


def eager_and_capture(hf):
    """(eager logits, eager attentions [layer][head, q, k], logits during attnlab's recording, captured Trace)."""
    ids = torch.arange(3, 3 + N)
    with torch.no_grad():
        ref = hf(input_ids=ids[None], output_attentions=True)
    model = AttnModel("tiny", hf, None, source="test", random_weights=True)
    model.state.start({"scores", "probs"}, list(range(model.n_layers)), None)
    try:
        logits = model.forward(ids).logits
    finally:
        model.state.recording = False
    model.state.records, model.state.buffers = {}, {}
    trace = model.capture(ids, keep=("scores", "probs"))
    return ref.logits, [a[0] for a in ref.attentions], logits, trace, model


def test_gemma2_softcap_is_captured_exactly():
    """Gemma 2's softcap 0.05 (issue 37): the probs and the logits while recording equal eager's (they differed
    by 4.9e-3 and 5.8e-3 when the keyword was dropped), and the scores are the capped logits, |s| <= c."""
    ref_logits, ref_att, logits, trace, _ = eager_and_capture(gemma2())
    for i, a in enumerate(ref_att):
        assert float((trace.probs[i] - a).abs().max()) <= 1e-6
    assert float((logits - ref_logits).abs().max()) <= 1e-6
    finite = trace.scores[torch.isfinite(trace.scores)]
    assert float(finite.abs().max()) <= 0.05 + 1e-7          # (0.05 in float32)
    assert torch.allclose(torch.softmax(trace.scores, -1), trace.probs, atol=1e-6)


def test_a_swapped_normalizer_receives_the_softcapped_scores():
    _, _, _, trace, model = eager_and_capture(gemma2())
    seen = []

    def softmax(scores, visible):
        seen.append(scores.clone())
        return torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)

    with model.normalizer(softmax, layers=[0]):
        model.forward(torch.arange(3, 3 + N))
    assert float(seen[0].abs().max()) <= 0.05 + 1e-7
    vis = torch.isfinite(trace.scores[0])
    assert torch.allclose(seen[0][vis], trace.scores[0][vis], atol=1e-7)          # (one block: every head)


def test_gpt_oss_sinks_are_captured_exactly():
    """gpt-oss's per-head sink logits (s_aux): probs rows sum to less than 1, equal to eager's."""
    hf = tiny("gpt_oss", num_local_experts=4, num_experts_per_tok=2, sliding_window=4)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.normal_(generator=torch.Generator().manual_seed(0))   # (initialised to 0)
    ref_logits, ref_att, logits, trace, _ = eager_and_capture(hf)
    assert float((logits - ref_logits).abs().max()) <= 1e-6
    for i, a in enumerate(ref_att):
        assert float((trace.probs[i] - a).abs().max()) <= 1e-6
    assert float(trace.probs.sum(-1).max()) < 1 - 1e-3


def test_an_unknown_attention_keyword_is_refused_at_load():
    """A keyword attnlab does not compute (here 'xyz', injected into layer 0's call) refuses the model when it is
    loaded, in one line naming the model type and the keyword; it was dropped silently before."""
    hf = tiny("llama")
    attention = hf.model.layers[0].self_attn
    attention.forward = functools.partial(attention.forward, xyz=0.5)
    with pytest.raises(ValueError, match=r"^llama: attention feature 'xyz' is not implemented by attnlab's capture"):
        AttnModel("tiny", hf, None, source="test")


def test_a_feature_read_from_the_module_is_caught_by_the_eager_check():
    """granite_swa's sinks are read from the module by its eager function and scale the output after the
    softmax: attnlab's output differs, and the load-time comparison with the model's eager attention refuses it."""
    hf = tiny("granite_swa", sliding_window=4)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("sinks"):
                p.normal_()
    with pytest.raises(ValueError, match=r"^granite_swa: attnlab's attention differs from the model's eager"):
        AttnModel("tiny", hf, None, source="test")


def test_a_models_forward_flags_reach_the_attention_and_are_accepted():
    """Many models pass their forward's keywords down to the attention function: the flags attnlab's own calls use
    (compare.py: output_hidden_states, use_cache) and return_dict change nothing in eager and are accepted."""
    hf = tiny("llama")
    ids = torch.arange(3, 3 + N)
    with torch.no_grad():
        ref = hf(input_ids=ids[None], output_hidden_states=True)
    model = AttnModel("tiny", hf, None, source="test")
    out = model.forward(ids, output_hidden_states=True, use_cache=False, return_dict=True)
    assert float((out.logits - ref.logits).abs().max()) <= 1e-6
