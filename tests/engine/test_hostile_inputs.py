"""Hostile model files and arguments end in a named error, quickly and in little memory.

One section per finding of the engine probe: config values that size buffers, reader
crashes on odd JSON, the safetensors rules of the official library, NaN logits and the CLI.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint import Checkpoint
from engine.checkpoint.safetensors_file import SafetensorsFile
from engine.errors import CheckpointError, ConfigError
from engine.model_config import load_config, parse_config

TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 96,
}
SMALL_MEMORY = 32 << 20  # bytes Python may allocate while refusing a hostile file


def config(**change) -> dict:
    return {"model_type": "qwen3_5", "text_config": {**TEXT, **change}}


def bounded(work, seconds: float = 2.0, memory: int = SMALL_MEMORY):
    """Run `work()`, asserting it allocates under `memory` bytes and takes under `seconds`."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        return work()
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < memory, f"allocated {peak / 2**20:.0f} MiB"
        assert elapsed < seconds, f"took {elapsed:.1f} s"


def raises_bounded(error, match: str, work, **limits) -> str:
    def run():
        with pytest.raises(error, match=match) as info:
            work()
        return str(info.value)

    message = bounded(run, **limits)
    assert len(message) < 1500, f"message of {len(message)} characters"
    return message


# -- 1. config values that size buffers --------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_hidden_layers", 1_000_000),
        ("num_hidden_layers", 10**8),
        ("head_dim", 65536),
        ("linear_key_head_dim", 16384),
        ("linear_value_head_dim", 16384),
        ("linear_num_value_heads", 100_000),
        ("hidden_size", 1 << 20),
        ("vocab_size", 1 << 30),
        ("max_position_embeddings", 1 << 40),
    ],
)
def test_out_of_range_size_is_refused_before_allocation(tmp_path, key, value):
    (tmp_path / "config.json").write_text(json.dumps(config(**{key: value})))
    message = raises_bounded(
        ConfigError, rf"config\.json: {key} = {value} must be", lambda: load_config(tmp_path)
    )
    assert "fix that key in config.json" in message


@pytest.mark.parametrize(
    ("change", "product"),
    [
        ({"hidden_size": 65536, "intermediate_size": 262144}, "hidden_size .* intermediate_size"),
        ({"vocab_size": 1 << 22, "hidden_size": 65536}, "vocab_size .* hidden_size"),
        (
            {
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 256,
                "linear_key_head_dim": 1024,
                "linear_value_head_dim": 256,
            },
            "recurrent state",
        ),
        ({"num_key_value_heads": 64, "num_attention_heads": 64, "head_dim": 1024}, "key/value"),
    ],
)
def test_products_past_a_real_model_are_refused(change, product):
    with pytest.raises(ConfigError, match=product):
        parse_config(config(**change), source="m/config.json")


def test_million_layer_checkpoint_fails_fast(tmp_path):
    """A 1 KB config.json next to real weights: refused before any per-layer bookkeeping."""
    (tmp_path / "config.json").write_text(json.dumps(config(num_hidden_layers=100_000)))
    write_raw(tmp_path / "model.safetensors", {"w": ("F32", [1], b"\0" * 4)})
    raises_bounded(ConfigError, "num_hidden_layers = 100000", lambda: Checkpoint.open(tmp_path))


# -- 2. values that crashed the readers ----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"rope_parameters": True}, "rope_parameters = True must be an object"),
        ({"rope_scaling": [1, 2]}, "rope_scaling = \\[1, 2\\] must be an object"),
        ({"rms_norm_eps": "x"}, "rms_norm_eps = 'x' must be a number"),
        ({"max_position_embeddings": ""}, "max_position_embeddings = '' must be"),
        ({"max_position_embeddings": -5}, "max_position_embeddings = -5 must be"),
        ({"rope_parameters": {"rope_theta": float("nan")}}, "rope_theta = nan"),
        ({"rope_parameters": {"rope_theta": float("inf")}}, "rope_theta = inf"),
        ({"rope_theta": -1}, "rope_theta = -1 is out of range"),
        ({"rope_parameters": {"partial_rotary_factor": float("nan")}}, "partial_rotary_factor"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings = 'false' must be true or false"),
        ({"hidden_size": 64.0}, "hidden_size = 64.0 must be a positive integer"),
        ({"hidden_size": True}, "hidden_size = True must be a positive integer"),
        ({"eos_token_id": [1, "2"]}, "eos_token_id '2'"),
        ({"eos_token_id": 96}, "eos_token_id 96 is not a token id"),
        ({"layer_types": [[]] * 4}, "layer_types must be a list of strings"),
        ({"layer_types": list(range(10**6))}, "layer_types has 1000000 entries"),
    ],
)
def test_bad_values_are_config_errors(change, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(config(**change))


@pytest.mark.parametrize(
    "top",
    [[], "qwen3_5", None, {"model_type": ["qwen3_5"]}, {"model_type": "qwen3_5", "text_config": 1}],
)
def test_non_objects_are_config_errors(top):
    with pytest.raises(ConfigError):
        parse_config(top)


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1"])
def test_deeply_nested_config_json(tmp_path, raw):
    (tmp_path / "config.json").write_bytes(raw)
    raises_bounded(ConfigError, r"config\.json", lambda: load_config(tmp_path))


def test_quantization_values_must_be_integers():
    with pytest.raises(ConfigError, match="needs integer bits and group_size"):
        parse_config({**config(), "quantization": {"bits": "4", "group_size": 64}})
    with pytest.raises(ConfigError, match="needs integer bits and group_size"):
        parse_config({**config(), "quantization": {"bits": 4.7, "group_size": 64}})


# -- 3. safetensors as the format specifies ------------------------------------------------------


def write_raw(path: Path, tensors: dict, *, header: dict | None = None) -> bytes:
    """A safetensors file from `{name: (dtype, shape, data bytes)}`, contiguous, its header
    padded with 1 to 8 spaces; `header` replaces the computed one (to write a damaged one)."""
    computed, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        computed[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header if header is not None else computed).encode()
    raw += b" " * (8 - len(raw) % 8)
    blob = struct.pack("<Q", len(raw)) + raw + b"".join(t[2] for t in tensors.values())
    path.write_bytes(blob)
    return raw


TWO = {"a": ("F32", [2], b"\0" * 8), "b": ("F32", [2], b"\1" * 8)}


@pytest.mark.parametrize(
    ("offsets", "match"),
    [
        ({"a": [0, 8], "b": [4, 12]}, "overlaps"),
        ({"a": [0, 8], "b": [0, 8]}, "overlaps"),
        ({"a": [4, 12], "b": [12, 20]}, "gap"),
        ({"a": [0, 8], "b": [12, 20]}, "gap"),
        ({"a": [8, 16], "b": [0, 8]}, None),  # out of order on disk order is fine
    ],
)
def test_offsets_must_tile_the_data(tmp_path, offsets, match):
    header = {n: {"dtype": "F32", "shape": [2], "data_offsets": o} for n, o in offsets.items()}
    data = bytes(range(max(o[1] for o in offsets.values())))
    raw = json.dumps(header).encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    if match is None:
        f = SafetensorsFile(tmp_path / "x.safetensors")
        assert f.read("a").tobytes() == bytes(range(8, 16))
        return
    with pytest.raises(CheckpointError, match=match):
        SafetensorsFile(tmp_path / "x.safetensors")


def test_header_length_off_by_one_is_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    raw = write_raw(path, TWO)
    assert raw.endswith(b" ")  # space padding: the JSON still parses one byte short
    blob = path.read_bytes()
    for delta in (-1, 1):
        path.write_bytes(struct.pack("<Q", len(raw) + delta) + blob[8:])
        with pytest.raises(CheckpointError, match="x.safetensors"):
            SafetensorsFile(path)


def test_bytes_after_the_last_tensor_are_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    write_raw(path, TWO)
    path.write_bytes(path.read_bytes() + b"\0" * 4)
    with pytest.raises(CheckpointError, match="4 bytes belong to no tensor"):
        SafetensorsFile(path)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ('{"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 8]}', "Infinity is not JSON"),
        ('{"dtype": "F32", "shape": [2], "data_offsets": [0, Infinity]}', "Infinity is not JSON"),
        ('{"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}', "not an integer"),
        ('{"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}', "unknown dtype \\['F32'\\]"),
        ('{"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}', "non-negative"),
        ('{"dtype": "F32", "shape": [true, 2], "data_offsets": [0, 8]}', "non-negative"),
        ('{"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}', "needs 8 bytes"),
        ('{"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}', "two non-negative"),
        ('{"dtype": "F32", "shape": [2], "data_offsets": [0, ' + "9" * 30 + "]}", "20 digits"),
        ('{"dtype": "F4", "shape": [3], "data_offsets": [0, 8]}', "not a whole number of bytes"),
        ('{"shape": [2], "data_offsets": [0, 8]}', "needs dtype, shape and data_offsets"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_bad_header_entries_are_checkpoint_errors(tmp_path, spec, match):
    raw = ('{"t": ' + spec + "}").encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8)
    raises_bounded(CheckpointError, match, lambda: SafetensorsFile(tmp_path / "x.safetensors"))


def test_header_must_be_an_object_with_string_metadata(tmp_path):
    path = tmp_path / "x.safetensors"
    for raw, match in (
        (b" {}", "does not start with"),
        (b"[]", "does not start with"),
        (b'{"__metadata__": {"format": 1}}', "must map strings to strings"),
        (b'{"__metadata__": []}', "must map strings to strings"),
    ):
        path.write_bytes(struct.pack("<Q", len(raw)) + raw)
        with pytest.raises(CheckpointError, match=match):
            SafetensorsFile(path)


def test_huge_header_of_empty_entries_is_refused_in_little_memory(tmp_path):
    entries = b",".join(b'"t%07d":{}' % i for i in range(1_000_000))  # 13 MB of header
    raw = b"{" + entries + b"}"
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    raises_bounded(CheckpointError, "JSON items", lambda: SafetensorsFile(path))


def test_messages_quote_at_most_a_short_excerpt(tmp_path):
    name = "n" * 1_000_000
    header = {name: {"dtype": "Q" * 1_000_000, "shape": [1], "data_offsets": [0, 1]}}
    write_raw(tmp_path / "x.safetensors", {"x": ("U8", [1], b"\0")}, header=header)
    raises_bounded(
        CheckpointError, "unknown dtype", lambda: SafetensorsFile(tmp_path / "x.safetensors")
    )


def test_declared_header_over_the_format_limit(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    with pytest.raises(CheckpointError, match="over the format's limit of 100,000,000"):
        SafetensorsFile(path)


# -- 5. NaN logits -------------------------------------------------------------------------------


@pytest.fixture
def nan_checkpoint(tiny_checkpoint, tmp_path) -> Path:
    from safetensors.numpy import load_file, save_file

    out = tmp_path / "nan"
    shutil.copytree(tiny_checkpoint("tied-l4-r1", "hf-fp32"), out)
    weights = load_file(str(out / "model.safetensors"))
    key = next(k for k in weights if k.endswith("language_model.norm.weight"))
    weights[key] = np.full_like(weights[key], np.nan)
    save_file(weights, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize("greedy", [True, False])
def test_nan_logits_refuse_the_request_by_name(nan_checkpoint, greedy):
    from engine.config import EngineSettings
    from engine.errors import NumericalError, RequestRefused
    from engine.session import Engine, GenerationParams

    engine = Engine.load(nan_checkpoint, EngineSettings(backend="numpy"), context=64)
    try:
        params = GenerationParams(max_new_tokens=3, greedy=greedy, seed=1)
        with pytest.raises(NumericalError, match="NaN/Inf logits .*SNUG_COMPUTE_DTYPE=float32"):
            list(engine.generate([5, 6, 7], params))
        assert issubclass(NumericalError, RequestRefused)
        with pytest.raises(NumericalError):  # the engine stays usable: the next one is refused too
            engine.generate_many([[5, 6]], params)
    finally:
        engine.unload()


# -- 6. CLI arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
        (["--max-new-tokens", "-5"], "argument --max-new-tokens: must be >= 1, got -5"),
        (["--context", "0"], "argument --context: must be >= 1, got 0"),
        (["--context", "-5"], "argument --context: must be >= 1, got -5"),
        (["--max-rows", "0"], "argument --max-rows: must be >= 1, got 0"),
        (["--max-rows", "-1"], "argument --max-rows: must be >= 1, got -1"),
        (["--seed", "-1"], "argument --seed: must be >= 0"),
        (["--limit-gib", "nan"], "argument --limit-gib: must be a finite number"),
        (["--reserve-gib", "2e299"], "argument --reserve-gib: must be at most 1,048,576 GiB"),
        (["--temperature", "inf"], "argument --temperature: must be a finite number"),
    ],
)
def test_cli_refuses_out_of_range_numbers(tmp_path, capsys, args, message):
    from engine.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(tmp_path), "--prompt-ids", "1", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (["--prompt-ids=-1"], "token id -1 is negative"),
        (["--prompt-ids", "1,x"], "expected comma-separated token ids"),
        (["--prompt", "caf\udce9"], "argument --prompt: is not valid UTF-8 text (byte 0xe9"),
        (["--prompt", "hi", "--system", "\udcff"], "argument --system: is not valid UTF-8"),
    ],
)
def test_cli_refuses_bad_prompts(tmp_path, capsys, source, message):
    from engine.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(tmp_path), *source])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_ids_outside_the_vocabulary(tiny_checkpoint, capsys):
    from engine.cli import main

    model = str(tiny_checkpoint("tied-l4-r1", "hf-fp32"))
    base = ["generate", "--model", model, "--backend", "numpy", "--max-new-tokens", "1"]
    assert main([*base, "--prompt-ids", "5,100000"]) == 2
    err = capsys.readouterr().err
    assert "token id 100000 is outside the vocabulary of" in err and "RequestRefused" in err
