"""attnlab: diagnostics and reproductions of the limits of softmax attention.

Data flow: text -> token ids -> AttnModel.capture(ids) -> Trace -> pure functions -> Result -> views.

    core/               text, models, capture (Trace), result (Result), cache, util
    normalization/      arXiv 2508.17821 (Theorems 1-2, Lemma 2, the 6% rule)
    sample_complexity/  arXiv 2512.10656 (token sample complexity)
    tools/              normalizers, compare, diagnose, report
    figures             the one registry of figures; book, widgets, cli/ on top
"""
__version__ = "0.1.0"

from attnlab.core.result import Result, provenance  # noqa: E402,F401


def __getattr__(name):  # lazy: importing attnlab must not import transformers
    if name in ("load_model", "AttnModel"):
        from attnlab.core import models
        return getattr(models, name)
    if name == "Trace":
        from attnlab.core.capture import Trace
        return Trace
    raise AttributeError(name)
