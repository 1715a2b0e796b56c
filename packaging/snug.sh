#!/usr/bin/env bash
# Set up Snug in .venv (with CuPy when an NVIDIA driver is present) and start it.
# pip runs only when pyproject.toml (or the CUDA extra) changed since the last install:
# .venv/.snug-install holds the hash of what was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
extra=""
if command -v nvidia-smi >/dev/null 2>&1; then
    cuda_major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -n1 || true)
    if [ "${cuda_major:-0}" -ge 13 ]; then extra="[cuda13]"; elif [ "${cuda_major:-0}" -ge 12 ]; then extra="[cuda12]"; fi
fi
stamp=.venv/.snug-install
want="$( (cat pyproject.toml; echo "extra=${extra}") | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/snug ] || [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    echo "snug.sh: installing Snug into .venv (pyproject.toml changed or first run)..." >&2
    # A .venv without pip is one Debian/Ubuntu's python3 left before python3-venv was
    # installed: make it again (venv names the package to install while it is missing).
    .venv/bin/python -m pip --version >/dev/null 2>&1 || "$PY" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".${extra}"
    echo "$want" > "$stamp"
fi
# Qt's X11 platform plugin needs a few system libraries that minimal Debian/Ubuntu lack:
# installed here as root, else named when a display is there for the window to open on.
# The list is read whole into a variable: `ldconfig -p | grep -q` under pipefail fails at
# random (grep -q exits at the first match, ldconfig then dies of SIGPIPE).
if command -v ldconfig >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    libs="$(ldconfig -p 2>/dev/null || true)"
    pkgs="libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0
          libxcb-render-util0 libxcb-shape0 libegl1 libgl1"
    case "$libs" in
        *libxcb-cursor.so.0*) ;;
        *)
            if [ "$(id -u)" = 0 ]; then
                apt-get update -qq && apt-get install -y -qq $pkgs >/dev/null
            elif [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
                echo "snug.sh: Qt's window needs libraries missing here:" \
                    "sudo apt-get install" $pkgs >&2
            fi
            ;;
    esac
fi
exec .venv/bin/snug "$@"
