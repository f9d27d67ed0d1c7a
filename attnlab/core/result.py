"""Result = a tidy table (one dict per row) + a provenance dict. Views (plots, widgets, CLI, claim
checks) read Results; they never recompute science."""
from __future__ import annotations

import csv
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np


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


def provenance(**fields: Any) -> dict:
    """Standard provenance: package versions, host, time, plus the caller's fields (model, text sha256,
    window, grids, protocol switches, device, runtime...)."""
    import attnlab

    info = {
        "attnlab": attnlab.__version__,
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

    def save(self, out_dir: str | os.PathLike) -> dict[str, Path]:
        """Write <name>.csv and <name>.json (provenance + column list) atomically into out_dir."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out / f"{self.name}.csv", "json": out / f"{self.name}.json"}
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        tmp = paths["csv"].with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            writer.writerows({k: to_plain(v) for k, v in r.items()} for r in self.rows)
        os.replace(tmp, paths["csv"])
        meta = {"name": self.name, "columns": keys, "n_rows": len(self.rows), "provenance": to_plain(self.provenance)}
        tmp = paths["json"].with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2, default=str))
        os.replace(tmp, paths["json"])
        return paths

    @classmethod
    def load(cls, out_dir: str | os.PathLike, name: str) -> "Result":
        """Read a Result written by `save` (numbers come back as floats/ints)."""
        out = Path(out_dir)
        meta = json.loads((out / f"{name}.json").read_text())
        with open(out / f"{name}.csv", newline="") as fh:
            rows = [{k: _parse(v) for k, v in r.items()} for r in csv.DictReader(fh)]
        return cls(name=name, rows=rows, provenance=meta["provenance"])

    def extend(self, rows: Iterable[dict]) -> None:
        self.rows.extend(rows)


def _parse(text: str) -> Any:
    if text == "":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)
