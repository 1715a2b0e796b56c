"""Property tests: every config.json and safetensors header ends in a value or a named error.

Inputs are mutated valid files and arbitrary JSON: values of every JSON type and extreme
sizes, deleted and added keys, shifted and overlapping offsets, wrong header lengths, deep
nesting, truncation. Each example must return or raise ConfigError / CheckpointError, within
`DEADLINE` and `MAX_MEMORY`. The CI run draws `SNUG_FUZZ_EXAMPLES` examples per property (200
by default, about 20 s in all); a long run sets it higher, and `SNUG_FUZZ_REPORT` names a JSON
file that receives the outcome counts (also printed with `-s`):

    SNUG_FUZZ_EXAMPLES=20000 SNUG_FUZZ_REPORT=/tmp/fuzz.json \\
        pytest -s tests/engine/test_fuzz_readers.py
"""

from __future__ import annotations

import copy
import json
import math
import os
import struct
import tracemalloc
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.checkpoint.header import DTYPE_BITS
from engine.checkpoint.safetensors_file import READABLE, SafetensorsFile
from engine.errors import CheckpointError, ConfigError, SnugError
from engine.model_config import ModelConfig, load_config, parse_config

EXAMPLES = int(os.environ.get("SNUG_FUZZ_EXAMPLES", "200"))
DEADLINE = timedelta(seconds=3)
MAX_MEMORY = 64 << 20
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=DEADLINE,
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OUTCOMES: dict[str, Counter] = defaultdict(Counter)

TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "eos_token_id": 7,
    "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25},
}
KEYS = [*TEXT, "layer_types", "full_attention_interval", "mtp_num_hidden_layers", "rope_scaling"]
KEYS += ["rope_theta", "partial_rotary_factor", "quantization", "text_config", "model_type"]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder per module: each example overwrites its file there."""
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    counts = {test: dict(sorted(c.items())) for test, c in sorted(OUTCOMES.items())}
    print(f"\nfuzz outcomes ({EXAMPLES} examples per property): {json.dumps(counts)}")
    if os.environ.get("SNUG_FUZZ_REPORT"):
        Path(os.environ["SNUG_FUZZ_REPORT"]).write_text(json.dumps(counts, indent=1))


def outcome(test: str, work) -> str:
    """Run `work()` within the memory bound; the outcome is 'value' or the named error's
    class. Any other exception fails the property."""
    tracemalloc.start()
    try:
        work()
        kind = "value"
    except SnugError as exc:
        assert isinstance(exc, ConfigError | CheckpointError), repr(exc)
        assert len(str(exc)) < 2000, f"message of {len(str(exc))} characters"
        kind = type(exc).__name__
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < MAX_MEMORY, f"allocated {peak / 2**20:.0f} MiB"
    OUTCOMES[test][kind] += 1
    return kind


# -- strategies ----------------------------------------------------------------------------------

EDGE_INTS = [0, 1, -1, 2, 3, 4, 7, 8, 16, 63, 64, 1023, 1024, 1025, 4096, 65536, 65537]
EDGE_INTS += [2**20, 2**22 + 1, 2**24 + 1, 2**31, 2**32, 2**53 + 1, 2**63, 2**64, 10**8, 10**30]
EDGE_INTS += [-(2**63), 10**400]
EDGE_FLOATS = [0.0, -0.0, 0.25, 0.5, 1.0, 1e-6, -1.0, 1e300, math.inf, -math.inf, math.nan, 1e7]

scalars = (
    st.none()
    | st.booleans()
    | st.sampled_from(EDGE_INTS)
    | st.integers()
    | st.sampled_from(EDGE_FLOATS)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["", "x", "false", "true", "4", "1e7", "NaN", "qwen3_5", "full_attention"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=24,
)


@st.composite
def mutated_config(draw) -> dict:
    text = copy.deepcopy(TEXT)
    if draw(st.booleans()):
        text["layer_types"] = ["linear_attention"] * 7 + ["full_attention"]
    if draw(st.booleans()):
        text["quantization"] = {"bits": 4, "group_size": 64}
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(KEYS) | st.text(max_size=6))
        action = draw(st.sampled_from(["set", "set", "delete", "rope", "list"]))
        if action == "delete":
            text.pop(key, None)
        elif action == "rope" and isinstance(text.get("rope_parameters"), dict):
            field = draw(st.sampled_from(["rope_theta", "partial_rotary_factor", "rope_type"]))
            text["rope_parameters"][field] = draw(json_values)
        elif action == "list":
            text[key] = draw(st.lists(scalars, max_size=10))
        else:
            text[key] = draw(json_values)
    if draw(st.booleans()):
        return {"model_type": "qwen3_5_text", **text}
    return {"model_type": "qwen3_5", "text_config": text, "eos_token_id": draw(json_values)}


# -- config.json ---------------------------------------------------------------------------------


@FUZZ
@given(mutated_config())
def test_mutated_config_is_a_value_or_config_error(top):
    def parse():
        cfg = parse_config(top, source="fuzz/config.json")
        assert isinstance(cfg, ModelConfig) and len(cfg.layer_types) == cfg.num_hidden_layers

    outcome("mutated config", parse)


@FUZZ
@given(json_values)
def test_any_json_value_is_a_value_or_config_error(top):
    outcome("any JSON value", lambda: parse_config(top))


@FUZZ
@given(
    mutated_config(),
    st.sampled_from(["none", "truncate", "flip", "nest", "bigint", "constant", "bom"]),
    st.integers(0, 10**6),
    st.integers(1, 30_000),
)
def test_config_json_bytes_are_a_value_or_config_error(scratch, top, how, at, depth):
    raw = json.dumps(top).encode()
    at %= len(raw)
    if how == "truncate":
        raw = raw[:at]
    elif how == "flip":
        raw = raw[:at] + bytes([raw[at] ^ 0x80 | 1]) + raw[at + 1 :]
    elif how == "nest":
        raw = raw.replace(b"64", b"[" * depth + b"64" + b"]" * depth, 1)
    elif how == "bigint":
        raw = raw.replace(b"64", b"9" * min(depth, 6000), 1)
    elif how == "constant":
        raw = raw.replace(b"64", b"-Infinity", 1)
    elif how == "bom":
        raw = b"\xef\xbb\xbf" + raw
    (scratch / "config.json").write_bytes(raw)
    outcome("config.json bytes", lambda: load_config(scratch))


# -- safetensors ---------------------------------------------------------------------------------

WHOLE_BYTE = [d for d, bits in DTYPE_BITS.items() if bits % 8 == 0]


@st.composite
def safetensors_bytes(draw) -> bytes:
    """A valid file of 0-4 small tensors, then 0-3 mutations of its header or framing."""
    entries, blobs, offset = [], [], 0
    for i in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(WHOLE_BYTE))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        n = math.prod(shape) * DTYPE_BITS[dtype] // 8
        entries.append([f"t{i}", json.dumps(dtype), json.dumps(shape), [offset, offset + n]])
        blobs.append(draw(st.binary(min_size=n, max_size=n)))
        offset += n
    fields = [json.dumps(e[3]) for e in entries]
    metadata = ""
    extra = b""
    length_delta = 0
    for _ in range(draw(st.integers(0, 3))):
        what = draw(
            st.sampled_from(
                ["shape", "offsets", "shift", "swap", "dtype", "length", "nest", "meta", "tail"]
            )
        )
        if what == "length":
            length_delta = draw(st.sampled_from([-9, -1, 1, 7, 2**40]) | st.integers(-16, 16))
        elif what == "meta":
            metadata = json.dumps(draw(json_values))
        elif what == "tail":
            extra = draw(st.binary(max_size=16))
        elif not entries:
            continue
        else:
            i = draw(st.integers(0, len(entries) - 1))
            e = entries[i]
            if what == "shape":
                e[2] = json.dumps(draw(json_values | st.lists(st.sampled_from(EDGE_INTS))))
            elif what == "dtype":
                e[1] = json.dumps(draw(json_values | st.sampled_from(list(DTYPE_BITS))))
            elif what == "offsets":
                fields[i] = json.dumps(draw(json_values | st.lists(st.sampled_from(EDGE_INTS))))
            elif what == "shift":
                a, b = entries[i][3]
                d = draw(st.integers(-8, 8))
                fields[i] = json.dumps([a + d, b + draw(st.sampled_from([0, d]))])
            elif what == "swap":
                j = draw(st.integers(0, len(entries) - 1))
                fields[i], fields[j] = fields[j], fields[i]
            elif what == "nest":
                depth = draw(st.integers(1, 5000))
                e[2] = "[" * depth + e[2] + "]" * depth
    parts = [
        f'"{name}": {{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}'
        for (name, dtype, shape, _), offsets in zip(entries, fields, strict=True)
    ]
    if metadata:
        parts.insert(draw(st.integers(0, len(parts))), f'"__metadata__": {metadata}')
    header = ("{" + ", ".join(parts) + "}").encode()
    header += b" " * (-len(header) % 8)
    length = max(len(header) + length_delta, 0)
    return struct.pack("<Q", length) + header + b"".join(blobs) + extra


def tiles_the_data(path: Path, blob: bytes) -> None:
    """An accepted file's tensors cover its data section exactly, and each can be read."""
    f = SafetensorsFile(path)
    entries = sorted(f.entries.values(), key=lambda e: (e.start, e.end))
    at = 8 + struct.unpack("<Q", blob[:8])[0]  # where the data section starts
    for e in entries:
        assert e.start == at and e.end >= e.start
        at = e.end
        if e.dtype in READABLE:
            assert f.read_raw(e.name).nbytes == e.nbytes
    assert at == len(blob)


@FUZZ
@given(safetensors_bytes())
def test_safetensors_header_is_a_value_or_checkpoint_error(scratch, blob):
    path = scratch / "model.safetensors"
    path.write_bytes(blob)
    outcome("safetensors file", lambda: tiles_the_data(path, blob))


@FUZZ
@given(st.binary(max_size=64), json_values)
def test_arbitrary_header_json_is_a_value_or_checkpoint_error(scratch, tail, header):
    raw = json.dumps(header).encode()
    path = scratch / "model.safetensors"
    blob = struct.pack("<Q", len(raw)) + raw + tail
    path.write_bytes(blob)
    outcome("any header JSON", lambda: tiles_the_data(path, blob))
