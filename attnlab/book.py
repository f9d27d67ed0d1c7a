"""What the chapters call: the model and device from the environment, figure Results computed once and
cached on disk (shared by every chapter and by rebuilds), and traces for live sliders.

    from attnlab import book
    inputs = book.inputs()                       # ATTNLAB_MODEL / ATTNLAB_DEVICE, War and Peace
    res = book.figure_results(["fig2a", "fig2b"], inputs)   # {id: Result}, from the cache when present
    res = book.cached_result("compare", {"lengths": [64, 128]}, compute, model=inputs.model)

Every cached Result goes through `attnlab.core.cache` (one key recipe: the package's sources,
model + weights checksum, text checksum, grids and protocol).
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Optional, Sequence

from attnlab.core.cache import cached, model_key
from attnlab.core.result import Result
from attnlab.figures import FIGURES, Inputs, compute_figures


@lru_cache(maxsize=4)
def inputs(model: Optional[str] = None, device: Optional[str] = None) -> Inputs:
    """The chapters' inputs: model and device from ATTNLAB_MODEL / ATTNLAB_DEVICE (defaults auto, cpu)."""
    return Inputs(model or os.environ.get("ATTNLAB_MODEL", "auto"), device or os.environ.get("ATTNLAB_DEVICE", "cpu"))


def _key(fig_id: str, inp: Inputs, quick: bool) -> dict:
    key = {"figure": fig_id, "quick": quick, "device": inp.device}
    if FIGURES[fig_id].needs == "model+text":
        key.update(model_key(inp.model), text=inp.corpus.sha256)
    elif FIGURES[fig_id].needs == "encoder":
        key.update(model_key(inp.encoder))
    return key


def figure_results(fig_ids: Sequence[str], inp: Optional[Inputs] = None, *, quick: bool = False,
                   refresh: bool = False) -> dict[str, Result]:
    """{id: Result} for `fig_ids`; missing ones are computed together (sharing forward passes) and cached."""
    inp = inp or inputs()
    out: dict[str, Result] = {}
    missing = []
    for fig_id in fig_ids:
        try:
            out[fig_id] = cached(fig_id, _key(fig_id, inp, quick), _raise_missing, refresh=refresh)
        except _Missing:
            missing.append(fig_id)
    if missing:
        fresh = compute_figures(missing, inp, quick=quick, progress=False)
        for fig_id, result in fresh.items():
            out[fig_id] = cached(fig_id, _key(fig_id, inp, quick), lambda r=result: r, refresh=True)
    return {i: out[i] for i in fig_ids}


class _Missing(Exception):
    pass


def _raise_missing():
    raise _Missing


@lru_cache(maxsize=8)
def trace(length: int, model: Optional[str] = None, device: Optional[str] = None,
          keep: tuple = ("probs", "scores", "v")):
    """A Trace of the first `length` tokens of War and Peace (kept in memory for live sliders)."""
    inp = inputs(model, device)
    ids = inp.model.window(inp.corpus.text, length)
    return inp.model.capture(ids, keep=keep, text_sha256=inp.corpus.sha256)


def cached_result(name: str, key: dict, compute, *, model=None, text_sha256: Optional[str] = None,
                  refresh: bool = False) -> Result:
    """A chapter's own experiment, cached like the figures: `key` names its grids and protocol; the
    model (name + weights checksum) and the text checksum are added when given."""
    full = dict(key)
    if model is not None:
        full.update(model_key(model))
    if text_sha256 is not None:
        full["text"] = text_sha256
    return cached(name, full, compute, refresh=refresh)
