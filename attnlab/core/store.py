"""The results store: the one place Results are read from and written to (`core.cache`, `core.published.publish`,
the book build, a cluster's workers). ATTNLAB_RESULTS_DIR names it: a local path, a ``file://`` URL (the same), or
any fsspec URL (``memory://`` in the tests, ``s3://bucket/prefix`` with s3fs installed, ...), so that a cluster's
workers, the serial CLI and the book read and write one store under the same keys.

Every write is atomic, so a killed writer leaves nothing half-written that a reader takes for a file: in a local
folder a temporary file in the same folder, then a rename (`core.util.atomic_write`); in an object store
(`ATOMIC_PUT`: memory, S3, GCS, Azure) one put, which the store makes visible whole or not at all; in any other
fsspec file system a temporary name, then a move. A Result is a pair of such files that the reader checks against
each other (`core.result.Result.from_files`), so a run killed between the two is a miss, computed again.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Optional

from attnlab.core.util import atomic_write, read_regular

#: fsspec protocols whose single put is atomic (an object appears whole or not at all)
ATOMIC_PUT = frozenset({"memory", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def is_url(root) -> bool:
    """True for "scheme://..." text (a store fsspec opens), False for a path."""
    return isinstance(root, str) and "://" in root


def local_path(root) -> Optional[Path]:
    """The folder `root` names on this machine (a path or a file:// URL), or None for any other URL."""
    if not is_url(root):
        return Path(root).expanduser()
    if root.startswith("file://"):
        return Path(root[len("file://"):]).expanduser()
    return None


class Store:
    """A results store at `root` (a path or URL). Paths inside it are "/"-separated: "<entry>/<file>"."""

    def __init__(self, root):
        self.root = str(root)
        self.local = local_path(root)
        if self.local is None:
            import fsspec

            self.fs, base = fsspec.core.url_to_fs(self.root)
            self.base = base.rstrip("/")

    def __str__(self) -> str:
        return str(self.local) if self.local is not None else self.root

    def _remote(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def read(self, rel: str, what: str, limit: int, error: type = OSError) -> bytes:
        """The bytes of `rel`, at most `limit` (`error` past it or for a local path that is not a regular file);
        FileNotFoundError (an OSError) when it is absent."""
        if self.local is not None:
            return read_regular(self.local / rel, what, limit=limit, error=error)
        size = self.fs.size(self._remote(rel))
        if size is not None and size > limit:
            raise error(f"{what} {self.root}/{rel} is larger than {limit} bytes")
        return self.fs.cat_file(self._remote(rel))

    def write(self, rel: str, data: bytes) -> None:
        """Write `data` at `rel` atomically (the module doc), making its folder where needed."""
        if self.local is not None:
            atomic_write(self.local / rel, data)
            return
        path = self._remote(rel)
        if set(_protocols(self.fs)) & ATOMIC_PUT:
            self.fs.pipe_file(path, data)
            return
        folder, _, name = path.rpartition("/")
        tmp = f"{folder}/.{name}.{uuid.uuid4().hex}.part"
        self.fs.makedirs(folder, exist_ok=True)
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
            raise

    def exists(self, rel: str) -> bool:
        if self.local is not None:
            return (self.local / rel).is_file()
        return self.fs.isfile(self._remote(rel))

    def files(self, entry: str) -> list[str]:
        """The names of the files of `entry` (a Result's folder), sorted, without hidden or temporary ones."""
        if self.local is not None:
            folder = self.local / entry
            names = [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
        else:
            try:
                names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self._remote(entry), detail=False)]
            except FileNotFoundError:
                names = []
        return sorted(n for n in names if not n.startswith("."))

    def entries(self) -> list[str]:
        """The names of the store's Result folders ("<name>-<key hash>"), sorted."""
        if self.local is not None:
            names = [p.name for p in self.local.glob("*-*") if p.is_dir()] if self.local.is_dir() else []
        else:
            try:
                found = self.fs.ls(self.base, detail=True)
            except FileNotFoundError:
                found = []
            names = [f["name"].rstrip("/").rsplit("/", 1)[-1] for f in found if f.get("type") == "directory"]
        return sorted(n for n in names if "-" in n and not n.startswith("."))


def _protocols(fs) -> tuple:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def results_root():
    """ATTNLAB_RESULTS_DIR, else results/ in attnlab's cache folder (`core.text.cache_dir`): a Path, or the URL of a
    store that is not a local folder (a file:// URL is its Path)."""
    from attnlab.core import settings
    from attnlab.core.text import cache_dir

    root = settings.get("ATTNLAB_RESULTS_DIR") or cache_dir() / "results"
    return local_path(root) or root


def results_store() -> Store:
    """The store ATTNLAB_RESULTS_DIR names (`results_root`)."""
    return Store(results_root())
