"""Running what the chapters show: the chapters' workspace (`inputs`: model and device from the environment,
loaded once), figure Results and a chapter's own experiments computed once and cached on disk, traces for live
sliders, the claim rows, and the chapters' torch thread count (`ChapterThreads`)."""
from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Optional, Sequence

from attnlab.core import settings, util
from attnlab.core.cache import cached, model_key
from attnlab.core.result import Result
from attnlab.figures import Inputs, cached_figures
from attnlab.workspace import share_models


class ChapterThreads:
    """The chapters' torch thread count, owned by one object (the book's: `CHAPTER_THREADS`; a test makes its
    own): one thread for their small views once `for_views` chose it, the count of `process` (a
    `core.util.ThreadState`) back inside `heavy` computations."""

    def __init__(self, process: util.ThreadState = util.THREADS):
        self.process = process
        self.one = False             # set once `for_views` chose one torch thread (and the user had chosen no count)

    def for_views(self) -> None:
        """torch on one thread for the chapters' own code: their views, sliders and solutions are small tensor
        operations, and on a CPU shared with other jobs two OpenMP threads competing for the same cores run them
        several times slower than one. Left alone when the user chose a count (OMP_NUM_THREADS, or
        torch.set_num_threads before: `util.threads_chosen`). The heavy computations (`figure_results`,
        `cached_result`, `trace`) get torch's default count back, lowered to the free CPUs (`heavy`)."""
        import torch

        if not self.one and not self.process.threads_chosen():
            torch.set_num_threads(1)
            self.one = True

    @contextlib.contextmanager
    def heavy(self):
        """Inside: torch's thread count from before `inputs()` chose one thread (so `util.auto_threads`, which
        the experiments run under, picks min(default, free CPUs) as everywhere else); one thread again after.
        A no-op when the user chose a count or `for_views` did not set one."""
        import torch

        if not self.one or torch.get_num_threads() != 1 or self.process.depth > 0:
            yield
            return
        torch.set_num_threads(self.process.default)
        try:
            yield
        finally:
            torch.set_num_threads(1)


#: the chapters' thread count (`inputs()` sets one thread for the views; `heavy` lends the default back)
CHAPTER_THREADS = ChapterThreads()
heavy = CHAPTER_THREADS.heavy


@lru_cache(maxsize=4)
def inputs(model: Optional[str] = None, device: Optional[str] = None) -> Inputs:
    """The chapters' inputs: model and device from ATTNLAB_MODEL / ATTNLAB_DEVICE (defaults auto, cpu), the
    model loaded now (the fallback warning of "auto" goes to the chapter's admonition, not to the page).
    Also sets torch to one thread for the chapters' small tensor views (`ChapterThreads.for_views`)."""
    import warnings

    CHAPTER_THREADS.for_views()
    share_models()                       # each model loaded once per chapter, whichever workspace asks

    inp = Inputs(model or settings.get("ATTNLAB_MODEL"), device or settings.get("ATTNLAB_DEVICE"))
    with warnings.catch_warnings():      # the chapter's admonition says which model ran, and why
        warnings.filterwarnings("ignore", message="model 'auto': GPT-2 is not available")
        inp.model
    return inp


def figure_results(fig_ids: Sequence[str], inp: Optional[Inputs] = None, *, quick: bool = False,
                   refresh: bool = False) -> dict[str, Result]:
    """{id: Result} for `fig_ids`, from the on-disk cache when present; missing ones are computed together
    (sharing forward passes) and cached (`attnlab.figures.cached_figures`, which `attnlab check` reads too)."""
    inp = inp or inputs()
    with heavy():
        return cached_figures(fig_ids, inp, quick=quick, refresh=refresh)


@lru_cache(maxsize=8)
def trace(length: int, model: Optional[str] = None, device: Optional[str] = None,
          keep: tuple = ("probs", "scores", "v")):
    """A Trace of the first `length` tokens of War and Peace (kept in memory for live sliders)."""
    inp = inputs(model, device)
    ids = inp.model.window(inp.corpus.text, length)
    with heavy():
        return inp.model.capture(ids, keep=keep, text_sha256=inp.corpus.sha256)


def cached_result(name: str, key: dict, compute, *, version: Optional[int] = None, model=None,
                  text_sha256: Optional[str] = None, refresh: bool = False) -> Result:
    """A chapter's own experiment, cached like the figures: `key` names its grids and protocol; the model (name +
    identity: `core.cache.model_key`) and the text checksum are added when given. `version`: the version of the
    numbers `compute` returns, declared in `attnlab.computations` (None: that one; another: ValueError)."""
    full = dict(key)
    if model is not None:
        full.update(model_key(model))
    if text_sha256 is not None:
        full["text"] = text_sha256
    with heavy():
        return cached(name, full, compute, version=version, refresh=refresh)


def result(name: str, key: dict, *, model=None, corpus=None, refresh: bool = False) -> Result:
    """The Result `name` (a computation of `attnlab.computations`) for `key`, on the loaded `model` and `corpus`:
    from the results cache, else computed by the registry's recipe and stored (`attnlab.recompute.result`)."""
    from attnlab.recompute import result as get

    with heavy():
        return get(name, key, model=model, corpus=corpus, refresh=refresh)


@heavy()         # computes Results when the cache lacks them: torch's default thread count
def claims(inp: Optional[Inputs] = None) -> list[dict]:
    """Every claim row of both papers on this build's model (the table `attnlab check` prints), from
    the cached figure Results (computed once for every chapter)."""
    from attnlab.figures import claim_rows

    return claim_rows(inp or inputs(), quick=False, progress=False)
