"""What the reading experiments of Theorem 2 and Lemma 2 share (`theorem2`, `lemma2`): one forward pass over
the first L tokens of a window, one row per (layer, head), and the finished Result with its provenance."""
from __future__ import annotations

import hashlib
import time

import numpy as np
import torch

from attnlab.core.result import Result, provenance
from attnlab.core.text import window_prefix
from attnlab.normalization import readings
from attnlab.normalization.experiments import sep_token_id

QUICK_L = 128            # quick: the first 128 tokens


def capture_window(model, ids, quick: bool, L, keep: set):
    """One forward pass over the first L tokens of ids [L_max] (default all of them up to `readings.MAX_LENGTH`;
    quick: at most 128)."""
    ids = torch.as_tensor(ids).long()
    if ids.ndim != 1:
        raise ValueError(f"ids must be one window of token ids [L_max], got shape {tuple(ids.shape)}")
    L = int(L or min(len(ids), QUICK_L if quick else readings.MAX_LENGTH))
    if not 2 <= L <= len(ids):
        raise ValueError(f"L must be in [2, {len(ids)}] for this window, got {L}")
    t0 = time.perf_counter()
    trace = model.capture(window_prefix(ids, L, sep_token_id(model)), keep=sorted(keep))
    return trace, L, time.perf_counter() - t0


def reading_result(name: str, model, trace, L: int, p: dict, extra: dict, rows: list[dict], t0: float,
            capture_s: float, quick: bool) -> Result:
    text = p["text"] or {}
    prov = provenance(
        figure=name, model=model.name, causal=bool(model.causal), max_positions=int(model.max_positions),
        device=str(getattr(model, "device", "cpu")),
        model_info=(model.provenance() if hasattr(model, "provenance") else None),
        text=text.get("text", text.get("name")), text_sha256=text.get("text_sha256") or trace.text_sha256,
        text_meta=text, window_tokens=L,
        token_ids_sha256=hashlib.sha256(trace.token_ids.numpy().astype(np.int64).tobytes()).hexdigest()[:16],
        scaling=trace.scaling, layers=trace.layers, heads=trace.heads, quick=bool(quick), n_passes=1,
        capture_seconds=round(capture_s, 3), runtime_seconds=round(time.perf_counter() - t0, 3),
        torch_threads=torch.get_num_threads(), **extra)
    return Result(name=name, rows=rows, provenance=prov)


def window_label(res: Result) -> str:
    return f"L={res.provenance.get('window_tokens')}, {res.provenance.get('model')}"
