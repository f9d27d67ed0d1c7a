"""A small on-disk cache of Results, so chapters and the CLI do not recompute a figure they already have.

The key is a dict naming everything the result depends on (experiment, model + weights checksum, text
checksum, grids, protocol switches, attnlab version); the file name carries its hash.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import attnlab
from attnlab.result import Result, _plain
from attnlab.text import cache_dir


def results_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_RESULTS_DIR", cache_dir() / "results")).expanduser()


def key_hash(key: dict) -> str:
    text = json.dumps(_plain({**key, "attnlab": attnlab.__version__}), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached(name: str, key: dict, compute: Callable[[], Result], *, refresh: bool = False) -> Result:
    """Load the Result stored under (name, key), or compute, store and return it."""
    folder = results_dir() / f"{name}-{key_hash(key)}"
    if not refresh and (folder / f"{name}.json").is_file():
        result = Result.load(folder, name)
        result.provenance = dict(result.provenance, loaded_from_cache=True)
        return result
    result = compute()
    result.save(folder)
    return result
