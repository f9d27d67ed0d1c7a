"""attnlab: diagnostics and reproductions of the limits of softmax attention.

Data flow: text -> token ids -> AttnModel.capture(ids) -> Trace -> pure functions -> Result -> views.

    core/               text, models, capture (Trace), result (Result), cache, util
    normalization/      arXiv 2508.17821 (Theorems 1-2, Lemma 2, the 6% rule)
    sample_complexity/  arXiv 2512.10656 (token sample complexity)
    tools/              normalizers, compare, diagnose, report
    figures             the one registry of figures; book, widgets, cli/ on top
"""
import os

from attnlab._version import __version__  # noqa: F401 (re-exported)

# numba caches compiled kernels in attnlab's cache (normalization/kernels/metrics.py), also when `core.util` is the
# first to import numba (it starts numba's thread pool early: `util.start_numba_pool`). OpenMP's wait policy is left to
# the user: on a busy machine `core.util.auto_threads` runs one thread, where the policy does not matter, and on a
# quiet one spinning waits are faster (measured: README, "Threads on a busy machine").
# importing attnlab is light (no torch, numpy or numba until used): `attnlab ...` handles a Ctrl-C from its
# first instant (`cli.main`)
from attnlab.core.text import cache_dir  # noqa: E402

os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir() / "numba"))
del cache_dir


def __getattr__(name):  # lazy: importing attnlab must not import transformers
    if name in ("Result", "provenance"):
        from attnlab.core import result
        return getattr(result, name)
    if name in ("load_model", "AttnModel"):
        from attnlab.core import models
        return getattr(models, name)
    if name == "Trace":
        from attnlab.core.capture import Trace
        return Trace
    raise AttributeError(name)
