"""Published Results: the site carries the Results it was built from, so that a reader's kernel fetches a missing
Result by its key, sha256-checked, instead of computing it (issue #38, item 2).

On the site (under its root, `SITE_FOLDER`):

    results/registry.json     {"format": 1, "results": {"<name>-<key hash>": {"<file>": "<sha256>", ...}}}
    results/files/<sha256>    each file's bytes under its sha256 (content-addressed: equal files stored once)

An entry is a results-cache folder (`core.cache`: `<name>-<key hash>/` with `<name>.csv` and `<name>.json`). The
book build logs the entries it reads or writes (`ATTNLAB_RESULTS_LOG`) and `publish` copies them into the site.
`fetch` downloads an entry with pooch (the fetcher scientific Python uses: a known sha256 per file, retries,
atomic downloads) into the results cache, where `Result.load` verifies it like any stored Result.

Where: `ATTNLAB_RESULTS_URL` (the site's root; "" or "off": never fetch), else `DEFAULT_URL` (the site set in
_config.yml's `results: url`, written into the chapters' setup cells). An unreachable site costs one short
timeout per process, then nothing: every Result is computed as before.
"""
from __future__ import annotations

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
FORMAT = 1
TIMEOUT_S = 5.0


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

def publish(entries: Iterable[str], results_dir: Path, site: Path) -> dict:
    """Copy the results-cache `entries` (folder names under `results_dir`) into `site`/results: each file under its
    sha256, and registry.json naming them. Entries missing from the cache are left out (listed in the return).
    Returns {"entries": n, "files": n, "bytes": n, "missing": [...]}."""
    target = Path(site) / SITE_FOLDER
    files = target / "files"
    files.mkdir(parents=True, exist_ok=True)
    registry, missing, size = {}, [], 0
    for entry in sorted(set(entries)):
        folder = Path(results_dir) / entry
        parts = sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []
        if not parts:
            missing.append(entry)
            continue
        registry[entry] = {}
        for path in parts:
            sha = file_sha256(path)
            registry[entry][path.name] = sha
            if not (files / sha).exists():
                shutil.copyfile(path, files / sha)
                size += path.stat().st_size
    text = json.dumps({"format": FORMAT, "results": registry}, indent=1, sort_keys=True)
    (target / "registry.json").write_text(text)
    return {"entries": len(registry), "files": sum(map(len, registry.values())), "bytes": size, "missing": missing}


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


def fetch(entry: str, results_dir: Path) -> bool:
    """Download the published results-cache `entry` into `results_dir`/entry (each file checked against the
    registry's sha256, the folder moved into place whole). True when it is there now; False when fetching is off,
    the site does not have it, or a download fails (then nothing is written)."""
    url = results_url()
    if url is None:
        return False
    files = _registry(url).get(entry)
    if not files:
        return False
    import pooch

    results_dir = Path(results_dir)
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=results_dir, prefix=f".{entry}.fetch-"))
    except OSError:
        return False
    try:
        for name, sha in files.items():
            pooch.retrieve(url + f"{SITE_FOLDER}/files/{sha}", known_hash=f"sha256:{sha}", path=tmp, fname=name,
                           progressbar=False, downloader=pooch.HTTPDownloader(timeout=TIMEOUT_S))
        try:
            os.replace(tmp, results_dir / entry)
        except OSError:                      # another process placed it first
            pass
        return (results_dir / entry).is_dir()
    except Exception as exc:  # noqa: BLE001 - a failed download means: compute instead
        print(f"attnlab: could not fetch {entry} from {url} ({type(exc).__name__}); computing it", file=sys.stderr)
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Optional[list[str]] = None) -> int:
    """python -m attnlab.core.published LOG SITE: publish the entries LOG names (one per line) into SITE."""
    from attnlab.core.cache import results_dir

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m attnlab.core.published RESULTS_LOG SITE_DIR", file=sys.stderr)
        return 2
    log, site = Path(argv[0]), Path(argv[1])
    entries = log.read_text().split() if log.is_file() else []
    done = publish(entries, results_dir(), site)
    missing = f"; {len(done['missing'])} missing from the cache" if done["missing"] else ""
    print(f"attnlab: published {done['entries']} Results ({done['files']} files, {done['bytes'] / 1e6:.1f} MB new) "
          f"into {site / SITE_FOLDER}{missing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
