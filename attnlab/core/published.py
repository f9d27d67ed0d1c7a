"""Published Results: the site carries the Results it was built from, so that a reader's kernel fetches a missing
Result by its key, sha256-checked, instead of computing it (issue #38, item 2).

On the site (under its root, `SITE_FOLDER`):

    results/registry.json     {"format": 2, "results": {"<portable key>": {"name": ..., "files": {"<file>": "<sha256>"},
                                                                          "environment": {...}}}}
    results/files/<sha256>    each file's bytes under its sha256 (content-addressed: equal files stored once)

An entry is a results-cache folder (`core.cache`: `<name>-<key hash>/` with `<name>.csv`, `<name>.json` and the
key, `key.json`). Its portable key (`portable_key`) is the hash of that key without the environment (library
versions, kernels switch): a reader whose torch is not the build's still finds the site's Result, and the
Result says so (provenance `published_by`, `published_environment`); the local cache stores it under the
reader's own key. The book build logs the entries its chapters read or write (`ATTNLAB_RESULTS_LOG`) and
`publish` copies them into the site. `fetch` downloads an entry with pooch (the fetcher scientific Python uses:
a known sha256 per file, atomic downloads) and `Result.load` verifies it like any stored Result.

Where: `ATTNLAB_RESULTS_URL` (the site's root; "" or "off": never fetch), else `DEFAULT_URL` (the site set in
_config.yml's `results: url`, written into the chapters' setup cells). An unreachable site costs one short
timeout per process, then nothing: every Result is computed as before.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional

from attnlab.core.model_files import file_sha256

URL_ENV, LOG_ENV = "ATTNLAB_RESULTS_URL", "ATTNLAB_RESULTS_LOG"
DEFAULT_URL = ""                  # no site by default for the package; the chapters' setup cell sets URL_ENV
SITE_FOLDER = "results"
FORMAT = 2
KEY_FILE = "key.json"              # beside every stored Result (core.cache.KEY_FILE)
TIMEOUT_S = 5.0


def results_dir() -> Path:
    """The results cache (`core.cache` stores there): ATTNLAB_RESULTS_DIR, else results/ in attnlab's cache folder
    (`core.text.cache_dir`). Here rather than in core.cache, which loads torch: the book's Sphinx extension looks
    in it too."""
    from attnlab.core.text import cache_dir

    return Path(os.environ.get("ATTNLAB_RESULTS_DIR", cache_dir() / "results")).expanduser()


def results_url() -> Optional[str]:
    """The site root to fetch Results from (ending in "/"), or None (fetching off)."""
    url = os.environ.get(URL_ENV, DEFAULT_URL).strip()
    if not url or url.lower() in ("off", "0", "none"):
        return None
    return url if url.endswith("/") else url + "/"


def log_use(entry: str) -> None:
    """Append a results-cache entry (folder name) to the build's log of Results it used, when LOG_ENV is set."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(entry + "\n")


# --------------------------------------------------------------------------- publishing (the book build)

def portable_key(full_key: dict) -> str:
    """16 hex digits of sha256 over a Result's full key (`core.cache.full_key`, as plain data) without its
    "environment": the same computation on the same inputs at the same declared version."""
    text = json.dumps({k: v for k, v in full_key.items() if k != "environment"}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def publish(entries: Iterable[str], results_dir: Path, site: Path) -> dict:
    """Copy the results-cache `entries` (folder names under `results_dir`) into `site`/results: each file under its
    sha256, and registry.json naming them by portable key. Entries missing from the cache (or without their key)
    are left out and listed. Returns {"entries": n, "files": n, "bytes": n, "missing": [...]}."""
    target = Path(site) / SITE_FOLDER
    files = target / "files"
    files.mkdir(parents=True, exist_ok=True)
    registry, missing, size = {}, [], 0
    for entry in sorted(set(entries)):
        folder = Path(results_dir) / entry
        try:
            key = json.loads((folder / KEY_FILE).read_text())
            parts = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        except (OSError, ValueError):
            missing.append(entry)
            continue
        record = {"name": entry.rsplit("-", 1)[0], "files": {}, "environment": key.get("environment")}
        for path in parts:
            sha = file_sha256(path)
            record["files"][path.name] = sha
            if not (files / sha).exists():
                shutil.copyfile(path, files / sha)
                size += path.stat().st_size
        registry[portable_key(key)] = record
    text = json.dumps({"format": FORMAT, "results": registry}, indent=1, sort_keys=True)
    (target / "registry.json").write_text(text)
    return {"entries": len(registry), "files": sum(len(r["files"]) for r in registry.values()), "bytes": size,
            "missing": missing}


# --------------------------------------------------------------------------- fetching (a reader's kernel)

@lru_cache(maxsize=4)
def _registry(url: str) -> dict:
    """The site's registry ({} when the site is unreachable or has none: asked once per process)."""
    import pooch

    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = pooch.retrieve(url + f"{SITE_FOLDER}/registry.json", known_hash=None, path=tmp,
                                  fname="registry.json", progressbar=False,
                                  downloader=pooch.HTTPDownloader(timeout=TIMEOUT_S))
            data = json.loads(Path(path).read_text())
    except Exception as exc:  # noqa: BLE001 - any failure means: compute instead
        print(f"attnlab: no published Results at {url} ({type(exc).__name__}); computing what is missing",
              file=sys.stderr)
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("results"), dict):
        return {}
    return data["results"]


def fetch(name: str, portable: str):
    """The Result `name` the site publishes under portable key `portable` (`portable_key`), downloaded (each file
    checked against the registry's sha256) and verified (`Result.load`, its key's portable part equal to
    `portable`), with provenance `published_by` (the site) and `published_environment`; None when fetching is
    off, the site does not have it, or a download or check fails."""
    from attnlab.core.result import CorruptResult, Result

    url = results_url()
    record = _registry(url).get(portable) if url is not None else None
    if not isinstance(record, dict) or record.get("name") != name or not record.get("files"):
        return None
    import pooch

    with tempfile.TemporaryDirectory() as tmp:
        try:
            for fname, sha in record["files"].items():
                pooch.retrieve(url + f"{SITE_FOLDER}/files/{sha}", known_hash=f"sha256:{sha}", path=tmp,
                               fname=Path(fname).name, progressbar=False,
                               downloader=pooch.HTTPDownloader(timeout=TIMEOUT_S))
            if portable_key(json.loads((Path(tmp) / KEY_FILE).read_text())) != portable:
                raise CorruptResult(f"{name}: the published key is not the one asked for")
            result = Result.load(tmp, name)
        except Exception as exc:  # noqa: BLE001 - a failed download or check means: compute instead
            print(f"attnlab: could not fetch {name} from {url} ({type(exc).__name__}); computing it", file=sys.stderr)
            return None
    result.provenance = dict(result.provenance, published_by=url, published_environment=record.get("environment"))
    return result


def publish_log(log: Path, results_dir: Path, site: Path) -> str:
    """`publish` the entries a build's log names (one per line) into `site`; one line that says what it did."""
    log = Path(log)
    entries = log.read_text().split() if log.is_file() else []
    done = publish(entries, results_dir, site)
    missing = f"; {len(done['missing'])} missing from the cache" if done["missing"] else ""
    return (f"attnlab: published {done['entries']} Results ({done['files']} files, {done['bytes'] / 1e6:.1f} MB new) "
            f"into {Path(site) / SITE_FOLDER}{missing}")
