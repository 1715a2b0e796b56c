# Sourced by the device scripts (device_check.sh, device_batch.sh, device_ab.sh): compiled
# kernels travel between lent machines, which start bare. A carried .kernel-cache.txz (or
# an older .kernel-cache.tgz) in the repository root is unpacked into CuPy's cache
# (CUPY_CACHE_DIR) when this file is sourced; pack_kernel_cache packs the cache into
# $OUT/kernel-cache.txz when it is under the 16 MiB a returned file may have. xz, not gzip:
# the cubins pack about four times smaller (64 MB of them: 4 MB, where gzip gave 17 MB).
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/snug-cupy-cache}
for carried in .kernel-cache.tgz .kernel-cache.txz; do  # the newer one last, over the older
  if [ -f "$carried" ]; then
    mkdir -p "$CUPY_CACHE_DIR" && tar -xf "$carried" -C "$CUPY_CACHE_DIR"
  fi
done
pack_kernel_cache() {
  [ -d "$CUPY_CACHE_DIR" ] || return 0
  XZ_OPT=-T0 tar -cJf "$OUT/kernel-cache.txz" -C "$CUPY_CACHE_DIR" . 2> /dev/null
  local size
  size=$(stat -c %s "$OUT/kernel-cache.txz")
  if [ "$size" -gt $((16 << 20)) ]; then
    rm -f "$OUT/kernel-cache.txz"
    echo "kernel cache not returned: $((size >> 20)) MiB packed, over 16 MiB" \
      "(carry the last one that was; its kernels compile again)"
  fi
}
