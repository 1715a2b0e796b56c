#!/usr/bin/env bash
# Same-machine A/B of decode speed: the tree as it is (A) against overlays of changed files
# (B, C, ...), run in turn on one lent GPU, twice (the second round in reverse order, so a
# drift of the machine shows as a difference between rounds, not between trees).
# Make an overlay here first, from a branch (the files it changed since it left HEAD; rebase
# it on HEAD first so they carry HEAD's own changes too) or from commits applied to HEAD
# (applied in turn, as a reverted experiment is kept in the history):
#   tools/device_ab.sh --overlay wip/some-branch ab/some-branch
#   tools/device_ab.sh --commits ab/some-change 14f7001 [ddb0af8 ...]
# then, on the GPU machine (repo root; logs to $OUT; carry the overlays' folder):
#   tools/device_ab.sh ab/some-branch [ab/other ...]
# What each tree runs (AB_BENCH):
#   small-card (the default): tools/bench_small_card.py, through Engine.load and
#     Engine.generate, with SMALL_FLAGS (default: the 0.8B and the 4B, whole card and 4 GiB,
#     a 512-token prompt); the product's speed, and the projection variants each cell ran;
#   decode: tools/bench_decode.py with BENCH_FLAGS (graph replays: kernel-level figures).
# AB_TESTS='pytest -k expression' runs that part of tests/device in every tree first, A too
# (a line each: passed / failed; a new test, overlaid, shows the tree before failing it). The kernel cache is packed into $OUT/kernel-cache.txz at the
# end (under 16 MiB), to carry as .kernel-cache.txz into the next call. WARM_TIMEOUT and
# BENCH_TIMEOUT (seconds) bound the kernels' compile and each benchmark.
set -o pipefail
overlay_from() {  # overlay_from REV DIR: the files REV changed against HEAD
  local rev=$1 dir=$2
  rm -rf "$dir" && mkdir -p "$dir"
  git diff --name-only --diff-filter=AM HEAD..."$rev" | while read -r f; do
    mkdir -p "$dir/$(dirname "$f")" && git show "$rev:$f" > "$dir/$f"
  done
  git diff --name-only --diff-filter=D HEAD..."$rev" > "$dir/.deleted"
}
if [ "$1" = --overlay ]; then
  overlay_from "$2" "$3"
  echo "overlay of $2 in $3: $(find "$3" -type f ! -name .deleted | wc -l) files"
  exit 0
fi
if [ "$1" = --commits ]; then
  dir=$2
  shift 2
  [ $# -gt 0 ] || { echo "--commits DIR needs at least one commit" >&2; exit 2; }
  work=$(mktemp -d)
  git worktree add -q --detach "$work/tree" HEAD || exit 1
  # Applied and committed in a throwaway worktree (an identity of its own, so none need be
  # configured); the commit is then an ordinary revision for overlay_from.
  if git -C "$work/tree" cherry-pick -n "$@" > /dev/null 2>&1 &&
    git -C "$work/tree" -c user.name=device_ab -c user.email=device_ab@localhost \
      commit -q --allow-empty -m "overlay" > /dev/null 2>&1; then
    overlay_from "$(git -C "$work/tree" rev-parse HEAD)" "$dir"
    ok=1
  else
    ok=0
  fi
  git worktree remove --force "$work/tree" && rm -rf "$work"
  if [ $ok = 0 ]; then
    echo "commits $* do not apply to HEAD (resolve them on a branch and use --overlay)" >&2
    exit 1
  fi
  echo "overlay of HEAD + $* in $dir: $(find "$dir" -type f ! -name .deleted | wc -l) files"
  exit 0
fi
OUT=${OUT:-./device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. tools/kernel_cache.sh  # a carried .kernel-cache.txz unpacked into CuPy's cache
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
  (cd "${trees[$i]}" && PYTHONPATH=. timeout "${WARM_TIMEOUT:-300}" python3 tools/compile_kernels.py warm --rows 1 \
    --dtypes bfloat16 --jobs 8 > "$OUT/warm_${names[$i]}.log" 2>&1) &
done
wait
if [ -n "${AB_TESTS:-}" ]; then
  for i in "${!trees[@]}"; do
    (cd "${trees[$i]}" && PYTHONPATH=. timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s \
      -p no:cacheprovider tests/device -k "$AB_TESTS" > "$OUT/tests_${names[$i]}.log" 2>&1)
    echo "tests ${names[$i]}: $(tail -1 "$OUT/tests_${names[$i]}.log")"
  done
fi
bench=${AB_BENCH:-small-card}
small=${SMALL_FLAGS:---sizes 0.8B,4B --limits none,4 --prompts 512 --first-prompt 512}
order=("${!trees[@]}")
for round in 1 2; do
  for i in "${order[@]}"; do
    tag=${names[$i]}$round
    if [ "$bench" = small-card ]; then
      # shellcheck disable=SC2086
      (cd "${trees[$i]}" && PYTHONPATH=. timeout "${BENCH_TIMEOUT:-300}" python3 \
        tools/bench_small_card.py $small --commit "$tag" --out "$OUT/$tag" > "$OUT/$tag.log" 2>&1)
      echo "$tag:"
      grep -h '^| 4B\|^| 0.8B\|^| 9B\|^| 2B' "$OUT/$tag/small_card.md" 2>/dev/null |
        cut -d'|' -f2,3,8 | sed 's/^/   /'
      # the variants the tuning chose, shapes counted per variant (the tool's --choices)
      (cd "${trees[$i]}" && PYTHONPATH=. python3 tools/bench_small_card.py --choices "$OUT/$tag/small_card.json" \
        2>/dev/null | sed 's/^/     /')
      continue
    fi
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
  reversed=()
  for ((j = ${#order[@]} - 1; j >= 0; j--)); do reversed+=("${order[$j]}"); done
  order=("${reversed[@]}")
done
pack_kernel_cache
