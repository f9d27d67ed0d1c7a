"""Vanishing attention by layer kind: a model's sliding-window layers (Gemma 3: a query sees its last 512 keys) against
its full layers (every earlier key), the same quantities per layer and head at several lengths L of one window.

Causal models only: one pass at the longest L, one layer captured at a time (the layers below it replayed from one
native pass, `AttnModel.layer_outputs`); a shorter L reads the first L query rows, exact for causal attention (with
or without a window: row t sees the same keys at every length).
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch

from attnlab.core.capture import visible_mask
from attnlab.core.result import Result, provenance
from attnlab.core.util import progress as progress_bar

KIND_STATS = ("max_weight", "first_weight", "max_rest", "support", "uniform")


def visible_keys(n_rows: int, window) -> torch.Tensor:
    """float64 [row]: the keys causal row t sees, itself included (`capture.visible_mask`): t + 1, at most `window`
    (None: no window)."""
    kind = "full" if window is None else "sliding"
    return visible_mask(n_rows, True, kind, window).sum(-1, dtype=torch.float64)


def layer_row_stats(probs: torch.Tensor, window) -> dict[str, torch.Tensor]:
    """Per row [head, row] of one layer's probs [head, query, key]: the largest weight, the weight on the first token
    (key 0: a BOS token, where one is put first, takes much of the full layers' weight), the largest weight on any
    other key (0 in row 0), the keys the row sees (`visible_keys`) and the uniform weight 1 / that."""
    support = visible_keys(probs.shape[-2], window).expand(probs.shape[0], -1)
    return {"max_weight": probs.amax(-1).double(), "first_weight": probs[..., 0].double(),
            "max_rest": probs[..., 1:].amax(-1).double(), "support": support, "uniform": 1.0 / support}


def layer_kind_rows(model, ids, lengths: Sequence[int] = (256, 1024, 4096), progress: bool = False,
                    bos: bool = False, text: Optional[dict] = None) -> Result:
    """One row per (L, layer, head): the layer's kind and window (`AttnModel.layer_kinds`) and the means over the
    first L query rows of ids [token] of `KIND_STATS` (`layer_row_stats`). bos: the tokenizer's BOS token first, then
    ids (Gemma is trained with it: its full layers then put much of their weight on it; ids from
    `AttnModel.window` of a model whose table entry says bos start with it already). text: the text's provenance
    (`core.text.Corpus.provenance`, the window's name). Memory: one layer's [head, L, L] float32 probs at a time
    (4 heads at L = 8192: 1 GiB). Time: a sliding layer's attention is formed in blocks of rows over their band of
    keys only (`capture.first_seen_key`)."""
    if not model.causal:
        raise ValueError(f"{model.name} is not causal: layer kinds are measured on causal models (prefix rows)")
    lengths = sorted({int(L) for L in lengths})
    ids = torch.as_tensor(ids).long()
    if bos and ids.numel() and int(ids[0]) == model.tokenizer.bos_token_id:
        raise ValueError("bos: ids already start with the BOS token (`AttnModel.window` puts it first where the model "
                         "table says bos)")
    if bos:
        ids = torch.cat([torch.tensor([model.tokenizer.bos_token_id]), ids])
    ids = ids[: lengths[-1]]
    if lengths[0] < 2 or ids.numel() < lengths[-1]:
        raise ValueError(f"lengths must be in [2, {ids.numel()}] (the window), got {lengths}")
    t0 = time.perf_counter()
    outputs, storage, rows = model.layer_outputs(ids), {}, []
    for layer in progress_bar(range(model.n_layers), progress, "layer kinds"):
        kind, window = model.layer_kinds[layer]
        trace = model.capture(ids, layers=[layer], keep=("probs",), reuse=(outputs, layer), storage=storage)
        st = layer_row_stats(trace.probs[0], window)
        for L in lengths:
            means = {name: v[:, :L].mean(-1).tolist() for name, v in st.items()}
            rows += [{"L": L, "layer": layer, "head": h, "kind": kind, "window": window,
                      **{name: means[name][h] for name in KIND_STATS}} for h in range(model.n_heads)]
    bos_first = int(ids[0]) == getattr(model.tokenizer, "bos_token_id", None)
    first = "the BOS token, then the text" if bos_first else "the text's tokens, no BOS token"
    prov = provenance(**model.provenance(), layer_kinds=[list(k) for k in model.layer_kinds], lengths=lengths,
                      runtime_seconds=round(time.perf_counter() - t0, 3), torch_threads=torch.get_num_threads(),
                      bos=bos_first, window_tokens=int(ids.numel()),
                      text=(text or {}).get("text"), text_sha256=(text or {}).get("text_sha256"),
                      text_meta=text or {},
                      protocol=f"one causal window of the longest L ({first}); each L reads its first L "
                               "query rows; means over rows")
    return Result(name="layer_kinds", rows=rows, provenance=prov)


def by_kind(result: Result) -> list[dict]:
    """`layer_kind_rows` averaged over the layers and heads of each kind, per L: one row per (L, kind) with the
    number of layers and the means of `KIND_STATS`."""
    groups: dict[tuple, list[dict]] = {}
    for r in result.rows:
        groups.setdefault((r["L"], r["kind"], r["window"]), []).append(r)
    return [{"L": L, "kind": kind, "window": window, "n_layers": len({r["layer"] for r in rs}),
             **{name: sum(r[name] for r in rs) / len(rs) for name in KIND_STATS}}
            for (L, kind, window), rs in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1]))]
