#!/usr/bin/env bash
# Same-machine A/B of decode speed: the tree as it is (A) against overlays of changed files
# (B, C, ...), benchmarked in turn, twice, on one lent GPU (run-to-run spread is up to 5%).
# Make an overlay here from a branch first (the files it changed since it left HEAD; rebase
# it on HEAD first so they carry HEAD's own changes too):
#   tools/device_ab.sh --overlay wip/some-branch ab/some-branch
# then, on the GPU machine (repo root; logs to $OUT):
#   tools/device_ab.sh ab/some-branch [ab/other ...]
# AB_TESTS='pytest -k expression' runs that part of tests/device in every overlay first (a
# line each: passed / failed); BENCH_FLAGS replaces the benchmark's flags.
set -o pipefail
if [ "$1" = --overlay ]; then
  branch=$2 dir=$3
  rm -rf "$dir" && mkdir -p "$dir"
  git diff --name-only --diff-filter=AM HEAD..."$branch" | while read -r f; do
    mkdir -p "$dir/$(dirname "$f")" && git show "$branch:$f" > "$dir/$f"
  done
  git diff --name-only --diff-filter=D HEAD..."$branch" > "$dir/.deleted"
  echo "overlay of $branch in $dir: $(find "$dir" -type f ! -name .deleted | wc -l) files"
  exit 0
fi
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/snug-cupy-cache}
if [ -f .kernel-cache.tgz ]; then
  mkdir -p "$CUPY_CACHE_DIR" && tar -xzf .kernel-cache.tgz -C "$CUPY_CACHE_DIR"
fi
flags=${BENCH_FLAGS:---runs 4B:mlx4 --prefill 512 --hf= --decode-tokens 128}  # split on spaces
trees=("$PWD")
names=(A)
letter=B
for dir in "$@"; do
  tree=/tmp/ab-$letter
  rm -rf "$tree" && mkdir -p "$tree"
  cp -r engine tools tests pyproject.toml "$tree"/ && cp -r "$dir"/. "$tree"/
  [ -f "$dir/.deleted" ] && (cd "$tree" && xargs -r rm -f < .deleted)
  trees+=("$tree")
  names+=("$letter")
  letter=$(echo "$letter" | tr 'A-Y' 'B-Z')
done
for i in "${!trees[@]}"; do  # the decode step's projection kernels, every tree at once
  (cd "${trees[$i]}" && PYTHONPATH=. timeout 300 python3 tools/kernels.py warm --rows 1 \
    --dtypes bfloat16 --jobs 8 > "$OUT/warm_${names[$i]}.log" 2>&1) &
done
wait
if [ -n "${AB_TESTS:-}" ]; then
  for i in "${!trees[@]}"; do
    [ "$i" = 0 ] && continue
    (cd "${trees[$i]}" && PYTHONPATH=. timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s \
      -p no:cacheprovider tests/device -k "$AB_TESTS" > "$OUT/tests_${names[$i]}.log" 2>&1)
    echo "tests ${names[$i]}: $(tail -1 "$OUT/tests_${names[$i]}.log")"
  done
fi
for round in 1 2; do
  for i in "${!trees[@]}"; do
    tag=${names[$i]}$round
    # shellcheck disable=SC2086
    (cd "${trees[$i]}" && PYTHONPATH=. timeout "${BENCH_TIMEOUT:-200}" python3 \
      tools/bench_decode.py $flags --commit "$tag" --out "$OUT/$tag" > "$OUT/$tag.log" 2>&1)
    echo "$tag: $(grep -h '^| 4B\|^| 0.8B\|^| 9B' "$OUT/$tag.log" | cut -d'|' -f2,3,6,9 | tr '\n' ' ')"
    # The step tuning's variant per projection shape (out x in, prologue: warps, tiles, groups).
    python3 - "$OUT/$tag/bench.json" <<'PY' 2>/dev/null
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    c = r.get("step_tuned_choice", {})
    name = lambda k: "{2}x{3}{4}".format(*k.split(", ")[:4], " pro" + k.split(", ")[5] if k.split(", ")[5] != "0" else "")
    print("   ", ", ".join(f"{name(k)}: {tuple(v[1:4])}" for k, v in c.items()))
PY
  done
done
