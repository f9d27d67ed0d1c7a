"""Result = a tidy table (one dict per row) + a provenance dict. Views (plots, widgets, CLI, claim
checks) read Results; they never recompute science."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from attnlab.core.util import atomic_write, read_regular


def to_plain(value: Any) -> Any:
    """Make numpy/torch scalars and arrays JSON-friendly."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


#: columns that measure time, not the numbers of a computation (left out when Results are compared)
TIMINGS = frozenset({"seconds", "ratio_softmax", "ratio_sort", "runtime_s"})
#: the tolerance two computations of one Result agree to (float32 work, 1 or 2 threads: tests/test_golden.py)
RTOL, ATOL = 1e-5, 1e-7


def numbers(result: "Result") -> list[dict]:
    """The rows of `result` as JSON values, without the timing columns (`TIMINGS`) and empty cells (None: a
    loaded Result has every column in every row)."""
    return [{k: to_plain(v) for k, v in row.items() if k not in TIMINGS and v is not None} for row in result.rows]


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where JSON values `got` and `want` differ beyond RTOL/ATOL (NaN equals NaN; ints, bools and text exactly),
    one line each ([]: they agree)."""
    if isinstance(want, (bool, str)) or isinstance(got, (bool, str)) or want is None or got is None:
        return [] if got == want else [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        if math.isnan(want) and math.isnan(got) or math.isclose(got, want, rel_tol=RTOL, abs_tol=ATOL):
            return []
        return [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{where}: columns {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{where}[{i}]")]
    return [f"{where}: {got!r} != {want!r}"]


def provenance(**fields: Any) -> dict:
    """Standard provenance: package versions, host, time, plus the caller's fields (model, text sha256,
    window, grids, protocol switches, device, runtime...)."""
    from attnlab._version import __version__

    info = {
        "attnlab": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    info.update(to_plain(fields))
    return info


class CorruptResult(ValueError):
    """A stored Result that cannot be trusted: a file missing, unreadable, truncated or edited."""


MAX_TABLE_BYTES, MAX_META_BYTES = 1 << 30, 64 << 20     # the caps on a stored Result's CSV and JSON halves


def _meta_sha256(meta: dict) -> str:
    """sha256 of a Result's JSON half without its own checksum field (keys sorted): an edited provenance differs."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Result:
    """One experiment's output: `rows` is a tidy table, `provenance` says how it was made."""

    name: str
    rows: list[dict] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)

    def column(self, key: str, **where: Any) -> np.ndarray:
        """Values of `key` over the rows matching every `where` item, as an array."""
        return np.array([r[key] for r in self.select(**where)])

    def select(self, **where: Any) -> list[dict]:
        """Rows whose fields equal every `where` item."""
        return [r for r in self.rows if all(r.get(k) == v for k, v in where.items())]

    def unique(self, key: str) -> list:
        """Distinct values of `key` over the rows that have it, in first-seen order."""
        return list(dict.fromkeys(r[key] for r in self.rows if r.get(key) is not None))

    def to_files(self, *, key: str | None = None) -> dict[str, bytes]:
        """{file name: bytes} of this Result in the order to write them: <name>.csv, then <name>.json (provenance,
        columns, row count, the CSV's sha256, `key`, the results cache's key hash, and the sha256 of all of these:
        `meta_sha256`). `from_files` checks the pair, so a reader never takes a truncated, edited or mismatched
        table (two concurrent writers, a writer killed between the two files) for a Result."""
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=keys)
        writer.writeheader()
        writer.writerows({k: to_plain(v) for k, v in r.items()} for r in self.rows)
        table = buf.getvalue().encode()
        meta = {"name": self.name, "columns": keys, "n_rows": len(self.rows),
                "csv_sha256": hashlib.sha256(table).hexdigest(), "key": key, "provenance": to_plain(self.provenance)}
        meta = json.loads(json.dumps(meta, default=str))       # what `load` will read back, then checksummed
        meta["meta_sha256"] = _meta_sha256(meta)
        return {f"{self.name}.csv": table, f"{self.name}.json": json.dumps(meta, indent=2, default=str).encode()}

    def save(self, out_dir: str | os.PathLike, *, key: str | None = None) -> dict[Path, str]:
        """Write `to_files` into the folder out_dir, each file atomically (`atomic_write`). Returns {path: sha256 of
        the bytes this call wrote}."""
        return {Path(out_dir) / f: atomic_write(Path(out_dir) / f, data) for f, data in self.to_files(key=key).items()}

    @classmethod
    def load(cls, out_dir: str | os.PathLike, name: str, *, key: str | None = None) -> "Result":
        """Read and verify a Result written by `save` in the folder out_dir (`from_files`; a file that is not a
        regular file is refused: `util.read_regular`)."""
        out = Path(out_dir)

        def read(file: str, limit: int) -> bytes:
            return read_regular(out / file, "cached Result", limit=limit, error=CorruptResult)

        return cls.from_files(read, name, key=key, where=out)

    @classmethod
    def from_files(cls, read, name: str, *, key: str | None = None, where=".") -> "Result":
        """Read and verify a Result written by `to_files`; `read(file name, byte limit)` gives a file's bytes
        (`where` names their folder in messages). Numbers come back as floats/ints. Raises `CorruptResult` (one
        line: which file, what is wrong) when a file is missing or unreadable, the JSON half differs from its
        checksum (an edited provenance), the table does not match the sha256, row count and columns recorded
        beside it, or (with `key`) the pair was saved under another key."""
        out = str(where).rstrip("/")
        where = f"{out}/{name}.json"
        try:
            meta = json.loads(read(f"{name}.json", MAX_META_BYTES))
            table = read(f"{name}.csv", MAX_TABLE_BYTES)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptResult(f"{out}: {name}: cannot read ({type(exc).__name__}: {exc})") from None
        fields = {"provenance", "n_rows", "columns", "csv_sha256", "meta_sha256"}
        if not isinstance(meta, dict) or not fields <= set(meta):
            raise CorruptResult(f"{where}: not a Result written by this version (fields missing)")
        if _meta_sha256(meta) != meta["meta_sha256"]:
            raise CorruptResult(f"{where}: the provenance or table record differs from the one saved (sha256)")
        if key is not None and meta.get("key") != key:
            raise CorruptResult(f"{where}: saved under another key ({meta.get('key')}, not {key})")
        if hashlib.sha256(table).hexdigest() != meta["csv_sha256"]:
            raise CorruptResult(f"{out}/{name}.csv: the table differs from the one saved (sha256)")
        reader = csv.reader(io.StringIO(table.decode(), newline=""))
        columns, cells = next(reader, []), list(reader)
        parsed = _ParsedCells()                   # each distinct cell text parsed once: most cells repeat
        rows = [dict(zip(columns, map(parsed.__getitem__, r))) for r in cells]
        if (len(rows) != meta["n_rows"] or (rows and columns != meta["columns"])
                or any(len(r) != len(columns) for r in cells)):
            raise CorruptResult(f"{out}/{name}.csv: {len(rows)} rows / columns differ from the "
                                f"{meta['n_rows']} rows saved")
        return cls(name=name, rows=rows, provenance=meta["provenance"])

    def extend(self, rows: Iterable[dict]) -> None:
        self.rows.extend(rows)


class _ParsedCells(dict):
    """{cell text: `_parse(text)`}, filled on first lookup (a table's empty cells, flags, layers and repeated values
    are parsed once, not once per row)."""

    def __missing__(self, text: str) -> Any:
        value = self[text] = _parse(text)
        return value


def _parse(text: str) -> Any:
    """A CSV cell as written by `save`: "" -> None, an int, a float, True/False, else the text."""
    if text == "":
        return None
    if text.isascii() and "_" not in text and text.strip() == text:        # the cells `save` writes: no exceptions
        digits = text[1:] if text[0] in "+-" else text
        if digits.isdigit():
            return int(text)
        try:
            return float(text)
        except ValueError:
            return {"True": True, "False": False}.get(text, text)
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)
