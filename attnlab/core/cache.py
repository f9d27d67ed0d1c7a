"""A small on-disk cache of Results, so chapters and the CLI do not recompute a figure they already have.

One key recipe for every cached Result (`full_key`): the version its caller declares (`version`: an integer, 1 at
first, bumped by whoever changes the numbers the computation returns; the golden probes of tests/test_golden.py
fail when numbers move without a bump), the caller's inputs (the model's identity, text checksum, grids,
protocol switches; `model_key` builds the model's part) and the versions of the libraries that compute it with
the kernels switch (`environment`). Not the bytes of the package's sources: a comment, a docstring or a refactor
that moves no number reuses every Result. A Result is stored in the folder `<name>-<hash of the key>`, its key
beside it (`KEY_FILE`, read by `verify`).

Every Result computed here is announced on one line, "attnlab: computed NAME (...) in S s" (`announce`).

Two processes never compute the same Result (two chapters' kernels of a book build side by side,
scripts/attnlab_book.py): each looks for a Result holding a lock on its key (`locked`), so while one computes it the
other waits, then reads what the first stored.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

from attnlab.core import published, settings
from attnlab.core.published import results_dir
from attnlab.core.result import MAX_META_BYTES, CorruptResult, Result, differences, numbers, to_plain
from attnlab.core.store import results_store
from attnlab.core.util import kernels_on

#: the libraries whose version can change a Result's numbers
LIBRARIES = ("torch", "transformers", "numpy", "scipy", "numba")


@lru_cache(maxsize=1)
def library_versions() -> dict:
    """{library: installed version ("-" where not installed)} for `LIBRARIES`."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "-"

    return {name: version(name) for name in LIBRARIES}


def environment() -> dict:
    """What computes a Result besides attnlab's code: `library_versions` and the kernels switch (numba loops or
    torch operations: `core.util.kernels_on`, ATTNLAB_KERNELS)."""
    return {"libraries": library_versions(), "kernels": kernels_on()}


def model_key(model) -> dict:
    """The key parts that name a model: its name and identity (`AttnModel.identity`: weights, the files that
    shape its numbers, its config and tokenizer as loaded)."""
    return {"model": model.name, "identity": model.identity}


def full_key(key: dict) -> dict:
    """The caller's key (with its "version", a positive int) and `environment`: what the hash is taken of.
    ValueError when the key declares no version."""
    version = key.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"a cached Result's key needs a version (an int >= 1), got {version!r}")
    return {**key, "environment": environment()}


def key_hash(key: dict) -> str:
    text = json.dumps(to_plain(full_key(key)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: the file beside a stored Result that holds its key (`full_key`), so that `verify` can compute it again
KEY_FILE = "key.json"


def _entry(name: str, key: dict) -> str:
    """The folder of (name, key) in the results store (`core.store`)."""
    return f"{name}-{key_hash(key)}"


def _load(store, entry: str, name: str, key_hash_: str) -> Result:
    """The Result `name` in the store's folder `entry`, verified (`Result.from_files`: CorruptResult otherwise)."""
    def read(file: str, limit: int) -> bytes:
        return store.read(f"{entry}/{file}", "cached Result", limit, CorruptResult)

    return Result.from_files(read, name, key=key_hash_, where=f"{store}/{entry}")


def stored(name: str, key: dict) -> Result | None:
    """The Result stored under (name, key) (provenance `loaded_from_cache`), or None. One that fails
    verification (`Result.load`: missing, truncated, edited files, or stored under another key) is a
    miss: one warning, then None. An unreadable cache folder is a miss as well."""
    store, entry = results_store(), _entry(name, key)
    try:
        if not (store.exists(f"{entry}/{name}.json") or store.exists(f"{entry}/{name}.csv")):
            return _from_site(name, key)
        result = _load(store, entry, name, key_hash(key))
    except (CorruptResult, OSError) as exc:
        warnings.warn(f"attnlab cache: {exc}; recomputing", stacklevel=3)
        return None
    published.log_use(entry)
    result.provenance = dict(result.provenance, loaded_from_cache=True)
    return result


def _from_site(name: str, key: dict) -> Result | None:
    """The Result the published site holds for (name, key) (`core.published`: by the key without the
    environment), stored in the local cache under this key; provenance `fetched_from_site` on this call only."""
    result = published.fetch(name, published.portable_key(to_plain(full_key(key))))
    if result is None:
        return None
    store(name, key, result)
    result.provenance = dict(result.provenance, loaded_from_cache=True, fetched_from_site=True)
    return result


def store(name: str, key: dict, result: Result) -> Result:
    """Store `result` under (name, key), replacing what was there; returns it. ValueError when the Result is
    named otherwise (it would be saved where `stored` never looks). The cache is an optimisation: where it
    cannot be written (a full disk, a read-only or misplaced folder), one warning and the Result is returned
    all the same."""
    if result.name != name:
        raise ValueError(f"attnlab cache: the computation stored as {name!r} returned a Result named "
                         f"{result.name!r}: store it under its own name")
    store, entry = results_store(), _entry(name, key)
    try:
        for file, data in result.to_files(key=key_hash(key)).items():      # the table, then its checked record
            store.write(f"{entry}/{file}", data)
        published.log_use(entry)
        store.write(f"{entry}/{KEY_FILE}", json.dumps(to_plain(full_key(key)), sort_keys=True, default=str).encode())
    except OSError as exc:
        where = exc.filename or results_dir()
        warnings.warn(f"attnlab cache: cannot store {name} in {where} ({exc.strerror or exc}); the result is "
                      "not cached", stacklevel=3)
    return result


def cached(name: str, key: dict, compute: Callable[[], Result], *, version: int | None = None,
           refresh: bool = False) -> Result:
    """Load the Result stored under (name, key + `version`) (`stored`), or compute, announce (`announce`),
    store and return it (refresh=True: always compute). `version`: the computation's declared version (see the
    module doc), from the registry (`attnlab.computations`) when None; one given for a declared computation must
    be the registry's (ValueError: a chapter's stale version)."""
    key = dict(key, version=declared_version(name, version))
    with locked([(name, key)]):
        result = None if refresh else stored(name, key)
        if result is None:
            t0 = time.perf_counter()
            result = compute()
            announce(name, key, time.perf_counter() - t0)
            result = store(name, key, result)
        return result


def declared_version(name: str, version: int | None = None) -> int:
    """`version`, or the registry's (`attnlab.computations`) when None. ValueError when `name` is declared there
    with another version, or is not declared and no version is given."""
    from attnlab.computations import COMPUTATIONS

    declared = COMPUTATIONS.get(name)
    if declared is None and version is None:
        raise ValueError(f"{name!r} is not a computation of attnlab/computations.py: declare it there")
    if declared is not None and version is not None and version != declared.version:
        raise ValueError(f"{name} is version {declared.version} in attnlab/computations.py, not {version}")
    return declared.version if version is None else version


#: the folder of `locked`'s lock files, in `results_dir`
LOCKS = ".locks"


@contextlib.contextmanager
def locked(wanted: list[tuple[str, dict]], patience: float = 1.0):
    """Context manager: an exclusive lock (`filelock.FileLock`: flock on POSIX, msvcrt on Windows; the system
    releases it if the process dies) on each
    (name, key) of `wanted`, held inside, where a caller looks for the Results and computes and stores the
    missing ones: two processes (two chapters' kernels side by side) never compute the same Result, and none
    reads one half-written. Taken once per Result, in the order of their folder names, so that two processes
    wanting overlapping sets never deadlock. A process that waits longer than `patience` seconds for one says so
    on one line (`announce`'s destination). Where `results_dir` cannot be written, no lock (`store` warns there);
    in a store that is not a local folder (`core.store`: an object store) no lock either: two processes may then
    compute one Result twice, each write whole (a single put), the same numbers under the same key."""
    local = results_store().local
    with contextlib.ExitStack() as held:
        for folder, (name, key) in sorted({_entry(n, k): (n, k) for n, k in wanted}.items()):
            if local is None:
                break
            try:
                locks = local / LOCKS
                locks.mkdir(parents=True, exist_ok=True)
                lock = _lock(locks / f"{folder}.lock", patience, name, key)
            except OSError:
                continue
            held.callback(lock.release)
        yield


def _lock(path: Path, patience: float, name: str, key: dict):
    """An exclusive FileLock on `path`, held: trying for `patience` seconds, then one line, then waiting."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=patience, poll_interval=0.02)
        return lock
    except Timeout:
        pass
    what = describe(key)
    progress_line(f"attnlab: waiting for {name}{f' ({what})' if what else ''}: another process is computing or "
                  "reading it\n")
    lock.acquire()
    return lock


def entries() -> list[tuple[str, dict]]:
    """(name, key) of every Result stored in the results store with its key file, sorted by folder."""
    out, store = [], results_store()
    for entry in store.entries():
        try:
            key = json.loads(store.read(f"{entry}/{KEY_FILE}", "key file", MAX_META_BYTES))
        except (OSError, ValueError):
            continue
        out.append((entry.rsplit("-", 1)[0], key))
    return out


def verify(recompute: Callable[[str, dict], Result | None]) -> Iterator[tuple[str, str, list[str]]]:
    """Compute every stored Result (`entries`) again and compare its numbers with the stored ones
    (`core.result.differences`): yields (name, status, differences), status "same", "differs", "damaged" (the
    stored Result fails verification), "other environment" (stored by other library versions or kernels: not
    comparable here) or "not recomputable" (`recompute(name, key)` returned None: not declared in
    `attnlab.computations`, or its key does not say how)."""
    for name, key in entries():
        if key.get("environment") != environment():
            yield name, "other environment", []
            continue
        try:
            old = _load(results_store(), _entry(name, key), name, key_hash(key))
        except (CorruptResult, OSError) as exc:
            yield name, "damaged", [str(exc)]
            continue
        new = recompute(name, key)
        if new is None:
            yield name, "not recomputable", []
            continue
        moved = differences(numbers(_as_stored(new)), numbers(old), name)
        yield name, "differs" if moved else "same", moved


def _as_stored(result: Result) -> Result:
    """`result` saved and loaded again (in a temporary folder), so that it compares with a stored one cell by cell:
    a list column (bench_normalizers' shape) reads back as its text."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result.save(Path(tmp), key="verify")
        return Result.load(Path(tmp), result.name, key="verify")


#: where `announce` writes: this file (appended to) when set, else stderr
PROGRESS_ENV = settings.PROGRESS_LOG.name


def describe(key: dict) -> str:
    """The few key parts a person recognises, "smollm2, wikitext2 from character 5000, L=512, quick": model, text
    (where a figure names one), window length, quick."""
    parts = [str(key["model"])] if key.get("model") else []
    if key.get("model") and key.get("text_name"):
        start = key.get("text_start") or 0
        parts.append(key["text_name"] + (f" from character {start}" if start else ""))
    if key.get("max_length"):
        parts.append(f"L={key['max_length']}")
    if key.get("quick"):
        parts.append("quick")
    return ", ".join(parts)


def announce(name: str, key: dict, seconds: float) -> None:
    """One line, "attnlab: computed NAME (model, L=...) in S s", to the file named by ATTNLAB_PROGRESS_LOG (the
    book build sets it and copies the lines to its terminal: a notebook kernel's stderr would land in the page),
    else to stderr."""
    what = describe(key)
    progress_line(f"attnlab: computed {name}{f' ({what})' if what else ''} in {seconds:.1f} s\n")


def progress_line(line: str) -> None:
    """`line` to the file named by PROGRESS_ENV (appended), else to stderr."""
    path = settings.get(PROGRESS_ENV)
    if not path:
        sys.stderr.write(line)
        sys.stderr.flush()
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
    except OSError:
        pass            # a progress line is not worth a traceback, nor a line in a page
