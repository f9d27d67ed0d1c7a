"""Visible / total code lines per chapter (issue 50 item 3): a cell is hidden when tagged hide-input, remove-input,
hide-cell or remove-cell; `--ref REV` reads the chapters at a git revision instead of the working tree.
Solution cells (tag `solution`, folded by design) are counted apart."""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

HIDDEN = {"hide-input", "remove-input", "hide-cell", "remove-cell"}
ROOT = Path(__file__).resolve().parents[1]


def counts(nb: dict) -> tuple[int, int, int, int]:
    """(visible, total) non-blank code lines, then the same without solution cells."""
    v = t = vs = ts = 0
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        n = sum(1 for line in "".join(c["source"]).splitlines() if line.strip())
        tags = set(c.get("metadata", {}).get("tags", []))
        shown = not tags & HIDDEN
        v, t = v + n * shown, t + n
        if "solution" not in tags:
            vs, ts = vs + n * shown, ts + n
    return v, t, vs, ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ref", help="a git revision (default: the working tree)")
    args = ap.parse_args()
    paths = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    total = [0, 0, 0, 0]
    print(f"{'chapter':26s} {'visible/total':>15s} {'without solutions':>20s}")
    for p in paths:
        text = (subprocess.run(["git", "-C", str(ROOT), "show", f"{args.ref}:book/{p.name}"], check=True,
                               capture_output=True, text=True).stdout if args.ref else p.read_text())
        c = counts(json.loads(text))
        total = [a + b for a, b in zip(total, c)]
        print(f"{p.stem:26s} {c[0]:4d}/{c[1]:4d} {c[0] / c[1]:4.0%} {c[2]:8d}/{c[3]:4d} {c[2] / c[3]:4.0%}")
    print(f"{'all':26s} {total[0]:4d}/{total[1]:4d} {total[0] / total[1]:4.0%} {total[2]:8d}/{total[3]:4d} "
          f"{total[2] / total[3]:4.0%}")


if __name__ == "__main__":
    main()
