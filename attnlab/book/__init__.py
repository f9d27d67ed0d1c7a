"""What the chapters call, in one namespace; each part in the submodule of what it serves:

    running         the chapters' workspace (`inputs`), figure Results and a chapter's own experiments computed once
                    and cached on disk (`figure_results`, `result`), traces, claim rows, thread count
    markup          the page: `table`, `prose`, `answer`, `tex`, `png`, `rendered`, `registry_table`, `plain_log`
    models          the model admonition, every offline model's verdicts side by side, Fig. 1 past the context
    across_windows  claims over the book's text windows: spreads, robustness, pooled critical N, markup windows
    checks          exercises answered on the page: `check_number`, `check_choice` (hint, verdict, no kernel)
    chapters        the chapter map and the verdict summary (`CHAPTER_CLAIMS`)
    outline         the course outline: each chapter's time, read from its Time line, and the sum

    from attnlab import book
    inputs = book.inputs()                       # ATTNLAB_MODEL / ATTNLAB_DEVICE, War and Peace
    res = book.figure_results(["fig2a", "fig2b"], inputs)   # {id: Result}, from the cache when present
    res = book.result("diagnose", {"device": "cpu", "params": "default"}, model=inputs.model, corpus=inputs.corpus)
                                                # by name: a computation of attnlab.computations and its recipe

Every cached Result goes through `attnlab.core.cache` (one key recipe: the computation's declared version,
the model's identity, text checksum, grids and protocol, the libraries' versions). Library code (the views)
imports the submodule it needs: `from attnlab.book import markup`.
"""
from attnlab.book.across_windows import (  # noqa: F401 (the chapters' names)
    fragile_claims,
    markup_table,
    pooled_critical,
    reading_over_windows,
    robustness_table,
    window_changes_summary,
    window_markup,
    window_spread,
    window_strip,
    window_summaries,
    windows_described,
)
from attnlab.book.chapters import (  # noqa: F401
    CHAPTER_CLAIMS,
    CHAPTER_NOTES,
    NO_MODEL,
    chapter_map,
    default_rows,
    default_verdicts,
    row_model,
    verdict_summary,
)
from attnlab.book.checks import choice as check_choice  # noqa: F401
from attnlab.book.checks import number as check_number  # noqa: F401
from attnlab.book.markup import (  # noqa: F401
    NOTATION,
    TABLE_TAGS,
    answer,
    head_mean,
    plain_log,
    png,
    prose,
    registry_table,
    rendered,
    seconds,
    table,
    tex,
    volatile,
)
from attnlab.book.models import (  # noqa: F401
    OFFLINE_MODELS,
    beyond_context,
    beyond_context_prose,
    claims_per_model,
    is_paper_model,
    missing_models,
    long_context,
    model_admonition,
    model_changes,
    model_changes_summary,
    model_facts,
    model_label,
    per_model_table,
)
from attnlab.book.outline import course_outline  # noqa: F401
from attnlab.book.running import (  # noqa: F401
    CHAPTER_THREADS,
    ChapterThreads,
    cached_result,
    claims,
    figure_results,
    heavy,
    inputs,
    result,
    trace,
)
from attnlab.core.style import use_figure_style
from attnlab.figures import Inputs, cached_figures  # noqa: F401 (book.Inputs, book.cached_figures)

use_figure_style()          # every chapter's figures: text >= 9 pt at the size the page shows them
