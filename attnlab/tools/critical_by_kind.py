"""The critical N of each layer kind (issue #48 item 3): a model's sliding-window layers (Gemma 3: a row sees its last
512 keys) against its full layers (every earlier key), at lengths L up to the model's longest, with `diagnose`'s
protocol: per-head token means of d~ (reading b) and E over `max_rows` evenly spaced query rows, the KS scan of
paper 1's Alg. 3 on `diagnose.critical_grid` of each kind's longest row (min(L, w)), the heads of every layer of a
kind pooled.

Causal models only, one layer captured at a time (the layers below it replayed from one native pass, as
`normalization.layer_kinds`): a [head, L, L] layer at a time, so L = 8,192 fits where a pooled capture of every layer
(Fig. 2c) does not. A shorter L reads the first L rows of the longest pass (exact for causal attention).

    res = critical_by_kind(model, ids, lengths=(512, 2048, 8192))      # Result "critical_by_kind"
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
import torch

from attnlab.core.capture import visible_mask
from attnlab.core.result import Result, provenance
from attnlab.core.util import progress as progress_bar
from attnlab.normalization.metrics.distance import distance_stats
from attnlab.normalization.metrics.engine import row_mean
from attnlab.tools import diagnose as dg

NAME = "critical_by_kind"
PROTOCOL = ("diagnose's critical N: per-head token means of d~ (reading b) and E (float32 products) over {max_rows} "
            "evenly spaced query rows of the first L, KS two-sample test (alpha = {alpha}) on the grid of each kind's "
            "longest row (every N up to 8, then steps of {step:g} of it up to {top:g} of it), the heads of every layer "
            "of a kind pooled; reported N = the first grid N not rejected (an upper bound on the first N), censored = "
            "none up to the grid's end. [R] rows sampled, not every row (Fig. 2c uses every row up to L = 1,024)")


SCAN_DTYPE = torch.float32     # the scan ranks per-head means: float32 products, as paper 1's reading scans
                               # (`readings.theorem1`; d~ and E within 6e-7 relative of float64, `distance_stats`)


def head_means(probs: torch.Tensor, x: torch.Tensor, visible: torch.Tensor, ns: Sequence[int]):
    """Per-head token means of d~ (reading b) and E at each N: probs [head, Q, K], x [head, K, D], visible [Q, K] ->
    two arrays [head, len(ns)] (`diagnose.distance_heads` with SCAN_DTYPE's products)."""
    st = distance_stats(probs, x, ns, visible, stats=("dtilde_b", "E"), dtype=SCAN_DTYPE)
    return row_mean(st["dtilde_b"], dim=-2).numpy(), row_mean(st["E"], dim=-2).numpy()


def kind_grid(L: int, window: Optional[int], crit_max_frac: float, crit_step_frac: float) -> tuple[int, list[int]]:
    """(longest, N grid) of a layer kind at length L: its longest row sees min(L, w) keys (L without a window)."""
    longest = L if window is None else min(L, int(window))
    return longest, dg.critical_grid(longest, max_frac=crit_max_frac, step_frac=crit_step_frac)


def critical_by_kind(model, ids, lengths: Sequence[int] = (512, 1024, 2048, 4096, 8192), *,
                     max_rows: int = dg.MAX_ROWS, alpha: float = dg.ALPHA, crit_max_frac: float = dg.CRIT_MAX_FRAC,
                     crit_step_frac: float = dg.CRIT_STEP_FRAC, text: Optional[dict] = None,
                     progress: bool = False) -> Result:
    """One row per (L, kind): the critical N of the kind's heads pooled (`diagnose.pooled_critical_n`: critical_n,
    critical_n_frac = N / longest_row, critical_n_censored, critical_n_pvalue, critical_n_max, n_pooled_heads,
    critical_n_testable), its layers, window and longest row. ids [token]: one causal window of at least
    max(lengths) tokens (its first max(lengths) are read). Memory: one layer's [head, L, L] float32 probs at a time."""
    if not model.causal:
        raise ValueError(f"{model.name} is not causal: layer kinds are measured on causal models (prefix rows)")
    lengths = sorted({int(L) for L in lengths})
    ids = torch.as_tensor(ids).long()
    if lengths[0] < 16 or ids.numel() < lengths[-1]:
        raise ValueError(f"lengths must be in [16, {ids.numel()}] (the window), got {lengths}")
    ids = ids[: lengths[-1]]
    t0 = time.perf_counter()
    outputs, storage = model.layer_outputs(ids), {}
    pooled: dict[tuple, dict] = {}            # (L, kind, window) -> {"layers", "d", "e", "longest", "ns"}
    for layer in progress_bar(range(model.n_layers), progress, "critical N by layer kind"):
        kind, window = model.layer_kinds[layer]
        trace = model.capture(ids, layers=[layer], keep=("probs", "v"), reuse=(outputs, layer), storage=storage)
        for L in lengths:
            longest, ns = kind_grid(L, window, crit_max_frac, crit_step_frac)
            vis = visible_mask(L, True, kind, window)
            rows = dg.row_sample(L, max_rows)
            d, e = head_means(trace.probs[0, :, rows, :L], trace.v[0, :, :L], vis[rows], ns)     # [head, N] each
            slot = pooled.setdefault((L, kind, window), {"layers": [], "d": [], "e": [], "longest": longest, "ns": ns})
            slot["layers"].append(layer)
            slot["d"].append(d)
            slot["e"].append(e)
        del trace
    out = []
    for (L, kind, window), s in sorted(pooled.items(), key=lambda item: (item[0][0], item[0][1])):
        crit = dg.pooled_critical_n(np.concatenate(s["d"]), np.concatenate(s["e"]), s["ns"], s["longest"], alpha)
        out.append({"L": L, "kind": kind, "window": window, "longest_row": s["longest"], "n_layers": len(s["layers"]),
                    **crit})
    bos = int(ids[0]) == getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    prov = provenance(**model.provenance(), layer_kinds=[list(k) for k in model.layer_kinds], lengths=lengths, bos=bos,
                      max_rows=max_rows, alpha=alpha, crit_max_frac=crit_max_frac, crit_step_frac=crit_step_frac,
                      protocol=PROTOCOL.format(max_rows=max_rows, alpha=alpha, step=crit_step_frac,
                                               top=crit_max_frac),
                      window_tokens=int(ids.numel()), text=(text or {}).get("text"),
                      text_sha256=(text or {}).get("text_sha256"), text_meta=text or {},
                      runtime_seconds=round(time.perf_counter() - t0, 3), torch_threads=torch.get_num_threads())
    return Result(name=NAME, rows=out, provenance=prov)
