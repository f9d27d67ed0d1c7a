"""A small on-disk cache of Results, so chapters and the CLI do not recompute a figure they already have.

One key recipe for every cached Result: the caller's key (experiment, model + weights checksum, text
checksum, grids, protocol switches; `model_key` and `text_key` build the usual parts) plus, always,
the attnlab version and the sha256 of every source file of the package (subpackages included), so
that any code change recomputes. The folder name carries the key's hash.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Callable

import attnlab
from attnlab.core.result import CorruptResult, Result, to_plain
from attnlab.core.text import cache_dir

PACKAGE_DIR = Path(attnlab.__file__).parent


def results_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_RESULTS_DIR", cache_dir() / "results")).expanduser()


@lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 of every .py file of the package, subpackages included (path and bytes), 16 hex digits."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def model_key(model) -> dict:
    """The key parts that name a model: its name and weights checksum."""
    return {"model": model.name, "weights": model.weights_sha256}


def full_key(key: dict) -> dict:
    """The caller's key with the package version and sources added (what the hash is taken of)."""
    return {**key, "attnlab": attnlab.__version__, "sources": source_hash()}


def key_hash(key: dict) -> str:
    text = json.dumps(to_plain(full_key(key)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _folder(name: str, key: dict) -> Path:
    return results_dir() / f"{name}-{key_hash(key)}"


def stored(name: str, key: dict) -> Result | None:
    """The Result stored under (name, key) (provenance `loaded_from_cache`), or None. One that fails
    verification (`Result.load`: missing, truncated, edited files, or stored under another key) is a
    miss: one warning, then None. An unreadable cache folder is a miss as well."""
    folder = _folder(name, key)
    try:
        if not ((folder / f"{name}.json").exists() or (folder / f"{name}.csv").exists()):
            return None
        result = Result.load(folder, name, key=key_hash(key))
    except (CorruptResult, OSError) as exc:
        warnings.warn(f"attnlab cache: {exc}; recomputing", stacklevel=3)
        return None
    result.provenance = dict(result.provenance, loaded_from_cache=True)
    return result


def store(name: str, key: dict, result: Result) -> Result:
    """Store `result` under (name, key), replacing what was there; returns it. The cache is an
    optimisation: where it cannot be written (a full disk, a read-only or misplaced folder), one warning
    and the Result is returned all the same."""
    try:
        result.save(_folder(name, key), key=key_hash(key))
    except OSError as exc:
        where = exc.filename or results_dir()
        warnings.warn(f"attnlab cache: cannot store {name} in {where} ({exc.strerror or exc}); the result is "
                      "not cached", stacklevel=3)
    return result


def cached(name: str, key: dict, compute: Callable[[], Result], *, refresh: bool = False) -> Result:
    """Load the Result stored under (name, key) (`stored`), or compute, store and return it (refresh=True:
    always compute)."""
    result = None if refresh else stored(name, key)
    return result if result is not None else store(name, key, compute())
