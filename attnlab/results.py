"""One function to get a Result by name and inputs: `result(name, key, model=..., corpus=...)`.

The name is a computation of `attnlab.computations` (its version comes from there); the key names its parameters;
the model and the text the caller has loaded complete the key (the model's name and identity, the text's
checksum: `core.cache.model_key`) and are handed to the computation's recipe (`attnlab.recompute`), the same
function `attnlab results verify` computes a stored Result again with. So a chapter says what it wants, never how
it is computed, and what a chapter stores can always be verified.
"""
from __future__ import annotations

from typing import Optional

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
