# Sourced by the device scripts (device_check.sh, device_batch.sh, device_ab.sh): compiled
# kernels travel between lent machines, which start bare. A carried .kernel-cache.tgz in the
# repository root is unpacked into CuPy's cache (CUPY_CACHE_DIR) when this file is sourced;
# pack_kernel_cache packs the cache into $OUT/kernel-cache.tgz when it is under the 16 MiB a
# returned file may have.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/snug-cupy-cache}
if [ -f .kernel-cache.tgz ]; then
  mkdir -p "$CUPY_CACHE_DIR" && tar -xzf .kernel-cache.tgz -C "$CUPY_CACHE_DIR"
fi
pack_kernel_cache() {
  [ -d "$CUPY_CACHE_DIR" ] || return 0
  tar -czf "$OUT/kernel-cache.tgz" -C "$CUPY_CACHE_DIR" . 2> /dev/null
  local size
  size=$(stat -c %s "$OUT/kernel-cache.tgz")
  if [ "$size" -gt $((16 << 20)) ]; then
    rm -f "$OUT/kernel-cache.tgz"
    echo "kernel cache not returned: $((size >> 20)) MiB packed, over 16 MiB" \
      "(carry the last one that was; its kernels compile again)"
  fi
}
