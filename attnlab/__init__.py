"""attnlab: diagnostics and reproductions of the limits of softmax attention.

Data flow: text -> token ids -> AttnModel.capture(ids) -> Trace -> pure functions -> Result -> views.

    core/               text, models, capture (Trace), result (Result), cache, util
    normalization/      arXiv 2508.17821 (Theorems 1-2, Lemma 2, the 6% rule)
    sample_complexity/  arXiv 2512.10656 (token sample complexity)
    tools/              normalizers, compare, diagnose, report
    figures             the one registry of figures; book, widgets, cli/ on top
"""
__version__ = "0.1.0"

import os

# Process settings for thread pools, before torch or numba is imported:
# - OpenMP threads (torch's, and numba's kernels through its "omp" threading layer) sleep when idle instead of
#   spinning: a spinning thread holds a CPU that another process, or the next parallel region, needs. Beside one
#   busy process on 2 cores, 2 threads ran 5-10x slower than 1 with spinning and about as fast with PASSIVE.
#   libgomp reads it when torch is first imported: it acts when attnlab is imported before torch (the CLI always
#   is). A value already set (OMP_WAIT_POLICY=ACTIVE) wins.
# - numba caches compiled kernels in attnlab's cache (normalization/kernels.py), also when `core.util` is the
#   first to import numba (it starts numba's thread pool early: `util.start_numba_pool`).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from attnlab.core.result import Result, provenance  # noqa: E402,F401
from attnlab.core.text import cache_dir  # noqa: E402

os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir() / "numba"))
del cache_dir


def __getattr__(name):  # lazy: importing attnlab must not import transformers
    if name in ("load_model", "AttnModel"):
        from attnlab.core import models
        return getattr(models, name)
    if name == "Trace":
        from attnlab.core.capture import Trace
        return Trace
    raise AttributeError(name)
