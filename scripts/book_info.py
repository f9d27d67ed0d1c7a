#!/usr/bin/env python3
"""Print where the built site is and which model produced it (from _static/attnlab-build.json,
written by scripts/attnlab_book.py at the end of the build). Usage: book_info.py [SITE_DIR]"""
from __future__ import annotations

import json
import sys
from pathlib import Path

site = Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html").resolve()
info_file = site / "_static" / "attnlab-build.json"
if not info_file.is_file():
    sys.exit(f"no build information at {info_file}: did the build finish?")
info = json.loads(info_file.read_text())
print(f"Site: {site / 'index.html'}")
print(f"Model setting: ATTNLAB_MODEL={info['model_setting']} ATTNLAB_DEVICE={info['device']}")
if info["models"]:
    print("Models reported by the chapters: " + ", ".join(info["models"]))
    for page, models in info["models_in_pages"].items():
        print(f"  {page}: {', '.join(models)}")
else:
    print("Models reported by the chapters: none (chapters report theirs with attnlab.widgets.model_note)")
