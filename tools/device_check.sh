#!/usr/bin/env bash
# Device check: CUDA kernel and forward tests, the decode/prefill benchmark, a per-kernel
# profile of one decode step, its timeline, the per-block clock records of its projections.
# Usage (on the GPU machine, repo root):
#   tools/device_check.sh [tests|bench|small-card|soak|draft|profile|timeline|stamps|all] [pytest -k expression or tool flags...]
#   tools/device_check.sh bench --runs 4B:mlx4 --prefill 512,2048,8192 --hf=   # the table
#   tools/device_check.sh bench --first-request      # or --small-card (tools/bench_decode.py)
#   tools/device_check.sh stamps --tuned             # tools/profile_step.py --stamps
#   tools/device_check.sh small-card --sizes 4B      # tools/bench_small_card.py (its log, small_card.md)
#   tools/device_check.sh soak                       # tools/soak.py: 1,000 requests under 4 GiB (soak.json)
#   tools/device_check.sh draft --shape 4B           # tools/bench_draft.py: MTP drafting (draft.md)
#   tools/device_check.sh draft --shape 4B --profile # and a step's and each verify's kernels
#   tools/device_check.sh resume [--dtype float32]   # tools/bench_resume.py: a turn after a restart
#   tools/device_check.sh serve --synth 4B:mlx4 --limit-gib 4 --streams 6   # tools/bench_serve.py
#   tools/device_check.sh llamacpp --shape 4B        # tools/llamacpp.py bench (carry .llama-src.tgz)
# Logs, JSON and the markdown tables go to $OUT (or ./device_out). The projection kernels are
# compiled first, in parallel (tools/compile_kernels.py warm); the full test run then takes
# about 3.5 minutes on an H200; `tests 'attention or delta'` runs a part.
set -o pipefail
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
mode=${1:-all}
shift || true
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}  # carried wheels may be on it
export PYTHONUNBUFFERED=1
# The kernel cache: a carried .kernel-cache.txz unpacked now, $OUT/kernel-cache.txz at exit.
. tools/kernel_cache.sh
trap pack_kernel_cache EXIT
# The projection kernels compiled in parallel first (tests and benchmarks compile one by one).
warm=(--rows "${WARM_ROWS:-1,2,3,8}")
[ "$mode" = profile ] || [ "$mode" = timeline ] && warm=(--rows 1 --dtypes bfloat16)
[ "$mode" = stamps ] && warm=(--rows 1 --dtypes bfloat16 --define SNUG_STAMPS)
[ "$mode" = small-card ] && warm=(--rows 1 --dtypes bfloat16)
[ "$mode" = soak ] && warm=(--rows 1,2,3,4 --dtypes bfloat16)
[ "$mode" = draft ] && warm=(--rows 1,2,3,4 --dtypes bfloat16)
[ "$mode" = resume ] && warm=(--rows 1 --dtypes "${RESUME_DTYPE:-bfloat16}")
[ "$mode" = serve ] && warm=(--rows 1,2,3,4,5,6,7,8 --dtypes bfloat16)
[ "$mode" = llamacpp ] && warm=(--rows 1 --dtypes bfloat16)
timeout 300 python3 tools/compile_kernels.py warm "${warm[@]}" > "$OUT/warm_kernels.log" 2>&1 ||
  echo "warm_kernels failed (see $OUT/warm_kernels.log); the runs compile as they go"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
status=0
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  select=()
  [ "$mode" = tests ] && [ -n "$1" ] && select=(-k "$1")
  timeout "${TEST_TIMEOUT:-480}" python3 -m pytest tests/device -q -s -p no:cacheprovider \
    "${select[@]}" 2>&1 | tee "$OUT/device_tests.log"
  status=$?
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  # The copy of the tree on a lent machine may carry an older .git: pass COMMIT=<hash>.
  commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  flags=("$@")
  [ "$mode" = all ] && flags=()
  timeout "${BENCH_TIMEOUT:-330}" python3 tools/bench_decode.py --commit "$commit" --out "$OUT" \
    "${flags[@]}" 2>&1 | tee "$OUT/bench.log"
  [ $status -eq 0 ] && status=$?
fi
if [ "$mode" = profile ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  # NCU_CACHE=all flushes the caches before each kernel (and each replay pass of its metrics).
  timeout "${PROFILE_TIMEOUT:-300}" "$ncu" --profile-from-start off --cache-control "${NCU_CACHE:-none}" \
    --metrics "${NCU_METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct}" \
    --csv python3 tools/profile_step.py "$@" \
    > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  status=$?
  python3 tools/profile_step.py --summary "$OUT/ncu.csv" | tee "$OUT/profile.md"
fi
if [ "$mode" = timeline ]; then
  # The decode graph as it replays (kernels overlap under overlapped launches): Nsight Systems.
  nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/*/bin/nsys \
    /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
  n=${REPLAYS:-20}
  if [ -n "$nsys" ]; then
    timeout "${PROFILE_TIMEOUT:-300}" "$nsys" profile --capture-range=cudaProfilerApi \
      --cuda-graph-trace=node --trace=cuda -o "$OUT/step" -f true \
      python3 tools/profile_step.py --graph "$n" "$@" > "$OUT/nsys.log" 2>&1
    status=$?
    "$nsys" stats --report cuda_gpu_trace --format csv --output "$OUT/trace" \
      "$OUT/step.nsys-rep" >> "$OUT/nsys.log" 2>&1
  else  # no Nsight Systems: CUPTI through torch's profiler
    timeout "${PROFILE_TIMEOUT:-300}" python3 tools/profile_step.py --graph "$n" \
      --cupti "$OUT/trace_cuda_gpu_trace.csv" "$@" > "$OUT/nsys.log" 2>&1
    status=$?
    gzip -f "$OUT/trace_cuda_gpu_trace.csv.json"
  fi
  python3 tools/profile_step.py --timeline "$OUT/trace_cuda_gpu_trace.csv" --graph "$n" \
    --sequence "$OUT/sequence.csv" | tee "$OUT/timeline.md"
  rm -f "$OUT/step.sqlite"
fi
if [ "$mode" = soak ]; then
  commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  timeout "${SOAK_TIMEOUT:-540}" python3 tools/soak.py --commit "$commit" --out "$OUT" "$@" 2>&1 |
    tee "$OUT/soak.log"
  status=$?
fi
if [ "$mode" = small-card ]; then
  # Each cell in a process of its own; the full log to a file, the table and verdicts here.
  commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  timeout "${BENCH_TIMEOUT:-570}" python3 tools/bench_small_card.py --commit "$commit" \
    --out "$OUT" "$@" > "$OUT/small_card.log" 2>&1
  status=$?
  cat "$OUT/small_card.md" 2>/dev/null || tail -n 40 "$OUT/small_card.log"
fi
if [ "$mode" = stamps ]; then
  timeout "${PROFILE_TIMEOUT:-300}" python3 tools/profile_step.py --stamps --out "$OUT" "$@" 2>&1 |
    tee "$OUT/stamps.md"
  status=$?
fi
if [ "$mode" = draft ]; then
  timeout "${BENCH_TIMEOUT:-540}" python3 tools/bench_draft.py --out "$OUT" "$@" 2>&1 |
    tee "$OUT/draft.log"
  status=$?
fi
if [ "$mode" = llamacpp ]; then
  # llama.cpp built from the carried sources (minutes, once a machine), then timed.
  commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  timeout "${BENCH_TIMEOUT:-540}" python3 tools/llamacpp.py bench --commit "$commit" \
    --out "$OUT" "$@" > "$OUT/llamacpp.log" 2>&1
  status=$?
  tail -n 12 "$OUT/llamacpp.log"
fi
if [ "$mode" = resume ] || [ "$mode" = serve ]; then
  # Each run's log and JSON under a name of its own (TAG), so several runs fit one $OUT.
  commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  tag=${TAG:-$mode}
  mkdir -p "/tmp/$tag"
  timeout "${BENCH_TIMEOUT:-300}" python3 "tools/bench_$mode.py" --commit "$commit" \
    --out "/tmp/$tag" "$@" 2>&1 | tee "$OUT/$tag.log"
  status=$?
  cp /tmp/"$tag"/*.json "$OUT/$tag.json" 2>/dev/null
fi
exit $status
