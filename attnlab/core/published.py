"""Published Results: the site carries the Results it was built from, so that a reader's kernel fetches a missing
Result by its key, sha256-checked, instead of computing it (issue #38, item 2).

On the site (under its root, `SITE_FOLDER`):

    results/registry.json     {"format": 2, "results": {"<portable key>": {"name": ..., "files": {"<file>": "<sha256>"},
                                                                          "sizes": {"<file>": <bytes>},
                                                                          "environment": {...}}}}
    results/files/<sha256>    each file's bytes under its sha256 (content-addressed: equal files stored once)

An entry is a results-cache folder (`core.cache`: `<name>-<key hash>/` with `<name>.csv`, `<name>.json` and the
key, `key.json`). Its portable key (`portable_key`) is the hash of that key without the environment (library
versions, kernels switch): a reader whose torch is not the build's still finds the site's Result, and the
Result says so (provenance `published_by`, `published_environment`); the local cache stores it under the
reader's own key. The book build logs the entries its chapters read or write (`ATTNLAB_RESULTS_LOG`) and
`publish` copies them into the site. `fetch` downloads an entry with pooch (the fetcher scientific Python uses:
a known sha256 per file, atomic downloads) and `Result.load` verifies it like any stored Result.

Where: `ATTNLAB_RESULTS_URL` (the site's root; unset, "" or "off": never fetch; the chapters' setup cells set it to
the site of _config.yml's `attnlab: results_url`). An unreachable site costs one short timeout per process, then
nothing: every Result is computed as before. A slow or oversized site cannot hang a reader: each download has a
deadline for the whole download (`DEADLINE_S`) and a size cap (the registry's stated size of each file,
`FILE_MAX_BYTES` where it states none; `REGISTRY_MAX_BYTES` for the registry); past either, one line, the Result is
computed, and the process asks that site nothing more. ("sizes" came after format 2's first registries: a registry
without it is read as before.)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional

from attnlab.core import settings

URL_ENV, LOG_ENV = settings.RESULTS_URL.name, settings.RESULTS_LOG.name   # unset: no site, no log
SITE_FOLDER = "results"
FORMAT = 2
KEY_FILE = "key.json"              # beside every stored Result (core.cache.KEY_FILE)
TIMEOUT_S = 5.0                    # per connection attempt and per read: a silent site
DEADLINE_S = 30.0                  # per download, from its request to its last byte: a site that trickles
# The registry's cap: an entry is about 0.5 kB and a full build publishes a few hundred (about 0.2 MB); 16 MiB
# leaves a hundred times that and still bounds what a broken or hostile site can send.
REGISTRY_MAX_BYTES = 16 << 20
# A published file's cap where the registry states no size (registries written before "sizes"): the largest
# Result file of a full build is about 3 MB (a fig3.csv).
FILE_MAX_BYTES = 256 << 20
CHUNK_BYTES = 1 << 16


def results_dir():
    """The results store (`core.store`; `core.cache` stores there): ATTNLAB_RESULTS_DIR, else results/ in attnlab's
    cache folder (`core.text.cache_dir`): a Path, or the URL of a store that is not a local folder (a file:// URL is
    its Path). Here rather than in core.cache, which loads torch: the book's Sphinx extension looks in it too."""
    from attnlab.core.store import results_root

    return results_root()


def results_url() -> Optional[str]:
    """The site root to fetch Results from (ending in "/"), or None (fetching off)."""
    return settings.get(URL_ENV)


def log_use(entry: str) -> None:
    """Append a results-cache entry (folder name) to the build's log of Results it used, when LOG_ENV is set."""
    path = settings.get(LOG_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(entry + "\n")


# --------------------------------------------------------------------------- publishing (the book build)

def portable_key(full_key: dict) -> str:
    """16 hex digits of sha256 over a Result's full key (`core.cache.full_key`, as plain data) without its
    "environment": the same computation on the same inputs at the same declared version."""
    text = json.dumps({k: v for k, v in full_key.items() if k != "environment"}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def publish(entries: Iterable[str], results_dir, site: Path) -> dict:
    """Copy the results-store `entries` (folder names in the store `results_dir`: a path or URL, `core.store`) into
    `site`/results: each file under its sha256, and registry.json naming them by portable key. Entries missing from
    the store (or without their key) are left out and listed. Returns {"entries": n, "files": n, "bytes": n,
    "missing": [...]}."""
    from attnlab.core.store import Store

    store = Store(results_dir)
    target = Path(site) / SITE_FOLDER
    files = target / "files"
    files.mkdir(parents=True, exist_ok=True)
    registry, missing, size = {}, [], 0
    for entry in sorted(set(entries)):
        try:
            key = json.loads(store.read(f"{entry}/{KEY_FILE}", "key file", REGISTRY_MAX_BYTES))
            parts = {name: store.read(f"{entry}/{name}", "stored Result", FILE_MAX_BYTES)
                     for name in store.files(entry)}
        except (OSError, ValueError):
            missing.append(entry)
            continue
        record = {"name": entry.rsplit("-", 1)[0], "files": {}, "sizes": {}, "environment": key.get("environment")}
        for name, data in parts.items():
            sha = hashlib.sha256(data).hexdigest()
            record["files"][name] = sha
            record["sizes"][name] = len(data)
            if not (files / sha).exists():
                (files / sha).write_bytes(data)
                size += len(data)
        registry[portable_key(key)] = record
    text = json.dumps({"format": FORMAT, "results": registry}, indent=1, sort_keys=True)
    (target / "registry.json").write_text(text)
    return {"entries": len(registry), "files": sum(len(r["files"]) for r in registry.values()), "bytes": size,
            "missing": missing}


# --------------------------------------------------------------------------- fetching (a reader's kernel)

class SiteLimit(Exception):
    """A download past its deadline ("too slow: ...") or its size cap ("too large: ...") (`BoundedDownload`)."""


class BoundedDownload:
    """A pooch downloader (`pooch.retrieve(..., downloader=...)`: pooch still writes atomically and checks the
    sha256) that streams `url` and raises SiteLimit, naming the download by `label`, once time.monotonic() passes
    `deadline` or more than `max_bytes` arrive (or a Content-Length says so before the first byte). Each read
    returns what has arrived (`read1`), so a site that trickles a byte at a time is checked between bytes; a
    silent one times out after TIMEOUT_S."""

    def __init__(self, deadline: float, max_bytes: int, label: str):
        self.deadline, self.max_bytes, self.label = deadline, int(max_bytes), label

    def __call__(self, url: str, output_file, pooch=None) -> None:
        import requests

        with requests.get(url, stream=True, timeout=TIMEOUT_S) as response, \
                _opened(output_file) as out:
            response.raise_for_status()
            stated = response.headers.get("Content-Length", "")
            if stated.isdigit() and int(stated) > self.max_bytes and not response.headers.get("Content-Encoding"):
                raise SiteLimit(f"too large: {self.label} is {int(stated)} bytes, at most {self.max_bytes} expected")
            got, total = 0, f" of {stated}" if stated.isdigit() else ""
            while True:
                if time.monotonic() > self.deadline:
                    raise SiteLimit(f"too slow: {self.label} not complete in {DEADLINE_S:g} s ({got}{total} bytes)")
                block = response.raw.read1(CHUNK_BYTES, decode_content=True)
                if not block:
                    return
                got += len(block)
                if got > self.max_bytes:
                    raise SiteLimit(f"too large: {self.label} sends more than the {self.max_bytes} bytes expected")
                out.write(block)


@contextlib.contextmanager
def _opened(output_file):
    """`output_file` as a binary file to write: pooch passes a path (its temporary file) or a file object."""
    if hasattr(output_file, "write"):
        yield output_file
        return
    with open(output_file, "wb") as fh:
        yield fh


@contextlib.contextmanager
def _pooch_quiet():
    """pooch's own log lines off ("Downloading data from ...", the known_hash hint): attnlab says in one line
    what a failed fetch means, and nothing when it works."""
    import pooch

    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel("WARNING")
    try:
        yield
    finally:
        logger.setLevel(level)


_given_up: set[str] = set()          # sites found too slow or too large: not asked again in this process


def _give_up(url: str, exc: SiteLimit, computing: str) -> None:
    """One line: the site `url` was too slow or too large (`exc`), so `computing` happens here; never ask it
    again in this process."""
    _given_up.add(url)
    print(f"attnlab: the site {url} is {exc}; computing {computing}, and fetching nothing more from that site",
          file=sys.stderr)


def _size_cap(record: dict, fname: str) -> int:
    """The bytes `fname` of a registry `record` may have: its stated size, else FILE_MAX_BYTES (never more)."""
    sizes = record.get("sizes")
    stated = sizes.get(fname) if isinstance(sizes, dict) else None
    if isinstance(stated, int) and not isinstance(stated, bool) and 0 <= stated:
        return min(stated, FILE_MAX_BYTES)
    return FILE_MAX_BYTES


@lru_cache(maxsize=4)
def _registry(url: str) -> dict:
    """The site's registry ({} when the site is unreachable, too slow or too large, or has none: asked once per
    process)."""
    import pooch

    try:
        with tempfile.TemporaryDirectory() as tmp:
            with _pooch_quiet():
                path = pooch.retrieve(url + f"{SITE_FOLDER}/registry.json", known_hash=None, path=tmp,
                                      fname="registry.json", progressbar=False,
                                      downloader=BoundedDownload(time.monotonic() + DEADLINE_S, REGISTRY_MAX_BYTES,
                                                                 f"{SITE_FOLDER}/registry.json"))
            data = json.loads(Path(path).read_text())
    except SiteLimit as exc:
        _give_up(url, exc, "what is missing")
        return {}
    except Exception as exc:  # noqa: BLE001 - any failure means: compute instead
        print(f"attnlab: no published Results at {url} ({type(exc).__name__}); computing what is missing",
              file=sys.stderr)
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("results"), dict):
        return {}
    return data["results"]


def fetch(name: str, portable: str):
    """The Result `name` the site publishes under portable key `portable` (`portable_key`), downloaded (each file
    checked against the registry's sha256, all of them within DEADLINE_S, each within its stated size) and
    verified (`Result.load`, its key's portable part equal to `portable`), with provenance `published_by` (the
    site) and `published_environment`; None when fetching is off, the site does not have it, a download or check
    fails, or the site was found too slow or too large in this process."""
    from attnlab.core.result import CorruptResult, Result

    url = results_url()
    if url is None or url in _given_up:
        return None
    record = _registry(url).get(portable)
    if not isinstance(record, dict) or record.get("name") != name or not record.get("files") or url in _given_up:
        return None
    import pooch

    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for fname, sha in record["files"].items():
                with _pooch_quiet():
                    pooch.retrieve(url + f"{SITE_FOLDER}/files/{sha}", known_hash=f"sha256:{sha}", path=tmp,
                                   fname=Path(fname).name, progressbar=False,
                                   downloader=BoundedDownload(deadline, _size_cap(record, fname), f"{name}'s {fname}"))
            if portable_key(json.loads((Path(tmp) / KEY_FILE).read_text())) != portable:
                raise CorruptResult(f"{name}: the published key is not the one asked for")
            result = Result.load(tmp, name)
        except SiteLimit as exc:
            _give_up(url, exc, name)
            return None
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
