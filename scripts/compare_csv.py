"""Compare the figure CSVs of two `attnlab figures --out` folders (e.g. CUDA against CPU): per file, the rows, the
largest relative difference of a numeric column and where it is, and the rows whose text cells differ.

usage: python scripts/compare_csv.py DIR_A DIR_B
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path


def _num(s: str):
    try:
        return float(s)
    except ValueError:
        return None


def compare(a: Path, b: Path) -> str:
    """One line: `name rows max_rel=... (column, row) text_differs=k`, or why the two cannot be compared."""
    ra, rb = (list(csv.DictReader(p.open())) for p in (a, b))
    if len(ra) != len(rb) or (ra and ra[0].keys() != rb[0].keys()):
        return f"{a.name}: shapes differ ({len(ra)} against {len(rb)} rows)"
    worst, where, text = 0.0, "-", 0
    for i, (x, y) in enumerate(zip(ra, rb)):
        for col in x:
            u, v = _num(x[col]), _num(y[col])
            if u is None or v is None:
                text += x[col] != y[col]
            elif not (math.isnan(u) and math.isnan(v)) and u != v:
                rel = abs(u - v) / max(abs(u), abs(v), 1e-300) if math.isfinite(u - v) else math.inf
                if rel > worst:
                    worst, where = rel, f"{col}, row {i}"
    return f"{a.name}: {len(ra)} rows, max relative difference {worst:.3g} ({where}), text cells differing: {text}"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(Path(d).is_dir() for d in argv):
        print("usage: python scripts/compare_csv.py DIR_A DIR_B (two folders of figure CSVs)", file=sys.stderr)
        return 2
    da, db = map(Path, argv)
    names = sorted({p.name for p in da.glob("*.csv")} | {p.name for p in db.glob("*.csv")})
    for n in names:
        pa, pb = da / n, db / n
        print(compare(pa, pb) if pa.exists() and pb.exists() else f"{n}: only in {da if pa.exists() else db}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
