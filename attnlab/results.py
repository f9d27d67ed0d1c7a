"""Results by name, and what `attnlab results compute` and `make book` fill.

`result(name, key, model=..., corpus=...)` (kept beside the recipes, `attnlab.recompute`, so that the book's helpers
reach it without this module): the name is a computation of `attnlab.computations` (its version comes from there);
the key names its parameters; the model and the text the caller has loaded complete the key (the model's name and
identity, the text's checksum: `core.cache.model_key`) and are handed to the computation's recipe, the same function
`attnlab results verify` computes a stored Result again with. So a chapter says what it wants, never how it is
computed, and what a chapter stores can always be verified.

`plan` and `fill` are `attnlab results compute`'s tasks (a model on one window) and their work, shared by the serial
path and the Dask cluster (`attnlab.cluster`); `book_plan` the tasks of the Results the book's chapters read.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from types import SimpleNamespace
from typing import Optional, Sequence

from attnlab.core.result import Result
from attnlab.recompute import full_key, result  # noqa: F401 (results.result: a Result by name)

# ------------------------------------------------------------------ what `attnlab results compute` fills

# the chapters' Results that need only a model and the book's window: (name, key without the model and text), and
# chapter 7's comparison (`views.normalizers.comparison`)
BOOK_WINDOW_RESULTS = (("diagnose", {"params": "default"}),)              # chapter 8, cell 8b431e04


#: the window length of the book's window's figures (the paper's L; `Workspace.window_length` when max_length is None)
PAPER_LENGTH = 1024


@dataclass(frozen=True)
class Task:
    """One unit of `attnlab results compute`: the Results of `model` on one window (`window`: (corpus, start) of
    `windows.text_windows`; None: the book's window), computed together so that they share forward passes. `length`:
    the L the window's figures go to (`windows.BOOK_MAX_LENGTH` unless --lengths says; None: the book's window, at
    the paper's `PAPER_LENGTH`; a chapter task: the longest L its parts reach, what a worker's memory is sized by)."""

    model: str
    window: Optional[tuple[str, int]]
    label: str                  # "the book's window" or the window's label ("W&P #2", "W&P #2, L = 8192")
    device: str = "cpu"
    quick: bool = False
    length: Optional[int] = None
    perplexity: tuple[str, ...] = ("war_and_peace", "wikitext2")     # the book's window: a causal model's on these
    chapters: tuple[str, ...] = ()     # instead of figures: the chapters' own Results of these `CHAPTER_PARTS`


def plan(models: Sequence[str], windows: Optional[int] = None, device: str = "cpu", quick: bool = False,
         lengths: Optional[Sequence[int]] = None) -> list[Task]:
    """The tasks of `results compute`, one model's after another: the book's window (windows None) or K windows of
    each corpus, each at every L of `lengths` (default: `windows.BOOK_MAX_LENGTH`). ValueError (one line, before
    anything is loaded) for a model name `load_model` would refuse, K < 1, an L below the figures' shortest window
    (`core.checks.check_max_length`) or above a known model's longest (the model table's `max_positions`), or
    lengths without windows."""
    from attnlab import windows as W
    from attnlab.core import model_table
    from attnlab.core.checks import check_max_length
    from attnlab.core.models import check_model_name

    models = [m.strip() for m in models if m.strip()]
    if not models:
        raise ValueError("no model to compute: name one or more (--models A,B)")
    for m in models:
        check_model_name(m)
    if windows is None:
        if lengths:
            raise ValueError("--lengths goes with --windows K: the book's window is at the paper's L = "
                             f"{PAPER_LENGTH}")
        return [Task(m, None, "the book's window", device, quick) for m in models]
    if windows < 1:
        raise ValueError(f"--windows must be at least 1, got {windows}")
    lengths = [check_max_length(L, "figures", "--lengths") for L in (lengths or [W.BOOK_MAX_LENGTH])]
    for m in models:
        entry = model_table.entry(m)
        if entry is not None and entry.max_positions and max(lengths) > entry.max_positions:
            raise ValueError(f"--lengths {max(lengths)} exceeds {m}'s {entry.max_positions} positions")
    ws = W.text_windows(windows)
    return [Task(m, (w.corpus, w.start), w.label if L == W.BOOK_MAX_LENGTH else f"{w.label}, L = {L}", device, quick,
                 L) for m in models for L in dict.fromkeys(lengths) for w in ws]


# A local worker's memory, estimated before anything is loaded (reconstructed from this machine's measured peaks,
# not derived): the Python, torch and transformers runtime, the model's float32 weights, and the attention tensors of
# the task's dearest capture: scores and probabilities, [layers x heads, L, L] float32 each, held whole by the
# pooled figures (fig2c, fig4: every head, up to `streaming.POOLED_LIMIT`; longer windows they refuse), and above
# that one streamed block (`streaming.CAPTURE_BUDGET`) and its working copies (1.5 blocks), times a margin.
# tests/test_cluster_plan.py checks it against the measured peaks (`core.costs`; e.g. SmolLM2 at L = 8,192: 6.52 GB).
RUNTIME_BYTES = 3 << 29                 # 1.5 GiB: a worker that imported torch and transformers, before any model
MEMORY_MARGIN = 1.25
DEFAULT_WORKER_BYTES = 6 << 30          # a model outside the model table (a folder, a hub id): its size is unknown
# a model with sliding-window layers (two layer kinds) holds each kind's cut of the whole-window tensors beside them
# (`Trace` cut per kind, each with its visible-key mask): Gemma 3's six figures at L = 1,024 peaked at 5.35 GB where one
# copy predicts 4.1 GB (`core.costs`); three copies cover it. Streamed (L = 8,192: 7.06 GB), one block's estimate does.
KINDS_COPIES = 3
# the readings (`figures.READING_FIGURES`, which the book's window and the chapters' "build" part compute) hold, beside
# the window's attention tensors, their scans' float64 [layers x heads, l, l] arrays at their longest length l =
# `readings.MAX_LENGTH` (512): the running x_i.s of the top order and of each random order, the x_i.o and x_i.m
# products, the Gram matrices (`critical_n.RunningTopN`). Reconstructed from measured peaks, not derived: SmolLM2's
# book window (six figures, readings, perplexity, diagnose, comparison) peaked at 10.74 GB and its thm1_readings alone
# at 8.81 GB where the figures' estimate says 5.5 GB (`core.costs`); eight such arrays cover them.
READINGS_ARRAYS = 8


def worker_memory(model: str, length: int, readings: bool = False) -> int:
    """Bytes a one-thread worker computing `model`'s Results at window length `length` may need (the estimate above),
    with the readings where `readings`; `DEFAULT_WORKER_BYTES` for a model the table does not size."""
    from attnlab.core import model_table
    from attnlab.normalization.readings import MAX_LENGTH as READINGS_LENGTH
    from attnlab.normalization.streaming import CAPTURE_BUDGET, POOLED_LIMIT

    entry = model_table.entry(model)
    if entry is None or not entry.n_params:
        return DEFAULT_WORKER_BYTES
    L = min(length, entry.max_positions)
    heads = entry.n_layers * entry.n_heads
    attention = 2 * heads * L * L * 4
    copies = KINDS_COPIES if entry.sliding_window else 1
    held = attention * copies if attention <= POOLED_LIMIT else 1.5 * CAPTURE_BUDGET
    if readings:
        window, longest = min(PAPER_LENGTH, entry.max_positions), min(READINGS_LENGTH, entry.max_positions)
        held = max(held, 2 * heads * window * window * 4 + READINGS_ARRAYS * heads * longest * longest * 8)
    return int(MEMORY_MARGIN * (RUNTIME_BYTES + 4 * entry.n_params + held))


def computes_readings(task: Task) -> bool:
    """Whether `task` may compute the readings (`figures.READING_FIGURES`): the book's window (not quick), and the
    chapters' own Results of the build's model (their "build" part reads thm1_readings, computes `reading_windows`)."""
    return task.window is None and not task.quick and (not task.chapters or "build" in task.chapters)


def memory_bytes() -> int:
    """This machine's physical memory (8 GiB where the system does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def local_workers(tasks: Sequence[Task]) -> int:
    """How many one-thread workers this machine holds for `tasks`: its cores, and its memory at `plan_memory` each."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, memory_bytes() // plan_memory(tasks)))


def plan_memory(tasks: Sequence[Task]) -> int:
    """The largest `worker_memory` over `tasks` (a worker may meet any of them)."""
    return max((worker_memory(t.model, t.length or PAPER_LENGTH, computes_readings(t)) for t in tasks),
               default=DEFAULT_WORKER_BYTES)


def fill(task: Task, loaded: Optional[dict] = None) -> dict:
    """Compute and store the Results of `task` the results store lacks; {"model", "label", "stored", "computed"}.
    `loaded`: {(model, device): AttnModel} of models loaded before in this process (a worker's workspace, filled
    here), so a model is loaded once per process."""
    from attnlab.figures import READING_FIGURES, Inputs, figure_ids
    from attnlab.windows import BOOK_MAX_LENGTH

    loaded = {} if loaded is None else loaded
    window = {} if task.window is None else {"text": task.window[0], "start": task.window[1],
                                             "max_length": task.length or BOOK_MAX_LENGTH}
    have = loaded.get((task.model, task.device))
    inp = Inputs(task.model, task.device, **window) if have is None else Inputs.around(have, task.device, **window)
    loaded[(task.model, task.device)] = inp.model
    if task.chapters:
        res = _chapter_results(inp, task.chapters)
    elif task.window is None:
        res = _book_window(inp, task)
    else:
        res = _figures([i for i in figure_ids("normalization") if i not in READING_FIGURES], inp, task.quick)
    fresh = sum(not r.provenance.get("loaded_from_cache") for r in res)
    return {"model": task.model, "label": task.label, "stored": len(res) - fresh, "computed": fresh}


# ------------------------------------------------------------------ what `make book` fills before the chapters run

#: what the chapters read that `book_plan` leaves to them: {name: why}. tests/test_cluster_plan.py compares
#: `book_plan` with the Results a build read (its record, scripts/attnlab_book.py), so a chapter that starts reading
#: a new kind of Result fails there. Each is cheap (`_jobs` runs the chapters two at a time after a fill).
BOOK_NOT_PLANNED = {
    "head_separability": "chapters 4 and 6: 0.1 s each from the stored fig1 and fig3 (`views.separability`)",
    "tsc_real": "chapter 10's solutions 10.1 and 10.3: the planned run on other layers or offset, 1-3 s each",
}


#: the parts of the chapters' own Results (`_chapter_results`, `describe_chapters`): "build" the build's model's
#: (chapters 3 and 7) and chapter 9's synthetic ones, "in_book" each in-book model's (chapters 3, 5-7),
#: "long_context" chapter 1's long window (`book.models.LONG_CONTEXT`), "layer_kinds" Gemma 3's layer kinds and its
#: critical N by kind (chapters 1, 3, 6, 7; planned where it is installed, else those chapters say in one line which
#: rows are missing)
CHAPTER_PARTS = ("build", "in_book", "long_context", "layer_kinds")


#: the perplexity the chapters show (`book.models.model_admonition`: WikiText-2's)
BOOK_PERPLEXITY = ("wikitext2",)


def book_plan(model: Optional[str] = None, device: Optional[str] = None) -> list[Task]:
    """The tasks that fill what the book's chapters read, before they run (`make book`: scripts/attnlab_book.py):
    the build's model (ATTNLAB_MODEL) on the book's window (every figure, perplexity, `BOOK_WINDOW_RESULTS`), then
    each of the model table's in-book models on the book's window set (`windows.BOOK_WINDOWS` windows of each corpus,
    L <= `windows.BOOK_MAX_LENGTH`), then the chapters' own Results of each model (`CHAPTER_PARTS`). An in-book
    model not installed here (`model_table.missing_from_book`) is left out. The chapters compute the rest, cheap
    (`BOOK_NOT_PLANNED`)."""
    from attnlab.core import model_table, settings
    from attnlab.windows import BOOK_WINDOWS

    model = model or settings.get("ATTNLAB_MODEL")
    device = device or settings.get("ATTNLAB_DEVICE")
    own = [replace(t, perplexity=BOOK_PERPLEXITY) for t in plan([model], None, device)]
    in_book = list(model_table.book_models())
    return (own + plan(in_book, BOOK_WINDOWS, device) + _claims_windows(model, in_book, device)
            + _chapter_tasks(model, in_book, device))


def _claims_windows(model: str, in_book: Sequence[str], device: str) -> list[Task]:
    """The figures each other in-book model's claims read (`book.claims_per_model`: the book's window, at the paper's
    L where its positions allow) when that window is not one of `windows.BOOK_WINDOWS`' (L = 512): a task each."""
    from attnlab.core import model_table
    from attnlab.windows import BOOK_MAX_LENGTH

    out = []
    for m in in_book:
        entry = model_table.entry(m)
        L = min(entry.max_positions or PAPER_LENGTH, PAPER_LENGTH)
        if m != model and L > BOOK_MAX_LENGTH:
            out.append(Task(m, ("war_and_peace", 0), f"the book's window, L = {L}", device, length=L))
    return out


def _chapter_tasks(model: str, in_book: Sequence[str], device: str) -> list[Task]:
    """One task per model for the chapters' own Results (`CHAPTER_PARTS`), after the figures they read."""
    from attnlab.book.models import LONG_CONTEXT
    from attnlab.core import model_table
    from attnlab.views.layer_kinds import LENGTHS as KINDS_LENGTHS
    from attnlab.views.layer_kinds import MODEL as KINDS_MODEL

    parts: dict[str, list[str]] = {model: ["build"]}
    for m in in_book:
        parts.setdefault(m, []).append("in_book")
    if LONG_CONTEXT[0] in in_book:
        parts[LONG_CONTEXT[0]].append("long_context")
    if model_table.installed(KINDS_MODEL):
        parts.setdefault(KINDS_MODEL, []).append("layer_kinds")
    longest = {"long_context": LONG_CONTEXT[1], "layer_kinds": max(KINDS_LENGTHS)}
    return [Task(m, None, "the chapters' Results", device, length=max([longest.get(x, 0) for x in p]) or None,
                 chapters=tuple(p)) for m, p in parts.items()]


def describe_planned(tasks: Sequence[Task], auto: str) -> set[tuple]:
    """(name, model, text, start, L, params) of each Result `tasks` fill, without loading anything (`describe_key`'s
    shape; "auto" read as the model `auto` names)."""
    from attnlab.core import model_table
    from attnlab.figures import FIGURES, READING_FIGURES, figure_ids
    from attnlab.sample_complexity import real_tokens

    out = set()
    for t in tasks:
        model = auto if t.model == "auto" else t.model
        entry = model_table.entry(model)
        if t.chapters:
            out |= describe_chapters(model, t.chapters)
            continue
        text, start = t.window or ("war_and_peace", 0)
        if t.window is None:
            ids = figure_ids()
            causal = entry is None or entry.causal
        else:
            ids = [i for i in figure_ids("normalization") if i not in READING_FIGURES]
            causal = False
        for i in ids:
            needs = FIGURES[i].needs
            if needs == "model+text":
                L = min(entry.max_positions if entry else PAPER_LENGTH, t.length or PAPER_LENGTH)
                out.add((i, model, text, start, L, None))
            elif needs == "none":
                out.add((i, None, text, start, t.length, None))
            else:        # "encoder": the model when bidirectional, else MiniLM (`Workspace.encoder`); its key
                encoder = model if entry is not None and not entry.causal else "minilm"
                size = SimpleNamespace(max_positions=model_table.entry(encoder).max_positions)
                p = real_tokens.real_params(size, t.quick)
                out.add((i, encoder, p["corpus"], p["offset"], p["L"], "real_encoder"))
        if t.window is None and causal and not t.quick:
            out |= {("perplexity", model, c, None, None, None) for c in t.perplexity}
            out |= {(name, model, None, None, None, key.get("params")) for name, key in BOOK_WINDOW_RESULTS}
            out.add(("compare_normalizers", model, None, None, None, "default"))
    return out


def describe_chapters(model: str, parts: Sequence[str]) -> set[tuple]:
    """What `_chapter_results` fills for `model` (`describe_key`'s shape), without loading anything."""
    from attnlab.book.models import LONG_CONTEXT
    from attnlab.core import model_table
    from attnlab.views import tokens as views
    from attnlab.windows import BOOK_MAX_LENGTH

    entry = model_table.entry(model)
    L = min(entry.max_positions if entry else PAPER_LENGTH, PAPER_LENGTH)
    out = set()
    if "build" in parts:
        out |= {("fig2c_ratio", model, "war_and_peace", 0, L, None), ("reading_windows", model, None, None, None, None),
                ("compare_normalizers", model, None, None, None, "default"),
                ("compare_normalizers", model, None, None, None, "peers"),
                ("compare_normalizers_each", model, None, None, None, None),
                ("bench_normalizers", model, None, None, None, None), ("sink_shares", model, None, None, None, None),
                ("tsc_authors_sphere_reference", None, None, None, None, None)}
        out |= {(views.EXPERIMENTS[e][0], None, None, None, None, e) for e, _ in views.CHAPTER_RUNS}
    if "in_book" in parts:
        out |= {("pooled_ks", model, None, None, BOOK_MAX_LENGTH, None),
                ("fig4_without_repeats", model, None, None, BOOK_MAX_LENGTH, None),
                ("sink_shares", model, None, None, None, None), ("sink_claims", model, None, None, None, None)}
    if "long_context" in parts:
        out.add(("fig1", model, "war_and_peace", 0, LONG_CONTEXT[1], None))
    if "layer_kinds" in parts:
        out |= {("layer_kinds", model, None, None, None, None), ("critical_by_kind", model, None, None, None, None)}
    return out


def describe_key(name: str, key: dict) -> tuple:
    """(name, model, text, start, L, params) of a stored Result's key (`core.cache.KEY_FILE`): what
    `describe_planned` says of the Result a task fills."""
    params = key.get("params")
    if name == "perplexity":
        return (name, key.get("model"), _corpus_names().get(key.get("text")), None, None, None)
    if isinstance(params, dict) and "experiment" in key:
        text, start, L = params.get("corpus"), params.get("offset"), params.get("L")
        return (name, key.get("model"), text, start, L, key["experiment"])
    return (name, key.get("model"), key.get("text_name"), key.get("text_start"), key.get("max_length"),
            params if isinstance(params, str) else None)


@lru_cache(maxsize=1)
def _corpus_names() -> dict:
    """{text checksum: corpus name} of the two corpora (what a perplexity's key names its text by)."""
    from attnlab.core.text import load_corpus

    return {load_corpus(c).sha256: c for c in ("war_and_peace", "wikitext2")}


def _figures(ids, inp, quick: bool) -> list[Result]:
    from attnlab.figures import cached_figures

    return list(cached_figures(ids, inp, quick=quick).values())


def _book_window(inp, task: Task) -> list[Result]:
    """Every figure of `inp`'s model on the book's window, then (not with quick) for a causal model its perplexity on
    the task's corpora, `BOOK_WINDOW_RESULTS` and chapter 7's comparison."""
    from attnlab.figures import figure_ids

    out = _figures(figure_ids(), inp, task.quick)
    if task.quick:
        return out
    from attnlab.core.perplexity import cached_perplexity
    from attnlab.core.text import load_corpus

    model = inp.model
    out += [cached_perplexity(model, load_corpus(c)) for c in task.perplexity if model.causal]
    if model.causal:
        out += [result(name, dict(key, device=inp.device), model=model, corpus=inp.corpus)
                for name, key in BOOK_WINDOW_RESULTS]
        from attnlab.views.normalizers import comparison

        out.append(comparison(inp))
    return out


def _chapter_results(inp, parts: Sequence[str]) -> list[Result]:
    """The chapters' own Results of `inp`'s model (book's window) for `parts` (`CHAPTER_PARTS`), each computed by the
    function its chapter calls, so with the same key."""
    from attnlab import windows
    from attnlab.book.models import long_context
    from attnlab.figures import cached_figures
    from attnlab.views import layer_kinds, normalizers, sinks, six_percent, tokens

    out: list[Result] = []
    if "build" in parts:                                         # chapters 3 and 7, on the build's model
        out.append(six_percent.ratio_curve(inp))
        rr = cached_figures(["thm1_readings"], inp)["thm1_readings"]
        out += [windows.reading_result(inp.model, windows.book_windows(), h, device=inp.device)
                for h in six_percent.readings_over_windows(rr)]
        res = normalizers.comparison(inp)
        out += [res, normalizers.each_layer(inp, res), normalizers.peers(inp, res), normalizers.bench(inp),
                *sinks.swapped_shares(inp).values()]
        out += tokens.chapter_results(inp.device)                # chapter 9: no model
    if "in_book" in parts:                                       # chapters 3, 5-7, on each in-book model
        out.append(windows.pooled_result(inp.model, windows.book_windows(), device=inp.device))
        # fig4_without_repeats of each window that starts on repeated tokens (not counted in the task's line)
        windows.markup_over_windows(inp.model.name, windows.book_windows(), device=inp.device)
        out += [sinks.shares(inp), sinks.claims(inp)]
    if "long_context" in parts:                                  # chapter 1
        out += list(long_context(inp.model.name, device=inp.device).values())
    if "layer_kinds" in parts:                                   # chapters 1, 3, 6 and 7
        out += [layer_kinds.kinds(inp), layer_kinds.critical(inp)]
    return out
