"""Long windows, layer block by layer block: which layers of a causal model one capture may hold (the attention
tensors of a block must fit CAPTURE_BUDGET), which figures cannot stream (POOLED: their statistic pools every
head), and one Result from a figure computed block by block. `experiments.run_figures` uses it."""
from __future__ import annotations

from typing import Iterable, Optional

from attnlab.core.result import Result

#: bytes of captured [head, query, key] float32 tensors one pass may hold; above it a causal model's layers are
#: captured in blocks (one block at L = 8192 on SmolLM2: 9 heads x 8192^2 x 4 B = 2.4 GB per tensor)
CAPTURE_BUDGET = 3 << 30


def layer_blocks(model, n_tokens: int, keep: Iterable[str], budget: Optional[int] = None) -> list[Optional[tuple]]:
    """(layers, heads) blocks of `model` whose captured [head, query, key] tensors at `n_tokens` fit `budget`
    bytes: consecutive layers with every head (heads None) while a layer fits, else one layer and a few of its
    heads at a time (the layer's attention is formed a few heads at a time on the CPU, so only the kept heads
    count). [None] (one pass) when everything fits, or for bidirectional models (one pass per length: they never
    reach such lengths)."""
    square = max(1, len(set(keep) & {"scores", "probs"}))
    per_head = square * n_tokens ** 2 * 4
    budget = CAPTURE_BUDGET if budget is None else budget
    n_layers, n_heads = model.n_layers, model.n_heads
    size = max(1, budget // (per_head * n_heads))
    if size >= n_layers or not model.causal:
        return [None]
    if budget >= per_head * n_heads:
        return [(list(range(s, min(s + size, n_layers))), None) for s in range(0, n_layers, size)]
    width = max(1, budget // per_head)
    return [([layer], list(range(h, min(h + width, n_heads)))) for layer in range(n_layers)
            for h in range(0, n_heads, width)]


def merge(parts: list[Result]) -> Result:
    """One Result from the same figure computed on blocks of layers: rows concatenated, costs added."""
    first = parts[0]
    if len(parts) == 1:
        return first
    layers = sorted({l for r in parts for l in r.provenance.get("layers") or []})
    heads = sorted({h for r in parts for h in r.provenance.get("heads") or []})
    prov = dict(first.provenance, layers=layers, heads=heads,
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
