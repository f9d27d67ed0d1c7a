"""One function to get a Result by name and inputs: `result(name, key, model=..., corpus=...)`.

The name is a computation of `attnlab.computations` (its version comes from there); the key names its parameters;
the model and the text the caller has loaded complete the key (the model's name and identity, the text's
checksum: `core.cache.model_key`) and are handed to the computation's recipe (`attnlab.recompute`), the same
function `attnlab results verify` computes a stored Result again with. So a chapter says what it wants, never how
it is computed, and what a chapter stores can always be verified.

`plan` and `fill` are `attnlab results compute`'s tasks (a model on one window) and their work, shared by the serial
path and the Dask cluster (`attnlab.cluster`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from attnlab.core.result import Result


def full_key(key: dict, model=None, corpus=None) -> dict:
    """`key` with the model's name and identity and the text's checksum added (the parts they name)."""
    from attnlab.core.cache import model_key

    out = dict(key)
    if model is not None:
        out.update(model_key(model))
    if corpus is not None:
        out["text"] = corpus.sha256
    return out


def result(name: str, key: dict, *, model=None, corpus=None, refresh: bool = False,
           text_sha256: Optional[str] = None) -> Result:
    """The Result `name` for `key` (+ `model`, `corpus`) from the results cache, else computed by its recipe and
    stored. ValueError when `name` has no recipe in the registry (`attnlab results list` says which do) or the
    recipe does not know the key (a "params" it has no recipe for). `text_sha256`: the text's checksum when no
    corpus object is at hand."""
    from attnlab import recompute
    from attnlab.computations import COMPUTATIONS
    from attnlab.core.cache import cached

    c = COMPUTATIONS.get(name)
    if c is None or not c.recompute:
        known = ", ".join(n for n, x in COMPUTATIONS.items() if x.recompute)
        raise ValueError(f"{name!r} has no recipe in attnlab/computations.py; these do: {known}")
    full = full_key(key, model, corpus)
    if text_sha256 is not None:
        full["text"] = text_sha256

    def compute() -> Result:
        out = recompute.recompute(name, full, model, corpus)
        if out is None:
            raise ValueError(f"{name}: its recipe ({c.recompute}) does not know the key {key}")
        return out

    return cached(name, full, compute, refresh=refresh)


# ------------------------------------------------------------------ what `attnlab results compute` fills

# the chapters' Results that need only a model and the book's window: (name, key without the model and text)
BOOK_WINDOW_RESULTS = (("compare_normalizers", {"params": "default"}),     # chapter 7, cell baa9369c
                       ("diagnose", {"params": "default"}))                # chapter 8, cell 8b431e04


@dataclass(frozen=True)
class Task:
    """One unit of `attnlab results compute`: the Results of `model` on one window (`window`: (corpus, start) of
    `windows.text_windows`; None: the book's window), computed together so that they share forward passes."""

    model: str
    window: Optional[tuple[str, int]]
    label: str                  # "the book's window" or the window's label ("W&P #2")
    device: str = "cpu"
    quick: bool = False


def plan(models: Sequence[str], windows: Optional[int] = None, device: str = "cpu", quick: bool = False) -> list[Task]:
    """The tasks of `results compute`, one model's after another: the book's window (windows None) or K windows of
    each corpus. ValueError (before anything is loaded) for a model name `load_model` would refuse, or K < 1."""
    from attnlab import windows as W
    from attnlab.core.models import check_model_name

    models = [m.strip() for m in models if m.strip()]
    if not models:
        raise ValueError("no model to compute: name one or more (--models A,B)")
    for m in models:
        check_model_name(m)
    if windows is None:
        return [Task(m, None, "the book's window", device, quick) for m in models]
    if windows < 1:
        raise ValueError(f"--windows must be at least 1, got {windows}")
    ws = W.text_windows(windows)
    return [Task(m, (w.corpus, w.start), w.label, device, quick) for m in models for w in ws]


def fill(task: Task, loaded: Optional[dict] = None) -> dict:
    """Compute and store the Results of `task` the results store lacks; {"model", "label", "stored", "computed"}.
    `loaded`: {(model, device): AttnModel} of models loaded before in this process (a worker's workspace, filled
    here), so a model is loaded once per process."""
    from attnlab.figures import READING_FIGURES, Inputs, figure_ids
    from attnlab.windows import BOOK_MAX_LENGTH

    loaded = {} if loaded is None else loaded
    window = {} if task.window is None else {"text": task.window[0], "start": task.window[1],
                                             "max_length": BOOK_MAX_LENGTH}
    have = loaded.get((task.model, task.device))
    inp = Inputs(task.model, task.device, **window) if have is None else Inputs.around(have, task.device, **window)
    loaded[(task.model, task.device)] = inp.model
    if task.window is None:
        res = _book_window(inp, task.quick)
    else:
        res = _figures([i for i in figure_ids("normalization") if i not in READING_FIGURES], inp, task.quick)
    fresh = sum(not r.provenance.get("loaded_from_cache") for r in res)
    return {"model": task.model, "label": task.label, "stored": len(res) - fresh, "computed": fresh}


def _figures(ids, inp, quick: bool) -> list[Result]:
    from attnlab.figures import cached_figures

    return list(cached_figures(ids, inp, quick=quick).values())


def _book_window(inp, quick: bool) -> list[Result]:
    """Every figure of `inp`'s model on the book's window, then (not with quick) for a causal model its perplexity on
    both corpora and `BOOK_WINDOW_RESULTS`."""
    from attnlab.figures import figure_ids

    out = _figures(figure_ids(), inp, quick)
    if quick:
        return out
    from attnlab.core.perplexity import cached_perplexity
    from attnlab.core.text import load_corpus

    model = inp.model
    out += [cached_perplexity(model, load_corpus(c)) for c in ("war_and_peace", "wikitext2") if model.causal]
    if model.causal:
        out += [result(name, dict(key, device=inp.device), model=model, corpus=inp.corpus)
                for name, key in BOOK_WINDOW_RESULTS]
    return out
