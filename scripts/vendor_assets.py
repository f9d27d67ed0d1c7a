#!/usr/bin/env python3
"""Copy the JavaScript the book serves itself (no CDN) from node_modules/ into book/_assets/vendor/.

Run `npm ci` first (the Makefile's `vendor` target does both). Sphinx copies book/_assets/vendor/
into _build/html/_static/ (html_static_path in _config.yml), so pages load:
  _static/attnlab/mathjax/tex-mml-chtml.js   MathJax 3 (+ the components it loads on demand)
Sliders need no library: attnlab.widgets writes them as plain HTML with a few lines of JavaScript.
The folder is not named _static (jupyter-book 1.x would inject every .js under it into every page),
and everything sits under attnlab/ so nothing mixes with the theme's own _static/vendor/.
Standard library only.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "node_modules"
DEST = ROOT / "book" / "_assets" / "vendor" / "attnlab"

# package -> version pinned in package.json (checked, so a stale node_modules is caught)
PINS = {"mathjax": "3.2.2"}
MATHJAX_PARTS = ["tex-mml-chtml.js", "input", "output", "ui", "a11y", "sre", "adaptors"]


def _check_versions() -> None:
    for name, want in PINS.items():
        meta = NODE / name / "package.json"
        if not meta.is_file():
            sys.exit(f"vendor_assets: {meta.relative_to(ROOT)} is missing: run `npm ci` first")
        have = json.loads(meta.read_text())["version"]
        if have != want:
            sys.exit(f"vendor_assets: {name} is {have} in node_modules, package.json pins {want}: "
                     "run `npm ci`")


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)


def main() -> int:
    _check_versions()
    if DEST.parent.exists():
        shutil.rmtree(DEST.parent)
    DEST.mkdir(parents=True)

    mathjax = NODE / "mathjax"
    for part in MATHJAX_PARTS:
        _copy(mathjax / "es5" / part, DEST / "mathjax" / part)
    _copy(mathjax / "LICENSE", DEST / "licenses" / "mathjax-LICENSE")

    size = sum(f.stat().st_size for f in DEST.rglob("*") if f.is_file())
    print(f"vendor_assets: {DEST.relative_to(ROOT)} ready ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
