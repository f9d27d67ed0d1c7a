"""A small on-disk cache of Results, so chapters and the CLI do not recompute a figure they already have.

One key recipe for every cached Result: the caller's key (experiment, model + weights checksum, text
checksum, grids, protocol switches; `model_key` and `text_key` build the usual parts) plus, always,
the attnlab version and the sha256 of source files of the package: by default every file (subpackages
included), so that any code change recomputes; a key with "code": (module, ...) covers only those
modules and every package module they import, directly or not (`module_files`: the figures of the
registry use it, so an edit to a plot, the book or the CLI reuses their Results). The folder name
carries the key's hash.
"""
from __future__ import annotations

import ast
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


def _module_path(name: str) -> Path | None:
    """The file of package module `name` ("attnlab.core.models"), or None (not a module of the package)."""
    base = PACKAGE_DIR.parent.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _imported(path: Path, name: str) -> set[str]:
    """Module names of the package that the file imports anywhere (functions included), as written:
    "from attnlab.x import y" gives attnlab.x and attnlab.x.y (y may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                       # relative: from . import x, from ..core import y
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m.split(".")[0] == PACKAGE_DIR.name}


@lru_cache(maxsize=64)
def module_files(roots: tuple[str, ...]) -> tuple[Path, ...]:
    """The package files that modules `roots` run when imported: theirs, every package module they import
    (a static reading of every import statement, those inside functions too), transitively, and the
    parent packages' __init__ files. Sorted."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = None if name in seen else _module_path(name)
        if path is None:
            continue
        seen[name] = path
        todo += _imported(path, name)
        todo.append(name.rpartition(".")[0])
    return tuple(sorted(set(seen.values())))


@lru_cache(maxsize=64)
def source_hash(roots: tuple[str, ...] | None = None) -> str:
    """sha256 of .py files of the package (path and bytes), 16 hex digits: every file (roots None), or
    those that modules `roots` import (`module_files`)."""
    files = sorted(PACKAGE_DIR.rglob("*.py")) if roots is None else module_files(roots)
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def model_key(model) -> dict:
    """The key parts that name a model: its name and identity (`AttnModel.identity`: weights, the files that
    shape its numbers, its config and tokenizer as loaded)."""
    return {"model": model.name, "identity": model.identity}


def full_key(key: dict) -> dict:
    """The caller's key with the package version and sources added (what the hash is taken of): the
    files of the modules named by key["code"] and their imports, else every file."""
    code = key.get("code")
    return {**key, "attnlab": attnlab.__version__, "sources": source_hash(None if code is None else tuple(code))}


def key_hash(key: dict) -> str:
    text = json.dumps(to_plain(full_key(key)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _folder(name: str, key: dict) -> Path:
    return results_dir() / f"{name}-{key_hash(key)}"


def stored(name: str, key: dict) -> Result | None:
    """The Result stored under (name, key) (provenance `loaded_from_cache`), or None. One that fails
    verification (`Result.load`: missing, truncated, edited files, or stored under another key) is a
    miss: one warning, then None. An unreadable cache folder is a miss as well."""
    from attnlab.core import published

    folder = _folder(name, key)
    fetched = False
    try:
        if not ((folder / f"{name}.json").exists() or (folder / f"{name}.csv").exists()):
            fetched = published.fetch(folder.name, results_dir())
            if not fetched:
                return None
        result = Result.load(folder, name, key=key_hash(key))
    except (CorruptResult, OSError) as exc:
        warnings.warn(f"attnlab cache: {exc}; recomputing", stacklevel=3)
        return None
    published.log_use(folder.name)
    result.provenance = dict(result.provenance, loaded_from_cache=True, fetched_from_site=fetched)
    return result


def store(name: str, key: dict, result: Result) -> Result:
    """Store `result` under (name, key), replacing what was there; returns it. The cache is an
    optimisation: where it cannot be written (a full disk, a read-only or misplaced folder), one warning
    and the Result is returned all the same."""
    from attnlab.core import published

    try:
        result.save(_folder(name, key), key=key_hash(key))
        published.log_use(_folder(name, key).name)
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
