#!/usr/bin/env bash
# Several device steps in one lent-machine call, their logs packed into one file.
#
# A lent machine starts bare and returns at most a few files from $OUT, so one call runs
# every step a session needs and packs the logs into $OUT/logs.tgz. Each argument is one
# step, "SECONDS COMMAND...", run from the repository root with its own time limit; a step
# that fails or runs out of time does not stop the next. Carried wheels (.whl/*.whl) are
# installed into /tmp/site first, and a carried .kernel-cache.txz is unpacked into CuPy's
# cache (device_check.sh does the same for its own runs).
#
#   tools/device_batch.sh "200 python3 -m pytest tests/device/test_mtp.py -q -s" \
#       "150 tools/device_check.sh draft --shape 4B"
#
# Step i's output goes to $OUT/logs/step<i>.log (device_check.sh steps get OUT=$OUT/logs/step<i>
# for their own files); $OUT/logs/summary.txt lists each step's exit status and seconds.
set -u
OUT=${OUT:-./device_out}
logs="$OUT/logs"
mkdir -p "$logs"
if compgen -G ".whl/*.whl" > /dev/null; then
  pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$logs/wheels.log" 2>&1
  export PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
. tools/kernel_cache.sh  # a carried .kernel-cache.txz unpacked into CuPy's cache
pack() { tar -czf "$OUT/logs.tgz" -C "$OUT" logs; }
trap pack EXIT
i=0
for step in "$@"; do
  i=$((i + 1))
  limit=${step%% *}
  command=${step#* }
  start=$(date +%s)
  OUT="$logs/step$i" timeout "$limit" bash -c "$command" > "$logs/step$i.log" 2>&1
  status=$?
  echo "step $i: exit $status after $(($(date +%s) - start)) s: $command" | tee -a "$logs/summary.txt"
  pack  # what has run comes back even if a later step outlasts the call
done
