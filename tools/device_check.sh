#!/usr/bin/env bash
# Device check: CUDA kernel and forward tests, then the decode/prefill benchmark.
# Usage (on the GPU machine, repo root): tools/device_check.sh [tests|bench|all] [bench flags...]
# Logs, JSON and the markdown table go to $OUT (or ./device_out).
set -o pipefail
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
mode=${1:-all}
shift || true
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/snug-cupy-cache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
status=0
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests/device -q -s -p no:cacheprovider 2>&1 | tee "$OUT/device_tests.log"
  status=$?
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  timeout ${BENCH_TIMEOUT:-330} python3 tools/bench_decode.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
  [ $status -eq 0 ] && status=$?
fi
exit $status
