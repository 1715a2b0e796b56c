"""Reading downloaded JSON within bounds: file size, number of items, nesting, numbers.

config.json, the safetensors headers and the shard index come from the internet. Python's
`json` turns 99 MB of `{"a":{},...}` into gigabytes of dicts and raises RecursionError on
deep nesting, so every such file is read here: its size and its count of JSON items are
bounded before parsing, and whatever `json` raises becomes the caller's named error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import SnugError

# Objects, arrays, strings and separators a file may hold. A Qwen3.5 shard header holds a
# few thousand tensors at about 13 items each; a config.json a few hundred items.
MAX_ITEMS = 1 << 20
# Digits of an integer in a safetensors header: offsets and dims are 64-bit unsigned.
MAX_HEADER_INT_DIGITS = 20


class _NumberRefused(Exception):
    """Raised from the strict number hooks; turned into the caller's error."""


def count_items(raw: bytes) -> int:
    """An upper bound on the JSON values in `raw`, without parsing it (bytes inside strings
    count too, which only makes the bound safer)."""
    return raw.count(b"{") + raw.count(b"[") + raw.count(b",") + raw.count(b'"') // 2 + 1


def _header_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_HEADER_INT_DIGITS:
        raise _NumberRefused(f"the integer {text[:24]}... has more than 20 digits")
    return int(text)


def _no_float(text: str) -> float:
    raise _NumberRefused(f"{text[:40]!r} is not an integer (shapes and offsets are integers)")


def _no_constant(text: str) -> float:
    raise _NumberRefused(f"{text} is not JSON (shapes and offsets are integers)")


def parse_json(
    raw: bytes,
    where: str,
    error: type[SnugError],
    *,
    integers_only: bool = False,
    max_items: int = MAX_ITEMS,
) -> Any:
    """Parse UTF-8 JSON `raw`; raise `error` for anything that is not plain, bounded JSON,
    its message starting with `where` ("<path>: the safetensors header"). `integers_only`
    (safetensors headers) refuses floats, NaN, Infinity and integers past 20 digits while
    parsing."""
    items = count_items(raw)
    if items > max_items:
        raise error(
            f"{where} holds about {items:,} JSON items, more than the {max_items:,} a model "
            "file needs; the file is damaged or not what its name says, fetch it again"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{where} is not UTF-8 text (byte {exc.start}: {exc.reason}); the file is "
            "damaged, fetch it again"
        ) from None
    hooks: dict[str, Any] = {}
    if integers_only:
        hooks = dict(parse_int=_header_int, parse_float=_no_float, parse_constant=_no_constant)
    try:
        return json.loads(text, **hooks)
    except RecursionError:
        raise error(
            f"{where} is JSON nested too deeply to read; the file is damaged or hostile, fetch "
            "it again from the model's page"
        ) from None
    except MemoryError:
        raise error(f"{where} is too large to parse in the memory available") from None
    except _NumberRefused as exc:
        raise error(f"{where} is refused: {exc}; the file is damaged, fetch it again") from None
    except ValueError as exc:  # JSONDecodeError, or an integer past Python's digit limit
        raise error(
            f"{where} is not valid JSON ({str(exc)[:200]}); the file is damaged or "
            "incomplete, fetch it again"
        ) from None


def read_json_file(
    path: Path, error: type[SnugError], max_bytes: int, *, max_items: int = MAX_ITEMS
) -> Any:
    """Read and parse the JSON file at `path` if it is at most `max_bytes` long."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(
                f"{path}: is {size:,} bytes, more than the {max_bytes:,} this kind of file "
                "ever needs; the file is damaged or not what its name says"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc})") from exc
    return parse_json(raw, f"{path}: the file", error, max_items=max_items)
