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


# ------------------------------------------------------------------------- helpers every chapter uses

def table(header: Sequence[str], rows: Sequence[Sequence], caption: str = ""):
    """A small HTML table (a view: the numbers come from Results and attnlab functions)."""
    from IPython.display import HTML

    cell = 'style="padding:3px 10px; vertical-align:top; text-align:left; border-bottom:1px solid #ddd"'
    head = "".join(f"<th {cell}>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td {cell}>{c}</td>" for c in r) + "</tr>" for r in rows)
    cap = f"<caption>{caption}</caption>" if caption else ""
    return HTML(f'<table style="border-collapse:collapse">{cap}<thead><tr>{head}</tr></thead>'
                f"<tbody>{body}</tbody></table>")


def png(fig, dpi: int = 72, colors: int = 64) -> bytes:
    """The figure as a light PNG (a `colors`-colour palette): frames are embedded in the page and the
    notebook, and this makes them about four times lighter with no visible change."""
    import io

    from PIL import Image

    from attnlab.widgets import fig_to_png

    out = io.BytesIO()
    Image.open(io.BytesIO(fig_to_png(fig, dpi))).convert("RGB").quantize(
        colors=colors, method=Image.Quantize.MEDIANCUT).save(out, "PNG", optimize=True)
    return out.getvalue()


def plain_log(*axes, nice: bool = False) -> None:
    """Log axes with plain tick labels and no minor-tick labels (mathtext labels make every redraw
    slow); `nice`: 1-2-5 major ticks, for short ranges."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                if nice:
                    axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                axis.set_minor_formatter(NullFormatter())


def head_mean(result: Result, key: str, **where) -> float:
    """Mean over heads (rows matching `where`) of the per-head value `key`, NaN rows ignored."""
    import warnings

    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # no finite value: NaN, said by the NaN itself
        return float(np.nanmean(result.column(key, **where)))


def model_admonition(model, result: Result):
    """Which model and text produced the results below, and what that changes (an admonition box).
    The one place a chapter names its model."""
    from IPython.display import HTML

    p = result.provenance
    text = (f"{p.get('text', 'text')} (sha256 {str(p.get('text_sha256'))[:12]}…), "
            f"first {p.get('window_tokens')} tokens")
    arch = (f"{'causal' if model.causal else 'bidirectional'}, {model.n_layers} layers × {model.n_heads} heads "
            f"= {model.n_layers * model.n_heads} heads, head dimension {model.d_head}, "
            f"{model.max_positions} positions")
    if model.causal and (model.n_layers, model.n_heads, model.d_head) == (12, 12, 64):
        title, kind = f"Computed with {model.name}: the paper's model", "note"
        body = (f"<p>The results below come from <code>{model.name}</code> ({arch}) on {text}. This is the "
                "architecture the paper used (GPT-2 124M), so its empirical statements can be compared directly; "
                "what still differs is listed in the section <em>What differs</em>.</p>")
    else:
        title, kind = f"Computed with {model.name}, not with GPT-2", "warning"
        body = (f"<p>GPT-2 was not available when this page was built, so the results below come from "
                f"<code>{model.name}</code> ({arch}) on {text}. The paper used GPT-2 124M (causal, 12 × 12 = 144 "
                "heads, head dimension 64, 1024 positions).</p><p>What this changes: the longest window is "
                f"{min(model.max_positions, 1024)} tokens instead of 1024; "
                + ("every query row sees all the keys (no causal mask), so there are no short rows at the start "
                   "of the window; " if not model.causal else "")
                + "the heads are those of another model, trained for another task. The theorems must hold on any "
                "model; the paper's numbers about GPT-2 need not carry over.</p>")
    return HTML(f'<div class="admonition {kind}"><p class="admonition-title">{title}</p>{body}</div>')
