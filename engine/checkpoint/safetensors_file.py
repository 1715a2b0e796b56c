"""Lazy safetensors reading: one file's header and tensors, and a folder's set of files.

The format is an 8-byte little-endian header length, a JSON header mapping each tensor name
to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the end of the
header), then the raw little-endian data. Only the header is read at open; each tensor is
read on request with one seek + read, so a multi-GiB file never sits in memory at once.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.bf16 import from_bf16
from engine.errors import CheckpointError

# Bytes per element for every dtype the format defines: used to check sizes and offsets
# even for tensors Snug never reads (a vision tower in FP8 must not break the open).
ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}

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

# A header larger than this is not a real checkpoint header (the 9B index is ~60 KiB).
MAX_HEADER_BYTES = 100 * 1024 * 1024


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
                if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                    raise CheckpointError(
                        f"{path}: header length {header_len} does not fit in the file "
                        f"({size} bytes); the file is truncated or not a safetensors file"
                    )
                raw = f.read(header_len)
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot be read ({exc})") from exc
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(
                f"{path}: the safetensors header is not valid JSON ({exc}); the file is "
                "damaged, fetch it again"
            ) from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: the safetensors header must be a JSON object")
        data_start = 8 + header_len
        for name, spec in header.items():
            if name == "__metadata__":
                if isinstance(spec, dict):
                    self.metadata = {str(k): str(v) for k, v in spec.items()}
                continue
            self.entries[name] = self._entry(name, spec, data_start, size)

    def _entry(self, name: str, spec: object, data_start: int, size: int) -> Entry:
        path = self.path
        try:
            dtype = spec["dtype"]  # type: ignore[index]
            shape = tuple(int(d) for d in spec["shape"])  # type: ignore[index]
            begin, end = (int(o) for o in spec["data_offsets"])  # type: ignore[index]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{path}: header entry for tensor {name!r} is malformed ({spec!r}); it needs "
                "dtype, shape and data_offsets"
            ) from exc
        if dtype not in ITEMSIZE:
            raise CheckpointError(
                f"{path}: tensor {name!r} has unknown dtype {dtype!r}; known dtypes are "
                f"{', '.join(ITEMSIZE)}"
            )
        expected = math.prod(shape) * ITEMSIZE[dtype]
        if begin < 0 or end - begin != expected:
            raise CheckpointError(
                f"{path}: tensor {name!r} ({dtype} {list(shape)}) needs {expected} bytes but "
                f"its data_offsets [{begin}, {end}] span {end - begin}; the header is damaged"
            )
        if data_start + end > size:
            raise CheckpointError(
                f"{path}: file is truncated: tensor {name!r} ends at byte {data_start + end} "
                f"but the file has {size} bytes; the download is incomplete, fetch it again"
            )
        return Entry(name, dtype, shape, data_start + begin, data_start + end)

    def entry(self, name: str) -> Entry:
        try:
            return self.entries[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: has no tensor {name!r}") from None

    def read_raw(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The stored array (BF16 as uint16 bits), optionally only a range of leading rows.

        Reading a row range touches only those bytes, which is how a large embedding or a
        quantized matrix is dequantized piece by piece.
        """
        e = self.entry(name)
        dtype = READABLE.get(e.dtype)
        if dtype is None:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} has dtype {e.dtype}, which Snug cannot read "
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
            raise CheckpointError(f"{self.path}: reading tensor {name!r} failed ({exc})") from exc
        if got != len(buf):
            raise CheckpointError(
                f"{self.path}: file is truncated: tensor {name!r} got {got} of "
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
                    f"{model_dir}: tensor {key!r} is in both {out.by_key[key].path.name} and "
                    f"{path.name}; remove the stray file or add {INDEX_NAME}"
                )
            out.by_key[key] = f
    return out


def _from_index(index: Path) -> WeightFiles:
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{index}: cannot be read as JSON ({exc})") from exc
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: has no weight_map object mapping tensor names to shards")
    opened: dict[str, SafetensorsFile] = {}
    out = WeightFiles()
    for key, shard in weight_map.items():
        # Shard names come from a downloaded file: refuse anything but a plain file name.
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(
                f"{index}: weight_map[{key!r}] = {shard!r} is not a file name in this folder"
            )
        f = opened.get(shard)
        if f is None:
            path = index.parent / shard
            if not path.is_file():
                raise CheckpointError(
                    f"{index}: shard {shard} (holding {key!r}) is missing from {index.parent}; "
                    "the download is incomplete, fetch that file"
                )
            f = opened[shard] = SafetensorsFile(path)
            out.metadata = out.metadata or f.metadata
        if key not in f.entries:
            raise CheckpointError(
                f"{index}: weight_map puts {key!r} in {shard}, but that file does not hold it"
            )
        out.by_key[key] = f
    return out
