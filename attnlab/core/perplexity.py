"""Perplexity of a causal language model on a text: the sanity figure that a model is a working language
model (SmolLM2's 4-bit weights, a user's GGUF), by the usual strided evaluation.

Windows of `window` tokens start every `stride` tokens; a token is scored once, in the first window that
predicts it, so every scored token past the first window sees at least window - stride tokens of context.
With stride < window every token but the first is scored; with stride = window the first token of each
window is not (nothing before it in that window). perplexity = exp(mean negative log-likelihood per scored token).
A model whose table entry says `bos` (Gemma 3: its windows start with the BOS token, as in its training) reads each
window as BOS + window - 1 text tokens; the same tokens are scored (the first text token of a window, predicted from
BOS alone, is not), each from one token less of text context (Gemma 3 270M on 511 tokens of War and Peace, one
window: 75.9 without BOS, 30.0 with it; measured 2026-11-29).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from attnlab.core.result import Result, provenance
from attnlab.core.util import progress

PERPLEXITY_TOKENS, PERPLEXITY_WINDOW, PERPLEXITY_STRIDE = 8192, 1024, 512   # the book's and `attnlab info`'s


LOGIT_ROWS = 256     # positions whose logits are formed at a time: [256, vocab] (Gemma 3's 262,144 words: 256 MiB)


def strided_nll(model, ids: torch.Tensor, window: int, stride: int, show: bool = False,
                bos: Optional[int] = None) -> tuple[float, int]:
    """(sum of negative log-likelihoods in nats, tokens scored) of ids [token] under causal `model` (AttnModel).
    bos: a token id each window starts with (window - 1 text tokens after it), or None (`window` text tokens)."""
    if not model.causal:
        raise ValueError(f"{model.name} is not a causal language model: perplexity needs one")
    text_window = window - (bos is not None)                 # text tokens per window
    if not 1 <= stride <= text_window:
        raise ValueError(f"need 1 <= stride <= window{' - 1 (BOS first)' if bos is not None else ''}, got stride "
                         f"{stride}, window {window}")
    total, scored, done = 0.0, 0, 1                  # token 0 has no context: it is never scored
    starts = range(0, max(1, ids.numel() - 1), stride)
    with model.implementation("sdpa"):
        for begin in progress(starts, show, "perplexity"):
            end = min(begin + text_window, ids.numel())
            if end <= done:
                continue
            if bos is None:
                nll = window_nll(model, ids[begin:end])                         # predicts tokens begin+1 .. end-1
            else:                                                   # (its first: ids[begin] from BOS alone, dropped)
                nll = window_nll(model, torch.cat([ids.new_tensor([bos]), ids[begin:end]]))[1:]
            fresh = nll[done - begin - 1:] if done > begin else nll
            total, scored, done = total + float(fresh.sum()), scored + fresh.numel(), end
    return total, scored


@torch.no_grad()
def window_nll(model, ids: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihoods [token - 1] of ids[1:] given the tokens before them, from one forward pass of ids
    [token]. The logits are formed LOGIT_ROWS positions at a time from the final hidden states (`head_logits`), never
    [token, vocab] at once: checked against the model's own logits of the last position, else (a model whose logits
    are more than its LM head) all at once from its output."""
    found = final_hidden(model, ids)
    hidden = None if found is None else found[0]
    if found is None or not torch.allclose(head_logits(model.hf, hidden[-1:])[0], found[1], rtol=1e-4, atol=1e-4):
        logp = torch.log_softmax(model.forward(ids).logits[0, :-1].float(), dim=-1)
        return -logp.gather(1, ids[1:, None].to(logp.device))[:, 0]
    targets = ids[1:].to(hidden.device)
    nll = torch.empty(targets.numel(), device=hidden.device)
    for r in range(0, targets.numel(), LOGIT_ROWS):
        rows = slice(r, min(r + LOGIT_ROWS, targets.numel()))
        logp = torch.log_softmax(head_logits(model.hf, hidden[rows]), dim=-1)          # [rows, vocab]
        nll[rows] = -logp.gather(1, targets[rows, None])[:, 0]
    return nll


def final_hidden(model, ids: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(the final hidden states [token, d_model] that the LM head reads, the model's logits of the last token
    [vocab]) from one forward pass of ids [token] that forms the logits of the last position only; None for a model
    whose forward takes no `logits_to_keep` or whose base model returns no hidden states."""
    seen = {}

    def keep(module, args, output):
        seen["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    hook = model.hf.base_model.register_forward_hook(keep)
    try:
        out = model.forward(ids, logits_to_keep=1)
    except TypeError:                                   # (an older model class: no logits_to_keep)
        return None
    finally:
        hook.remove()
    return (seen["hidden"][0], out.logits[0, -1].float()) if "hidden" in seen else None


def head_logits(hf, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits [row, vocab] of final hidden states [row, d_model]: the LM head, then the final logit
    softcapping where the config has one (Gemma 2: c tanh(logits / c))."""
    logits = hf.get_output_embeddings()(hidden).float()
    cap = getattr(hf.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def perplexity(model, text, *, tokens: int = PERPLEXITY_TOKENS, window: int = PERPLEXITY_WINDOW,
               stride: int = PERPLEXITY_STRIDE, show: bool = False) -> Result:
    """Perplexity of causal `model` on the first `tokens` tokens of `text` (a core.text Corpus), strided.
    One row: perplexity, nll_per_token, tokens, window, stride; provenance names model and text."""
    window = min(window, model.max_positions)
    ids = torch.as_tensor(model.tokenizer(text.text[: tokens * 12], add_special_tokens=False)["input_ids"][:tokens])
    if ids.numel() < 2:
        raise ValueError(f"{text.name}: fewer than 2 tokens to score")
    bos = model.tokenizer.bos_token_id if getattr(model, "bos", False) else None
    if getattr(model, "bos", False) and bos is None:
        raise ValueError(f"{model.name}'s windows start with BOS, but its tokenizer has no BOS token")
    stride = min(stride, window - (bos is not None))
    nll, scored = strided_nll(model, ids, window, stride, show=show, bos=bos)
    row = {"perplexity": math.exp(nll / scored), "nll_per_token": nll / scored, "tokens": int(ids.numel()),
           "scored": scored, "window": window, "stride": stride}
    first = "" if bos is None else f" (BOS, then {window - 1} text tokens)"
    prov = provenance(**model.provenance(), text=text.name, text_sha256=text.sha256,
                      protocol=f"strided evaluation: the first {ids.numel()} tokens of {text.name}, windows of "
                               f"{window} tokens{first} every {stride} tokens, each token scored once",
                      **({"bos_first": True} if bos is not None else {}))
    return Result("perplexity", [row], prov)


def cached_perplexity(model, text, **options) -> Result:
    """`perplexity` from the results cache (model weights, text and options in the key)."""
    from attnlab.core.cache import cached, model_key

    key = {"experiment": "perplexity", **model_key(model), "text": text.sha256, **options,   # other models: as before
           **({"windows": "BOS first"} if getattr(model, "bos", False) else {})}
    return cached("perplexity", key, lambda: perplexity(model, text, **options))
