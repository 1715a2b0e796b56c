#!/usr/bin/env bash
# Set up everything the tests need (a virtual environment in .venv with the test extra) and
# run them: ruff, the 600-line lean check, and pytest (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Also when a .venv has no pip: Debian/Ubuntu's python3 leaves one so before python3-venv is
# installed (venv then names the package to install).
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
export QT_QPA_PLATFORM=offscreen
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python tools/lean_check.py
.venv/bin/python -m pytest -q "$@"
