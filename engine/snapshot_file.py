"""A saved state's safetensors file (engine.snapshot_store): its XXH3-128 checksums, one per
block, computed when it is written, and the checked read of a restore: the file is read
once into one buffer on up to READ_THREADS threads, each checking the blocks it reads as it
reads them, and the arrays handed out are views of that buffer."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

READ_THREADS = min(8, os.cpu_count() or 1)  # threads reading (and checking) a saved file
READ_CHUNK = 1 << 20  # each read is hashed while it is still in the reading core's cache


def block_checksums(path: Path, block_bytes: int) -> list[str]:
    """XXH3-128 of each `block_bytes` block of a file, the last one shorter (read back on
    the writer's thread)."""
    import xxhash

    with open(path, "rb") as f:
        return [xxhash.xxh3_128_hexdigest(b) for b in iter(lambda: f.read(block_bytes), b"")]


# numpy's type for each safetensors dtype a saved state uses (bf16 is stored as U16 bits).
_NUMPY_DTYPES = {
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "F16": np.float16,
    "I32": np.int32,
    "U32": np.uint32,
    "F32": np.float32,
    "I64": np.int64,
    "F64": np.float64,
}


def read_checked(
    path: Path,
    checksums: list[str],
    block_bytes: int,
    buffer: Callable[[int], np.ndarray | None] | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of a saved state's safetensors file, as views of one buffer the file is
    read into once; ValueError (with the reason) when its length, a block's checksum or its
    header does not check out. `buffer(nbytes)`: where to read it (a writable contiguous
    uint8 array of at least `nbytes`, whose first `nbytes` it fills), or None to read it
    into a new array. Writing the parser here, not calling safetensors' loader, saves a
    copy of every array and a second read of the file for the checksums."""
    from engine.checkpoint.header import parse_header
    from engine.errors import CheckpointError

    size = path.stat().st_size
    blocks = -(-size // block_bytes) if block_bytes > 0 else -1
    if size < 8 or blocks != len(checksums):
        raise ValueError(
            f"its {size} bytes are not the {len(checksums)} blocks of {block_bytes} bytes its "
            "checksums cover (truncated or rewritten)"
        )
    out = buffer(size) if buffer is not None else None
    if out is None:
        buf = np.empty(size, np.uint8)
    else:
        assert out.dtype == np.uint8 and out.ndim == 1 and out.nbytes >= size, out.shape
        assert out.flags.c_contiguous and out.flags.writeable
        buf = out[:size]
    _read_blocks(path, buf, checksums, block_bytes)
    n = int.from_bytes(buf[:8].tobytes(), "little")
    if n > min(size - 8, 100_000_000):
        raise ValueError(f"its header length {n} does not fit the file")
    try:
        entries, _ = parse_header(buf[8 : 8 + n].tobytes(), path, size)
    except CheckpointError as exc:
        raise ValueError(str(exc)[:300]) from None
    arrays = {}
    for name, e in entries.items():
        if e.dtype not in _NUMPY_DTYPES:
            raise ValueError(f"array {name[:80]!r} has dtype {e.dtype[:16]!r}")
        arrays[name] = buf[e.start : e.end].view(_NUMPY_DTYPES[e.dtype]).reshape(e.shape)
    return arrays


def _read_blocks(path: Path, buf: np.ndarray, checksums: list[str], block_bytes: int) -> None:
    """Fill `buf` with the file's bytes, block by block on up to READ_THREADS threads (the
    reads and the hashing release the GIL), each block checked against its checksum as it
    is read; ValueError naming the first block that does not check out. Every thread is
    done with `buf` when this returns (the caller holds the last reference: a pinned
    buffer is freed on the engine thread)."""
    import xxhash

    size = buf.nbytes

    def check(block: int) -> bool:
        start, end = block * block_bytes, min(size, (block + 1) * block_bytes)
        h = xxhash.xxh3_128()
        with open(path, "rb", buffering=0) as f:  # a handle each: no shared file offset
            f.seek(start)
            while start < end:
                view = memoryview(buf[start : min(end, start + READ_CHUNK)])
                got = f.readinto(view)
                if not got:
                    return False  # the file got shorter since its size was read
                h.update(view[:got])
                start += got
        return h.hexdigest() == checksums[block]

    threads = max(1, min(READ_THREADS, len(checksums)))
    with ThreadPoolExecutor(threads, thread_name_prefix="snug-cache-read") as pool:
        good = list(pool.map(check, range(len(checksums))))
    if not all(good):
        bad = good.index(False)
        raise ValueError(
            f"its block {bad} of {len(good)} does not match its checksum (corrupt or truncated)"
        )
