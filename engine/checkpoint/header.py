"""The safetensors header, checked as the format specifies before any tensor is read.

A file is an 8-byte little-endian length N, N bytes of UTF-8 JSON, then the data section:

    [ N (u64 LE) ][ {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...}  ][ data ]
    0             8                                                        8 + N     file end

The rules are those the official `safetensors` library enforces when it opens a file
(`Metadata::validate` and `read_metadata` in its tensor.rs): N is at most 100,000,000; the
header starts with `{` and is a JSON object whose `__metadata__`, if present, maps strings
to strings; every other key is a tensor with a known dtype, a shape of non-negative
integers and two offsets with `end - begin == prod(shape) * itemsize`; sorted by offset, the
tensors' byte ranges follow each other with no gap or overlap from 0 to the end of the data
section, which is the end of the file. A header whose length is off by one byte, or
offsets that overlap or shift, are refused here instead of read as nonsense weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from engine.errors import CheckpointError, quoted
from engine.json_limits import parse_json

# Bits per element of every dtype the format defines: sizes and offsets are checked even
# for tensors Snug never reads (a vision tower in FP8 must not break the open).
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

MAX_HEADER_BYTES = 100_000_000  # as the official library (HeaderTooLarge)
MAX_RANK = 16  # Qwen3.5's tensors have at most 5 dims (the vision patch embedding)
MAX_DIM = 1 << 48  # past any real tensor; keeps numpy's index arithmetic exact
_DAMAGED = "the file is damaged or was not written by a safetensors writer; fetch it again"


@dataclass(frozen=True)
class Entry:
    """One tensor's place in the file: dtype as written, shape and absolute byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _index(value: object) -> bool:
    """A JSON integer that can be a size or offset (JSON `true` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_header(raw: bytes, path: Path, file_size: int) -> tuple[dict[str, Entry], dict[str, str]]:
    """The tensors and `__metadata__` of the header `raw` (the N bytes after the length).

    Raises CheckpointError naming the file and the tensor for every rule above.
    """
    if not raw.startswith(b"{"):
        raise CheckpointError(
            f"{path}: the safetensors header does not start with '{{' (it starts "
            f"{quoted(raw[:16])}); the header length is wrong or {_DAMAGED}"
        )
    where = f"{path}: the safetensors header"
    header = parse_json(raw, where, CheckpointError, integers_only=True)
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header must be a JSON object; {_DAMAGED}")
    data_start = 8 + len(raw)
    entries: dict[str, Entry] = {}
    metadata: dict[str, str] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            metadata = _metadata(spec, path)
        else:
            entries[name] = _entry(name, spec, data_start, path)
    _check_coverage(entries, data_start, file_size, path)
    return entries, metadata


def _metadata(spec: object, path: Path) -> dict[str, str]:
    if spec is None:
        return {}
    if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
        raise CheckpointError(
            f"{path}: __metadata__ = {quoted(spec)} must map strings to strings; {_DAMAGED}"
        )
    return spec


def _entry(name: str, spec: object, data_start: int, path: Path) -> Entry:
    def refuse(problem: str) -> CheckpointError:
        return CheckpointError(
            f"{path}: tensor {quoted(name)} {problem} (header entry: {quoted(spec)}); {_DAMAGED}"
        )

    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
        raise refuse("needs dtype, shape and data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise refuse(f"has unknown dtype {quoted(dtype)}; known dtypes are {', '.join(DTYPE_BITS)}")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise refuse(f"needs a shape of at most {MAX_RANK} dimensions")
    if not all(_index(d) and d <= MAX_DIM for d in shape):
        raise refuse(f"needs a shape of non-negative integers up to {MAX_DIM}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_index, offsets))):
        raise refuse("needs data_offsets [begin, end] of two non-negative integers")
    begin, end = offsets
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise refuse(f"holds {bits} bits of {dtype}, not a whole number of bytes")
    if end < begin or end - begin != bits // 8:
        raise refuse(
            f"({dtype} {shape}) needs {bits // 8} bytes but its data_offsets "
            f"[{begin}, {end}] span {end - begin}"
        )
    return Entry(name, dtype, tuple(shape), data_start + begin, data_start + end)


def _check_coverage(entries: dict[str, Entry], data_start: int, file_size: int, path: Path):
    """Sorted by offset, the tensors tile the data section exactly (no gap, no overlap)."""
    at, previous = data_start, None
    for e in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if e.start != at:
            where = f"after tensor {quoted(previous)}" if previous else "at the data start"
            kind = "overlaps the bytes" if e.start < at else "leaves a gap of bytes"
            raise CheckpointError(
                f"{path}: tensor {quoted(e.name)} starts at data offset {e.start - data_start} "
                f"but the data {where} ends at {at - data_start}: it {kind} between them; the "
                f"tensors' data_offsets must follow each other exactly; {_DAMAGED}"
            )
        at, previous = e.end, e.name
    if at > file_size:
        raise CheckpointError(
            f"{path}: file is truncated: tensor {quoted(previous)} ends at byte {at} but the "
            f"file has {file_size} bytes; the download is incomplete, fetch it again"
        )
    if at != file_size:
        raise CheckpointError(
            f"{path}: the tensors' data ends at byte {at} but the file has {file_size} bytes "
            f"({file_size - at} bytes belong to no tensor); the header length is wrong or "
            + _DAMAGED
        )
