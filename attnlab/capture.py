"""Capturing attention through transformers' AttentionInterface; the Trace object.

Trace is the one object that crosses from the model world into the math world.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

KEEPABLE = ("q", "k", "v", "scores", "probs", "hidden")


@dataclass
class Trace:
    """Attention tensors of one forward pass, float32, batch of one sequence.

    q, k, v:   [layer, head, token, d_head]   (after projection, biases included; before scaling)
    scores:    [layer, head, query, key]      scaled logits `scaling * q.k`, masked entries = -inf
    probs:     [layer, head, query, key]      the model's attention weights (0 on masked keys)
    hidden:    [layer, token, d_model]        input of each attention block (GPT-2: after ln_1)
    layers / heads: the model's layer and head index for each entry of the first two axes.
    """

    model_name: str
    token_ids: torch.Tensor
    layers: list[int]
    heads: list[int]
    causal: bool
    scaling: float
    text_sha256: Optional[str] = None
    q: Optional[torch.Tensor] = None
    k: Optional[torch.Tensor] = None
    v: Optional[torch.Tensor] = None
    scores: Optional[torch.Tensor] = None
    probs: Optional[torch.Tensor] = None
    hidden: Optional[torch.Tensor] = None
    meta: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[-1])

    def visible(self, length: Optional[int] = None) -> torch.Tensor:
        """bool [query, key]: which keys each query row sees (lower triangle when causal)."""
        n = self.n_tokens if length is None else length
        full = torch.ones(n, n, dtype=torch.bool)
        return torch.tril(full) if self.causal else full

    def prefix(self, length: int) -> "Trace":
        """The trace of the first `length` tokens. Exact for causal models only (row t sees keys <= t)."""
        if not self.causal:
            raise ValueError("prefix() is exact only for causal models; run one pass per length instead")
        if not 1 <= length <= self.n_tokens:
            raise ValueError(f"length must be in [1, {self.n_tokens}], got {length}")
        cut = {}
        for name in ("q", "k", "v", "hidden"):
            t = getattr(self, name)
            cut[name] = None if t is None else t[..., :length, :]
        for name in ("scores", "probs"):
            t = getattr(self, name)
            cut[name] = None if t is None else t[..., :length, :length]
        return Trace(self.model_name, self.token_ids[:length], self.layers, self.heads, self.causal,
                     self.scaling, self.text_sha256, meta=dict(self.meta, prefix_of=self.n_tokens), **cut)

    def provenance(self) -> dict:
        """What produced this trace, for a Result's provenance."""
        return {"model": self.model_name, "n_tokens": self.n_tokens, "causal": self.causal,
                "scaling": self.scaling, "text_sha256": self.text_sha256, "layers": self.layers,
                "heads": self.heads, **self.meta}
