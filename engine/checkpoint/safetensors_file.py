"""Lazy safetensors reading: one file's header and tensors, and a folder's set of files.

The format is an 8-byte little-endian header length, a JSON header mapping each tensor name
to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the end of the
header), then the raw little-endian data. Only the header is read at open, and checked as
the format specifies (engine.checkpoint.header); each tensor is read on request with one
seek + read, so a multi-GiB file never sits in memory at once.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.bf16 import from_bf16
from engine.checkpoint.header import MAX_HEADER_BYTES, Entry, parse_header
from engine.errors import CheckpointError, quoted
from engine.json_limits import read_json_file

# The dtypes Snug can read, with the numpy dtype of the stored bytes (BF16 as its raw bits).
READABLE = {
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
    "I64": np.dtype("<i8"),
}


class SafetensorsFile:
    """The header of one safetensors file plus on-demand reads of its tensors."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.entries: dict[str, Entry] = {}
        self.metadata: dict[str, str] = {}
        self._parse_header()

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def keys(self) -> list[str]:
        return list(self.entries)

    def _parse_header(self) -> None:
        path = self.path
        try:
            size = path.stat().st_size
            with path.open("rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise CheckpointError(
                        f"{path}: file is {size} bytes, too short for a safetensors header; "
                        "the download is incomplete, fetch the file again"
                    )
                (header_len,) = struct.unpack("<Q", head)
                if header_len > MAX_HEADER_BYTES:
                    raise CheckpointError(
                        f"{path}: header length {header_len:,} is over the format's limit of "
                        f"{MAX_HEADER_BYTES:,} bytes; the file is damaged or not a "
                        "safetensors file"
                    )
                if 8 + header_len > size:
                    raise CheckpointError(
                        f"{path}: header length {header_len:,} does not fit in the file "
                        f"({size:,} bytes); the file is truncated or not a safetensors file"
                    )
                raw = f.read(header_len)
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot be read ({exc})") from exc
        self.entries, self.metadata = parse_header(raw, path, size)

    def entry(self, name: str) -> Entry:
        try:
            return self.entries[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: has no tensor {quoted(name)}") from None

    def read_raw(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The stored array (BF16 as uint16 bits), optionally only a range of leading rows.

        Reading a row range touches only those bytes, which is how a large embedding or a
        quantized matrix is dequantized piece by piece.
        """
        e = self.entry(name)
        dtype = READABLE.get(e.dtype)
        if dtype is None:
            raise CheckpointError(
                f"{self.path}: tensor {quoted(name)} has dtype {e.dtype}, which Snug cannot read "
                f"(readable: {', '.join(READABLE)})"
            )
        shape = e.shape
        start = e.start
        if rows is not None and shape:
            first, stop, step = rows.indices(shape[0])
            if step != 1:
                raise ValueError(f"row ranges must be contiguous, got step {step}")
            row_bytes = math.prod(shape[1:]) * dtype.itemsize
            start += first * row_bytes
            shape = (max(stop - first, 0), *shape[1:])
        count = math.prod(shape)
        buf = bytearray(count * dtype.itemsize)  # writable, unlike the bytes of f.read()
        try:
            with self.path.open("rb") as f:
                f.seek(start)
                got = f.readinto(buf)
        except OSError as exc:
            raise CheckpointError(
                f"{self.path}: reading tensor {quoted(name)} failed ({exc})"
            ) from exc
        if got != len(buf):
            raise CheckpointError(
                f"{self.path}: file is truncated: tensor {quoted(name)} got {got} of "
                f"{len(buf)} bytes; fetch the file again"
            )
        return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor in a computable dtype: BF16 widened to float32, others as stored."""
        arr = self.read_raw(name, rows)
        if self.entries[name].dtype == "BF16":
            return from_bf16(arr)
        return arr


# ---------------------------------------------------------------------------------------------
# A model folder: one `model.safetensors`, or shards listed by `model.safetensors.index.json`.

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass
class WeightFiles:
    """Where each file key lives, plus the first file's metadata (`{"format": "mlx"}`)."""

    by_key: dict[str, SafetensorsFile] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: f.entries[k].shape for k, f in self.by_key.items()}


def find_weights(model_dir: Path) -> WeightFiles:
    """Open the headers of every weight file in `model_dir` (no tensor data is read)."""
    index = model_dir / INDEX_NAME
    if index.is_file():
        return _from_index(index)
    paths = sorted(model_dir.glob("*.safetensors"))
    if not paths:
        raise CheckpointError(
            f"{model_dir}: no weights found; expected {SINGLE_NAME}, or {INDEX_NAME} with the "
            "shards it lists (Hugging Face or MLX safetensors)"
        )
    out = WeightFiles()
    for path in paths:
        f = SafetensorsFile(path)
        out.metadata = out.metadata or f.metadata
        for key in f.entries:
            if key in out.by_key:
                raise CheckpointError(
                    f"{model_dir}: tensor {quoted(key)} is in both {out.by_key[key].path.name} and "
                    f"{path.name}; remove the stray file or add {INDEX_NAME}"
                )
            out.by_key[key] = f
    return out


MAX_INDEX_BYTES = 64 << 20  # the index of a 400B-parameter model is under 2 MB


def _from_index(index: Path) -> WeightFiles:
    raw = read_json_file(index, CheckpointError, MAX_INDEX_BYTES)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: has no weight_map object mapping tensor names to shards")
    opened: dict[str, SafetensorsFile] = {}
    out = WeightFiles()
    for key, shard in weight_map.items():
        # Shard names come from a downloaded file: refuse anything but a plain file name.
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(
                f"{index}: weight_map[{quoted(key)}] = {quoted(shard)} is not a file name in "
                "this folder"
            )
        f = opened.get(shard)
        if f is None:
            path = index.parent / shard
            if not path.is_file():
                raise CheckpointError(
                    f"{index}: shard {shard} (holding {quoted(key)}) is missing from "
                    f"{index.parent}; "
                    "the download is incomplete, fetch that file"
                )
            f = opened[shard] = SafetensorsFile(path)
            out.metadata = out.metadata or f.metadata
        if key not in f.entries:
            raise CheckpointError(
                f"{index}: weight_map puts {quoted(key)} in {shard}, but that file does not hold it"
            )
        out.by_key[key] = f
    return out
