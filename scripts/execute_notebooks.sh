#!/usr/bin/env bash
# Execute the book's notebooks in place from book/ (refresh stored outputs and widget state).
# Usage: scripts/execute_notebooks.sh [book/NN_name.ipynb ...]   (default: every book/*.ipynb)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
PY="${PY:-$here/../.venv/bin/python}"
exec "$PY" "$here/execute_notebooks.py" "$@"
