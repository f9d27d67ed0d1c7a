"""Long windows, layer block by layer block: which layers of a causal model one capture may hold (the attention
tensors of a block must fit CAPTURE_BUDGET), which figures cannot stream (POOLED: their statistic pools every
head), and one Result from a figure computed block by block. `experiments.run_figures` uses it."""
from __future__ import annotations

from typing import Iterable, Optional

from attnlab.core.result import Result

#: bytes of captured [head, query, key] float32 tensors one pass may hold; above it a causal model's layers are
#: captured in blocks (one block at L = 8192 on SmolLM2: 9 heads x 8192^2 x 4 B = 2.4 GB per tensor)
CAPTURE_BUDGET = 3 << 30


def layer_blocks(model, n_tokens: int, keep: Iterable[str], budget: Optional[int] = None) -> list[Optional[list[int]]]:
    """The layers of `model` in consecutive blocks whose captured [head, query, key] tensors at `n_tokens` fit
    `budget` bytes: [None] (all layers in one pass) when they all fit, or for bidirectional models (one
    pass per length: they never reach such lengths)."""
    square = max(1, len(set(keep) & {"scores", "probs"}))
    per_layer = square * model.n_heads * n_tokens ** 2 * 4
    size = max(1, (CAPTURE_BUDGET if budget is None else budget) // per_layer)
    if size >= model.n_layers or not model.causal:
        return [None]
    return [list(range(s, min(s + size, model.n_layers))) for s in range(0, model.n_layers, size)]


def merge(parts: list[Result]) -> Result:
    """One Result from the same figure computed on blocks of layers: rows concatenated, costs added."""
    first = parts[0]
    if len(parts) == 1:
        return first
    prov = dict(first.provenance, layers=[l for r in parts for l in r.provenance.get("layers") or []],
                layer_blocks=len(parts), n_passes=sum(r.provenance["n_passes"] for r in parts),
                capture_seconds=round(sum(r.provenance["capture_seconds"] for r in parts), 3),
                runtime_seconds=round(sum(r.provenance["runtime_seconds"] for r in parts), 3))
    return Result(first.name, [row for r in parts for row in r.rows], prov)


#: figures whose statistic pools every head (fig2c: one KS test over all heads' means; fig4: Alg. 5's largest
#: mean over heads): never streamed
POOLED = ("fig2c", "fig4")
POOLED_LIMIT = 12 << 30


def check_pooled_fits(model, n_tokens: int, keep: Iterable[str]) -> None:
    """ValueError (one line) when a pooled figure's all-layer capture at `n_tokens` would exceed POOLED_LIMIT."""
    need = max(1, len(set(keep) & {"scores", "probs"})) * model.n_heads * model.n_layers * n_tokens ** 2 * 4
    if need > POOLED_LIMIT:
        top = int((POOLED_LIMIT / (model.n_heads * model.n_layers * 4 * 2)) ** 0.5)
        raise ValueError(f"fig2c and fig4 pool every head of every layer: at L = {n_tokens} that is "
                         f"{need / 1e9:.0f} GB of attention tensors; run fig2c and fig4 with --max-length <= {top} "
                         "(fig1, fig2a, fig2b and fig3 stream their layers and reach the model's positions)")
