#!/usr/bin/env bash
# Build the one-folder Linux bundle into dist/snug/ (see packaging/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import PyInstaller" 2>/dev/null; then
    "$PY" -m pip install --quiet -e ".[bundle]"
fi
exec "$PY" packaging/build.py "$@"
