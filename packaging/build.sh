#!/usr/bin/env bash
# Build the one-folder Linux bundle into dist/snug/ (see packaging/README.md).
# Sets up .venv first when a fresh clone has none, as packaging/snug.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Also when a .venv has no pip: Debian/Ubuntu's python3 leaves one so before python3-venv is
# installed (venv then names the package to install).
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    "$PY" -m venv .venv
fi
# PyInstaller (the bundle extra) and Snug itself: the spec copies its metadata.
if ! .venv/bin/python -c "import PyInstaller, importlib.metadata as m; m.version('snug')" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[bundle]"
fi
exec .venv/bin/python packaging/build.py "$@"
