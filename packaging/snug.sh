#!/usr/bin/env bash
# Set up Snug in .venv (with CuPy when an NVIDIA driver is present) and start the app.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
extra=""
if command -v nvidia-smi >/dev/null 2>&1; then
    cuda_major=$(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -n1)
    if [ "${cuda_major:-0}" -ge 13 ]; then extra="[cuda13]"; elif [ "${cuda_major:-0}" -ge 12 ]; then extra="[cuda12]"; fi
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".${extra}"
# Qt's X11 platform plugin needs a few system libraries that minimal Debian/Ubuntu lack.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! ldconfig -p | grep -q libxcb-cursor.so.0; then
    apt-get update -qq && apt-get install -y -qq libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 \
        libxcb-keysyms1 libxcb-image0 libxcb-render-util0 libxcb-shape0 libegl1 libgl1 >/dev/null
fi
exec .venv/bin/snug "$@"
