"""Perplexity of a causal language model on a text: the sanity figure that a model is a working language
model (SmolLM2's 4-bit weights, a user's GGUF), by the usual strided evaluation.

Windows of `window` tokens start every `stride` tokens; a token is scored once, in the first window that
predicts it, so every scored token past the first window sees at least window - stride tokens of context.
With stride < window every token but the first is scored; with stride = window the first token of each
window is not (nothing before it in that window). perplexity = exp(mean negative log-likelihood per scored token).
"""
from __future__ import annotations

import math

import torch

from attnlab.core.result import Result, provenance
from attnlab.core.util import progress

PERPLEXITY_TOKENS, PERPLEXITY_WINDOW, PERPLEXITY_STRIDE = 8192, 1024, 512   # the book's and `attnlab info`'s


def strided_nll(model, ids: torch.Tensor, window: int, stride: int, show: bool = False) -> tuple[float, int]:
    """(sum of negative log-likelihoods in nats, tokens scored) of ids [token] under causal `model` (AttnModel)."""
    if not model.causal:
        raise ValueError(f"{model.name} is not a causal language model: perplexity needs one")
    if not 1 <= stride <= window:
        raise ValueError(f"need 1 <= stride <= window, got stride {stride}, window {window}")
    total, scored, done = 0.0, 0, 1                  # token 0 has no context: it is never scored
    starts = range(0, max(1, ids.numel() - 1), stride)
    with model.implementation("sdpa"):
        for begin in progress(starts, show, "perplexity"):
            end = min(begin + window, ids.numel())
            if end <= done:
                continue
            logits = model.forward(ids[begin:end]).logits[0].float()          # [token, vocab]
            logp = torch.log_softmax(logits[:-1], dim=-1)
            targets = ids[begin + 1:end].to(logp.device)
            nll = -logp.gather(1, targets[:, None])[:, 0]                       # predicts tokens begin+1 .. end-1
            fresh = nll[done - begin - 1:] if done > begin else nll
            total, scored, done = total + float(fresh.sum()), scored + fresh.numel(), end
    return total, scored


def perplexity(model, text, *, tokens: int = PERPLEXITY_TOKENS, window: int = PERPLEXITY_WINDOW,
               stride: int = PERPLEXITY_STRIDE, show: bool = False) -> Result:
    """Perplexity of causal `model` on the first `tokens` tokens of `text` (a core.text Corpus), strided.
    One row: perplexity, nll_per_token, tokens, window, stride; provenance names model and text."""
    window = min(window, model.max_positions)
    ids = torch.as_tensor(model.tokenizer(text.text[: tokens * 12], add_special_tokens=False)["input_ids"][:tokens])
    if ids.numel() < 2:
        raise ValueError(f"{text.name}: fewer than 2 tokens to score")
    nll, scored = strided_nll(model, ids, window, min(stride, window), show=show)
    row = {"perplexity": math.exp(nll / scored), "nll_per_token": nll / scored, "tokens": int(ids.numel()),
           "scored": scored, "window": window, "stride": min(stride, window)}
    prov = provenance(**model.provenance(), text=text.name, text_sha256=text.sha256,
                      protocol=f"strided evaluation: the first {ids.numel()} tokens of {text.name}, windows of "
                               f"{window} tokens every {min(stride, window)} tokens, each token scored once")
    return Result("perplexity", [row], prov)


def cached_perplexity(model, text, **options) -> Result:
    """`perplexity` from the results cache (model weights, text and options in the key)."""
    from attnlab.core.cache import cached, model_key

    key = {"experiment": "perplexity", **model_key(model), "text": text.sha256, **options}
    return cached("perplexity", key, lambda: perplexity(model, text, **options))
