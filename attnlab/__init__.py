"""attnlab: diagnostics and reproductions of the limits of softmax attention.

Data flow: text -> token ids -> AttnModel.capture(ids) -> Trace -> metrics/bounds -> Result -> views.
"""
__version__ = "0.1.0"

from attnlab.result import Result, provenance  # noqa: E402,F401


def __getattr__(name):  # lazy: importing attnlab must not import transformers
    if name in ("load_model", "AttnModel"):
        from attnlab import models
        return getattr(models, name)
    if name == "Trace":
        from attnlab.capture import Trace
        return Trace
    raise AttributeError(name)
